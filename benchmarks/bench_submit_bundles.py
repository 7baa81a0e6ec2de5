"""Benchmark: submitting large bundles (issue 21), as ratios to baselines of the same run.

    .venv/bin/python benchmarks/bench_submit_bundles.py [--megabytes 256] [--trials 3]
        [--datasets random,wheels,text] [--worker]

Three bundle directories of N MiB each: ``random`` (incompressible bytes in 32 MiB files),
``wheels`` (wheels, jars and zips: deflated text beside stored binaries, as real ones
are) and ``text`` (about 900 text files from 2 KiB to 2 MiB). On a 2-nimbus cluster
(localfs, real ZooKeeper, separate processes) each is submitted with
``topology.min.replication.count=1``, and measured against, in the same run and on the
same bytes (the stored tar the submit sends, packed beforehand, untimed):

* (a) loopback TCP: a child process sends the bundle with ``sendfile``, this one writes
  and sha256-hashes it (``transfer_baselines.loopback_tcp``);
* (t) ``tar -cf - -C DIR . | cat >/dev/null``: GNU tar packing the directory into a pipe
  (``tar -cf /dev/null`` itself would not read the files: GNU tar skips reading when its
  archive is /dev/null).

Reported per dataset (best of the trials, each ratio = baseline time / measured time, so
1.0 is as fast as the baseline): the submit (``NimbusClient.submit`` of the directory,
what ``nimbus-ha submit`` runs once it has started) against (a) and (t); the follower's own
fetch (its ``nimbus_code_sync_duration_seconds``) against (a); the time from the start of
the submit until the follower holds the bundle (its replica registered in ZooKeeper).
One ``nimbus-ha submit`` process per dataset gives the command's wall time, start-up
included, beside that of a 1 KiB bundle (the start-up and round trips alone).

``--worker`` adds a supervisor and times, from the start of the submit, until the worker
runs: a process topology (``sleep``) with the random data, and the word-count pipeline
(examples/wordcount, Spark ``local[1]``) with the same data beside it, until its first
beat that names a running query. Needs pyspark and java for the pipeline.

Needs about 8 x N MiB of free disk under $TMPDIR.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

import _paths  # noqa: F401 - testsupport/ on sys.path
from kazoo.client import KazooClient
from prometheus_client.parser import text_string_to_metric_families
from transfer_baselines import loopback_tcp

from nimbus.dev.cluster import LocalCluster, NimbusProcess, wait_for
from nimbus.distribution.archive import pack_directory_file
from nimbus.state.records import WorkerBeat
from nimbus.thrift.client import NimbusClient

MB = 1 << 20
ROOT = "/storm"
PROCESS_YAML = 'command: ["sleep", "3600"]\n'
WORDCOUNT = Path(__file__).resolve().parents[1] / "examples" / "wordcount"
TARGETS = {"submit": 0.25, "fetch": 0.6}
WORDS = ("def return self import from class value key data stream topology nimbus "
         "leader follower bundle worker spark query batch record error timeout session "
         "lambda yield async await raise except finally while for if else elif").split()


# -- bundle directories ------------------------------------------------------------------------
def _text(rng: random.Random, size: int) -> bytes:
    """``size`` bytes of source-like text: indented lines of words and numbers."""
    lines, total = [], 0
    while total < size:
        line = " " * rng.choice((0, 4, 8)) + " ".join(
            rng.choice(WORDS) if rng.random() < 0.85 else str(rng.randrange(10**6))
            for _ in range(rng.randrange(3, 12))) + "\n"
        lines.append(line)
        total += len(line)
    return "".join(lines).encode()[:size]


def _text_pool(rng: random.Random) -> bytes:
    """8 MiB of text that files are cut from (generating every byte afresh is slow)."""
    return _text(rng, 8 * MB)


def write_random(directory: Path, megabytes: int) -> None:
    left, index = megabytes, 0
    while left > 0:
        size = min(left, 32)
        with open(directory / f"data-{index:03d}.bin", "wb") as fh:
            for _ in range(size):
                fh.write(os.urandom(MB))
        left, index = left - size, index + 1


def write_wheels(directory: Path, megabytes: int, rng: random.Random) -> None:
    """Archives of about 16 MiB: half deflated text (modules), half stored random bytes
    (native libraries, images), with wheel, jar and zip names."""
    pool = _text_pool(rng)
    written, index = 0, 0
    suffixes = (".whl", ".jar", ".zip")
    while written < megabytes * MB:
        path = directory / f"lib{index:03d}-1.0{suffixes[index % 3]}"
        with zipfile.ZipFile(path, "w") as zf:
            for member in range(24):  # about 8 MiB of modules, deflated to about half
                start = rng.randrange(len(pool) - MB)
                zf.writestr(f"pkg/mod{member}.py", pool[start:start + 1024 * 1024],
                            compress_type=zipfile.ZIP_DEFLATED, compresslevel=1)
            zf.writestr("pkg/native.so", os.urandom(12 * MB),
                        compress_type=zipfile.ZIP_STORED)
        written += path.stat().st_size
        index += 1


def write_text(directory: Path, megabytes: int, rng: random.Random) -> None:
    """Text files whose sizes spread log-uniformly from 2 KiB to 2 MiB, in 16 folders."""
    pool = _text_pool(rng)
    written, index = 0, 0
    while written < megabytes * MB:
        size = min(int(2 ** rng.uniform(11, 21)), megabytes * MB - written)
        start = rng.randrange(len(pool) - size)
        folder = directory / f"src{index % 16:02d}"
        folder.mkdir(exist_ok=True)
        (folder / f"module_{index:04d}.py").write_bytes(pool[start:start + size])
        written += size
        index += 1


def make_bundle(directory: Path, kind: str, megabytes: int) -> Path:
    directory.mkdir(parents=True)
    (directory / "topology.yaml").write_text(PROCESS_YAML)
    rng = random.Random(21)
    {"random": lambda: write_random(directory, megabytes),
     "wheels": lambda: write_wheels(directory, megabytes, rng),
     "text": lambda: write_text(directory, megabytes, rng)}[kind]()
    return directory


# -- what the cluster does ---------------------------------------------------------------------
class ReplicaClock:
    """When each topology's code reached ``wanted`` replicas, by ZooKeeper watches (the
    replica registrations under /storm/code-distributor/<id>)."""

    def __init__(self, zk_hosts: str, wanted: int):
        self.wanted = wanted
        self.reached: dict[str, float] = {}
        self._watched: set[str] = set()
        self._lock = threading.Lock()
        self._zk = KazooClient(hosts=zk_hosts)
        self._zk.start(timeout=15)
        self._zk.ensure_path(f"{ROOT}/code-distributor")
        self._zk.ChildrenWatch(f"{ROOT}/code-distributor", self._on_topologies)

    def _on_topologies(self, ids: list[str]) -> None:
        for topology_id in ids:
            with self._lock:
                if topology_id in self._watched:
                    continue
                self._watched.add(topology_id)
            self._zk.ChildrenWatch(f"{ROOT}/code-distributor/{topology_id}",
                                   lambda hosts, t=topology_id: self._on_replicas(t, hosts))

    def _on_replicas(self, topology_id: str, hosts: list[str]) -> bool | None:
        if len(hosts) >= self.wanted:
            self.reached.setdefault(topology_id, time.monotonic())
            return False  # stop watching
        return None

    def wait(self, topology_id: str, timeout_s: float = 300.0) -> float:
        return wait_for(lambda: self.reached.get(topology_id), timeout_s,
                        f"{topology_id} on {self.wanted} nimbuses", interval_s=0.01)

    def close(self) -> None:
        self._zk.stop()
        self._zk.close()


def fetch_seconds(nimbus: NimbusProcess) -> float:
    """The follower's total time spent in code fetches that succeeded (its metrics)."""
    with urllib.request.urlopen(nimbus.metrics_url, timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "nimbus_code_sync_duration_seconds":
            return sum(s.value for s in family.samples
                       if s.name.endswith("_sum") and s.labels.get("outcome") == "ok")
    return 0.0


def tar_to_null(directory: Path) -> float:
    started = time.monotonic()
    subprocess.run(["bash", "-c", 'tar -cf - -C "$1" . | cat >/dev/null', "tar",
                    str(directory)], check=True)
    return time.monotonic() - started


def cli_submit(cluster: LocalCluster, name: str, directory: Path) -> float:
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "nimbus.cli", "submit", name, str(directory),
                    "--config", str(cluster.config_file), "--set",
                    "topology.min.replication.count=1"], check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - started


