"""Chaos soak: random faults against a whole cluster running exactly-once pipelines.

    .venv/bin/python integration/soak.py --faults 200 --seed 1 [--pipelines 4]

The cluster: a 3-server ZooKeeper ensemble on loopback, each server behind a delay
proxy (nimbus-ha's processes connect through the proxies; the soak's own observer does
not), 3 nimbus processes with the audit trail of leader writes on, 3 supervisors with two
slots each, and ``--pipelines`` word-count pipelines (examples/wordcount, Spark local[1])
fed numbered records continuously.

Faults are drawn with ``random.Random(seed)``, one at a time, each followed by its
repair, with a random pause between them: kill -9, SIGSTOP/SIGCONT and a wiped
``storm.local.dir`` of nimbuses; kill -9 and SIGSTOP/SIGCONT of supervisors and workers;
one ZooKeeper server killed and restarted; the quorum lost (two servers killed) for longer
than the session timeout, then restored; network delay on every ZooKeeper connection.
The same seed gives the same faults in the same order (timing still varies).

Then every process is brought back, feeding stops, and the soak waits until every
pipeline committed every record. It reports:

* topologies lost (submitted, but not ACTIVE in the cluster at the end);
* records lost, duplicated or unexpected in any pipeline's committed output;
* leader writes by a deposed leader (the audit trail, nimbus.state.leader_audit);
* moments with two leaders, from every nimbus's own log of when it led (a nimbus frozen
  by SIGSTOP executes nothing, so its leadership is cut at the freeze; the time it still
  claimed after SIGCONT, before it noticed, is reported separately);
* the longest time without a leader and the longest time without progress per pipeline,
  as ratios to the session timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from helpers import leadership_events
from kazoo.client import KazooClient

from nimbus.devcluster import LocalCluster, NimbusProcess, wait_for
from nimbus.distribution.archive import pack_directory
from nimbus.state.leader_audit import deposed_writes, read_trail
from nimbus.state.zkserver import ZooKeeperEnsemble
from nimbus.testing.pipelines import (
    WORDCOUNT,
    WORKER_MODULE,
    CommittedOutput,
    RecordFeed,
    exactly_once_report,
    processes_with_arg,
)
from nimbus.testing.tcp_proxy import DelayProxy

SESSION_MS = 6000
SPARK_CONF = {"spark.ui.enabled": "false", "spark.driver.memory": "512m",
              "spark.sql.shuffle.partitions": "1"}
FEED_EVERY_S = 1.0
FEED_RECORDS = 5
SAMPLE_EVERY_S = 0.5
DRAIN_TIMEOUT_S = 600.0
FAULTS = {  # kind -> weight
    "nimbus_kill9": 3, "nimbus_stop": 2, "nimbus_wipe": 2,
    "supervisor_kill9": 3, "supervisor_stop": 2,
    "worker_kill9": 3, "worker_stop": 2,
    "zk_server_kill": 2, "zk_quorum_loss": 1, "zk_delay": 2,
}


@dataclass
class Pipeline:
    name: str
    feed: RecordFeed
    output: CommittedOutput
    topology_id: str = ""
    committed: int = 0
    last_progress: float = field(default_factory=time.time)
    longest_stall_s: float = 0.0
    longest_stall_since: float = 0.0  # when that stall began (wall clock)
    # CommittedOutput caches what it parsed: one reader at a time.
    lock: threading.Lock = field(default_factory=threading.Lock)

    def committed_ids(self) -> Any:
        with self.lock:
            return self.output.ids()

    def holds(self, ids: list[int]) -> bool:
        with self.lock:
            return self.output.holds(ids)


@dataclass
class Freeze:
    """A SIGSTOP of a nimbus: from ``stopped`` to ``resumed`` (wall clock)."""

    index: int
    stopped: float
    resumed: float = 0.0


class Soak:
    """One soak run; see the module docstring."""

    def __init__(self, work: Path, seed: int, pipelines: int = 4, log=print):
        self.work = Path(work)
        self.rng = random.Random(seed)
        self.seed = seed
        self.log = log
        self.session_s = SESSION_MS / 1000
        self.ensemble = ZooKeeperEnsemble(self.work / "zookeeper", size=3)
        self.proxies: list[DelayProxy] = []
        self.cluster: LocalCluster | None = None
        self.pipelines = [Pipeline(f"pipe{i}", RecordFeed(self.work / f"pipe{i}" / "input"),
                                   CommittedOutput(self.work / f"pipe{i}" / "output"))
                          for i in range(pipelines)]
        self.events: list[tuple[float, str]] = []  # (wall clock, what the soak did)
        self.kills: dict[int, list[float]] = {}     # nimbus index -> kill -9 times
        self.freezes: list[Freeze] = []
        self.fault_counts: dict[str, int] = {}
        self._stop = threading.Event()
        self._feeding = threading.Event()
        self._threads: list[threading.Thread] = []
        self.observer: KazooClient | None = None

    # -- set-up and tear-down ----------------------------------------------------------------
    def start(self) -> None:
        self.ensemble.start()
        self.proxies = [DelayProxy(server.port).start() for server in self.ensemble.servers]
        self.cluster = LocalCluster(
            self.work / "cluster", nimbuses=3, supervisors=3, slots_per_supervisor=2,
            zk_servers=[p.address for p in self.proxies],
            conf={"storm.zookeeper.session.timeout": SESSION_MS,
                  "nimbus.audit.leader.writes": True,
                  "nimbus.monitor.freq.secs": 1,
                  "supervisor.monitor.frequency.secs": 1,
                  "supervisor.heartbeat.frequency.secs": 1,
                  "topology.spark.master": "local[1]",
                  "topology.spark.conf": SPARK_CONF,
                  "topology.spark.checkpoint.dir": str(self.work / "checkpoints")})
        self.cluster.start()
        self.observer = KazooClient(hosts=self.ensemble.hosts, timeout=10)
        self.observer.start(timeout=30)
        client = self.cluster.client(deadline_s=120)
        for pipe in self.pipelines:
            pipe.topology_id = client.submit(pipe.name, pack_directory(WORDCOUNT), {
                "topology.min.replication.count": 2,
                "wordcount.input.dir": str(pipe.feed.input_dir),
                "wordcount.output.dir": str(pipe.output.output_dir),
                "wordcount.trigger.secs": 1})
        self.note("submitted " + ", ".join(p.topology_id for p in self.pipelines))
        for pipe in self.pipelines:
            pipe.feed.feed(FEED_RECORDS)
        self._feeding.set()
        for target, name in ((self._feed_loop, "soak-feed"), (self._sample_loop, "soak-sample")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        # Every pipeline running and committing before the first fault; progress is
        # measured from here (a pipeline's first Spark start is not a fault's doing).
        self.wait_all_committed(DRAIN_TIMEOUT_S, "the first records")
        now = time.time()
        for pipe in self.pipelines:
            with pipe.lock:
                pipe.last_progress, pipe.longest_stall_s = now, 0.0
        self.note("every pipeline commits: faults begin")

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)
        if self.observer is not None:
            self.observer.stop()
            self.observer.close()
        if self.cluster is not None:
            self.cluster.stop()
        for proxy in self.proxies:
            proxy.stop()
        self.ensemble.stop()

    def note(self, what: str) -> None:
        self.events.append((time.time(), what))
        self.log(f"{datetime.now():%H:%M:%S} {what}")

    # -- background: feeding and progress ---------------------------------------------------
    def _feed_loop(self) -> None:
        while not self._stop.wait(FEED_EVERY_S):
            if self._feeding.is_set():
                for pipe in self.pipelines:
                    pipe.feed.feed(FEED_RECORDS)

    def _sample_loop(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY_S):
            now = time.time()
            for pipe in self.pipelines:
                with pipe.lock:
                    committed = sum(pipe.output.ids().values())
                    # Progress: more committed, or nothing left to commit.
                    if committed > pipe.committed or committed >= len(pipe.feed.fed):
                        pipe.committed = committed
                        pipe.last_progress = now
                    if now - pipe.last_progress > pipe.longest_stall_s:
                        pipe.longest_stall_s = now - pipe.last_progress
                        pipe.longest_stall_since = pipe.last_progress

    def wait_all_committed(self, timeout_s: float, what: str) -> None:
        targets = {p.name: list(p.feed.fed) for p in self.pipelines}
        wait_for(lambda: all(p.holds(targets[p.name]) for p in self.pipelines),
                 timeout_s, f"every pipeline to commit {what}")

    # -- faults --------------------------------------------------------------------------------
    def run_faults(self, count: int) -> None:
        kinds, weights = list(FAULTS), list(FAULTS.values())
        for number in range(1, count + 1):
            kind = self.rng.choices(kinds, weights)[0]
            self.fault_counts[kind] = self.fault_counts.get(kind, 0) + 1
            self.note(f"fault {number}/{count}: {kind}")
            getattr(self, kind)()
            self.pause(1.0, 4.0)

    def pause(self, low: float, high: float) -> None:
        self._stop.wait(self.rng.uniform(low, high))

    def _nimbus(self) -> NimbusProcess:
        return self.rng.choice(self.cluster.nimbuses)

    def nimbus_kill9(self, wipe: bool = False) -> None:
        nimbus = self._nimbus()
        nimbus.kill9()
        self.kills.setdefault(nimbus.index, []).append(time.time())
        if wipe:
            nimbus.wipe()
        self.note(f"  nimbus {nimbus.index} killed{' and wiped' if wipe else ''}")
        self.pause(0.5, 3.0)
        nimbus.start()

    def nimbus_wipe(self) -> None:
        self.nimbus_kill9(wipe=True)

    def nimbus_stop(self) -> None:
        nimbus = self._nimbus()
        freeze = Freeze(nimbus.index, time.time())
        nimbus.signal(signal.SIGSTOP)
        self.freezes.append(freeze)
        self.pause(0.5 * self.session_s, 1.5 * self.session_s)
        freeze.resumed = time.time()
        nimbus.signal(signal.SIGCONT)
        self.note(f"  nimbus {nimbus.index} frozen {freeze.resumed - freeze.stopped:.1f}s")

    def supervisor_kill9(self) -> None:
        supervisor = self.rng.choice(self.cluster.supervisors)
        supervisor.kill9_group()
        self.pause(0.5, 3.0)
        supervisor.start()
        self.note(f"  supervisor {supervisor.index} killed and restarted")

    def supervisor_stop(self) -> None:
        supervisor = self.rng.choice(self.cluster.supervisors)
        supervisor.signal(signal.SIGSTOP)
        self.pause(0.5 * self.session_s, 1.5 * self.session_s)
        supervisor.signal(signal.SIGCONT)
        self.note(f"  supervisor {supervisor.index} frozen and thawed")

    def _worker(self) -> int | None:
        pids = processes_with_arg(WORKER_MODULE)
        return self.rng.choice(pids) if pids else None

    def worker_kill9(self) -> None:
        pid = self._worker()
        if pid is None:
            self.note("  no worker running")
            return
        try:
            os.killpg(pid, signal.SIGKILL)  # the worker and its Spark JVM
        except ProcessLookupError:
            pass
        self.note(f"  worker {pid} killed")

    def worker_stop(self) -> None:
        pid = self._worker()
        if pid is None:
            self.note("  no worker running")
            return
        try:
            os.killpg(pid, signal.SIGSTOP)
            self.pause(1.0, self.session_s)
            os.killpg(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        self.note(f"  worker {pid} frozen and thawed")

    def zk_server_kill(self) -> None:
        server = self.rng.choice(self.ensemble.servers)
        server.kill9()
        self.pause(2.0, 8.0)
        server.start_process()
        self.note(f"  ZooKeeper server {server.server_id} killed and restarted")

    def zk_quorum_loss(self) -> None:
        doomed = self.rng.sample(self.ensemble.servers, 2)
        for server in doomed:
            server.kill9()
        self.note(f"  quorum lost (servers {[s.server_id for s in doomed]})")
        self._stop.wait(self.session_s * self.rng.uniform(1.2, 2.0))
        for server in doomed:
            server.start_process()
        for server in self.ensemble.servers:
            server.wait_serving(60)
        self.note("  quorum restored")

    def zk_delay(self) -> None:
        delay = self.rng.uniform(0.1, 0.25 * self.session_s)
        for proxy in self.proxies:
            proxy.delay_s = delay
        self.pause(3.0, 8.0)
        for proxy in self.proxies:
            proxy.delay_s = 0.0
        self.note(f"  ZooKeeper traffic delayed {delay:.2f}s each way")

    # -- the end ---------------------------------------------------------------------------------
    def settle(self) -> None:
        """Every process back, feeding stopped, every record committed."""
        for server in self.ensemble.servers:
            if not server.alive:
                server.start_process()
        for server in self.ensemble.servers:
            server.wait_serving(60)
        for process in [*self.cluster.nimbuses, *self.cluster.supervisors]:
            process.signal(signal.SIGCONT)
            if not process.alive():
                process.start()
        self._feeding.clear()
        self.note("feeding stopped; waiting for every record to commit")
        self.wait_all_committed(DRAIN_TIMEOUT_S, "every record fed")

    def report(self) -> dict[str, Any]:
        client = self.cluster.client(deadline_s=60)
        live = {t.id: t.status for t in client.cluster_info().topologies}
        records = {}
        for pipe in self.pipelines:
            check = exactly_once_report(pipe.feed.fed, pipe.committed_ids())
            records[pipe.name] = {"fed": len(pipe.feed.fed), "lost": len(check["lost"]),
                                  "duplicated": len(check["duplicated"]),
                                  "unexpected": len(check["unexpected"])}
        trail = read_trail(self.observer, "/storm")
        leadership = leadership_report(self.cluster.nimbuses, self.kills, self.freezes,
                                       self.events[0][0], time.time())
        return {
            "seed": self.seed,
            "faults": sum(self.fault_counts.values()),
            "fault_counts": dict(sorted(self.fault_counts.items())),
            "session_timeout_s": self.session_s,
            "topologies_submitted": len(self.pipelines),
            "topologies_lost": sum(1 for p in self.pipelines
                                   if live.get(p.topology_id) != "ACTIVE"),
            "records": records,
            "leader_writes_audited": len(trail),
            "leader_writes_by_deposed_leaders": len(deposed_writes(trail)),
            **leadership,
            "longest_no_leader_ratio": round(leadership["longest_no_leader_s"] / self.session_s,
                                             2),
            "longest_no_progress_s": {p.name: round(p.longest_stall_s, 1)
                                      for p in self.pipelines},
            "longest_no_progress_from": {
                p.name: f"{datetime.fromtimestamp(p.longest_stall_since):%H:%M:%S}"
                for p in self.pipelines},
            "longest_no_progress_ratio": round(max(p.longest_stall_s for p in self.pipelines)
                                               / self.session_s, 2),
        }


# -- leadership from the nimbuses' own logs -------------------------------------------------------
def leadership_report(nimbuses: list[NimbusProcess], kills: dict[int, list[float]],
                      freezes: list[Freeze], began: float, ended: float) -> dict[str, Any]:
    """Intervals in which each nimbus led, by its own log; overlaps and gaps.

    A leadership ends at the nimbus's "lost leadership" line, at a kill -9, or at a
    SIGSTOP (a frozen process executes nothing). What it still claimed after SIGCONT,
    before it noticed the loss, is measured as ``claimed_after_thaw_s``.
    """
    intervals: list[tuple[float, float, int]] = []
    after_thaw = 0.0
    for nimbus in nimbuses:
        ends = [(t, "kill") for t in kills.get(nimbus.index, [])]
        ends += [(f.stopped, "freeze") for f in freezes if f.index == nimbus.index]
        thaws = [f.resumed for f in freezes if f.index == nimbus.index]
        start, cut_by_freeze = None, False
        events = sorted([(t, "gain" if g else "lost") for t, g in
                         leadership_events(nimbus.log_text())] + ends)
        for stamp, kind in events:
            if kind == "gain":
                cut_by_freeze = False
                if start is None:
                    start = stamp
                continue
            if kind == "lost" and cut_by_freeze:
                # Thawed while still believing it led, until it noticed: measured apart.
                thawed = [t for t in thaws if t <= stamp]
                if thawed:
                    after_thaw = max(after_thaw, stamp - thawed[-1])
            cut_by_freeze = kind == "freeze" and start is not None
            if start is not None:
                intervals.append((start, stamp, nimbus.index))
                start = None
        if start is not None:
            intervals.append((start, ended, nimbus.index))
    intervals.sort()
    overlaps = []
    for i, (_start, end, who) in enumerate(intervals):
        for other_start, other_end, other in intervals[i + 1:]:
            if other_start >= end:
                break
            if other != who:
                overlaps.append(round(min(end, other_end) - other_start, 3))
    longest_gap, covered = 0.0, began
    for start, end, _ in intervals:
        if start > covered:
            longest_gap = max(longest_gap, start - covered)
        covered = max(covered, end)
    longest_gap = max(longest_gap, ended - covered)
    return {"leaderships": len(intervals), "two_leaders_at_once": len(overlaps),
            "overlap_s": overlaps, "claimed_after_thaw_s": round(after_thaw, 3),
            "longest_no_leader_s": round(longest_gap, 2)}


def run(work: Path, faults: int, seed: int, pipelines: int = 4, log=print) -> dict[str, Any]:
    """Run a soak in ``work``; returns its report (see the module docstring)."""
    soak = Soak(work, seed, pipelines, log=log)
    try:
        soak.start()
        soak.run_faults(faults)
        soak.settle()
        return soak.report()
    finally:
        soak.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pipelines", type=int, default=4)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="nimbus-soak-"))
    started = time.monotonic()
    try:
        report = run(work, args.faults, args.seed, args.pipelines)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    report["wall_time_s"] = round(time.monotonic() - started)
    print(json.dumps(report, indent=2))
    bad = (report["topologies_lost"] or report["leader_writes_by_deposed_leaders"]
           or report["two_leaders_at_once"]
           or any(r["lost"] or r["duplicated"] or r["unexpected"]
                  for r in report["records"].values()))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
