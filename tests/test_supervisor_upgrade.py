"""The supervisor's side of upgrades (issue 31), with fakes: no ZooKeeper, no process.

What each slot wants (the version and code key of its executor, rolling or all at once),
a worker stopped when its slot wants another version (and never kept by a rebalance
across one), the slot's failures on a version (counted, not for stops, reset when the
version changes), what the heartbeat says of each slot ("version", "committed",
"failures"), and the clean-up keeping both versions' code during a rolling switch.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from nimbus.state import worker_state
from nimbus.state.records import Assignment, SupervisorInfo, WorkerBeat
from nimbus.supervisor import cleanup as cleanup_module
from nimbus.supervisor.adoption import Adoption
from nimbus.supervisor.cleanup import LocalCleanup
from nimbus.supervisor.code_cache import CodeCache
from nimbus.supervisor.ending import WorkerEnder
from nimbus.supervisor.lease_record import LeaseRecord, load_record
from nimbus.supervisor.policy import DesiredWorker, desired_workers
from nimbus.supervisor.registration import Registration
from nimbus.supervisor.reporting import Reporter
from nimbus.supervisor.slots import WorkerTable
from nimbus.supervisor.status_input import committed_batch, health_said
from nimbus.supervisor.worker_handle import WorkerHandle
from nimbus.worker_protocol.spec import WorkerSpec

TOPOLOGY = "up-1-1700000000"
SUP = "sup-1"
SHA = {"stormjar.jar": "a" * 64, "stormconf.json": "b" * 64, "stormcode.ser": "c" * 64}
SHA3 = {"stormjar.jar": "d" * 64, "stormconf.json": "e" * 64, "stormcode.ser": "f" * 64}


def assignment(**changes) -> Assignment:
    fields = {"master_code_dir": "/x", "code_sha256": SHA,
              "executor_node_port": {"worker-0": [SUP, 6700], "worker-1": [SUP, 6701],
                                     "worker-2": ["sup-other", 6700]}}
    fields.update(changes)
    return Assignment(**fields)


def want(port: int = 6700, version: int = 1, index: int = 0) -> DesiredWorker:
    return DesiredWorker(TOPOLOGY, port, f"worker-{index}", index, version)


# -- what each slot wants ------------------------------------------------------------------
def test_desired_workers_carry_each_executors_version_and_code_key():
    # Never upgraded: version 1, whose code key is the topology id.
    desired = desired_workers({TOPOLOGY: assignment()}, SUP, [6700, 6701])
    assert [(w.port, w.version, w.code_key, w.code_sha256) for w in desired.values()] == \
        [(6700, 1, TOPOLOGY, SHA), (6701, 1, TOPOLOGY, SHA)]
    # Strategy all: every worker runs version 3 (key <id>.v3) at once.
    desired = desired_workers({TOPOLOGY: assignment(code_version=3, code_sha256=SHA3)}, SUP,
                              [6700, 6701])
    assert [(w.version, w.code_key, w.code_sha256) for w in desired.values()] == \
        [(3, f"{TOPOLOGY}.v3", SHA3)] * 2


def test_a_rolling_switch_gives_each_slot_the_version_of_its_executor():
    # worker-0 switches now; worker-1 runs version 1 until its turn.
    rolling = assignment(code_version=3, code_sha256=SHA3, worker_versions={"worker-1": 1},
                         version_sha256={"1": SHA})
    desired = desired_workers({TOPOLOGY: rolling}, SUP, [6700, 6701])
    assert {p: (w.executor, w.version, w.code_key, w.code_sha256)
            for p, w in desired.items()} == {
        6700: ("worker-0", 3, f"{TOPOLOGY}.v3", SHA3),
        6701: ("worker-1", 1, TOPOLOGY, SHA)}


def test_a_desired_worker_without_a_code_key_is_given_its_versions():
    assert want(version=1).code_key == TOPOLOGY
    assert want(version=2).code_key == f"{TOPOLOGY}.v2"
    assert want(version=2) != want(version=3)
    assert hash(want(version=2)) == hash(want(version=2))  # hashable, sha map aside


# -- stopping a worker whose slot wants another version ---------------------------------
class FakeReporter:
    def __init__(self) -> None:
        self.exits: list[tuple[str, int | None]] = []

    def exited(self, handle, code) -> None:
        self.exits.append((handle.name, code))

    def report(self, *args, **kwargs) -> None:
        pass


def handle(port: int = 6700, version: int = 1, index: int = 0, num_workers: int = 2,
           kind: str = "pipeline") -> WorkerHandle:
    """A handle with no process (stop_all and release have nothing to signal)."""
    h = WorkerHandle(TOPOLOGY, port, Path("/nonexistent"), 1, 0, lambda *a: None)
    h.code_version, h.code_key = version, want(version=version).code_key
    h.worker_index, h.num_workers, h.kind = index, num_workers, kind
    h.topology_components = ("a",)   # worker 0 runs it as one of one or of two
    return h


def ender(table: WorkerTable) -> WorkerEnder:
    return WorkerEnder(table, FakeReporter(), lambda: None,  # type: ignore[arg-type]
                       grace_s=0.1, timeout_s=20, start_timeout_s=90)


def test_a_worker_whose_slot_wants_another_version_is_stopped_and_its_slot_kept(caplog):
    table = WorkerTable()
    old = handle(version=1)
    table.add(old)
    desired = {6700: want(version=2)}
    table.note_versions(desired)
    record = table.record(TOPOLOGY, 6700)
    record.restarts = 4
    with caplog.at_level(logging.INFO, logger="nimbus.supervisor.ending"):
        ender(table).stop_unwanted(desired, {TOPOLOGY: 2}, set())
    assert table.running() == [] and old.ended_by == "stop"   # a stop, not a crash
    assert f"stopping worker {TOPOLOGY}:6700: switching from version 1 to version 2" in \
        caplog.messages
    # Same topology, same port: the record (its restarts) stays, for the start on v2.
    assert table.slots[(TOPOLOGY, 6700)] is record and record.restarts == 4


def test_a_worker_runs_on_until_the_new_versions_code_is_here():
    """The switch costs no fetch: the old worker stops only once the new code is here."""
    table, ready, asked = WorkerTable(), set(), []
    old = handle(version=1)
    table.add(old)

    def code_ready(w: DesiredWorker) -> bool:
        asked.append(w.code_key)
        return w.code_key in ready

    switching = WorkerEnder(table, FakeReporter(), lambda: None,  # type: ignore[arg-type]
                            grace_s=0.1, timeout_s=20, start_timeout_s=90,
                            code_ready=code_ready)
    switching.stop_unwanted({6700: want(version=2)}, {TOPOLOGY: 2}, set())
    assert table.running() == [old] and asked == [f"{TOPOLOGY}.v2"]
    ready.add(f"{TOPOLOGY}.v2")
    switching.stop_unwanted({6700: want(version=2)}, {TOPOLOGY: 2}, set())
    assert table.running() == [] and old.ended_by == "stop"
    # Work moved away is stopped whatever code is here.
    gone = handle(version=1)
    table.add(gone)
    switching.stop_unwanted({}, {}, set())
    assert table.running() == [] and len(asked) == 2


def test_a_worker_on_the_wanted_version_is_left_running():
    table = WorkerTable()
    current = handle(version=2)
    table.add(current)
    ender(table).stop_unwanted({6700: want(version=2)}, {TOPOLOGY: 2}, set())
    assert table.running() == [current] and not current.ended_by


@pytest.mark.parametrize("kind", ["pipeline", "process"])
def test_a_rebalance_never_keeps_a_worker_across_a_version_change(kind, caplog):
    # Its share is the same as worker 0 of 1 and as worker 0 of 2 (one component): a
    # rebalance alone would keep it. Not when its version changes too.
    h = handle(version=1, index=0, num_workers=2, kind=kind)
    told = []
    h.reassign = lambda index, count: told.append((index, count)) or True
    assert WorkerEnder.keeps_its_share(h, 0, 1, version=2) is False
    assert told == []
    assert WorkerEnder.keeps_its_share(h, 0, 1, version=1) is True
    assert WorkerEnder.keeps_its_share(h, 0, 1) is True   # the version it runs
    # Through the pass: a rebalance (2 -> 1 workers) and a switch at once: stopped.
    table = WorkerTable()
    h2 = handle(version=1, index=0, num_workers=2, kind=kind)
    h2.reassign = lambda index, count: pytest.fail("told to run on across a switch")
    table.add(h2)
    with caplog.at_level(logging.INFO, logger="nimbus.supervisor.ending"):
        ender(table).stop_unwanted({6700: want(version=2)}, {TOPOLOGY: 1}, set())
    assert table.running() == [] and any("switching from version 1 to version 2" in m
                                         for m in caplog.messages)


def test_a_frozen_topologys_worker_is_not_stopped_for_a_version():
    table = WorkerTable()
    h = handle(version=1)
    table.add(h)
    ender(table).stop_unwanted({6700: want(version=2)}, {TOPOLOGY: 2}, {TOPOLOGY})
    assert table.running() == [h]


# -- failures on a version -----------------------------------------------------------------
class ExitedHandle:
    """What WorkerEnder.reap reads of a worker that exited."""

    def __init__(self, version: int, *, committed: bool = False, ended_by: str = "",
                 code: int = 3, kind: str = "pipeline",
                 components: tuple[str, ...] | None = None) -> None:
        self.topology_id, self.port, self.name = TOPOLOGY, 6700, f"{TOPOLOGY}:6700"
        self.topology_components = components   # what it declared (None: nothing)
        self.code_version, self.version_committed = version, committed
        self.committed = committed and kind == "pipeline"
        self.ended_by, self.kind, self.warm, self.warm_refused = ended_by, kind, "", ""
        self.lease_deadline, self.is_taken_over = time.monotonic() + 60, False
        self.started_at, self.last_error, self._code = time.monotonic(), "", code

    def exit_code(self) -> int:
        return self._code

    def release(self) -> None:
        pass


def reap_one(table: WorkerTable, exited: ExitedHandle, beats: list) -> None:
    table.workers[exited.port] = exited  # type: ignore[assignment]
    WorkerEnder(table, FakeReporter(), lambda: beats.append(1), grace_s=0.1, timeout_s=20,
                start_timeout_s=90).reap()


def test_exits_before_a_commit_count_as_failures_of_the_version_and_stops_do_not():
    table, beats = WorkerTable(), []
    table.note_versions({6700: want(version=2)})
    record = table.record(TOPOLOGY, 6700)
    reap_one(table, ExitedHandle(2), beats)        # build() raised, say
    assert (record.failures, record.restarts, len(beats)) == (1, 1, 1)
    reap_one(table, ExitedHandle(2, code=-signal.SIGKILL, ended_by="timeout"), beats)
    assert record.failures == 2                   # went silent before it committed
    for ended_by in ("stop", "lost", "lease"):     # the supervisor or its lease ended it
        reap_one(table, ExitedHandle(2, ended_by=ended_by), beats)
    assert (record.failures, record.restarts) == (2, 2)
    reap_one(table, ExitedHandle(2, committed=True), beats)   # it had committed
    assert (record.failures, record.restarts) == (2, 3)
    reap_one(table, ExitedHandle(1), beats)        # the old version's worker, late
    assert record.failures == 2


def test_failures_and_the_backoff_start_afresh_when_the_slots_version_changes():
    table, beats = WorkerTable(), []
    table.note_versions({6700: want(version=2)})
    record = table.record(TOPOLOGY, 6700)
    for _ in range(3):
        reap_one(table, ExitedHandle(2), beats)
    assert record.failures == 3 and record.not_before > time.monotonic()
    assert record.failed and record.last_error
    table.note_versions({6700: want(version=2)})  # unchanged: nothing forgotten
    assert record.failures == 3
    table.note_versions({6700: want(version=1)})  # rolled back: counted afresh
    assert (record.version, record.failures, record.not_before, record.failed) == \
        (1, 0, 0.0, False)
    assert record.restarts == 3 and record.last_error   # what happened stays said
    assert record.backoff.delay_after_exit(1.0) == 0    # no backoff carried over


# -- what the heartbeat says ---------------------------------------------------------------
def registration(table: WorkerTable) -> Registration:
    return Registration(None, None, SUP, "host", [6700, 6701], "/sup", table,  # type: ignore[arg-type]
                        heartbeat_s=5, task_timeout_s=30, warm_summary=lambda: None,
                        wake_monitor=lambda: None, stopping=lambda: False)


def entries(reg: Registration) -> dict[str, dict]:
    return {port: {k: e[k] for k in ("state", "version", "committed", "failures")}
            for port, e in reg.info().workers.items()}


def test_the_heartbeat_says_each_slots_version_commit_and_failures():
    table = WorkerTable()
    reg = registration(table)
    desired = {6700: want(6700, version=2), 6701: want(6701, version=1, index=1)}
    table.note_versions(desired)
    reg.set_desired(desired)
    # Nothing runs yet: the version each slot starts next.
    assert entries(reg) == {
        "6700": {"state": "starting", "version": 2, "committed": False, "failures": 0},
        "6701": {"state": "starting", "version": 1, "committed": False, "failures": 0}}
    new, old = handle(6700, version=2), handle(6701, version=1, index=1)
    table.add(new)
    table.add(old)
    old.version_committed, old.last_beat_at = True, time.monotonic()
    assert entries(reg)["6701"] == {"state": "running", "version": 1, "committed": True,
                                    "failures": 0}
    assert entries(reg)["6700"]["committed"] is False
    new.version_committed = True
    assert entries(reg)["6700"] == {"state": "starting", "version": 2, "committed": True,
                                    "failures": 0}
    # Its worker crashed before committing: the slot restarts, one failure of v2.
    table.workers.pop(6700)
    record = table.record(TOPOLOGY, 6700)
    record.failures, record.failed, record.last_error = 1, True, "build() raised"
    got = reg.info().workers["6700"]
    assert (got["state"], got["version"], got["committed"], got["failures"],
            got["last_error"]) == ("restarting", 2, False, 1, "build() raised")
    # The record decodes, and the readers' rule reads the same back.
    info = SupervisorInfo.decode(reg.info().encode())
    said = worker_state.statement(info, TOPOLOGY, 6700)
    assert (said.version, said.committed, said.failures) == (2, False, 1)


def test_the_error_of_a_failure_stays_said_while_the_next_process_runs():
    """A crash loop's next process beats at once: the entry keeps the error that ended
    the last one while its version has failures, which a leader rolling the upgrade
    back records as the reason."""
    table = WorkerTable()
    reg = registration(table)
    desired = {6700: want(6700, version=2)}
    table.note_versions(desired)
    reg.set_desired(desired)
    record = table.record(TOPOLOGY, 6700)
    record.failures, record.failed, record.last_error = 1, True, "health check failed"
    again = handle(6700, version=2)
    again.last_beat_at = time.monotonic()
    table.add(again)
    got = reg.info().workers["6700"]
    assert (got["state"], got["failures"], got["last_error"]) == (
        "running", 1, "health check failed")
    again.version_committed = True   # it proved itself: the old error is no news
    assert reg.info().workers["6700"]["last_error"] == ""


def test_a_worker_still_on_the_old_version_is_said_as_it_is():
    """While its slot already wants v2, the v1 worker being stopped is said as v1: its
    commit is no news of v2's."""
    table = WorkerTable()
    reg = registration(table)
    old = handle(6700, version=1)
    old.version_committed, old.last_beat_at = True, time.monotonic()
    table.add(old)
    desired = {6700: want(6700, version=2)}
    table.note_versions(desired)
    reg.set_desired(desired)
    assert entries(reg)["6700"] == {"state": "running", "version": 1, "committed": True,
                                    "failures": 0}
    old.ended_by = "stop"   # being stopped: what is said is of the next one, v2's
    assert entries(reg)["6700"] == {"state": "starting", "version": 2, "committed": False,
                                    "failures": 0}


