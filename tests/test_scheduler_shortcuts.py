"""The scheduler's shortcuts at fleet size, against a fake in-memory view (speed): a pass
looks at the topologies not at rest and those that changed, and decides exactly what a
pass over every topology decides; an Assignment judged unchanged is exactly the one a
pass would have built; a topology at rest costs no write."""

from __future__ import annotations

import logging
import random
import re
from dataclasses import replace

import pytest

from nimbus.config import load_config
from nimbus.master.scheduler import Scheduler, Slot
from nimbus.state.records import ACTIVE, INACTIVE, Assignment, StormBase, SupervisorInfo


class FakeView:
    """What a pass reads: shared dicts replaced (never changed) on each change, as the
    real view's are, and a change event per topology changed, as the real view's
    listeners get."""

    def __init__(self) -> None:
        self.storms_: dict[str, StormBase] = {}
        self.assignments_: dict[str, Assignment] = {}
        self.supervisors_: dict[str, SupervisorInfo] = {}
        self._listeners: list = []

    def listen(self, listener) -> None:
        self._listeners.append(listener)

    def notify(self, directory: str, topology_id: str) -> None:
        for listener in self._listeners:
            listener(directory, topology_id)

    def _replace(self, directory: str, attribute: str, topology_id: str,
                 record: object | None) -> None:
        records = dict(getattr(self, attribute))
        if record is None:
            records.pop(topology_id, None)
        else:
            records[topology_id] = record
        setattr(self, attribute, records)
        self.notify(directory, topology_id)

    def set_storm(self, topology_id: str, base: StormBase | None) -> None:
        self._replace("storms", "storms_", topology_id, base)

    def set_assignment(self, topology_id: str, assignment: Assignment | None) -> None:
        self._replace("assignments", "assignments_", topology_id, assignment)

    def barrier(self, **_: object) -> None:
        pass

    def storms(self) -> dict[str, StormBase]:
        return self.storms_

    def assignments(self) -> dict[str, Assignment]:
        return self.assignments_

    def supervisors(self) -> dict[str, SupervisorInfo]:
        return self.supervisors_

    def unreadable(self, _directory: str) -> frozenset[str]:
        return frozenset()

    def worker_beat_versions(self, _topology_id: str) -> dict[str, int]:
        return {}


class RecordingState:
    def __init__(self) -> None:
        self.writes: list[str] = []

    def supervisor_info(self, _supervisor_id: str) -> None:
        return None  # gone from ZooKeeper too


def scheduler(view: FakeView) -> Scheduler:
    conf = load_config(overrides={}, extra_defaults={})
    # A clock that stands still: no worker ever goes silent, so a pass's decisions are
    # those of the records alone, whichever pass made them.
    return Scheduler(conf, RecordingState(), view, quarantine_s=lambda: 0.0,  # type: ignore[arg-type]
                     clock=lambda: 1000.0)


@pytest.fixture
def writes(monkeypatch) -> list[tuple[str, Assignment]]:
    got: list[tuple[str, Assignment]] = []
    monkeypatch.setattr("nimbus.master.scheduler.write_assignment",
                        lambda state, fence, topology_id, old, new: got.append((topology_id, new)))
    return got


def looked_at(caplog) -> list[int]:
    return [int(re.search(r"\((\d+) looked at\)", r.getMessage()).group(1))
            for r in caplog.records if "scheduler pass:" in r.getMessage()]


