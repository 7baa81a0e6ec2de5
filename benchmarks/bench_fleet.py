"""Benchmark: code to a fleet of supervisors, through each code distributor.

For each backend (``--backends``) and fleet size N (``--fleet``), it measures the time
from the "submit" (the metafile published, every supervisor told to go) until all N
supervisors hold a verified, unpacked copy, and the bytes of code each nimbus sent.

* **Nimbuses** (``--nimbuses``, default 3) are simulated hosts in this process
  (:class:`nimbus.testing.hosts.SimulatedHosts`): a prepared distributor, a real Thrift
  server serving their copy, a ZooKeeper session each. The first uploads the bundle, the
  others download it before the clock starts, as followers do.
* **Supervisors** are N separate processes, each running the supervisor's own fetch code:
  :class:`~nimbus.supervisor.code_cache.CodeCache` with a
  :class:`~nimbus.supervisor.distributor_source.DistributorSource` on a ZooKeeper session
  of its own (the "light mode" of issue 27: everything a supervisor does to get code,
  without workers). Each prepares its distributor before the clock starts, as a
  supervisor's fetch thread does when it starts. After its copy is verified, a
  supervisor keeps serving it (torrent seeds) until the run ends.
* **Uplinks**: with torrent, every host's upload (nimbuses and supervisors) is capped at
  ``--cap-mb`` MiB/s by the distributor's own setting, and the same-run client-server
  baseline is one seeder capped the same serving ``--baseline-clients`` clients
  (``RateCappedServer``). localfs (Thrift) and s3 (a local SeaweedFS) are not capped.
* **Egress**: Thrift bytes from each nimbus's file server (``nimbus_code_served_bytes``),
  plus, with torrent, each nimbus's libtorrent payload upload.

It prints every raw figure and the ratios the targets are judged by: torrent time at the
largest N / at N = 1 (target <= 2) and bundles all nimbuses sent (target <= 2); s3 bytes
the nimbuses sent (target 0); localfs busiest / least busy nimbus (target <= 1.5).

    .venv/bin/python benchmarks/bench_fleet.py [--megabytes 64] [--cap-mb 32] \
        [--fleet 1,8,32] [--backends torrent,localfs,s3] [--nimbuses 3] [--trials 1]

With ``--trials K`` each backend and N runs K times and the median run is reported (its
time and its bytes), with every run's time beside it.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import multiprocessing
import os
import queue
import shutil
import tarfile
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import _paths  # noqa: F401 - testsupport/ on sys.path
from transfer_baselines import RateCappedServer, rate_capped_fetch

from nimbus.dev.zookeeper import ZooKeeperServer
from nimbus.supervisor.code_cache import CODE_FILES, CodeCache
from nimbus.testing.hosts import SimulatedHosts

TOPOLOGY = "fleet-1-1700000000"
MiB = 1 << 20
RUN_TIMEOUT_S = 900.0
TORRENT_PREFIX = "nimbus.codedistributor.torrent."


def make_code(directory: Path, megabytes: int) -> dict[str, str]:
    """Storm's three files, the bundle an uncompressed tar of random bytes; sha256s."""
    directory.mkdir(parents=True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = os.urandom(megabytes * MiB)
        info = tarfile.TarInfo("payload.bin")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        yaml = b'command: ["sleep", "3600"]\n'
        info = tarfile.TarInfo("topology.yaml")
        info.size = len(yaml)
        tar.addfile(info, io.BytesIO(yaml))
    (directory / "stormjar.jar").write_bytes(buf.getvalue())
    (directory / "stormconf.json").write_text('{"topology.workers": 1}')
    (directory / "stormcode.ser").write_bytes(b"")
    return {name: hashlib.sha256((directory / name).read_bytes()).hexdigest()
            for name in CODE_FILES}


def light_supervisor(index: int, job: dict[str, Any], events: dict[str, Any],
                     results: Any) -> None:
    """One supervisor's fetch path in its own process; see the module docstring."""
    from kazoo.client import KazooClient

    from nimbus.supervisor.distributor_source import DistributorSource
    from nimbus.thrift.client import fetch_file

    work = Path(job["work"]) / f"supervisor-{index}"
    zk = KazooClient(hosts=job["zk_hosts"], timeout=10.0)
    zk.start(timeout=30)
    source = DistributorSource(job["conf"], zk, job["zk_root"], f"bench-{index}", work,
                               fetch_file=fetch_file)
    cache = CodeCache(work / "stormdist", 1 << 40, fetch_file, distributor=source)
    try:
        # As a supervisor's fetch thread does when it starts, before any assignment.
        source.prepare()
        results.put(("ready", index, None))
        events["go"].wait(RUN_TIMEOUT_S)
        try:
            cache.ensure(TOPOLOGY, job["sha256"], job["peers"])
            via = "distributor" if cache.fetched_from["distributor"] else "nimbus"
            results.put(("done", index, (time.monotonic(), via)))
        except Exception as exc:  # reported, and the run fails
            results.put(("error", index, f"{type(exc).__name__}: {exc}"))
        events["stop"].wait(RUN_TIMEOUT_S)
    finally:
        source.close()
        zk.stop()
        zk.close()


def _torrent_upload(host: Any) -> int:
    plugin = next(iter(host.distributor._pm.get_plugins()))
    with warnings.catch_warnings():  # session.status() is deprecated, and still exact
        warnings.simplefilter("ignore", DeprecationWarning)
        return plugin._swarm.session.status().total_payload_upload


def run_fleet(backend: str, conf: dict[str, Any], n: int, nimbuses: int, code: Path,
              sha: dict[str, str], zk: ZooKeeperServer, work: Path,
              trial: int = 0) -> dict[str, Any]:
    """One run: returns seconds until all ``n`` hold the code, and each nimbus's bytes."""
    root = f"/fleet-{backend}-{n}-{trial}"   # each run on a cluster of its own
    simulated = SimulatedHosts(work / "nimbuses", zk.hosts, root, backend, conf,
                               topology_ids=(TOPOLOGY,))
    ctx = multiprocessing.get_context("spawn")
    events = {"go": ctx.Event(), "stop": ctx.Event()}
    results = ctx.Queue()
    procs: list[Any] = []
    try:
        hosts = simulated.make(nimbuses)
        shutil.copytree(code, hosts[0].code_dir / TOPOLOGY)
        metafile = hosts[0].distributor.upload(hosts[0].code_dir / TOPOLOGY, TOPOLOGY)
        meta_path = work / "metafile"
        meta_path.write_bytes(metafile.read_bytes())
        for host in hosts[1:]:   # the followers replicate before the submit returns
            host.distributor.download(host.code_dir / TOPOLOGY, TOPOLOGY, meta_path)
        peers = list(simulated.addresses)
        job = {"work": str(work), "zk_hosts": zk.hosts, "zk_root": root, "sha256": sha,
               "peers": peers, "conf": {"storm.codedistributor.class": backend, **conf}}
        procs = [ctx.Process(target=light_supervisor, args=(i, job, events, results),
                             name=f"supervisor-{i}") for i in range(n)]
        for proc in procs:
            proc.start()
        _collect(results, "ready", n)
        served_before = [t.served_bytes for t in simulated.transfers]
        torrent_before = [_torrent_upload(h) for h in hosts] if backend == "torrent" else []
        # The Assignment a leader writes: one worker on each supervisor (localfs spreads
        # a fleet over the nimbuses by each supervisor's rank in it).
        simulated.assign(TOPOLOGY, [f"bench-{i}" for i in range(n)], sha)
        simulated.publish(TOPOLOGY, backend, metafile.read_bytes())
        started = time.monotonic()
        events["go"].set()
        done = _collect(results, "done", n)
        elapsed = max(at for at, _via in done.values()) - started
        vias = sorted({via for _at, via in done.values()})
        sent = [t.served_bytes - b for t, b in zip(simulated.transfers, served_before, strict=True)]
        if backend == "torrent":
            sent = [s + _torrent_upload(h) - b
                    for s, h, b in zip(sent, hosts, torrent_before, strict=True)]
        return {"seconds": elapsed, "sent": sent, "via": vias}
    finally:
        events["go"].set()
        events["stop"].set()
        for proc in procs:
            proc.join(60)
            if proc.is_alive():
                proc.kill()
        simulated.close()
        shutil.rmtree(work, ignore_errors=True)


def _collect(results: Any, kind: str, n: int) -> dict[int, Any]:
    got: dict[int, Any] = {}
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while len(got) < n:
        try:
            what, index, value = results.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise SystemExit(f"timed out waiting for {n - len(got)} {kind!r} reports") \
                from None
        if what == "error":
            raise SystemExit(f"supervisor {index} failed: {value}")
        if what == kind:
            got[index] = value
    return got


def client_server(source: Path, clients: int, cap: int, work: Path) -> float:
    """Seconds until ``clients`` concurrent clients hold ``source`` from one seeder
    whose uplink is capped at ``cap`` bytes/s (all clients share it)."""
    size = source.stat().st_size
    work.mkdir(parents=True, exist_ok=True)
    with RateCappedServer(source, cap) as server:
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(clients) as pool:
            started = time.monotonic()
            pool.starmap(rate_capped_fetch, [(server.port, work / f"client-{i}", size)
                                             for i in range(clients)])
            return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=int, default=64)
    parser.add_argument("--cap-mb", type=float, default=32.0,
                        help="every torrent host's upload cap, MiB/s")
    parser.add_argument("--fleet", default="1,8,32")
    parser.add_argument("--backends", default="torrent,localfs,s3")
    parser.add_argument("--nimbuses", type=int, default=3)
    parser.add_argument("--baseline-clients", type=int, default=8)
    parser.add_argument("--piece-kb", type=int, default=0,
                        help="torrent piece size (0: the distributor's choice)")
    parser.add_argument("--trials", type=int, default=1,
                        help="runs of each backend and N; the median run is reported")
    args = parser.parse_args()
    fleet = [int(n) for n in args.fleet.split(",")]
    cap = int(args.cap_mb * MiB)
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        tmp_path = Path(tmp)
        sha = make_code(tmp_path / "code", args.megabytes)
        bundle = sum((tmp_path / "code" / f).stat().st_size for f in CODE_FILES)
        print(f"bundle {bundle / MiB:.1f} MiB; {args.nimbuses} nimbuses; fleet sizes {fleet}; "
              f"torrent uplinks capped at {args.cap_mb:g} MiB/s")
        zk = ZooKeeperServer(tmp_path / "zookeeper").start()
        seaweed = None
        try:
            baseline = client_server(tmp_path / "code" / "stormjar.jar",
                                     args.baseline_clients, cap, tmp_path / "baseline")
            print(f"client-server baseline: {args.baseline_clients} clients from one seeder "
                  f"capped at {args.cap_mb:g} MiB/s: {baseline:.2f} s "
                  f"({baseline / args.baseline_clients:.2f} s per client)")
            for backend in args.backends.split(","):
                conf: dict[str, Any] = {}
                if backend == "torrent":
                    conf = {TORRENT_PREFIX + "upload.rate.limit.bytes": cap,
                            TORRENT_PREFIX + "piece.size.kb": args.piece_kb}
                elif backend == "s3":
                    from nimbus_ha_s3.distributor import PREFIX
                    from nimbus_ha_s3.seaweed import SeaweedS3Server

                    seaweed = seaweed or SeaweedS3Server(tmp_path / "seaweed").start()
                    bucket = f"fleet-{int(time.time())}"
                    seaweed.create_bucket(bucket)
                    conf = {PREFIX + "endpoint": seaweed.endpoint_url, PREFIX + "bucket": bucket,
                            PREFIX + "access.key": seaweed.access_key,
                            PREFIX + "secret.key": seaweed.secret_key,
                            PREFIX + "replication.count": 2}
                times = {}
                for n in fleet:
                    runs = [run_fleet(backend, conf, n, args.nimbuses, tmp_path / "code", sha,
                                      zk, tmp_path / f"run-{backend}-{n}-{trial}", trial)
                            for trial in range(args.trials)]
                    runs.sort(key=lambda run: run["seconds"])
                    got = runs[len(runs) // 2]   # the median run (the upper one of two)
                    if args.trials > 1:
                        each = ", ".join(f"{run['seconds']:.2f}" for run in runs)
                        print(f"{backend:8} N={n:<3} trials: {each} s")
                    times[n] = got["seconds"]
                    sent = got["sent"]
                    busiest, least = max(sent), min(sent)
                    spread = f"{busiest / least:.2f}" if least else "inf" if busiest else "-"
                    print(f"{backend:8} N={n:<3} {got['seconds']:7.2f} s  via {got['via']}  "
                          f"nimbuses sent {sum(sent) / bundle:.2f} bundles "
                          f"[{', '.join(f'{s / MiB:.1f}' for s in sent)} MiB]  "
                          f"busiest/least {spread}")
                if len(fleet) > 1:
                    print(f"{backend:8} time N={fleet[-1]} / N={fleet[0]}: "
                          f"{times[fleet[-1]] / times[fleet[0]]:.2f}")
        finally:
            if seaweed is not None:
                seaweed.stop()
            zk.stop()


if __name__ == "__main__":
    main()