def test_a_worker_of_another_executor_does_not_speak_for_the_slot():
    """The slot was given to another executor of the same topology while the worker of
    the old one still runs there: its commit is no news of the new executor's."""
    table = WorkerTable()
    reg = registration(table)
    other = handle(6700, version=2, index=1)
    other.version_committed, other.last_beat_at = True, time.monotonic()
    table.add(other)
    desired = {6700: want(6700, version=2, index=0)}
    table.note_versions(desired)
    reg.set_desired(desired)
    assert entries(reg)["6700"] == {"state": "starting", "version": 2, "committed": False,
                                    "failures": 0}
    other.worker_index = 0   # kept through the rebalance: told it is worker-0 now
    assert entries(reg)["6700"] == {"state": "running", "version": 2, "committed": True,
                                    "failures": 0}


@pytest.mark.parametrize("changes", [{"version": 0}, {"version": True}, {"version": "2"},
                                     {"committed": 1}, {"failures": -1},
                                     {"failures": 1.5}])
def test_a_malformed_upgrade_key_makes_the_entry_unreadable(changes):
    entry = {"topology_id": TOPOLOGY, "state": "running", "restarts": 0, "backoff_secs": 0,
             "last_error": "", "version": 2, "committed": True, "failures": 0}
    info = SupervisorInfo(0, "h", workers={"6700": {**entry, **changes}})
    assert worker_state.statement(info, TOPOLOGY, 6700) is None
    earlier = {k: v for k, v in entry.items() if k not in ("version", "committed",
                                                           "failures")}
    said = worker_state.statement(SupervisorInfo(0, "h", workers={"6700": earlier}),
                                  TOPOLOGY, 6700)
    assert (said.version, said.committed, said.failures) == (1, False, 0)


