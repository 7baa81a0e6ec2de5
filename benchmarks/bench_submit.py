"""Benchmark: submission latency of a 10 MB topology with topology.min.replication.count 3
versus 1 on a 3-nimbus loopback cluster, plus a plain copy of the same bytes as baseline.

    .venv/bin/python benchmarks/bench_submit.py [--trials 5] [--megabytes 10]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from nimbus.dev.cluster import LocalCluster, wait_for


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--megabytes", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        import zipfile

        bundle = Path(tmp) / "bundle.jar"
        with zipfile.ZipFile(bundle, "w", zipfile.ZIP_STORED) as zf:
            zf.writestr("data.bin", os.urandom(args.megabytes * 1024 * 1024))
            # submit refuses a bundle with neither topology.py nor topology.yaml
            zf.writestr("topology.yaml", 'command: ["sleep", "3600"]\n')
        copies = []
        for i in range(args.trials):
            started = time.monotonic()
            shutil.copyfile(bundle, Path(tmp) / f"copy-{i}")
            copies.append(time.monotonic() - started)
        # A long periodic sync: replication must come from the watches.
        with LocalCluster(Path(tmp) / "cluster", 3,
                          conf={"nimbus.code.sync.freq.secs": 3600}) as cluster:
            client = cluster.client()
            times: dict[int, list[float]] = {1: [], 3: []}
            for trial in range(args.trials):
                for replicas in (1, 3):  # interleaved, so drift hits both alike
                    name = f"bench-{replicas}-{trial}"
                    started = time.monotonic()
                    client.submit(name, bundle, {"topology.min.replication.count": replicas,
                                                 "topology.max.replication.wait.time.sec": -1})
                    times[replicas].append(time.monotonic() - started)
                    info = client.cluster_info()
                    summary = next(t for t in info.topologies if t.name == name)
                    assert summary.replication_count >= replicas
                    client.kill(name, wait_secs=0)
                    wait_for(lambda n=name: n not in {t.name for t in client.cluster_info(
                    ).topologies}, 60, "removal")
    one, three = statistics.median(times[1]), statistics.median(times[3])
    print(f"{args.megabytes} MB topology, 3 nimbuses, {args.trials} trials each")
    print(f"plain file copy:            median {statistics.median(copies) * 1000:.1f} ms")
    print(f"submit, min replication 1:  median {one * 1000:.0f} ms")
    print(f"submit, min replication 3:  median {three * 1000:.0f} ms")
    print(f"ratio replication 3 / 1:    {three / one:.2f} (target <= 1.5)")


if __name__ == "__main__":
    main()
