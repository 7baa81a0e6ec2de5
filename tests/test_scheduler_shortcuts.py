"""The scheduler's shortcuts at fleet size, against a fake in-memory view (speed): the age
order kept incrementally equals a full sort, an Assignment judged unchanged is exactly
the one a pass would have built, and a topology at rest costs no write."""

from __future__ import annotations

import random
from dataclasses import replace

from nimbus.config import load_config
from nimbus.master.scheduler import Scheduler, Slot
from nimbus.state.records import ACTIVE, INACTIVE, Assignment, StormBase, SupervisorInfo


class FakeView:
    """What a pass reads: shared dicts replaced (never changed) on each change, as the
    real view's are."""

    def __init__(self) -> None:
        self.storms_: dict[str, StormBase] = {}
        self.assignments_: dict[str, Assignment] = {}
        self.supervisors_: dict[str, SupervisorInfo] = {}

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


def scheduler(view: FakeView) -> Scheduler:
    conf = load_config(overrides={}, extra_defaults={})
    return Scheduler(conf, RecordingState(), view, quarantine_s=lambda: 0.0)  # type: ignore[arg-type]


def test_the_age_order_kept_incrementally_is_a_full_sort():
    rng = random.Random(9)
    view = FakeView()
    sched = scheduler(view)
    for step in range(300):
        storms = dict(view.storms_)
        if storms and rng.random() < 0.3:
            for topology_id in rng.sample(sorted(storms), k=min(len(storms), rng.randint(1, 3))):
                del storms[topology_id]
        for _ in range(rng.choice([1, 1, 2, 70])):  # now and then more than a bisect's worth
            topology_id = f"t{rng.randrange(10**6)}-{step}-1"
            storms[topology_id] = StormBase(storm_name=topology_id, status=INACTIVE,
                                            launch_time_secs=rng.randrange(50), num_workers=1)
        view.storms_ = storms
        expected = sorted(storms, key=lambda t: (storms[t].launch_time_secs, t))
        got = sched._topologies()
        assert list(got) == expected, f"step {step}"
        assert all(got[t] is storms[t] for t in storms)


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


def test_topologies_at_rest_cost_no_write_and_a_new_active_one_is_placed(monkeypatch):
    view = FakeView()
    view.supervisors_ = {"s1": SupervisorInfo(time_secs=1, hostname="h1", meta=[6700, 6701])}
    view.storms_ = {f"t{i}-1-1": StormBase(storm_name=f"t{i}", status=INACTIVE,
                                           launch_time_secs=i, num_workers=1)
                    for i in range(500)}
    view.assignments_ = {t: Assignment(master_code_dir="/c") for t in view.storms_}
    sched = scheduler(view)
    written: list[str] = []
    monkeypatch.setattr("nimbus.master.scheduler.write_assignment",
                        lambda state, fence, topology_id, old, new: written.append(topology_id))
    assert sched.schedule(fence=None) == {}  # type: ignore[arg-type]
    assert written == []
    view.storms_ = {**view.storms_, "new-9-9": StormBase(
        storm_name="new", status=ACTIVE, launch_time_secs=999, num_workers=1)}
    view.assignments_ = {**view.assignments_, "new-9-9": Assignment(master_code_dir="/c")}
    got = sched.schedule(fence=None)  # type: ignore[arg-type]
    assert list(got) == ["new-9-9"] and written == ["new-9-9"]
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