# -- "committed", from what the worker sends -------------------------------------------------
class FakeState:
    def __init__(self) -> None:
        self.beats: list[WorkerBeat] = []

    def worker_heartbeat(self, topology_id, supervisor_id, port, data) -> None:
        self.beats.append(WorkerBeat.decode(data))


def reporter(state: FakeState, beats: list) -> Reporter:
    connected = threading.Event()
    connected.set()
    zk = SimpleNamespace(client_id=(1, b""))
    return Reporter(zk, state, SUP, "host", connected, lambda h, c: None,  # type: ignore[arg-type]
                    beat_now=lambda: beats.append(1), wake_monitor=lambda: None)


def pipeline_beat(progress: dict | None = None, history: list | None = None) -> dict:
    main: dict = {"batch_id": 7, "num_input_rows": 0}
    if progress is not None:
        main["progress"] = progress
    if history is not None:
        main["history"] = history
    return {"beat": {"components": {"main": main}}}


def declare(every: list[str], mine: list[str]) -> dict:
    return {"components": {"all": every, "mine": mine}}


def test_a_pipeline_counts_as_committed_from_a_batch_that_ran_not_an_idle_trigger():
    state, beats = FakeState(), []
    rep = reporter(state, beats)
    h = handle(version=3)
    rep.on_status(h, declare(["main"], ["main"]))
    # A trigger that found no data (after a restart: the next batch's id, no addBatch).
    rep.on_status(h, pipeline_beat({"batch_id": 7, "duration_ms": {"triggerExecution": 3,
                                                                     "latestOffset": 1}}))
    assert (h.committed, h.version_committed) == (False, False)
    assert state.beats[-1].code_version == 3
    before = len(beats)
    rep.on_status(h, pipeline_beat({"batch_id": 7, "duration_ms": {"addBatch": 40,
                                                                     "triggerExecution": 60}}))
    assert (h.committed, h.version_committed) == (True, True)
    assert len(beats) > before   # the heartbeat says so at once
    # Or its history shows a batch it ran (the newest progress an idle one since).
    h2 = handle(version=3)
    rep.on_status(h2, declare(["main"], ["main"]))
    rep.on_status(h2, pipeline_beat({"batch_id": 8, "duration_ms": {}},
                                    history=[[int(time.time()), 1.0, 1.0, 50]]))
    assert h2.version_committed


