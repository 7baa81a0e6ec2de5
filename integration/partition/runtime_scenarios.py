"""Scenarios about supervisors and the work they run: a supervisor cut from ZooKeeper (its
pipeline must move, exactly once), one cut from the nimbuses only (nothing may change),
and one cut from the nimbuses while it must fetch code as its pipeline is deactivated
and activated (the pipeline must never run twice).
"""

from __future__ import annotations

import random
import time
from typing import Any

from checker import Report
from copies import CopySampler
from labcluster import PartitionLab
from labprocess import LabSupervisor, wait_until
from processes import running
from steps import (
    COMMIT_TIMEOUT_S,
    SPARK_CONF,
    Options,
    RecordFeeder,
    finish,
    new_report,
    process_bundle,
    say,
    submit,
    wait_worker,
)

from nimbus.dev.feed import WORDCOUNT, CommittedOutput, RecordFeed


class Pipeline:
    """The word-count pipeline of a lab, fed continuously, its output and its workers
    watched."""

    def __init__(self, lab: PartitionLab, name: str = "wordcount"):
        self.lab = lab
        self.name = name
        self.feed = RecordFeed(lab.work / "input")
        self.output = CommittedOutput(lab.work / "output")
        self.feeder = RecordFeeder(self.feed)
        self.sampler = CopySampler(s.local_dir / "workers" for s in lab.supervisors)
        self.topology_id = ""

    def submit(self) -> str:
        self.topology_id = submit(self.lab, self.name, WORDCOUNT, {
            "topology.min.replication.count": 2,
            "topology.spark.master": "local[1]",
            "topology.spark.conf": SPARK_CONF,
            "topology.spark.checkpoint.dir": str(self.lab.work / "checkpoints"),
            "wordcount.input.dir": str(self.feed.input_dir),
            "wordcount.output.dir": str(self.output.output_dir),
            "wordcount.trigger.secs": 1})
        self.sampler.watch(self.topology_id)
        self.sampler.start()
        self.feeder.start()
        return self.topology_id

    def wait_committed(self, what: str, timeout_s: float = COMMIT_TIMEOUT_S) -> None:
        """Every record fed so far (and at least one batch) committed."""
        target = self.feeder.fed() or self.feeder.feed_now(self.feeder.count)
        wait_until(lambda: self.output.holds(target), timeout_s,
                   f"{self.name} to commit {what} ({len(target)} records)", interval_s=0.5)

    def drain_and_check(self, report: Report) -> None:
        """Stop feeding, wait for every record, then judge exactly once and copies."""
        self.feeder.stop()
        try:
            self.wait_committed("every record fed")
        except TimeoutError as exc:
            report.failures.append(str(exc))
        self.sampler.stop()
        report.exactly_once(self.feed.fed, self.output.ids())
        report.copies(self.sampler.topologies[self.topology_id],
                      [s.log_text() for s in self.lab.supervisors])

    def close(self) -> None:
        self.feeder.stop()
        self.sampler.stop()


def _supervisor(lab: PartitionLab, name: str) -> LabSupervisor:
    return next(s for s in lab.supervisors if s.name == name)


def supervisor_cut_zk(name: str, seed: int, opts: Options) -> Report:
    """The supervisor running the pipeline is cut from ZooKeeper: its worker must die
    (lease expiry) before the work moves, the pipeline resumes on the other supervisor,
    and every record is committed exactly once."""
    rng = random.Random(seed)
    lab = PartitionLab(opts.work / name, session_ms=opts.session_ms,
                       pythonpath=opts.pythonpath, slots=(1, 1))
    with lab:
        report = new_report(lab, name, seed)
        session = lab.session_s
        pipeline = Pipeline(lab)
        try:
            topology_id = pipeline.submit()
            pid, owner = wait_worker(lab, topology_id, COMMIT_TIMEOUT_S)
            pipeline.wait_committed("its first records")
            cut_supervisor = _supervisor(lab, owner)
            time.sleep(rng.uniform(0.5, 2.0))  # the cut's phase (fault schedule)
            say(opts, f"{name}: cutting {owner} (worker {pid}) from ZooKeeper")
            cut = lab.nemesis.partition([cut_supervisor.node], [lab.zk_node])
            cut_at = cut.event.began
            died_at = wait_until(lambda: None if running(pid) else time.time(),
                                 3 * session, "the cut supervisor's worker to die",
                                 interval_s=0.02)
            report.ratio("worker_died", died_at - cut_at)
            report.bound("worker_died_ratio", 1.0, "its lease runs out before its session")
            _, new_owner = wait_worker(lab, topology_id, 4 * session + 60)
            report.ratio("moved", time.time() - cut_at)
            report.require(new_owner != owner, "the pipeline did not move")
            pipeline.wait_committed("records fed during the cut")
            lab.nemesis.heal(cut)
            healed_at = time.time()
            say(opts, f"{name}: healed")
            # Back, it registers on a new session and must not start the moved work.
            wait_until(lambda: _registered_since(cut_supervisor, healed_at), 4 * session,
                       f"{owner} to register again", interval_s=0.2)
            pipeline.wait_committed("records fed after the heal")
            pipeline.drain_and_check(report)
        finally:
            pipeline.close()
        finish(lab, report, None)
    return report


def _registered_since(supervisor: LabSupervisor, since: float) -> bool:
    from leadership import log_time

    return any("registered supervisor" in line and (log_time(line) or 0) >= since
               for line in supervisor.log_text().splitlines())