def remove(client: NimbusClient, name: str) -> None:
    client.kill(name, wait_secs=0)
    wait_for(lambda: name not in {t.name for t in client.cluster_info().topologies}, 120,
             f"removal of {name}")


# -- the run ------------------------------------------------------------------------------------
def measure(cluster: LocalCluster, follower: NimbusProcess, clock: ReplicaClock,
            kind: str, directory: Path, packed: Path, scratch: Path,
            trials: int) -> dict[str, Any]:
    client = cluster.client(deadline_s=300)
    best: dict[str, float] = {}

    def keep(key: str, value: float) -> None:
        best[key] = min(best.get(key, value), value)

    for trial in range(trials):  # interleaved, so that drift hits all alike
        keep("loopback", loopback_tcp(packed, scratch / "received"))
        (scratch / "received").unlink()
        keep("tar", tar_to_null(directory))
        name = f"{kind}-{trial}"
        fetched = fetch_seconds(follower)
        started = time.monotonic()
        topology_id = client.submit(name, directory, {"topology.min.replication.count": 1})
        keep("submit", time.monotonic() - started)
        keep("held", clock.wait(topology_id) - started)
        # The fetch is registered just before its duration is recorded.
        wait_for(lambda f=fetched: fetch_seconds(follower) > f, 30, "the follower's metrics")
        keep("fetch", fetch_seconds(follower) - fetched)
        remove(client, name)
    best["cli"] = cli_submit(cluster, f"{kind}-cli", directory)
    remove(client, f"{kind}-cli")
    return best