def share_beat(**components: dict) -> dict:
    return {"beat": {"components": {name: {"batch_id": 3, **stats}
                                    for name, stats in components.items()}}}


BATCH = {"progress": {"batch_id": 3, "duration_ms": {"addBatch": 40}}}
IDLE = {"progress": {"batch_id": 3, "duration_ms": {"triggerExecution": 2}}}


def test_a_pipeline_counts_as_committed_only_once_every_query_of_its_share_committed():
    """A stateless query committing first proves nothing of a stateful one that may
    still fail at its first batch on a checkpoint Spark refuses: the worker is not
    switched, and its exit is a failure of the version (the leader rolls back)."""
    state, beats = FakeState(), []
    rep = reporter(state, beats)
    h = handle(version=2)
    # Nothing is committed before the worker said what its share is (the batches it ran
    # meanwhile are noted: a worker taken over says its share again after its beats).
    rep.on_status(h, share_beat(counts=BATCH, enrich=BATCH))
    assert (h.committed, h.version_committed) == (True, False)   # its backoff: it works
    rep.on_status(h, declare(["alerts", "counts", "enrich"], ["counts", "enrich"]))
    rep.on_status(h, share_beat(counts=IDLE, enrich=IDLE))
    assert h.version_committed
    h = handle(version=2)
    rep.on_status(h, declare(["alerts", "counts", "enrich"], ["counts", "enrich"]))
    rep.on_status(h, share_beat(counts=BATCH, enrich=IDLE))
    assert (h.committed, h.version_committed) == (True, False)
    rep.on_status(h, share_beat(counts=BATCH, enrich=IDLE, alerts=BATCH))  # not its own
    assert not h.version_committed
    # The stateful one fails at its first batch: a failure of version 2 on the slot.
    table, reaped = WorkerTable(), []
    table.note_versions({6700: want(version=2)})
    reap_one(table, ExitedHandle(2, committed=h.version_committed), reaped)
    assert table.record(TOPOLOGY, 6700).failures == 1
    # Each query of its share committed, on beats of their own: now it is switched.
    before = len(beats)
    rep.on_status(h, share_beat(enrich=BATCH))
    assert h.version_committed and len(beats) > before
    # A share of none (more workers than components) has nothing to prove.
    idle = handle(version=2, index=1, num_workers=2)
    rep.on_status(idle, {"beat": {"components": {}}})
    assert not idle.version_committed
    rep.on_status(idle, declare(["main"], []))
    rep.on_status(idle, {"beat": {"components": {}}})
    assert idle.version_committed
    # A share it did not say believably proves nothing.
    odd = handle(version=2)
    rep.on_status(odd, declare(["counts"], ["../counts"]))
    rep.on_status(odd, share_beat(counts=BATCH))
    assert (odd.own_components, odd.version_committed) == (None, False)