def supervisor_cut_nimbus(name: str, seed: int, opts: Options) -> Report:
    """The supervisor running a process topology is cut from both nimbuses (not from
    ZooKeeper) for about three sessions: it keeps running, its worker keeps its pid, and
    the work is not moved."""
    rng = random.Random(seed)
    lab = PartitionLab(opts.work / name, session_ms=opts.session_ms,
                       pythonpath=opts.pythonpath, slots=(1, 1))
    with lab:
        report = new_report(lab, name, seed)
        session = lab.session_s
        topology_id = submit(lab, "proc", process_bundle(lab.work / "proc"))
        sampler = CopySampler(s.local_dir / "workers" for s in lab.supervisors)
        seen = sampler.watch(topology_id)
        sampler.start()
        try:
            pid, owner = wait_worker(lab, topology_id, 60)
            before = lab.probe("assignment", topology_id)["assignment"]
            cut_supervisor = _supervisor(lab, owner)
            say(opts, f"{name}: cutting {owner} from the nimbuses")
            cut = lab.nemesis.partition([cut_supervisor.node], [n.node for n in lab.nimbuses])
            log_mark = len(cut_supervisor.log_text())
            # The fault's length (seeded), not a wait for anything.
            time.sleep(rng.uniform(2.5, 3.5) * session)
            lab.nemesis.heal(cut)
            say(opts, f"{name}: healed")
            time.sleep(session)  # the aftermath a heal could bring, watched by the sampler
            after = lab.probe("assignment", topology_id)["assignment"]
        finally:
            sampler.stop()
        report.figures["workers_seen"] = len(seen.lifetimes)
        report.require(running(pid) and set(seen.lifetimes) == {pid},
                       f"the worker did not keep running: workers seen {sorted(seen.lifetimes)}")
        report.require(_slots(before) == _slots(after),
                       f"the work moved: {_slots(before)} -> {_slots(after)}")
        report.require("lost ZooKeeper connection" not in cut_supervisor.log_text()[log_mark:],
                       "the supervisor lost its ZooKeeper connection")
        report.violations["two_copies_moments"] = len(seen.episodes)
        finish(lab, report, None)
    return report


def _slots(assignment: dict[str, Any] | None) -> Any:
    return (assignment or {}).get("executor_node_port")


def code_fetch_cut(name: str, seed: int, opts: Options) -> Report:
    """Supervisor 0 (two slots) runs the pipeline; supervisor 1 (one slot) is filled by
    another topology. Supervisor 0 is cut from the nimbuses, a new topology is placed on
    its free slot (it must fetch that code, and cannot), the filler is killed, and the
    pipeline is deactivated and, a little later, activated: it now goes to supervisor 1.
    The worker supervisor 0 ran must stop before the new one starts."""
    rng = random.Random(seed)
    lab = PartitionLab(opts.work / name, session_ms=opts.session_ms,
                       pythonpath=opts.pythonpath, slots=(2, 1), start_supervisors=False)
    with lab:
        report = new_report(lab, name, seed)
        session = lab.session_s
        first, second = lab.supervisors
        lab.start_supervisor(first)
        pipeline = Pipeline(lab)
        bundle = process_bundle(lab.work / "proc")
        try:
            topology_id = pipeline.submit()
            old_pid, _ = wait_worker(lab, topology_id, COMMIT_TIMEOUT_S, on=first.name)
            pipeline.wait_committed("its first records")
            lab.start_supervisor(second)
            filler = submit(lab, "filler", bundle)
            wait_worker(lab, filler, 60, on=second.name)
            say(opts, f"{name}: cutting {first.name} from the nimbuses")
            cut = lab.nemesis.partition([first.node], [n.node for n in lab.nimbuses])
            fetched = submit(lab, "needs-code", bundle)
            wait_until(lambda: _on(lab, fetched, first), 30,
                       f"the new topology to be placed on {first.name}", interval_s=0.2)
            time.sleep(rng.uniform(0.5, 1.5))  # fault schedule: its fetch is under way
            lab.probe("kill", "filler")
            wait_until(lambda: not lab.topology_workers(filler), 30, "the filler to stop")
            lab.probe("deactivate", pipeline.name)
            deactivated_at = time.time()
            wait_until(lambda: not _slots(lab.probe("assignment", topology_id)["assignment"]),
                       30, "the pipeline's slot to be freed", interval_s=0.3)
            # An operator's pause (seeded) before the activate: longer than a graceful
            # stop, far shorter than a code fetch that waits on silent nimbuses.
            time.sleep(rng.uniform(1.0, 1.5) * session)
            lab.probe("activate", pipeline.name)
            _, owner = wait_worker(lab, topology_id, 180, on=second.name)
            stopped = pipeline.sampler.topologies[topology_id].last_seen(old_pid)
            report.ratio("unassigned_worker_stopped",
                         None if stopped is None else stopped - deactivated_at)
            pipeline.wait_committed("records fed after the activate")
            lab.nemesis.heal(cut)
            say(opts, f"{name}: healed")
            wait_until(lambda: lab.topology_workers(fetched), 60,
                       "the new topology to run once its code can be fetched")
            pipeline.drain_and_check(report)
        finally:
            pipeline.close()
        finish(lab, report, None)
    return report


def _on(lab: PartitionLab, topology_id: str, supervisor: LabSupervisor) -> bool:
    slots = _slots(lab.probe("assignment", topology_id)["assignment"]) or {}
    return any(node == supervisor.id for node, _port in slots.values())