def worker_runs(cluster: LocalCluster, clock: ReplicaClock, data: Path, work: Path,
                pipeline: bool) -> tuple[float, float]:
    """(seconds until the supervisor holds the code, until the worker runs) from the start
    of the submit of a process (or pipeline) bundle with ``data``'s files beside it."""
    work.mkdir(parents=True)
    bundle = work / ("pipeline-bundle" if pipeline else "process-bundle")
    if pipeline:
        shutil.copytree(WORDCOUNT, bundle)
    else:
        bundle.mkdir()
        (bundle / "topology.yaml").write_text(PROCESS_YAML)
    for path in data.glob("data-*.bin"):
        os.link(path, bundle / path.name)
    conf: dict[str, Any] = {"topology.min.replication.count": 1}
    if pipeline:
        (work / "wc-in").mkdir()
        conf.update({"wordcount.input.dir": str(work / "wc-in"),
                     "wordcount.output.dir": str(work / "wc-out"),
                     "topology.spark.master": "local[1]",
                     "topology.spark.conf": {"spark.driver.memory": "512m",
                                             "spark.ui.enabled": "false"}})
    supervisor = cluster.supervisors[0]
    zk = KazooClient(hosts=cluster.zk.hosts)
    zk.start(timeout=15)
    try:
        started = time.monotonic()
        topology_id = cluster.client(deadline_s=300).submit(bundle.name, bundle, conf)
        stormdist = supervisor.local_dir / "supervisor" / "stormdist" / topology_id
        held = wait_for(lambda: stormdist.is_dir() and time.monotonic(), 300,
                        "the supervisor's copy", interval_s=0.01) - started

        def running() -> float | None:
            beats = f"{ROOT}/workerbeats/{topology_id}"
            for child in zk.get_children(beats):
                beat = WorkerBeat.decode(zk.get(f"{beats}/{child}")[0])
                # A pipeline's beat names its queries once they run; a process's first
                # beat comes from the worker of the running command.
                if beat.components or not pipeline:
                    return time.monotonic()
            return None

        ran = wait_for(running, 600, "the worker to run", interval_s=0.05) - started
        remove(cluster.client(deadline_s=120), bundle.name)
        return held, ran
    finally:
        zk.stop()
        zk.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=256)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--datasets", default="random,wheels,text")
    parser.add_argument("--worker", action="store_true",
                        help="also time submit -> worker running (needs a supervisor; "
                             "pyspark and java for the pipeline)")
    args = parser.parse_args()
    kinds = args.datasets.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-submit-bundles-") as tmp:
        work = Path(tmp)
        scratch = work / "scratch"
        scratch.mkdir()
        bundles: dict[str, tuple[Path, Path]] = {}
        for kind in kinds:
            started = time.monotonic()
            directory = make_bundle(work / kind, kind, args.megabytes)
            packed = scratch / f"{kind}.tar"
            size = pack_directory_file(directory, packed)
            files = sum(1 for p in directory.rglob("*") if p.is_file())
            print(f"{kind}: {files} files, bundle {size / MB:.1f} MiB, made in "
                  f"{time.monotonic() - started:.1f} s", flush=True)
            bundles[kind] = (directory, packed)
        conf = {"nimbus.code.sync.freq.secs": 3600,
                "nimbus.max.topology.bytes": 4 * args.megabytes * MB}
        with LocalCluster(work / "cluster", 2, conf=conf, metrics=True,
                          supervisors=1 if args.worker else 0,
                          slots_per_supervisor=1) as cluster:
            leader = cluster.wait_for_leader()
            follower = next(n for n in cluster.nimbuses if n is not leader)
            clock = ReplicaClock(cluster.zk.hosts, 2)
            try:
                small = work / "small"
                small.mkdir()
                (small / "topology.yaml").write_text(PROCESS_YAML)
                cli_small = cli_submit(cluster, "small-cli", small)
                remove(cluster.client(), "small-cli")
                results = {kind: measure(cluster, follower, clock, kind, *bundles[kind],
                                         scratch, args.trials) for kind in kinds}
                report(args, results, cli_small)
                if args.worker:
                    data = bundles["random"][0] if "random" in bundles else work
                    for kind in ("process", "pipeline"):
                        held, ran = worker_runs(cluster, clock, data, work / f"w-{kind}",
                                                kind == "pipeline")
                        print(f"{kind} bundle with {args.megabytes} MiB of data: the "
                              f"supervisor held it {held:.2f} s and the worker ran "
                              f"{ran:.2f} s after the submit began", flush=True)
            finally:
                clock.close()


