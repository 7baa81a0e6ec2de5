"""Benchmark: how fast the runtime recovers a PySpark pipeline, and what it costs.

    .venv/bin/python benchmarks/bench_runtime.py [--records 300000] [--trials 3]
        [--leader-kills 5] [--warm-workers 1]

Every figure is a ratio to a baseline measured in the same run:

Both baselines run beside the cluster's idle daemons (ZooKeeper, nimbuses, supervisors),
so that both sides of each ratio share the machine alike.

* **cold start**: a fresh Python process runs the example pipeline's ``build()`` directly
  with pyspark (no nimbus-ha) and commits records that were already waiting. This is the
  least any restart of a pipeline costs.
* **direct throughput**: the same process, fed ``--records`` records: records per second
  from feeding to commit.
* **direct restart**: that process killed with SIGKILL and started again at once on its
  checkpoint, until the next commit: a crash's cost with no supervisor involved. A
  restart recovers a checkpoint that the cold start did not have, so it is the fair
  baseline for the worker-crash figure; both ratios are printed.

Then, on a cluster of ZooKeeper, 2 nimbuses and 2 supervisors (one slot each):

* throughput of the same pipeline under nimbus-ha ÷ direct throughput (target ≥ 0.95);
* worker kill -9 → the next committed batch, ÷ cold start (target ≤ 0.35 with a warm
  worker ready, ``--warm-workers 1``, the default; ≤ 1.2 cold, ``--warm-workers 0``);
* ``--leader-kills`` kill -9s of the leader nimbus while the pipeline runs: worker
  restarts and records lost or duplicated (target 0, 0);
* ZooKeeper down (kill -9 of the server) until the worker's lease has run out and it has
  frozen, then started again → the next committed batch, counted from the restart, ÷ cold
  start (the session lives on, so the first renewal thaws the worker; docs/runtime.md, "A
  lease that runs out freezes the worker"; no target in the issue);
* supervisor kill -9 alone, started again at once → the next committed batch, ÷ cold
  start (the new process takes the running worker over; no target in the issue);
* supervisor kill -9 alone, started again only once its worker's lease has run out and
  the worker has frozen → the next committed batch, counted from the start, ÷ cold start
  (the new process takes the frozen worker over and thaws it; no target in the issue);
* supervisor kill -9 (with its worker) → the next committed batch on the other
  supervisor, minus the session timeout, ÷ cold start (target ≤ 0.35 warm, ≤ 1.2 cold);
* resident memory of an idle supervisor, of a warm worker and of a running worker
  (Python + its JVM).

Before each kill the benchmark waits until the supervisor that will restart the pipeline
has a warm worker ready, as a cluster at rest would.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _paths  # noqa: F401 - testsupport/ on sys.path
from helpers import observer
from processes import process_tree_rss_kib, workers_in

from nimbus.dev.cluster import LocalCluster, wait_for
from nimbus.dev.feed import (
    WORDCOUNT,
    CommittedOutput,
    RecordFeed,
    exactly_once_report,
)
from nimbus.distribution.archive import pack_directory
from nimbus.state import runtime_view

SESSION_MS = 6000
SPARK_CONF = {"spark.ui.enabled": "false", "spark.driver.memory": "512m",
              "spark.sql.shuffle.partitions": "2"}
TRIGGER_SECS = 0.5
# Input files of FILE_RECORDS records, FILES_PER_BATCH of them per micro-batch: a
# throughput run is many batches, not one, on both sides.
FILE_RECORDS = 10_000
FILES_PER_BATCH = 3
PIPELINE_CONF = {"wordcount.trigger.secs": TRIGGER_SECS,
                 "wordcount.max.files.per.trigger": FILES_PER_BATCH}
TIMEOUT_S = 300
FROZEN = "frozen until the supervisor renews it"  # the worker's log, nimbus/worker/lease.py


def run_direct(input_dir: str, output_dir: str, checkpoint: str) -> None:
    """Child mode: the example's build() run with plain pyspark, until killed."""
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    sys.path.insert(0, str(WORDCOUNT))
    from pyspark.sql import SparkSession
    from topology import build  # the example's module

    builder = (SparkSession.builder.master("local[1]").appName("direct")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1"))
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    writer = build(spark, {"wordcount.input.dir": input_dir, "wordcount.output.dir": output_dir,
                           **PIPELINE_CONF})
    writer.option("checkpointLocation", checkpoint).start().awaitTermination()


def timed_commit(feed: RecordFeed, output: CommittedOutput, count: int,
                 since: float | None = None) -> float:
    """Feed ``count`` records (in files of FILE_RECORDS) and return the seconds from
    ``since`` (default: now) until all of them committed."""
    start = time.monotonic() if since is None else since
    ids: list[int] = []
    while len(ids) < count:
        ids += feed.feed(min(FILE_RECORDS, count - len(ids)))
    wait_for(lambda: output.holds(ids), TIMEOUT_S, f"{count} records to commit",
             interval_s=0.02)
    return time.monotonic() - start


MILESTONES = {"worker started": "nimbus.worker: worker pid",
              "warm worker taken": "taken after",
              "SparkSession starting": "starting SparkSession",
              "query started": "started query"}


def milestones(worker_log: Path, since_wall: float) -> list[tuple[str, float]]:
    """(milestone, wall time) of a worker's start, from its log lines after ``since_wall``."""
    import datetime

    found: dict[str, float] = {}
    for line in worker_log.read_text(errors="replace").splitlines():
        try:
            at = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
        for what, marker in MILESTONES.items():
            if at >= since_wall and marker in line and what not in found:
                found[what] = at
    return sorted(found.items(), key=lambda kv: kv[1])


def throughput(feed: RecordFeed, output: CommittedOutput, records: int, trials: int) -> float:
    """The median records per second of ``trials`` runs of ``records`` records each."""
    rates = sorted(records / timed_commit(feed, output, records) for _ in range(trials))
    return rates[len(rates) // 2]


def measure_direct(work: Path, records: int, trials: int) -> tuple[float, float, float]:
    """(cold start s, records per second, restart s) of the pipeline without nimbus-ha.

    The restart is the same process killed with SIGKILL after the throughput run and
    started again at once on its checkpoint: what a crash costs with no one in between.
    """
    feed, output = RecordFeed(work / "direct-in"), CommittedOutput(work / "direct-out")

    def spawn() -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, __file__, "--direct", str(feed.input_dir),
             str(output.output_dir), str(work / "direct-ckpt")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    waiting = feed.feed(10)
    started = time.monotonic()
    child = spawn()
    try:
        wait_for(lambda: output.holds(waiting), TIMEOUT_S, "the direct run's first commit",
                 interval_s=0.02)
        cold = time.monotonic() - started
        rate = throughput(feed, output, records, trials)
        t0 = time.monotonic()
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        child = spawn()
        restart = timed_commit(feed, output, 1, since=t0)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    return cold, rate, restart


class Runtime:
    def __init__(self, cluster: LocalCluster, work: Path):
        self.cluster = cluster
        self.state = observer(cluster)
        self.feed = RecordFeed(work / "in")
        self.output = CommittedOutput(work / "out")
        self.topology_id = cluster.client().submit("wordcount", pack_directory(WORDCOUNT), {
            "topology.min.replication.count": 2,
            "wordcount.input.dir": str(self.feed.input_dir),
            "wordcount.output.dir": str(self.output.output_dir), **PIPELINE_CONF})

    def worker(self) -> tuple[str, int, int]:
        """(supervisor id, port, worker pid) once exactly one worker runs."""
        def one() -> tuple[str, int, int] | None:
            assignment = self.state.assignment_info(self.topology_id)
            slot = assignment and assignment.executor_node_port.get("worker-0")
            if not slot:
                return None
            worker_dir = self.supervisor(slot[0]).worker_dir(self.topology_id, int(slot[1]))
            pids = workers_in(worker_dir)
            return (slot[0], int(slot[1]), pids[0]) if len(pids) == 1 else None

        return wait_for(one, TIMEOUT_S, "one running worker")

    def supervisor(self, supervisor_id: str):
        return next(s for s in self.cluster.supervisors if s.id == supervisor_id)

    def wait_warm(self, supervisor_id: str, count: int) -> None:
        """Until the supervisor's heartbeat shows ``count`` warm workers ready."""
        if count:
            wait_for(lambda: (i := self.state.supervisor_info(supervisor_id)) is not None
                     and i.warm_ready >= count, TIMEOUT_S, "a warm worker to be ready",
                     interval_s=0.2)

    def warm_mb(self, supervisor_id: str) -> float:
        info = self.state.supervisor_info(supervisor_id)
        return info.warm_memory_bytes / 2**20 if info else 0.0

    def restarts(self) -> int:
        return runtime_view.topology_info(self.state, self.topology_id)["workers"][0]["restarts"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=300_000,
                        help="records per throughput trial")
    parser.add_argument("--trials", type=int, default=3,
                        help="throughput trials per side (the median is reported)")
    parser.add_argument("--leader-kills", type=int, default=5)
    parser.add_argument("--warm-workers", type=int, default=1,
                        help="supervisor.warm.workers of both supervisors (0: cold starts)")
    parser.add_argument("--direct", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.direct:
        run_direct(*args.direct)
        return
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    with tempfile.TemporaryDirectory(prefix="bench-runtime-") as tmp:
        work = Path(tmp)
        cluster = LocalCluster(work / "cluster", nimbuses=2, supervisors=2,
                               slots_per_supervisor=1, warm_workers=args.warm_workers, conf={
                                   "storm.zookeeper.session.timeout": SESSION_MS,
                                   "nimbus.monitor.freq.secs": 1,
                                   "supervisor.monitor.frequency.secs": 1,
                                   "supervisor.heartbeat.frequency.secs": 1,
                                   "topology.spark.master": "local[1]",
                                   "topology.spark.conf": SPARK_CONF,
                                   "topology.spark.checkpoint.dir": str(work / "ckpt")})
        with cluster:
            if args.warm_workers:
                # A warm worker starting takes a core: the baseline waits for them all.
                state = observer(cluster)
                wait_for(lambda: all((i := state.supervisor_info(s.id)) is not None
                                     and i.warm_ready >= args.warm_workers
                                     for s in cluster.supervisors), TIMEOUT_S,
                         "every supervisor's warm workers", interval_s=0.5)
                state.zk.stop()
            # The baseline runs beside the same idle daemons, so both sides share the load.
            cold, direct_rate, direct_restart = measure_direct(work, args.records, args.trials)
            print(f"baseline: cold start {cold:.2f}s; direct throughput "
                  f"{direct_rate:,.0f} rec/s; direct restart {direct_restart:.2f}s")
            runtime = Runtime(cluster, work)
            timed_commit(runtime.feed, runtime.output, 10)  # running, first batch done
            sid, _, pid = runtime.worker()
            idle = next(s for s in cluster.supervisors if s.id != sid)
            # The worker may have taken a warm one, replaced once it committed: measured
            # at rest, with that replacement's JVM start over.
            for supervisor in cluster.supervisors:
                runtime.wait_warm(supervisor.id, args.warm_workers)
            warm_rss = runtime.warm_mb(idle.id)
            # The supervisor's process tree holds its warm workers too.
            idle_rss = process_tree_rss_kib(idle.process.pid) / 1024 - warm_rss
            worker_rss = process_tree_rss_kib(pid) / 1024
            rate = throughput(runtime.feed, runtime.output, args.records, args.trials)

            sid, port, pid = runtime.worker()
            runtime.wait_warm(sid, args.warm_workers)
            t0, wall0 = time.monotonic(), time.time()
            os.killpg(pid, signal.SIGKILL)
            worker_crash = timed_commit(runtime.feed, runtime.output, 1, since=t0)
            log = runtime.supervisor(sid).worker_log(runtime.topology_id, port)
            print("worker crash, seconds after the kill: " + ", ".join(
                f"{what} {at - wall0:.2f}" for what, at in milestones(log, wall0))
                + f", committed {worker_crash:.2f}")

            sid, port, pid = runtime.worker()
            restarts_before = runtime.restarts()
            for _ in range(args.leader_kills):
                leader = cluster.wait_for_leader()
                leader.kill9()
                cluster.wait_for_leader(exclude=leader.address)
                timed_commit(runtime.feed, runtime.output, 100)
                leader.start()
            after = runtime.worker()
            restarts = (runtime.restarts() - restarts_before) + (after != (sid, port, pid))

            # ZooKeeper down for longer than a lease: the worker freezes, and the first
            # renewal once the server is back thaws it.
            sid, port, pid = after
            log = runtime.supervisor(sid).worker_log(runtime.topology_id, port)
            frozen_before = log.read_text().count(FROZEN)
            cluster.zk.kill9()
            wait_for(lambda: log.read_text().count(FROZEN) > frozen_before, TIMEOUT_S,
                     "the worker to freeze", interval_s=0.1)
            pending = runtime.feed.feed(1)
            cluster.zk.start()  # returns once it serves: counted from there
            t0 = time.monotonic()
            wait_for(lambda: runtime.output.holds(pending), TIMEOUT_S,
                     "the record fed while ZooKeeper was down", interval_s=0.02)
            outage = time.monotonic() - t0
            thawed = runtime.worker() == (sid, port, pid)

            # The supervisor alone, killed and started again at once: it takes the
            # running worker over (docs/runtime.md, "A supervisor started again").
            sid, port, pid = runtime.worker()
            supervisor = runtime.supervisor(sid)
            t0 = time.monotonic()
            supervisor.kill9_group()
            cluster.start_supervisor(supervisor)
            supervisor_restart = timed_commit(runtime.feed, runtime.output, 1, since=t0)
            taken_over = runtime.worker() == (sid, port, pid)

            # Killed again, and started only once its worker froze at the lease's end: the
            # new process takes the frozen worker over and thaws it.
            sid, port, pid = runtime.worker()
            supervisor = runtime.supervisor(sid)
            log = supervisor.worker_log(runtime.topology_id, port)
            frozen_before = log.read_text().count(FROZEN)
            supervisor.kill9_group()
            wait_for(lambda: log.read_text().count(FROZEN) > frozen_before, TIMEOUT_S,
                     "the orphaned worker to freeze", interval_s=0.1)
            t0 = time.monotonic()
            cluster.start_supervisor(supervisor)
            late_restart = timed_commit(runtime.feed, runtime.output, 1, since=t0)
            late_taken_over = runtime.worker() == (sid, port, pid)

            sid, port, pid = runtime.worker()
            supervisor = runtime.supervisor(sid)
            runtime.wait_warm(next(s.id for s in cluster.supervisors if s.id != sid),
                              args.warm_workers)
            t0 = time.monotonic()
            supervisor.kill9_group()
            os.killpg(pid, signal.SIGKILL)
            supervisor_crash = timed_commit(runtime.feed, runtime.output, 1, since=t0)
            moved_to = runtime.worker()[0]
            report = exactly_once_report(runtime.feed.fed, runtime.output.ids())
            runtime.state.zk.stop()

    session_s = SESSION_MS / 1000
    figures = {
        "cold_start_s": round(cold, 2),
        "direct_records_per_s": round(direct_rate),
        "nimbus_ha_records_per_s": round(rate),
        "throughput_ratio": round(rate / direct_rate, 3),
        "worker_crash_to_commit_s": round(worker_crash, 2),
        "worker_crash_ratio": round(worker_crash / cold, 3),
        "direct_restart_s": round(direct_restart, 2),
        "worker_crash_vs_direct_restart": round(worker_crash / direct_restart, 3),
        "leader_kills": args.leader_kills,
        "worker_restarts_during_leader_kills": restarts,
        "zookeeper_back_to_commit_s": round(outage, 2),
        "zookeeper_back_ratio": round(outage / cold, 3),
        "zookeeper_outage_thawed_the_worker": thawed,
        "supervisor_restart_to_commit_s": round(supervisor_restart, 2),
        "supervisor_restart_ratio": round(supervisor_restart / cold, 3),
        "supervisor_restart_took_over_the_worker": taken_over,
        "supervisor_late_restart_to_commit_s": round(late_restart, 2),
        "supervisor_late_restart_ratio": round(late_restart / cold, 3),
        "supervisor_late_restart_thawed_the_worker": late_taken_over,
        "supervisor_crash_to_commit_s": round(supervisor_crash, 2),
        "supervisor_crash_ratio": round(supervisor_crash / (session_s + cold), 3),
        "supervisor_crash_beyond_session_ratio": round((supervisor_crash - session_s) / cold,
                                                       3),
        "supervisor_crash_vs_session_plus_direct_restart": round(
            supervisor_crash / (session_s + direct_restart), 3),
        "moved_to_other_supervisor": moved_to != sid,
        "records_fed": len(runtime.feed.fed),
        "records_lost": len(report["lost"]),
        "records_duplicated": len(report["duplicated"]),
        "idle_supervisor_rss_mb": round(idle_rss, 1),
        "worker_rss_mb": round(worker_rss, 1),
        "warm_workers": args.warm_workers,
        "warm_worker_rss_mb": round(warm_rss, 1),
    }
    target = 0.35 if args.warm_workers else 1.2
    print(f"throughput under nimbus-ha: {rate:,.0f} rec/s = {figures['throughput_ratio']} "
          f"x direct (target >= 0.95)")
    print(f"worker kill -9 -> next commit: {worker_crash:.2f}s = "
          f"{figures['worker_crash_ratio']} x cold start (target <= {target}), "
          f"{figures['worker_crash_vs_direct_restart']} x the same crash and restart "
          f"without nimbus-ha")
    print(f"{args.leader_kills} leader kill -9s: {restarts} worker restarts (target 0)")
    print(f"ZooKeeper down past the lease, started again -> next commit: {outage:.2f}s = "
          f"{figures['zookeeper_back_ratio']} x cold start "
          f"({'the same worker, thawed' if thawed else 'a NEW worker'})")
    print(f"supervisor kill -9, started again at once -> next commit: "
          f"{supervisor_restart:.2f}s = {figures['supervisor_restart_ratio']} x cold start "
          f"({'the same worker, taken over' if taken_over else 'a NEW worker'})")
    print(f"supervisor kill -9, started again after its worker froze -> next commit: "
          f"{late_restart:.2f}s = {figures['supervisor_late_restart_ratio']} x cold start "
          f"({'the same worker, thawed' if late_taken_over else 'a NEW worker'})")
    print(f"supervisor kill -9 -> next commit elsewhere: {supervisor_crash:.2f}s = session "
          f"{session_s:.0f}s + {figures['supervisor_crash_beyond_session_ratio']} x cold start "
          f"(target <= {target}); {figures['supervisor_crash_ratio']} x (session + cold "
          f"start), {figures['supervisor_crash_vs_session_plus_direct_restart']} x "
          f"(session + the same restart without nimbus-ha)")
    print(f"records: {figures['records_fed']} fed, {figures['records_lost']} lost, "
          f"{figures['records_duplicated']} duplicated")
    print(f"RSS: idle supervisor {idle_rss:.1f} MB (target < 60); worker {worker_rss:.1f} MB "
          f"(Python + Spark JVM); {args.warm_workers} warm worker(s) waiting "
          f"{warm_rss:.1f} MB")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
