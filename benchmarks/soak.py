"""Chaos soak: random faults against a whole cluster running exactly-once pipelines.

    .venv/bin/python benchmarks/soak.py --faults 200 --seed 1 [--pipelines 4]
        [--spacing LOW:HIGH] [--warm-workers N] [--no-class-archive]

The cluster: a 3-server ZooKeeper ensemble on loopback, each server behind a delay
proxy (nimbus-ha's processes connect through the proxies; the soak's own observer does
not), 3 nimbus processes with the audit trail of leader writes on, 3 supervisors with two
slots each, and ``--pipelines`` word-count pipelines (examples/wordcount, Spark local[1])
fed numbered records continuously.

Faults are drawn with ``random.Random(seed)``, one at a time, each followed by its
repair, with a random pause of 1-4 s between them: kill -9, SIGSTOP/SIGCONT and a wiped
``storm.local.dir`` of nimbuses; kill -9 and SIGSTOP/SIGCONT of supervisors and workers;
one ZooKeeper server killed and restarted; the quorum lost (two servers killed) for longer
than the session timeout, then restored; network delay on every ZooKeeper connection.
The same seed gives the same faults in the same order (timing still varies). Worker
faults touch this cluster's workers only, told from other clusters' on the same machine
by their command line or working directory, under the soak's work directory.

Then every process is brought back, feeding stops, and the soak waits until every
pipeline committed every record. It reports:

* topologies lost (submitted, but not ACTIVE in the cluster at the end);
* records lost, duplicated or unexpected in any pipeline's committed output;
* leader writes by a deposed leader (the audit trail, nimbus.state.leader_audit);
* moments with two leaders, from every nimbus's own log of when it led (a nimbus frozen
  by SIGSTOP executes nothing, so its leadership is cut at the freeze; the time it still
  claimed after SIGCONT, before it noticed, is reported separately; one frozen for less
  than its lease never lost it, and leads again from the thaw: see leadership_report);
* the longest time without a leader and the longest time without progress per pipeline,
  as ratios to the session timeout.

The figures:

* **time without progress** (a pipeline's **stall**): a time in which the pipeline had
  records fed but not yet committed and committed none. It runs from the pipeline's last
  commit, or from the moment it had committed everything fed to it (or from just before
  the first fault), to its next commit; so a stall caused by a fault runs from the last
  commit before the fault (a batch a second: about a second before it) to the first
  commit after it. A commit is seen as a rise in the records in the sink's commit log,
  polled every 0.5 s (the resolution of the figure). Measured from just before the first
  fault until the end, the drain included; the report names when each pipeline's longest
  stall began and the faults that may have caused it: the last one begun before it and
  those begun during it (``longest_no_progress_faults``).
* **time without a leader**: a time in which no nimbus led, by the nimbuses' own logs
  (above), from the pipelines' submission until the end.

**Spaced faults.** ``--spacing LOW:HIGH`` (seconds: ``--spacing 30:60``) makes the pause
after each fault's repair a uniform draw from [LOW, HIGH] instead of [1, 4], from the
same generator, so a seed draws the same faults in either mode.

**The supervisors' settings** are the product's defaults, not a local cluster's (which
saves a small machine the JVMs): ``supervisor.warm.workers`` = 1 (``--warm-workers N``)
and ``supervisor.spark.class.archive`` = true (``--no-class-archive``). With warm workers,
each supervisor builds its class archive before the pipelines are submitted, as a host
would have long before (a supervisor restarted by a fault finds it in place); without,
each builds it when a pipeline first starts there.

Before the first fault, the spaced mode measures the **warm restart** once, on the quiet
cluster: every pipeline committing, and for 10 s no worker process started or ended and
no supervisor of pipe0 reported a warm worker still starting (``topology-info``; at most
120 s of waiting). Then pipe0's worker (and its Spark JVM) is killed with kill -9; the
warm restart is the time from the kill to pipe0's next committed batch, whatever the
supervisor does in between. The report says how many warm workers were ready before the
kill and whether the new worker started warm (``warm_restart_ready_before``,
``warm_restart_started_warm``; null where ``topology-info`` does not say). The first
fault comes HIGH seconds after that commit. Every pipeline's longest stall is then
checked against 2 × (session timeout + warm restart) (``stall_bound_s``).

**Verdict.** After the JSON report comes the verdict, one line per figure with PASS or
FAIL (``benchmarks/soak_verdict.py``). Guarantees: 0 topologies lost, 0 records lost,
duplicated or unexpected, 0 leader writes by a deposed leader, never two leaders at once.
Targets: the longest time without progress (the worst pipeline's) ≤ 15 × the session
timeout; the longest time without a leader ≤ 3 ×; with ``--spacing``, each pipeline's
longest stall ≤ 2 × (session timeout + warm restart). The exit status is 1 if a guarantee
failed, else 3 if a target was missed (the run held its guarantees but was slower than
asked: a caller can gate on correctness alone by treating 3 as success), else 0.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import _paths  # noqa: F401 - testsupport/ on sys.path
from helpers import leadership_events
from kazoo.client import KazooClient
from soak_verdict import STALL_BOUND_FACTOR, exit_status, judge, render, summary
from tcp_proxy import DelayProxy

from nimbus.dev.cluster import LocalCluster, NimbusProcess, wait_for
from nimbus.dev.feed import (
    WORDCOUNT,
    WORKER_MODULE,
    CommittedOutput,
    RecordFeed,
    exactly_once_report,
    processes_with_arg,
)
from nimbus.dev.zookeeper import ZooKeeperEnsemble
from nimbus.distribution.archive import pack_directory
from nimbus.master.leader_lease import FRACTION as LEASE_FRACTION
from nimbus.state import runtime_view
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.leader_audit import deposed_writes, read_trail

SESSION_MS = 6000
SPARK_CONF = {"spark.ui.enabled": "false", "spark.driver.memory": "512m",
              "spark.sql.shuffle.partitions": "1"}
FEED_EVERY_S = 1.0
FEED_RECORDS = 5
SAMPLE_EVERY_S = 0.5
DRAIN_TIMEOUT_S = 600.0
# Before the warm-restart baseline: how long no worker process may start or end, and the
# most to wait for that (supervisors that keep warm workers get to make them ready).
QUIET_S = 10.0
QUIET_TIMEOUT_S = 120.0
DEFAULT_PAUSE_S = (1.0, 4.0)  # between faults, without --spacing
WARM_WORKERS = 1              # supervisor.warm.workers: the product default
ARCHIVE_TIMEOUT_S = 600.0     # three supervisors building their class archives at once
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

    def __init__(self, work: Path, seed: int, pipelines: int = 4, log=print,
                 spacing: tuple[float, float] | None = None,
                 warm_workers: int = WARM_WORKERS, class_archive: bool = True,
                 pause_s: tuple[float, float] = DEFAULT_PAUSE_S):
        self.work = Path(work)
        self.spacing = spacing  # (low, high) s after each repair; None: pause_s
        self.pause_s = pause_s
        self.warm_workers = warm_workers      # supervisor.warm.workers
        self.class_archive = class_archive    # supervisor.spark.class.archive
        self.baseline: dict[str, Any] = {}  # the spaced mode's warm restart, measured
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
        self.fault_starts: list[tuple[float, str]] = []  # (wall clock, "fault n/N kind")
        self.kills: dict[int, list[float]] = {}     # nimbus index -> kill -9 times
        self.freezes: list[Freeze] = []
        self.fault_counts: dict[str, int] = {}
        self._stop = threading.Event()
        self._feeding = threading.Event()
        self._threads: list[threading.Thread] = []
        self.observer: KazooClient | None = None
        self.view: StormClusterState | None = None  # on the observer's session

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
                  "topology.spark.checkpoint.dir": str(self.work / "checkpoints"),
                  "supervisor.warm.workers": self.warm_workers,
                  "supervisor.spark.class.archive": self.class_archive})
        self.cluster.start()
        if self.class_archive and self.warm_workers:  # the warm workers ask for it
            for supervisor in self.cluster.supervisors:
                wait_for(lambda s=supervisor: "Spark class archive" in s.log_text()
                         and " in use" in s.log_text(), ARCHIVE_TIMEOUT_S,
                         f"supervisor {supervisor.index}'s class archive")
            self.note("every supervisor's class archive in use")
        self.observer = KazooClient(hosts=self.ensemble.hosts, timeout=10)
        self.observer.start(timeout=30)
        self.view = StormClusterState(self.observer, "/storm")
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
        if self.spacing is not None:
            self.measure_warm_restart()
        now = time.time()
        for pipe in self.pipelines:
            with pipe.lock:
                pipe.last_progress, pipe.longest_stall_s = now, 0.0
        self.note("every pipeline commits: faults begin")

    def measure_warm_restart(self) -> None:
        """The baseline of the spaced mode: kill -9 of pipe0's worker on the quiet
        cluster, timed to pipe0's next commit (see the module docstring)."""
        pipe = self.pipelines[0]
        self._wait_quiet(pipe.topology_id)
        pid = pipeline_worker(pipe.topology_id, workers_under(self.work))
        ready = self._warm(pipe.topology_id)[0]
        killed_workers = {worker_key(w) for w in self._workers(pipe.topology_id)}
        killed = time.time()
        kill9_tree(pid)
        # Counted after the kill: whatever committed by then was the killed worker's.
        before = self._committed(pipe)
        wait_for(lambda: self._committed(pipe) > before, DRAIN_TIMEOUT_S,
                 f"{pipe.name} to commit after its worker's kill -9", interval_s=0.1)
        restart_s = time.time() - killed
        self.baseline = {"warm_restart_pipeline": pipe.name,
                         "warm_restart_s": round(restart_s, 1),
                         "warm_restart_ready_before": ready,
                         "warm_restart_started_warm": self._started_warm(pipe.topology_id,
                                                                         killed_workers)}
        self.note(f"baseline: {pipe.name}'s worker {pid} killed, next commit after "
                  f"{restart_s:.1f}s (the warm restart; warm workers ready before: "
                  f"{ready}; the new worker started warm: "
                  f"{self.baseline['warm_restart_started_warm']})")
        # The kill is the soak's own fault: the first drawn fault gets the longest quiet
        # gap after it, as every later one does after its predecessor (a supervisor that
        # spent its warm worker on the baseline has that long to make another). Not drawn
        # from the generator, so the seed's faults are the same as without --spacing.
        self._stop.wait(self.spacing[1])

    def _wait_quiet(self, topology_id: str) -> None:
        """Until, for QUIET_S, no worker process has started or ended and no supervisor
        of ``topology_id`` has reported a warm worker still starting (at most
        QUIET_TIMEOUT_S; a cluster that never settles is measured as it is)."""
        deadline = time.monotonic() + QUIET_TIMEOUT_S
        seen, since = None, time.monotonic()
        while True:
            now = (workers_under(self.work), self._warm(topology_id)[1])
            if now != seen or now[1]:
                seen, since = now, time.monotonic()
            if time.monotonic() - since >= QUIET_S:
                return
            if time.monotonic() > deadline:
                self.note(f"  the cluster is not quiet after {QUIET_TIMEOUT_S:.0f}s: "
                          "the baseline is measured anyway")
                return
            self._stop.wait(1.0)

    def _topology_info(self, topology_id: str) -> dict[str, Any]:
        """What ``nimbus-ha topology-info`` shows of ``topology_id`` (workers from their
        beats, warm workers from their supervisors' heartbeats); {} if unreadable."""
        try:
            return runtime_view.topology_info(self.view, topology_id) or {}
        except Exception:  # the view mid-fault or unreadable: not known
            return {}

    def _workers(self, topology_id: str) -> list[dict[str, Any]]:
        return self._topology_info(topology_id).get("workers", [])

    def _warm(self, topology_id: str) -> tuple[int | None, int | None]:
        """(ready, starting) warm workers of the supervisors running ``topology_id``;
        (None, None) where topology-info does not say (no warm workers kept)."""
        warm = self._topology_info(topology_id).get("warm_workers") or {}
        if not warm:
            return None, None
        return (sum(int(w.get("ready") or 0) for w in warm.values()),
                sum(int(w.get("starting") or 0) for w in warm.values()))

    def _started_warm(self, topology_id: str, killed: set[tuple[Any, ...]]) -> bool | None:
        """Whether the worker that replaced the ``killed`` ones (:func:`worker_key`) says
        it started warm (its beat, in topology-info); None if none says within 10 s."""
        def said() -> list[bool]:
            return [bool(w["warm_start"]) for w in self._workers(topology_id)
                    if w.get("alive") and worker_key(w) not in killed
                    and "warm_start" in w]
        try:
            return any(wait_for(said, 10, f"a beat of {topology_id}'s new worker",
                                interval_s=0.2))
        except TimeoutError:
            return None

    @staticmethod
    def _committed(pipe: Pipeline) -> int:
        with pipe.lock:
            return sum(pipe.output.ids().values())

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
            self.fault_starts.append((time.time(), f"fault {number}/{count} {kind}"))
            self.note(f"fault {number}/{count}: {kind}")
            getattr(self, kind)()
            # One draw either way: a seed gives the same faults with or without spacing.
            self.pause(*(self.spacing or self.pause_s))

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
        # This cluster's workers only: the machine may run other clusters' workers.
        pids = workers_under(self.work)
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
        spaced: dict[str, Any] = {}
        if self.spacing is not None:
            spaced = {**self.baseline, "stall_bound_s": round(
                STALL_BOUND_FACTOR * (self.session_s + self.baseline["warm_restart_s"]), 1)}
        leadership = leadership_report(self.cluster.nimbuses, self.kills, self.freezes,
                                       self.events[0][0], time.time())
        no_leader_since = leadership.pop("longest_no_leader_since")
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
            "longest_no_leader_from": f"{datetime.fromtimestamp(no_leader_since):%H:%M:%S}",
            "longest_no_leader_faults": self.faults_in(
                no_leader_since, no_leader_since + leadership["longest_no_leader_s"]),
            "longest_no_progress_s": {p.name: round(p.longest_stall_s, 1)
                                      for p in self.pipelines},
            "longest_no_progress_from": {
                p.name: f"{datetime.fromtimestamp(p.longest_stall_since):%H:%M:%S}"
                for p in self.pipelines},
            "longest_no_progress_ratio": round(max(p.longest_stall_s for p in self.pipelines)
                                               / self.session_s, 2),
            "longest_no_progress_faults": {
                p.name: self.faults_in(p.longest_stall_since,
                                       p.longest_stall_since + p.longest_stall_s)
                for p in self.pipelines},
            "spacing_s": list(self.spacing) if self.spacing is not None else None,
            "warm_workers": self.warm_workers,
            "class_archive": self.class_archive,
            # What the leadership figures were computed from, with the nimbus logs.
            "nimbus_freezes": [[f.index, round(f.stopped, 3), round(f.resumed, 3)]
                               for f in self.freezes],
            "nimbus_kills": {str(i): [round(t, 3) for t in times]
                             for i, times in sorted(self.kills.items())},
            **spaced,
        }

    def faults_in(self, began: float, ended: float) -> str:
        """The faults that may have caused a stall from ``began`` to ``ended``: the last
        one begun before it (it may still have been under way) and those begun during it;
        the first two and the last of them when there are more than four."""
        before = [label for started, label in self.fault_starts if started <= began][-1:]
        labels = before + [label for started, label in self.fault_starts
                           if began < started <= ended]
        if len(labels) > 4:
            labels = [*labels[:2], f"... {len(labels) - 3} more ...", labels[-1]]
        return ", ".join(labels) or "none"