def report(args: argparse.Namespace, results: dict[str, dict[str, float]],
           cli_small: float) -> None:
    n = args.megabytes
    print(f"\n{n} MiB bundles, 2 nimbuses (localfs), replication 1, best of {args.trials}; "
          "ratio = baseline / measured")
    print(f"{'bundle':<8} {'(a) loopback':>12} {'(t) tar':>8} {'submit':>8} {'vs (a)':>7} "
          f"{'vs (t)':>7} {'fetch':>7} {'vs (a)':>7} {'held':>7} {'CLI':>7}")
    verdicts = []
    for kind, r in results.items():
        submit_ratio, fetch_ratio = r["loopback"] / r["submit"], r["loopback"] / r["fetch"]
        print(f"{kind:<8} {r['loopback']:>10.2f} s {r['tar']:>6.2f} s {r['submit']:>6.2f} s "
              f"{submit_ratio:>7.2f} {r['tar'] / r['submit']:>7.2f} {r['fetch']:>5.2f} s "
              f"{fetch_ratio:>7.2f} {r['held']:>5.2f} s {r['cli']:>5.2f} s")
        if kind in ("random", "text"):
            verdicts.append(submit_ratio >= TARGETS["submit"])
        verdicts.append(fetch_ratio >= TARGETS["fetch"])
    print(f"(a): sendfile over loopback, written and sha256-hashed; (t): tar of the "
          f"directory into a pipe; submit: NimbusClient.submit of the directory; fetch: the "
          f"follower's download; held: submit start -> follower holds it; CLI: one "
          f"`nimbus-ha submit` process, start-up included (a 1 KiB bundle: {cli_small:.2f} s)")
    print(f"targets: submit >= {TARGETS['submit']} x (a) for random and text, fetch >= "
          f"{TARGETS['fetch']} x (a): {'PASS' if all(verdicts) else 'FAIL'}", flush=True)


if __name__ == "__main__":
    main()