@pytest.mark.parametrize(("health", "committed"), [
    (None, True), ("none", True), ("passed", True), ("pending", False),
    ("PASSED", False), (True, False), ({"passed": True}, False)])
def test_a_process_counts_as_committed_when_its_health_check_passed_or_it_has_none(
        health, committed):
    state, beats = FakeState(), []
    rep = reporter(state, beats)
    h = handle(version=2, kind="process")
    beat = {"components": {"main": {"pid": 5}}}
    if health is not None:
        beat["health"] = health
    rep.on_status(h, {"beat": beat})
    assert h.version_committed is committed
    assert not h.committed   # a process has no batches: its backoff rule is its own


def test_a_worker_being_stopped_proves_nothing():
    state, beats = FakeState(), []
    h = handle(version=2, kind="process")
    h.ended_by = "stop"
    reporter(state, beats).on_status(h, {"beat": {"components": {"main": {"pid": 5}}}})
    assert not h.version_committed and state.beats == []


def test_committed_batch_and_health_said_read_only_what_is_well_formed():
    assert not committed_batch({})
    assert not committed_batch({"main": {"batch_id": 4}})   # the old rule: not enough
    assert not committed_batch({"main": {"progress": None, "history": []}})
    assert committed_batch({"a": {}, "b": {"progress": {"duration_ms": {"addBatch": 1}}}})
    assert committed_batch({"main": {"history": [[1, 1.0, 1.0, 1]]}})
    assert [health_said(v) for v in (None, "none", "pending", "passed", "yes", 1)] == \
        ["none", "none", "pending", "passed", "pending", "pending"]