# -- leadership from the nimbuses' own logs -------------------------------------------------------
def leadership_report(nimbuses: list[NimbusProcess], kills: dict[int, list[float]],
                      freezes: list[Freeze], began: float, ended: float,
                      lease_s: float = LEASE_FRACTION * SESSION_MS / 1000) -> dict[str, Any]:
    """Intervals in which each nimbus led, by its own log; overlaps and gaps.

    A leadership ends at the nimbus's "lost leadership" line, at a kill -9, or at a
    SIGSTOP (a frozen process executes nothing). After SIGCONT it either notices that its
    lease ran out meanwhile, within moments (what it still claimed until then is measured
    as ``claimed_after_thaw_s``), or, frozen for less than its lease, it never lost it
    and leads on: a claim that lasts longer than ``lease_s`` after the thaw counts as
    leading from the thaw for the gaps (time without a leader). Overlaps (two leaders)
    are counted on the leaderships cut at the freeze, as before; those of a claim after
    a thaw with another leader are listed apart (``led_on_overlap_s``), for a reader to
    look into.
    """
    intervals: list[tuple[float, float, int]] = []
    led_on: list[tuple[float, float, int]] = []   # after a thaw, longer than a lease
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
            if kind in ("lost", "kill") and cut_by_freeze:
                thawed = [t for t in thaws if t <= stamp]
                if thawed and stamp - thawed[-1] > lease_s:
                    led_on.append((thawed[-1], stamp, nimbus.index))
                elif thawed and kind == "lost":
                    # Thawed while still believing it led, until it noticed: apart.
                    after_thaw = max(after_thaw, stamp - thawed[-1])
            cut_by_freeze = kind == "freeze" and start is not None
            if start is not None:
                intervals.append((start, stamp, nimbus.index))
                start = None
        if start is not None:
            intervals.append((start, ended, nimbus.index))
        elif cut_by_freeze and thaws and ended - thaws[-1] > lease_s:
            led_on.append((thaws[-1], ended, nimbus.index))  # to the end
    intervals.sort()
    overlaps = _overlaps(intervals)
    led_on_overlaps = sorted((Counter(_overlaps(sorted(intervals + led_on)))
                              - Counter(overlaps)).elements())
    longest_gap, gap_from, covered = 0.0, began, began
    for start, end, _ in sorted(intervals + led_on):
        if start - covered > longest_gap:
            longest_gap, gap_from = start - covered, covered
        covered = max(covered, end)
    if ended - covered > longest_gap:
        longest_gap, gap_from = ended - covered, covered
    return {"leaderships": len(intervals), "two_leaders_at_once": len(overlaps),
            "overlap_s": overlaps, "led_on_overlap_s": led_on_overlaps,
            "claimed_after_thaw_s": round(after_thaw, 3),
            "longest_no_leader_s": round(longest_gap, 2), "longest_no_leader_since": gap_from}


