"""Benchmark: code-distributor throughput, against baselines of the same bytes.

For each backend (localfs, s3 on a real SeaweedFS, torrent, hdfs through pyarrow on a
local directory), upload and download a bundle (256 MB by default) between simulated
nimbus hosts on real servers. Baselines, measured in the same run
(``transfer_baselines``):

* (a) for downloads: the file sent over loopback TCP with ``socket.sendfile`` by another
  process, and written to disk and hashed with sha256 by this one, the least any
  verified transfer must do;
* (c) for uploads: coreutils ``sha256sum`` of the file, the least an upload that hashes
  its bytes must do.

Ratios are baseline time / backend time (1.0 = as fast as the baseline). Every figure,
the baselines included, is the best of ``--trials`` runs (fresh hosts each).
For torrent it also prints the time for ``--peers`` fresh peers to finish together
(beside the seeder and the first downloader, which seeds by then) versus 1 peer.

    .venv/bin/python benchmarks/bench_distributors.py [--megabytes 256] [--peers 8] \
        [--trials 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import _paths  # noqa: F401 - testsupport/ on sys.path
from transfer_baselines import loopback_tcp, sha256sum, write_random_file

from nimbus.dev.zookeeper import ZooKeeperServer
from nimbus.testing.hosts import SimulatedHosts

TOPOLOGY = "bench-1-1"


def write_bundle(code_dir: Path, megabytes: int) -> int:
    target = code_dir / TOPOLOGY
    target.mkdir(parents=True)
    size = write_random_file(target / "stormjar.jar", megabytes)
    (target / "stormconf.json").write_text("{}")
    return size


def timed(action) -> float:
    started = time.monotonic()
    action()
    return time.monotonic() - started


def bench_backend(name: str, work: Path, zk: ZooKeeperServer, conf: dict, megabytes: int,
                  peers: int) -> dict[str, float]:
    work.mkdir(parents=True, exist_ok=True)
    # "localfs-chunks": localfs from a nimbus without the code stream (Storm's downloadChunk).
    backend = name.removesuffix("-chunks")
    simulated = SimulatedHosts(work / name, zk.hosts, f"/bench-{name}-{work.name}", backend,
                               conf, topology_ids=(TOPOLOGY,),
                               code_stream=not name.endswith("-chunks"))
    try:
        # The seeder, the first downloader, then (torrent) ``peers`` fresh peers.
        hosts = simulated.make(2 + (peers if name == "torrent" else 0))
        source, first, *rest = hosts
        write_bundle(source.code_dir, megabytes)
        metafile = work / f"{name}.meta"
        upload = timed(lambda: metafile.write_bytes(
            source.distributor.upload(source.code_dir / TOPOLOGY, TOPOLOGY).read_bytes()))
        download = timed(lambda: first.distributor.download(
            first.code_dir / TOPOLOGY, TOPOLOGY, metafile))
        result = {"upload": upload, "download": download}
        if rest:
            # Fresh peers join together; the first downloader is a seeder by now too.
            def fetch(host) -> None:
                host.distributor.download(host.code_dir / TOPOLOGY, TOPOLOGY, metafile)

            def all_peers() -> None:
                threads = [threading.Thread(target=fetch, args=(h,), name=f"bench-peer-{i}")
                           for i, h in enumerate(rest)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()

            result["swarm"] = timed(all_peers)
        return result
    finally:
        simulated.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=256)
    parser.add_argument("--peers", type=int, default=8)
    parser.add_argument("--backends", default="localfs,localfs-chunks,s3,torrent,hdfs",
                        help="localfs-chunks: localfs served by downloadChunk only")
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    size = args.megabytes << 20
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        work = Path(tmp)
        baseline_src = work / "baseline.bin"
        write_random_file(baseline_src, args.megabytes)
        tcp_s = min(loopback_tcp(baseline_src, work / "tcp-copy") for _ in range(args.trials))
        (work / "tcp-copy").unlink()
        hash_s = min(sha256sum(baseline_src) for _ in range(args.trials))
        results = {}
        with ZooKeeperServer(work / "zookeeper") as zk:
            for name in args.backends.split(","):
                conf: dict = {}
                server = None
                if name == "s3":
                    from nimbus_ha_s3.distributor import PREFIX
                    from nimbus_ha_s3.seaweed import SeaweedS3Server

                    server = SeaweedS3Server(work / "seaweed").start()
                    server.create_bucket("bench")
                    conf = {PREFIX + "endpoint": server.endpoint_url, PREFIX + "bucket": "bench",
                            PREFIX + "access.key": server.access_key,
                            PREFIX + "secret.key": server.secret_key}
                if name == "hdfs":
                    # No HDFS can run here: pyarrow's LocalFileSystem, the same calls.
                    conf = {"nimbus.codedistributor.hdfs.namenode": f"file://{work / 'hdfs'}"}
                try:
                    runs = []
                    for trial in range(args.trials):
                        runs.append(bench_backend(name, work / f"trial-{trial}", zk, conf,
                                                  args.megabytes, args.peers))
                        shutil.rmtree(work / f"trial-{trial}", ignore_errors=True)
                    results[name] = {k: min(r[k] for r in runs) for k in runs[0]}
                finally:
                    if server is not None:
                        server.stop()
    mbps = size / 1e6
    print(f"bundle {args.megabytes} MiB ({mbps:.0f} MB), best of {args.trials} trials each")
    print(f"baseline (a) loopback TCP sendfile -> write + sha256: {tcp_s:.2f} s "
          f"({mbps / tcp_s:.0f} MB/s)")
    print(f"baseline (c) sha256sum: {hash_s:.2f} s ({mbps / hash_s:.0f} MB/s)")
    print("ratio = baseline time / backend time; uploads against (c), downloads against (a)")
    for name, r in results.items():
        print(f"{name:14} upload   {r['upload']:6.2f} s  {mbps / r['upload']:7.0f} MB/s  "
              f"ratio {hash_s / r['upload']:.3f}")
        print(f"{name:14} download {r['download']:6.2f} s  {mbps / r['download']:7.0f} MB/s  "
              f"ratio {tcp_s / r['download']:.3f}")
    if "torrent" in results and "swarm" in results["torrent"]:
        one, many = results["torrent"]["download"], results["torrent"]["swarm"]
        print(f"torrent  {args.peers} fresh peers at once: {many:.2f} s vs 1 peer {one:.2f} s "
              f"(ratio {many / one:.2f})")


if __name__ == "__main__":
    main()