# -- code by code key: kept while wanted or running, both versions in a rolling switch -------
class FakeZk:
    def __init__(self, existing: set[str]) -> None:
        self.existing = existing

    def exists(self, path: str):
        return object() if path in self.existing else None


class FakeStarter:
    def __init__(self) -> None:
        self.owned_code: set[str] = set()

    def worker_conf(self, code_dir: Path) -> dict:
        return {}


def make_cleanup(tmp_path: Path, table: WorkerTable, grace_s: float = 0.0,
                 run_as_user: bool = False, live: set[str] | None = None):
    code = CodeCache(tmp_path / "stormdist", 1 << 20)
    zk = FakeZk({f"/storms/{t}" for t in (live if live is not None else {TOPOLOGY})})
    state = SimpleNamespace(storm_path=lambda t: f"/storms/{t}")
    forgotten = []
    reporting = SimpleNamespace(forget_except=forgotten.append)
    starter = FakeStarter()
    clean = LocalCleanup(zk, state, code, table, reporting, starter,  # type: ignore[arg-type]
                         lambda: None, tmp_path / "workers", grace_s=grace_s,
                         run_as_user=run_as_user)
    return clean, code, starter


def hold(code: CodeCache, *keys: str) -> None:
    for key in keys:
        (code.path(key) / "resources").mkdir(parents=True)


def test_a_rolling_switch_keeps_both_versions_code_and_drops_an_older_one(tmp_path):
    table = WorkerTable()
    clean, code, starter = make_cleanup(tmp_path, table)
    hold(code, TOPOLOGY, f"{TOPOLOGY}.v2", f"{TOPOLOGY}.v3", "other-2-2")
    starter.owned_code |= {f"{TOPOLOGY}.v2", TOPOLOGY}
    # worker-0 switched to v3, worker-1 still runs v1: v2 (the version before, kept no
    # more by any slot) and the other topology's code go (grace 0).
    desired = {6700: want(6700, version=3), 6701: want(6701, version=1, index=1)}
    clean.clean_up(desired, set())
    assert code.topologies() == {TOPOLOGY, f"{TOPOLOGY}.v3"}
    assert starter.owned_code == {TOPOLOGY}
    # A worker still running v1 on a slot that wants v3 keeps v1's code too.
    table.add(handle(6701, version=1, index=1))
    clean.clean_up({6700: want(6700, version=3), 6701: want(6701, version=3, index=1)},
                   set())
    assert code.topologies() == {TOPOLOGY, f"{TOPOLOGY}.v3"}
    table.workers.clear()
    clean.clean_up({6700: want(6700, version=3), 6701: want(6701, version=3, index=1)},
                   set())
    assert code.topologies() == {f"{TOPOLOGY}.v3"}


def test_an_unneeded_versions_code_waits_out_the_grace_and_a_frozen_topology_keeps_all(
        tmp_path):
    table = WorkerTable()
    clean, code, _ = make_cleanup(tmp_path, table, grace_s=300)
    hold(code, TOPOLOGY, f"{TOPOLOGY}.v2")
    clean.clean_up({6700: want(6700, version=2)}, set())
    assert code.topologies() == {TOPOLOGY, f"{TOPOLOGY}.v2"}   # v1 within its grace
    assert code.retained == {TOPOLOGY}
    # A topology whose assignment cannot be read keeps every version it has here.
    clean0, code0, _ = make_cleanup(tmp_path / "frozen", WorkerTable())
    hold(code0, TOPOLOGY, f"{TOPOLOGY}.v2", "other-2-2")
    clean0.clean_up({}, {TOPOLOGY})
    assert code0.topologies() == {TOPOLOGY, f"{TOPOLOGY}.v2"}