def _overlaps(intervals: list[tuple[float, float, int]]) -> list[float]:
    """Seconds of each overlap of two nimbuses' intervals (sorted by start)."""
    found = []
    for i, (_start, end, who) in enumerate(intervals):
        for other_start, other_end, other in intervals[i + 1:]:
            if other_start >= end:
                break
            if other != who:
                found.append(round(min(end, other_end) - other_start, 3))
    return found


def workers_under(root: Path) -> list[int]:
    """Pids of the ``nimbus.worker`` processes (warm or running a topology) whose command
    line or working directory lies under ``root``: one cluster's workers, where the
    machine may run other clusters' too."""
    # Command lines hold paths as the cluster spelled them; /proc/<pid>/cwd, the real one.
    found = set(processes_with_arg(WORKER_MODULE, str(Path(root).absolute())))
    real = str(Path(root).resolve())
    for pid in processes_with_arg(WORKER_MODULE):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/cwd").startswith(real):
                found.add(pid)
    return sorted(found)


def worker_key(worker: dict[str, Any]) -> tuple[Any, ...]:
    """A worker of topology-info told from its successor: a restart in the same slot
    counts one more restart; a move changes the slot (and starts counting afresh)."""
    return worker.get("supervisor_id"), worker.get("port"), worker.get("restarts")