def test_a_pass_looks_only_at_topologies_not_at_rest_and_those_that_changed(writes, caplog):
    view = FakeView()
    view.supervisors_ = {"s1": SupervisorInfo(time_secs=1, hostname="h1", meta=[6700, 6701])}
    for i in range(500):
        view.set_storm(f"t{i}-1-1", StormBase(storm_name=f"t{i}", status=INACTIVE,
                                              launch_time_secs=i, num_workers=1))
        view.set_assignment(f"t{i}-1-1", Assignment(master_code_dir="/c"))
    view.set_storm("run-1-1", StormBase(storm_name="run", status=ACTIVE,
                                        launch_time_secs=1, num_workers=1))
    view.set_assignment("run-1-1", Assignment(master_code_dir="/c"))
    sched = scheduler(view)

    def run() -> None:
        applied = len(writes)
        sched.schedule(fence=None)  # type: ignore[arg-type]
        for topology_id, new in writes[applied:]:
            view.set_assignment(topology_id, new)  # the view hears the write

    with caplog.at_level(logging.DEBUG, logger="nimbus.master.scheduler"):
        run()  # every one, the first time
        run()  # the running one (its assignment was written, too)
        run()  # nothing changed: the running one
        view.set_storm("t7-1-1", replace(view.storms_["t7-1-1"], status=ACTIVE))
        run()  # it and t7
        view.notify("storms", "")  # the directory loaded again: every one
        run()
        sched.reset(successor=False)  # a new leadership: every one
        run()
    assert looked_at(caplog) == [501, 1, 1, 2, 501, 501]
    assert [t for t, _ in writes] == ["run-1-1", "t7-1-1"]


def test_a_pass_decides_what_a_pass_over_every_topology_decides(writes):
    """Random submits, kills, activations, resizes, supervisors coming and going and
    assignments changed behind the scheduler's back: after each, the scheduler that
    skips topologies at rest writes exactly what a new one (which looks at every
    topology) would."""
    rng = random.Random(27)
    view = FakeView()
    view.supervisors_ = {f"s{i}": SupervisorInfo(time_secs=1, hostname=f"h{i}",
                                                 meta=[6700, 6701]) for i in range(3)}
    kept = scheduler(view)
    for step in range(400):
        storms = sorted(view.storms_)
        kind = rng.randrange(7)
        if kind <= 1 or not storms:  # a submit, mostly inactive as in the fleet benchmark
            topology_id = f"t{step}-{rng.randrange(5)}-1"
            view.set_storm(topology_id, StormBase(
                storm_name=topology_id, status=rng.choice([INACTIVE, INACTIVE, ACTIVE]),
                launch_time_secs=rng.randrange(20), num_workers=rng.randint(0, 2)))
            view.set_assignment(topology_id, Assignment(master_code_dir="/c"))
        elif kind == 2:  # a kill's removal
            topology_id = rng.choice(storms)
            view.set_storm(topology_id, None)
            view.set_assignment(topology_id, None)
        elif kind == 3:  # activate, deactivate, resize
            topology_id = rng.choice(storms)
            view.set_storm(topology_id, replace(
                view.storms_[topology_id], status=rng.choice([ACTIVE, INACTIVE]),
                num_workers=rng.randint(0, 3)))
        elif kind == 4:  # a supervisor leaves or comes back
            name = f"s{rng.randrange(4)}"
            if name in view.supervisors_:
                view.supervisors_ = {k: v for k, v in view.supervisors_.items() if k != name}
            else:
                view.supervisors_ = {**view.supervisors_, name: SupervisorInfo(
                    time_secs=1, hostname=f"h{name}", meta=[6700, 6701])}
        elif kind == 5:  # an assignment emptied by someone else (an operator, a predecessor)
            topology_id = rng.choice(storms)
            view.set_assignment(topology_id, Assignment(master_code_dir="/c"))
        else:  # a submission in flight: a storm with no assignment yet
            topology_id = f"f{step}-1-1"
            view.set_storm(topology_id, StormBase(storm_name=topology_id, status=ACTIVE,
                                                  launch_time_secs=0, num_workers=1))
        writes.clear()
        scheduler(view).schedule(fence=None)  # type: ignore[arg-type]
        expected = {t: (a.executor_node_port, a.node_host) for t, a in writes}
        writes.clear()
        kept.schedule(fence=None)  # type: ignore[arg-type]
        got = {t: (a.executor_node_port, a.node_host) for t, a in writes}
        assert got == expected, f"step {step}"
        for topology_id, new in writes:
            view.set_assignment(topology_id, new)
    assert len(view.storms_) > 50