def test_a_topologys_account_goes_with_its_last_code_key_only(tmp_path, monkeypatch):
    removed = []
    monkeypatch.setattr(cleanup_module, "remove_account", removed.append)
    table = WorkerTable()
    clean, code, _ = make_cleanup(tmp_path, table, run_as_user=True, live=set())
    hold(code, TOPOLOGY, f"{TOPOLOGY}.v2")
    clean.clean_up({6700: want(6700, version=2)}, set())   # v1 goes, the topology stays
    assert code.topologies() == {f"{TOPOLOGY}.v2"} and removed == []
    clean.clean_up({}, set())                              # killed: its last key goes
    assert code.topologies() == set()
    assert removed == [cleanup_module.account_for(TOPOLOGY)]


# -- a worker an earlier process left, on another version ---------------------------------
def test_an_orphan_on_another_version_is_ended_not_taken_over(tmp_path):
    ended = []
    orphan = SimpleNamespace(topology_id=TOPOLOGY, port=6700, worker_index=0,
                             num_workers=1, code_version=1, name=f"{TOPOLOGY}:6700",
                             kill=lambda: ended.append("killed"), working_dirs=lambda: set())
    adoption = Adoption(WorkerTable(), FakeReporter(), None,  # type: ignore[arg-type]
                        supervisor_dir=tmp_path, timeout_s=20, connected=threading.Event(),
                        beat_now=lambda: None, code=lambda: pytest.fail("not read"),
                        cgroups=lambda: None, warm_root=lambda: None)
    assert adoption.take_over(orphan, (want(6700, version=2), 1), 1) is False  # type: ignore[arg-type]
    assert ended == ["killed"]


def test_a_lease_record_keeps_the_workers_version(tmp_path):
    path = tmp_path / "leases" / f"{TOPOLOGY}-6700.json"
    record = LeaseRecord(42, TOPOLOGY, 6700, 0, 1, 0, "/sys/fs/cgroup/x", 9, code_version=3)
    record.save(path)
    assert load_record(path) == record
    # One of an earlier release names no version: version 1.
    path.write_text(json.dumps({"pid": 42, "topology_id": TOPOLOGY, "port": 6700,
                                "worker_index": 0, "num_workers": 1, "restarts": 0,
                                "cgroup": "/c", "assignment_version": 9}))
    assert load_record(path).code_version == 1
    path.write_text(path.read_text()[:-1] + ', "code_version": 0}')
    assert load_record(path) is None


# -- a pipeline's components: remembered per slot, told to the slot's next worker -----------
V1_COMPONENTS = ("counts", "enrich")


class FakeWarmWorker:
    """What WorkerStarter.start_warm does with a warm worker it takes."""

    def __init__(self, tmp_path: Path) -> None:
        self.worker_dir = tmp_path / "warm-0"
        self.child_fds, self.pid, self.taken = (7, 8), 4242, None
        self.port = 0

    def rebind(self, on_status, on_closed) -> None:
        pass

    def take(self, worker_dir: Path) -> bool:
        self.taken = worker_dir
        return True


class FakeWarmPool:
    def __init__(self, worker: FakeWarmWorker | None) -> None:
        self.worker, self.asked = worker, []

    def take(self, spec, waiting_ahead: int = 0):
        self.asked.append(spec)
        return (self.worker, "") if self.worker else (None, "no warm worker ready")