def pipeline_worker(topology_id: str, workers: list[int]) -> int:
    """The pid among ``workers`` of the worker process running ``topology_id``, seen from
    outside: the one whose process tree (the worker, its Spark JVM) names the topology in
    a command line, a working directory or an open file. A cold worker runs in the slot's
    directory ``<topology id>-<port>``; a warm one that took the slot writes its log in
    ``.../workers-artifacts/<topology id>/<port>/`` (docs/logs.md). The soak does not rely
    on more."""
    needles = (f"{topology_id}-", f"/{topology_id}/")
    for pid in workers:
        if any(needle in name for member in [pid, *process_tree(pid)]
               for name in process_names(member) for needle in needles):
            return pid
    raise RuntimeError(f"no worker process of {topology_id} among the {WORKER_MODULE} "
                       f"processes {workers}: none names it in its command line, working "
                       "directory or open files, nor does any of their descendants")


def process_names(pid: int) -> list[str]:
    """The command line, working directory and open files' paths of ``pid`` (what of
    them can be read: the process may end meanwhile)."""
    proc = Path(f"/proc/{pid}")
    names = []
    with contextlib.suppress(OSError):
        names.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace"))
        names.append(os.readlink(proc / "cwd"))
        for fd in (proc / "fd").iterdir():
            with contextlib.suppress(OSError):
                names.append(os.readlink(fd))
    return names


