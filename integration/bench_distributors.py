"""Benchmark: code-distributor throughput, against a plain file copy of the same bytes.

For each backend (localfs, s3 on a real SeaweedFS, torrent, hdfs through pyarrow on a
local directory), upload and download a
bundle (256 MB by default) between simulated nimbus hosts on real servers, and print
throughput as a ratio to ``shutil.copyfile`` of the same bytes measured in the same run.
Every figure, the baseline included, is the best of ``--trials`` runs (fresh hosts each).
For torrent it also prints the time for ``--peers`` fresh peers to finish together
(beside the seeder and the first downloader, which seeds by then) versus 1 peer.

    .venv/bin/python integration/bench_distributors.py [--megabytes 256] [--peers 8] \
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

from nimbus.state.zkserver import ZooKeeperServer
from nimbus.testing.hosts import SimulatedHosts

TOPOLOGY = "bench-1-1"


def write_bundle(code_dir: Path, megabytes: int) -> int:
    target = code_dir / TOPOLOGY
    target.mkdir(parents=True)
    block = os.urandom(1024 * 1024)
    with open(target / "stormjar.jar", "wb") as fh:
        for _ in range(megabytes):
            fh.write(block)
    (target / "stormconf.json").write_text("{}")
    return megabytes * 1024 * 1024


def timed(action) -> float:
    started = time.monotonic()
    action()
    return time.monotonic() - started


def bench_backend(name: str, work: Path, zk: ZooKeeperServer, conf: dict, megabytes: int,
                  peers: int) -> dict[str, float]:
    work.mkdir(parents=True, exist_ok=True)
    simulated = SimulatedHosts(work / name, zk.hosts, f"/bench-{name}-{work.name}", name, conf,
                               topology_ids=(TOPOLOGY,))
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
    parser.add_argument("--backends", default="localfs,s3,torrent,hdfs")
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    size = args.megabytes * 1024 * 1024
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        work = Path(tmp)
        baseline_src = work / "baseline.bin"
        write_bundle(work / "baseline", args.megabytes)
        shutil.move(work / "baseline" / TOPOLOGY / "stormjar.jar", baseline_src)
        copy_s = min(timed(lambda i=i: shutil.copyfile(baseline_src, work / f"copy-{i}"))
                     for i in range(args.trials))
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
    print(f"bundle {args.megabytes} MB, best of {args.trials} trials each; plain file copy "
          f"{copy_s:.2f} s ({mbps / copy_s:.0f} MB/s) is the baseline "
          "(ratio = copy time / backend time)")
    for name, r in results.items():
        print(f"{name:8} upload   {r['upload']:6.2f} s  {mbps / r['upload']:7.0f} MB/s  "
              f"ratio {copy_s / r['upload']:.3f}")
        print(f"{name:8} download {r['download']:6.2f} s  {mbps / r['download']:7.0f} MB/s  "
              f"ratio {copy_s / r['download']:.3f}")
    if "torrent" in results and "swarm" in results["torrent"]:
        one, many = results["torrent"]["download"], results["torrent"]["swarm"]
        print(f"torrent  {args.peers} fresh peers at once: {many:.2f} s vs 1 peer {one:.2f} s "
              f"(ratio {many / one:.2f})")


if __name__ == "__main__":
    main()