def make_starter(tmp_path: Path, table: WorkerTable, warm: FakeWarmPool | None):
    from nimbus.config import load_config
    from nimbus.supervisor.starting import WorkerStarter

    def code_dir(key: str) -> Path:
        path = tmp_path / "stormdist" / key
        (path / "resources").mkdir(parents=True, exist_ok=True)
        (path / "resources" / "topology.py").write_text("def build(spark, conf): ...\n")
        (path / "stormconf.json").write_text("{}")
        return path

    code = SimpleNamespace(resources=lambda key: code_dir(key) / "resources")
    fetcher = SimpleNamespace(request=lambda key, sha: code_dir(key))
    adoption = SimpleNamespace(take_over_for=lambda *a: False, held=lambda port: False)
    connected = threading.Event()
    connected.set()
    conf = load_config(overrides={"storm.local.dir": str(tmp_path / "local")})
    log_dirs = SimpleNamespace(prepare=lambda *a, **k: tmp_path / "worker.log")
    rep = SimpleNamespace(on_status=lambda *a: None, on_closed=lambda *a: None)
    return WorkerStarter(
        lambda: conf, SUP, "host", table, rep, adoption,  # type: ignore[arg-type]
        SimpleNamespace(wake=lambda: None),  # type: ignore[arg-type]
        local_dir=tmp_path / "local", supervisor_dir=tmp_path / "sup",
        workers_dir=tmp_path / "workers", worker_command=("true",), run_as_user=False,
        grace_s=0.1, connected=connected, beat_now=lambda: None,
        may_start=lambda session: True, code=lambda: code,  # type: ignore[arg-type]
        fetcher=lambda: fetcher,  # type: ignore[arg-type]
        warm=lambda: warm,  # type: ignore[arg-type]
        cgroups=lambda: None, class_archive=lambda: None,
        log_dirs=log_dirs)  # type: ignore[arg-type]


def test_the_components_a_slots_worker_declared_reach_its_next_workers_spec(tmp_path):
    """An upgrade's switch: the v1 worker declared its topology's components; it is
    stopped for v2, and v2's worker (warm or cold) is told them in its worker.json."""
    table, beats = WorkerTable(), []
    old = handle(version=1, index=1, num_workers=2)
    reporter(FakeState(), beats).on_status(old, declare(["enrich", "counts"], ["enrich"]))
    table.add(old)
    desired = {6700: want(version=2, index=1)}
    table.note_versions(desired)
    table.forget_components(desired)
    ender(table).stop_unwanted(desired, {TOPOLOGY: 2}, set())
    assert old.ended_by == "stop"
    record = table.record(TOPOLOGY, 6700)
    assert record.components == V1_COMPONENTS
    # On a warm worker: the spec it is handed says them.
    warm = FakeWarmPool(FakeWarmWorker(tmp_path))
    make_starter(tmp_path, table, warm).ensure_running(desired[6700], 2, 1)
    assert warm.worker.taken == tmp_path / "workers" / f"{TOPOLOGY}-6700"
    spec = WorkerSpec.load(warm.worker.taken)
    assert (spec.code_version, spec.worker_index, spec.num_workers,
            spec.previous_components) == (2, 1, 2, list(V1_COMPONENTS))
    assert warm.asked[0].previous_components == list(V1_COMPONENTS)
    # Started cold: the same spec.
    table2 = WorkerTable()
    table2.record(TOPOLOGY, 6700).components = V1_COMPONENTS
    starter = make_starter(tmp_path / "cold", table2, FakeWarmPool(None))
    cold = []
    starter._start_cold = lambda want, record, spec, *rest: cold.append(spec)
    starter.ensure_running(desired[6700], 2, 1)
    assert [s.previous_components for s in cold] == [list(V1_COMPONENTS)]
    # A slot that remembers nothing says nothing: unknown, never refused for it.
    starter3 = make_starter(tmp_path / "new", WorkerTable(), None)
    starter3._start_cold = lambda want, record, spec, *rest: cold.append(spec)
    starter3.ensure_running(desired[6700], 2, 1)
    assert cold[-1].previous_components == []


def test_a_worker_that_exits_leaves_its_components_and_a_refused_one_leaves_them_as_they_were():
    table, beats = WorkerTable(), []
    table.note_versions({6700: want(version=1)})
    record = table.record(TOPOLOGY, 6700)
    reap_one(table, ExitedHandle(1, components=V1_COMPONENTS), beats)
    assert record.components == V1_COMPONENTS
    # Version 2 refused to run beside them: it declared nothing; still v1's for its next.
    table.note_versions({6700: want(version=2)})
    reap_one(table, ExitedHandle(2, code=2), beats)
    assert record.components == V1_COMPONENTS and record.failures == 1
    # A process topology's worker declares none.
    reap_one(table, ExitedHandle(2, kind="process", components=("x",)), beats)
    assert record.components == V1_COMPONENTS


def test_a_slot_no_longer_its_topologys_forgets_the_components():
    table = WorkerTable()
    table.note_versions({6700: want(6700), 6701: want(6701, index=1)})
    for port in (6700, 6701):
        table.record(TOPOLOGY, port).components = V1_COMPONENTS
    table.record("other-2-2", 6702).components = ("x",)
    # 6701 deactivated (or given to another topology); 6702's topology cannot be read.
    table.forget_components({6700: want(6700)}, keep={"other-2-2"})
    assert [table.record(TOPOLOGY, p).components for p in (6700, 6701)] == \
        [V1_COMPONENTS, ()]
    assert table.record("other-2-2", 6702).components == ("x",)