def process_tree(pid: int) -> list[int]:
    """The descendants of ``pid`` (Linux /proc), children before grandchildren."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        found.append(todo.pop(0))
        todo.extend(children.get(found[-1], []))
    return found


def kill9_tree(pid: int) -> None:
    """SIGKILL ``pid`` and its descendants (a worker and its Spark JVM), by process tree
    rather than process group: a worker need not lead a group of its own."""
    for victim in [pid, *process_tree(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)


def run(work: Path, faults: int, seed: int, pipelines: int = 4, log=print,
        spacing: tuple[float, float] | None = None, warm_workers: int = WARM_WORKERS,
        class_archive: bool = True,
        pause_s: tuple[float, float] = DEFAULT_PAUSE_S) -> dict[str, Any]:
    """Run a soak in ``work``; returns its report (see the module docstring).
    ``spacing``: (low, high) seconds between faults, as ``--spacing``; ``warm_workers``
    and ``class_archive``: the supervisors' settings (``--warm-workers``,
    ``--no-class-archive``); ``pause_s``: the pause between faults without spacing (one
    draw either way: the seed's faults are the same)."""
    soak = Soak(work, seed, pipelines, log=log, spacing=spacing, warm_workers=warm_workers,
                class_archive=class_archive, pause_s=pause_s)
    try:
        soak.start()
        soak.run_faults(faults)
        soak.settle()
        return soak.report()
    finally:
        soak.stop()


def spacing_arg(text: str) -> tuple[float, float]:
    """``--spacing``: ``LOW:HIGH`` seconds (or ``S`` for exactly S), 0 <= LOW <= HIGH."""
    low, _, high = text.partition(":")
    try:
        bounds = (float(low), float(high or low))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected LOW:HIGH in seconds, such as 30:60") from None
    if not 0 <= bounds[0] <= bounds[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: expected 0 <= LOW <= HIGH")
    return bounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pipelines", type=int, default=4)
    parser.add_argument("--spacing", type=spacing_arg, metavar="LOW:HIGH",
                        help="seconds between faults, drawn uniformly (such as 30:60); "
                             "also measures the warm restart and checks every pipeline's "
                             "longest stall (default: 1-4 s, no stall bound)")
    parser.add_argument("--warm-workers", type=int, metavar="N", default=WARM_WORKERS,
                        help="supervisor.warm.workers of every supervisor (default: "
                             "%(default)s, the product's)")
    parser.add_argument("--no-class-archive", dest="class_archive", action="store_false",
                        help="supervisor.spark.class.archive false (default: true, the "
                             "product's)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    if args.warm_workers < 0:
        parser.error(f"--warm-workers {args.warm_workers}: expected 0 or more")
    work = Path(tempfile.mkdtemp(prefix="nimbus-soak-"))
    started = time.monotonic()
    try:
        report = run(work, args.faults, args.seed, args.pipelines, spacing=args.spacing,
                     warm_workers=args.warm_workers, class_archive=args.class_archive)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    report["wall_time_s"] = round(time.monotonic() - started)
    verdicts = judge(report)
    report["verdicts"] = summary(verdicts)
    print(json.dumps(report, indent=2))
    print(render(verdicts, report))
    sys.exit(exit_status(verdicts))


if __name__ == "__main__":
    main()
