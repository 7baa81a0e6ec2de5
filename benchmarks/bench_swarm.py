"""Benchmark: does the BitTorrent swarm beat client-server when every uplink is capped?

Every host's upload rate is capped the same (``--cap-mb`` MiB/s). For 1, 4 and 8 peers
(``--peers``) fetching one bundle (``--megabytes`` MiB) from one seeder, it measures the
finish time (from the start signal until the last peer holds a verified copy) of:

* **swarm**: the torrent distributor. The seeder and every peer is a separate process
  (``multiprocessing`` spawn) with its own libtorrent session, ZooKeeper session and
  simulated nimbus host (:class:`nimbus.testing.hosts.SimulatedHosts`), against one real
  ZooKeeper. Every host's upload is capped with the distributor's setting
  ``nimbus.codedistributor.torrent.upload.rate.limit.bytes`` (libtorrent's session rate
  limit, loopback peers included). Peers keep seeding until the run ends, as nimbuses do.
* **client-server**: every peer, a separate process, fetches the same bytes from one
  seeder (:class:`transfer_baselines.RateCappedServer`) whose uplink is
  capped at the same rate, shared by all clients; each client writes and sha256s them.

It prints every raw time, the cap and the bundle size, and the two ratios the swarm is
judged by: swarm time for 8 peers / swarm time for 1 peer (target <= 2), and swarm time
for 8 peers / client-server time for 8 peers (target <= 0.5).

libtorrent's limiter is a token bucket of up to 3 s of quota, filled only while some peer
waits to send (``bandwidth_manager::update_quotas``): an idle host banks nothing, but one
that sends less than its quota for a while (little to share yet) may later exceed the cap
for a moment. Over the run no host sends more than cap x elapsed time; each host's mean
upload rate is printed to show it. The client-server seeder's bucket banks nothing.

    .venv/bin/python benchmarks/bench_swarm.py [--megabytes 64] [--cap-mb 16] \
        [--peers 1,4,8] [--trials 1]
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import queue
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import _paths  # noqa: F401 - testsupport/ on sys.path
from transfer_baselines import (
    RateCappedServer,
    rate_capped_fetch,
    write_random_file,
)

from nimbus.dev.zookeeper import ZooKeeperServer
from nimbus.testing.hosts import SimulatedHosts

TOPOLOGY = "swarm-1-1"
CAP_KEY = "nimbus.codedistributor.torrent.upload.rate.limit.bytes"
RUN_TIMEOUT_S = 900.0
MiB = 1 << 20


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(MiB):
            digest.update(block)
    return digest.hexdigest()


def _uploaded_bytes(host: Any) -> int:
    """Payload bytes this host's libtorrent session has sent, over all its torrents."""
    plugin = next(iter(host.distributor._pm.get_plugins()))
    with warnings.catch_warnings():  # session.status() is deprecated, and still exact
        warnings.simplefilter("ignore", DeprecationWarning)
        return plugin._swarm.session.status().total_payload_upload


def swarm_host(role: str, index: int, job: dict[str, Any], events: dict[str, Any],
               results: Any) -> None:
    """One swarm member in its own process: the seeder (``role`` "seeder") or a peer.

    The seeder uploads the bundle and reports the metafile. A peer reports ready; on
    "go" it downloads, reports when it finished, and seeds until "stop". Then each
    reports its bytes sent and its copy's sha256.
    """
    work = Path(job["work"]) / f"{role}-{index}"
    simulated = SimulatedHosts(work, job["zk_hosts"], job["zk_root"], "torrent",
                               {CAP_KEY: job["cap"]}, topology_ids=(TOPOLOGY,))
    try:
        (host,) = simulated.make(1)
        code = host.code_dir / TOPOLOGY
        if role == "seeder":
            code.mkdir(parents=True)
            shutil.copyfile(job["bundle"], code / "stormjar.jar")
            (code / "stormconf.json").write_text("{}")
            metafile = host.distributor.upload(code, TOPOLOGY)
            results.put(("metafile", index, metafile.read_bytes()))
        else:
            results.put(("ready", index, None))
            events["go"].wait(RUN_TIMEOUT_S)
            try:
                host.distributor.download(code, TOPOLOGY, Path(job["metafile"]))
                results.put(("done", index, time.monotonic()))
            except Exception as exc:  # reported, and the run fails
                results.put(("error", index, f"{type(exc).__name__}: {exc}"))
        events["stop"].wait(RUN_TIMEOUT_S)
        results.put(("uploaded", index, (role, _uploaded_bytes(host))))
        jar = code / "stormjar.jar"
        results.put(("sha256", index, _sha256(jar) if jar.exists() else ""))
    finally:
        simulated.close()