def test_an_assignment_judged_unchanged_is_the_one_a_pass_would_build():
    rng = random.Random(3)
    supervisors = {f"s{i}": SupervisorInfo(time_secs=1, hostname=f"h{i % 3}", meta=[1, 2])
                   for i in range(4)}
    for _ in range(2000):
        workers = {f"worker-{i}": Slot(f"s{rng.randrange(4)}", rng.choice([1, 2]))
                   for i in range(rng.randrange(4))}
        placed = {e: [s.supervisor_id, s.port] for e, s in workers.items()}
        old = Assignment(
            master_code_dir="/c",
            node_host={s.supervisor_id: supervisors[s.supervisor_id].hostname
                       for s in workers.values()},
            executor_node_port=placed,
            executor_start_time_secs={e: 5 for e in workers})
        # Perturb one thing, or nothing.
        kind = rng.randrange(6)
        if kind == 1 and placed:
            executor = rng.choice(sorted(placed))
            old = replace(old, executor_node_port={**placed, executor: [placed[executor][0], 9]})
        elif kind == 2:
            old = replace(old, node_host={**old.node_host, "gone": "h9"})
        elif kind == 3 and placed:
            executor = rng.choice(sorted(placed))
            old = replace(old, executor_start_time_secs={
                e: t for e, t in old.executor_start_time_secs.items() if e != executor})
        elif kind == 4 and old.node_host:
            host = rng.choice(sorted(old.node_host))
            old = replace(old, node_host={**old.node_host, host: "renamed"})
        elif kind == 5:
            old = replace(old, executor_start_time_secs={**old.executor_start_time_secs,
                                                         "worker-9": 1})
        built = Scheduler._assignment(old, workers, supervisors)
        if Scheduler._unchanged(old, workers, supervisors):
            assert built == old, (kind, old, workers)


def test_topologies_at_rest_cost_no_write_and_a_new_active_one_is_placed(writes):
    view = FakeView()
    view.supervisors_ = {"s1": SupervisorInfo(time_secs=1, hostname="h1", meta=[6700, 6701])}
    view.storms_ = {f"t{i}-1-1": StormBase(storm_name=f"t{i}", status=INACTIVE,
                                           launch_time_secs=i, num_workers=1)
                    for i in range(500)}
    view.assignments_ = {t: Assignment(master_code_dir="/c") for t in view.storms_}
    sched = scheduler(view)
    assert sched.schedule(fence=None) == {}  # type: ignore[arg-type]
    assert writes == []
    view.set_storm("new-9-9", StormBase(storm_name="new", status=ACTIVE,
                                        launch_time_secs=999, num_workers=1))
    view.set_assignment("new-9-9", Assignment(master_code_dir="/c"))
    got = sched.schedule(fence=None)  # type: ignore[arg-type]
    assert list(got) == ["new-9-9"] and [t for t, _ in writes] == ["new-9-9"]
    assert got["new-9-9"].executor_node_port == {"worker-0": ["s1", 6700]}


def test_a_pass_never_changes_the_views_shared_supervisors():
    """A supervisor in ZooKeeper but not yet in the view is added to the pass's own copy
    (its work stays), never to the dict every reader of the view shares."""
    view = FakeView()
    shared = {"s1": SupervisorInfo(time_secs=1, hostname="h1", meta=[6700])}
    view.supervisors_ = shared
    view.storms_ = {"t-1-1": StormBase(storm_name="t", status=ACTIVE, launch_time_secs=1,
                                       num_workers=1)}
    view.assignments_ = {"t-1-1": Assignment(
        master_code_dir="/c", node_host={"s2": "h2"},
        executor_node_port={"worker-0": ["s2", 6700]},
        executor_start_time_secs={"worker-0": 5})}
    sched = scheduler(view)
    sched._state.supervisor_info = lambda sid: SupervisorInfo(  # type: ignore[attr-defined]
        time_secs=1, hostname="h2", meta=[6700]) if sid == "s2" else None
    assert sched.schedule(fence=None) == {}  # type: ignore[arg-type]
    assert list(shared) == ["s1"], "the view's dict was changed"
