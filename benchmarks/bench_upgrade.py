"""Benchmark: the gap an upgrade leaves in a running pipeline, warm against cold.

    .venv/bin/python benchmarks/bench_upgrade.py [--trials 3]

The gap is the time from the old version's last commit to the new version's first
commit, both read from the checkpoint's commit log (the mtime of ``commits/<batch>``),
with records flowing all along (a file every 0.2 s). Which version committed a batch is
read from the rows it wrote (testsupport/upgrade_pipeline.py: each version writes its
number).

Two clusters in turn, each ZooKeeper, 1 nimbus and 1 supervisor with one slot, running
the same stateful pipeline (file source, ``dropDuplicates`` state, file sink), upgraded
``--trials`` times:

* **cold** (the baseline, same run): ``supervisor.warm.workers: 0``, so each new version
  starts a new JVM;
* **warm**: ``supervisor.warm.workers: 1``, with a warm worker ready before each upgrade,
  as a cluster at rest has; the new version takes it.

Printed: the median gap of each, and warm ÷ cold (target ≤ 0.35), then one JSON line.
Every record is checked to be committed exactly once after each run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _paths  # noqa: F401 - testsupport/ on sys.path
from helpers import observer
from upgrade_pipeline import (
    SPARK_CONF,
    SteadyFeed,
    batch_versions,
    pipeline_conf,
    version_bundle,
    version_dir,
)
from waiting import wait_for

from nimbus.dev.cluster import LocalCluster
from nimbus.dev.feed import CommittedOutput, RecordFeed, exactly_once_report

TIMEOUT_S = 240


def commit_times(checkpoints: Path) -> dict[int, float]:
    """batch id -> when it committed (the commit log file's mtime)."""
    commits = checkpoints / "main" / "commits"
    return {int(p.name): p.stat().st_mtime for p in commits.iterdir() if p.name.isdigit()}


def gap_of(version: int, output: Path, checkpoints: Path) -> float:
    """Seconds from the last commit before ``version``'s first batch to that batch's."""
    batches = batch_versions(output)
    first = min(b for b, versions in batches.items() if version in versions)
    times = commit_times(checkpoints)
    return times[first] - times[first - 1]


def run(work: Path, warm: int, trials: int) -> list[float]:
    feed = RecordFeed(work / "input")
    output = CommittedOutput(work / "output")
    with LocalCluster(work / "cluster", nimbuses=1, supervisors=1, slots_per_supervisor=1,
                      warm_workers=warm,
                      conf={"storm.zookeeper.session.timeout": 6000,
                            "nimbus.monitor.freq.secs": 1,
                            "supervisor.monitor.frequency.secs": 1,
                            "supervisor.heartbeat.frequency.secs": 1,
                            "topology.spark.master": "local[1]",
                            # The warm worker's session is made with the cluster's
                            # settings: the pipeline's must match them to be taken.
                            "topology.spark.conf": SPARK_CONF,
                            "topology.spark.checkpoint.dir": str(work / "checkpoints")}
                      ) as cluster:
        state = observer(cluster)
        supervisor = cluster.supervisors[0]
        topology_id = cluster.client().submit("bench-upgrade", version_bundle(work, 1),
                                              pipeline_conf(feed, output.output_dir))
        checkpoints = work / "checkpoints" / topology_id
        gaps = []
        with SteadyFeed(feed, every_s=0.2, count=5):
            wait_for(lambda: output.ids(), TIMEOUT_S, "the first commit")
            for version in range(2, trials + 2):
                if warm:
                    wait_for(lambda: (i := state.supervisor_info(supervisor.id))
                             and i.warm_ready >= 1, TIMEOUT_S, "a warm worker ready")
                started = time.monotonic()
                result = subprocess.run(
                    [sys.executable, "-m", "nimbus.cli", "upgrade", "bench-upgrade",
                     str(version_dir(work, version)), "--timeout", str(TIMEOUT_S),
                     "--config", str(cluster.config_file)],
                    capture_output=True, text=True, timeout=TIMEOUT_S + 30)
                if result.returncode != 0:
                    raise SystemExit(f"upgrade to {version} failed:\n{result.stdout}"
                                     f"{result.stderr}\n{supervisor.log_text()[-3000:]}")
                wait_for(lambda v=version: any(v in c for c in
                                               batch_versions(output.output_dir).values()),
                         TIMEOUT_S, f"a batch of version {version}")
                gap = gap_of(version, output.output_dir, checkpoints)
                gaps.append(gap)
                print(f"  {'warm' if warm else 'cold'} upgrade to v{version}: gap "
                      f"{gap:.2f}s (upgrade command {time.monotonic() - started:.1f}s)",
                      flush=True)
        log = supervisor.log_text()
        warm_starts = log.count(" on warm worker ")
        cold = [line.split("starts cold: ", 1)[1] for line in log.splitlines()
                if "starts cold: " in line]
        print(f"  starts on a warm worker: {warm_starts}; cold: {len(cold)} "
              f"{sorted(set(cold))[:3]}", flush=True)
        fed = list(feed.fed)
        wait_for(lambda: output.holds(fed), TIMEOUT_S, "every record to be committed")
        report = exactly_once_report(feed.fed, output.ids())
        if any(report.values()):
            raise SystemExit(f"not exactly once: {report}")
        state.zk.stop()
    return gaps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-upgrade-") as tmp:
        cold = run(Path(tmp) / "cold", 0, args.trials)
        warm = run(Path(tmp) / "warm", 1, args.trials)
    cold_s, warm_s = statistics.median(cold), statistics.median(warm)
    ratio = warm_s / cold_s
    print(f"upgrade gap, cold start (baseline): median {cold_s:.2f}s of {cold}")
    print(f"upgrade gap, warm worker: median {warm_s:.2f}s = {ratio:.2f}x cold "
          f"(target <= 0.35)")
    print(json.dumps({"cold_gap_s": round(cold_s, 2), "warm_gap_s": round(warm_s, 2),
                      "warm_over_cold": round(ratio, 3), "trials": args.trials}))


if __name__ == "__main__":
    main()