def cs_client(index: int, port: int, dest: str, size: int, events: dict[str, Any],
              results: Any) -> None:
    """One client-server peer in its own process: fetch the bundle on "go"."""
    results.put(("ready", index, None))
    events["go"].wait(RUN_TIMEOUT_S)
    try:
        rate_capped_fetch(port, Path(dest), size)
        results.put(("done", index, time.monotonic()))
    except Exception as exc:
        results.put(("error", index, f"{type(exc).__name__}: {exc}"))


class Run:
    """Processes of one measurement, their events and their result queue."""

    def __init__(self, ctx: Any):
        self.ctx = ctx
        self.events = {name: ctx.Event() for name in ("go", "stop")}
        self.results = ctx.Queue()
        self.processes: list[Any] = []
        self.deadline = time.monotonic() + RUN_TIMEOUT_S
        self._pending: list[tuple[str, int, Any]] = []  # received, not yet collected

    def start(self, target: Any, name: str, *args: Any) -> None:
        process = self.ctx.Process(target=target, name=name, args=(*args, self.events,
                                                                   self.results))
        process.start()
        self.processes.append(process)

    def collect(self, kind: str, count: int) -> dict[int, Any]:
        """Wait for ``count`` messages of ``kind``; an "error" message fails the run."""
        got = {index: value for message, index, value in self._pending if message == kind}
        self._pending = [m for m in self._pending if m[0] != kind]
        while len(got) < count:
            try:
                message, index, value = self.results.get(
                    timeout=max(0.1, self.deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"no {kind} from {count - len(got)} processes") from None
            if message == "error":
                raise RuntimeError(f"process {index}: {value}")
            if message == kind:
                got[index] = value
            else:
                self._pending.append((message, index, value))
        return got

    def finish(self) -> None:
        self.events["stop"].set()
        for process in self.processes:
            process.join(60)
            if process.is_alive():
                process.kill()
                process.join(10)


def measure_swarm(ctx: Any, work: Path, zk: ZooKeeperServer, bundle: Path, peers: int,
                  cap: int, label: str) -> tuple[float, dict[str, float]]:
    """Seconds until ``peers`` peers hold the bundle; and each host's mean upload rate."""
    digest = _sha256(bundle)
    job = {"work": str(work / label), "zk_hosts": zk.hosts, "zk_root": f"/{label}",
           "bundle": str(bundle), "cap": cap, "metafile": str(work / f"{label}.torrent")}
    run = Run(ctx)
    try:
        run.start(swarm_host, f"{label}-seeder", "seeder", 0, job)
        Path(job["metafile"]).write_bytes(run.collect("metafile", 1)[0])
        for i in range(1, peers + 1):
            run.start(swarm_host, f"{label}-peer-{i}", "peer", i, job)
        run.collect("ready", peers)
        started = time.monotonic()
        run.events["go"].set()
        done = run.collect("done", peers)
        elapsed = max(done.values()) - started
        run.events["stop"].set()
        uploaded = run.collect("uploaded", peers + 1)
        copies = run.collect("sha256", peers + 1)
        if any(copies[i] != digest for i in copies):
            raise RuntimeError(f"{label}: a copy differs from the bundle")
        rates = {f"{role}-{i}": sent / elapsed for i, (role, sent) in uploaded.items()}
        return elapsed, rates
    finally:
        run.finish()


def measure_client_server(ctx: Any, work: Path, bundle: Path, peers: int, cap: int,
                          label: str) -> float:
    """Seconds until ``peers`` clients hold the bundle from one capped server."""
    size = bundle.stat().st_size
    (work / label).mkdir(parents=True)
    run = Run(ctx)
    try:
        with RateCappedServer(bundle, cap) as server:
            for i in range(peers):
                run.start(cs_client, f"{label}-client-{i}", i, server.port,
                          str(work / label / f"copy-{i}"), size)
            run.collect("ready", peers)
            started = time.monotonic()
            run.events["go"].set()
            done = run.collect("done", peers)
            elapsed = max(done.values()) - started
        if any((work / label / f"copy-{i}").stat().st_size != size for i in range(peers)):
            raise RuntimeError(f"{label}: a copy is incomplete")
        shutil.rmtree(work / label)
        return elapsed
    finally:
        run.finish()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=64, help="bundle size, MiB")
    parser.add_argument("--cap-mb", type=float, default=16.0,
                        help="every host's upload cap, MiB/s")
    parser.add_argument("--peers", default="1,4,8")
    parser.add_argument("--trials", type=int, default=1, help="best of this many runs")
    args = parser.parse_args()
    cap = int(args.cap_mb * MiB)
    counts = [int(n) for n in args.peers.split(",")]
    ctx = multiprocessing.get_context("spawn")
    swarm: dict[int, float] = {}
    client_server: dict[int, float] = {}
    rates: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        work = Path(tmp)
        bundle = work / "bundle.bin"
        size = write_random_file(bundle, args.megabytes)
        with ZooKeeperServer(work / "zookeeper") as zk:
            for trial in range(args.trials):
                for n in counts:
                    label = f"swarm-{n}-t{trial}"
                    elapsed, host_rates = measure_swarm(ctx, work, zk, bundle, n, cap, label)
                    if elapsed < swarm.get(n, float("inf")):
                        swarm[n], rates[n] = elapsed, host_rates
                    shutil.rmtree(work / label, ignore_errors=True)
                    elapsed = measure_client_server(ctx, work, bundle, n, cap,
                                                    f"cs-{n}-t{trial}")
                    client_server[n] = min(elapsed, client_server.get(n, float("inf")))
    print(f"bundle {args.megabytes} MiB ({size} bytes); every host's upload capped at "
          f"{args.cap_mb:g} MiB/s ({cap} bytes/s); best of {args.trials} trial(s); "
          f"{os.cpu_count()} cores")
    print(f"one bundle through one capped uplink takes {size / cap:.2f} s")
    print(f"{'peers':>5}  {'swarm s':>8}  {'client-server s':>15}  {'swarm/cs':>8}  "
          f"{'N x bundle/cap s':>16}")
    for n in counts:
        print(f"{n:>5}  {swarm[n]:8.2f}  {client_server[n]:15.2f}  "
              f"{swarm[n] / client_server[n]:8.3f}  {n * size / cap:16.2f}")
    for n in counts:
        seeder = rates[n].pop("seeder-0")
        peak = max(rates[n].values(), default=0.0)
        print(f"swarm {n} peers, mean upload over the run: seeder {seeder / cap:.2f} x cap, "
              f"busiest peer {peak / cap:.2f} x cap")
    first, last = min(counts), max(counts)
    if first != last:
        print(f"swarm {last} peers / swarm {first} peer(s): "
              f"{swarm[last] / swarm[first]:.2f} (target <= 2)")
    print(f"swarm {last} peers / client-server {last} peers: "
          f"{swarm[last] / client_server[last]:.3f} (target <= 0.5)")


if __name__ == "__main__":
    main()
