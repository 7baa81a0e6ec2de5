"""The leader's scheduler against a real ZooKeeper.

Supervisors and workers are played by kazoo clients of their own doing exactly what those
daemons do in ZooKeeper (an ephemeral SupervisorInfo per session, heartbeat writes); the
leader's clock is a fake one, so that timeouts are exact and nothing sleeps.
"""

from __future__ import annotations

import re

import pytest
from faults import expire_session
from waiting import wait_for

from nimbus.config import load_config
from nimbus.master.elector import LeaderElector
from nimbus.master.scheduler import Scheduler
from nimbus.state.cluster_state import NotLeaderError, StormClusterState
from nimbus.state.cluster_view import ClusterView
from nimbus.state.records import ACTIVE, INACTIVE, KILLED, Assignment, StormBase, SupervisorInfo

pytestmark = pytest.mark.zookeeper
TIMEOUT_S, LAUNCH_S = 30, 120


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def cluster(make_zk, zk_root):
    """(state, fence, make scheduler, add supervisor, add topology, beat) on a real ZK."""
    state = StormClusterState(make_zk(), zk_root)
    state.setup()
    elector = LeaderElector(state.zk, state, "127.0.0.1:1")
    elector.add_to_leader_lock_queue()
    # Its steps taken here, as a nimbus's cycle would, with a complete code check.
    wait_for(lambda: elector.step(True).leadership is not None, 10,
             "the test's nimbus to lead")
    conf = load_config(overrides={"nimbus.task.timeout.secs": TIMEOUT_S,
                                  "nimbus.task.launch.secs": LAUNCH_S}, extra_defaults={})
    clock = FakeClock()
    supervisors = {}
    view = ClusterView(state)
    view.start()

    def scheduler(quarantine_s: float = 0.0) -> Scheduler:
        # No release quarantine unless a test asks for one: the fake clock stands still,
        # so a quarantine ends only when the test moves the clock.
        return Scheduler(conf, state, view, quarantine_s=lambda: quarantine_s, clock=clock)

    def add_supervisor(sid: str, ports: list[int]) -> StormClusterState:
        own = StormClusterState(make_zk(), zk_root)
        own.supervisor_heartbeat(sid, SupervisorInfo(time_secs=1, hostname=f"host-{sid}",
                                                     meta=ports))
        supervisors[sid] = own
        return own

    def add_topology(topology_id: str, workers: int, launched: int = 1) -> None:
        fence = elector.fence()
        state.activate_storm(fence, topology_id, StormBase(
            storm_name=topology_id.rsplit("-", 2)[0], launch_time_secs=launched,
            status=ACTIVE, num_workers=workers), Assignment(master_code_dir="/code"))

    def beat(topology_id: str, sid: str, port: int) -> None:
        supervisors[sid].worker_heartbeat(topology_id, sid, port, b"{}")

    yield state, elector, clock, scheduler, add_supervisor, add_topology, beat
    elector.stop()
    view.close()


def slots(state: StormClusterState, topology_id: str) -> dict[str, tuple[str, int]]:
    return {e: (n, p) for e, (n, p) in
            state.assignment_info(topology_id).executor_node_port.items()}


def test_workers_are_spread_over_supervisors(cluster):
    state, elector, _, scheduler, add_supervisor, add_topology, _ = cluster
    add_supervisor("s1", [6700, 6701])
    add_supervisor("s2", [6700, 6701])
    add_topology("a-1-1", workers=2, launched=1)
    add_topology("b-2-2", workers=2, launched=2)
    written = scheduler().schedule(elector.fence())
    assert set(written) == {"a-1-1", "b-2-2"}
    assert slots(state, "a-1-1") == {"worker-0": ("s1", 6700), "worker-1": ("s2", 6700)}
    assert slots(state, "b-2-2") == {"worker-0": ("s1", 6701), "worker-1": ("s2", 6701)}
    assert state.assignment_info("a-1-1").node_host == {"s1": "host-s1", "s2": "host-s2"}
    assert state.assignment_info("a-1-1").master_code_dir == "/code"


def test_a_pass_with_nothing_to_change_writes_nothing(cluster):
    _, elector, _, scheduler, add_supervisor, add_topology, _ = cluster
    add_supervisor("s1", [6700])
    add_topology("a-1-1", workers=1)
    sched = scheduler()
    assert set(sched.schedule(elector.fence())) == {"a-1-1"}
    assert sched.schedule(elector.fence()) == {}


def test_each_pass_logs_its_size_and_duration(cluster, caplog, monkeypatch):
    # The timing line benchmarks/bench_scale.py reads: DEBUG, INFO once a pass is slow.
    _, elector, _, scheduler, add_supervisor, add_topology, _ = cluster
    add_supervisor("s1", [6700])
    add_topology("a-1-1", workers=1)
    sched = scheduler()
    with caplog.at_level("DEBUG", logger="nimbus.master.scheduler"):
        sched.schedule(elector.fence())
        monkeypatch.setattr(Scheduler, "SLOW_PASS_S", 0.0)
        sched.schedule(elector.fence())
    passes = [r for r in caplog.records if "scheduler pass:" in r.getMessage()]
    assert [r.levelname for r in passes] == ["DEBUG", "INFO"]
    assert re.fullmatch(r"scheduler pass: 1 topologies, 1 supervisors, 1 assignments written "
                        r"in [\d.]+ ms \(1 looked at\)", passes[0].getMessage())
    assert "0 assignments written" in passes[1].getMessage()


def test_workers_of_an_ended_session_move_and_the_others_stay(cluster, zk_server):
    state, elector, _, scheduler, add_supervisor, add_topology, _ = cluster
    add_supervisor("s1", [6700])
    doomed = add_supervisor("s2", [6700])
    add_supervisor("s3", [6700])
    add_topology("a-1-1", workers=2)
    sched = scheduler()
    sched.schedule(elector.fence())
    before = slots(state, "a-1-1")
    assert before == {"worker-0": ("s1", 6700), "worker-1": ("s2", 6700)}
    started = dict(state.assignment_info("a-1-1").executor_start_time_secs)
    # Only a session that really ended moves work: the supervisor's node is ephemeral.
    expire_session(doomed.zk, zk_server.hosts)
    wait_for(lambda: "s2" not in state.supervisors(), 10, "s2's node to go")
    sched.schedule(elector.fence())
    assert slots(state, "a-1-1") == {"worker-0": ("s1", 6700), "worker-1": ("s3", 6700)}
    after = state.assignment_info("a-1-1").executor_start_time_secs
    assert after["worker-0"] == started["worker-0"], "the healthy worker was not restarted"


def test_a_silent_worker_moves_after_the_timeout_and_a_beating_one_never(cluster):
    state, elector, clock, scheduler, add_supervisor, add_topology, beat = cluster
    add_supervisor("s1", [6700, 6701])
    add_supervisor("s2", [6700])
    add_topology("a-1-1", workers=2)
    sched = scheduler()
    sched.schedule(elector.fence())
    assert slots(state, "a-1-1") == {"worker-0": ("s1", 6700), "worker-1": ("s2", 6700)}
    beat("a-1-1", "s1", 6700)
    beat("a-1-1", "s2", 6700)
    sched.schedule(elector.fence())
    for _ in range(3):  # worker-0 keeps beating, worker-1 has stopped
        clock.now += TIMEOUT_S / 2
        beat("a-1-1", "s1", 6700)
        sched.schedule(elector.fence())
    assert slots(state, "a-1-1") == {"worker-0": ("s1", 6700), "worker-1": ("s1", 6701)}


def test_a_new_leader_measures_heartbeats_afresh(cluster):
    """After a failover nothing moves that the new leader has not itself seen go silent:
    heartbeat data and start times written long ago mean nothing to it."""
    state, elector, clock, scheduler, add_supervisor, add_topology, beat = cluster
    add_supervisor("s1", [6700])
    add_supervisor("s2", [6700])
    add_topology("a-1-1", workers=1)
    scheduler().schedule(elector.fence())
    beat("a-1-1", "s1", 6700)
    clock.now += 10 * TIMEOUT_S  # the old leader is gone; time passes
    new_leader = scheduler()
    assert new_leader.schedule(elector.fence()) == {}
    clock.now += TIMEOUT_S - 1
    beat("a-1-1", "s1", 6700)
    assert new_leader.schedule(elector.fence()) == {}
    clock.now += TIMEOUT_S - 1
    assert new_leader.schedule(elector.fence()) == {}, "still within the timeout"
    clock.now += 2
    assert set(new_leader.schedule(elector.fence())) == {"a-1-1"}
    assert slots(state, "a-1-1") == {"worker-0": ("s2", 6700)}


def test_a_worker_gets_the_launch_time_for_its_first_heartbeat(cluster):
    state, elector, clock, scheduler, add_supervisor, add_topology, _ = cluster
    add_supervisor("s1", [6700])
    add_supervisor("s2", [6700])
    add_topology("a-1-1", workers=1)
    sched = scheduler()
    sched.schedule(elector.fence())
    clock.now += LAUNCH_S
    assert sched.schedule(elector.fence()) == {}, "never beat yet, but within the launch time"
    clock.now += 1
    sched.schedule(elector.fence())
    assert slots(state, "a-1-1") == {"worker-0": ("s2", 6700)}


def test_killed_topology_loses_its_workers_and_rebalance_resizes(cluster):
    state, elector, _, scheduler, add_supervisor, add_topology, _ = cluster
    add_supervisor("s1", [6700, 6701, 6702])
    add_topology("a-1-1", workers=3)
    add_topology("b-2-2", workers=1, launched=2)
    sched = scheduler()
    sched.schedule(elector.fence())
    assert len(slots(state, "a-1-1")) == 3 and slots(state, "b-2-2") == {}, \
        "slots ran out: the oldest topology keeps its workers"
    base, version = state.storm_base_versioned("a-1-1")
    state.update_storm(elector.fence(), "a-1-1",
                       StormBase(**{**base.__dict__, "num_workers": 1}), version)
    sched.schedule(elector.fence())
    assert slots(state, "a-1-1") == {"worker-0": ("s1", 6700)}
    assert slots(state, "b-2-2") == {"worker-0": ("s1", 6701)}
    base, version = state.storm_base_versioned("b-2-2")
    state.update_storm(elector.fence(), "b-2-2",
                       StormBase(**{**base.__dict__, "status": KILLED}), version)
    sched.schedule(elector.fence())
    assert slots(state, "b-2-2") == {}


def test_deactivate_frees_the_slots_and_activate_takes_them_again(cluster):
    """Only ACTIVE topologies run: an INACTIVE one keeps no slot (its queries stop, its
    checkpoints stay), so another topology can use the slot meanwhile."""
    state, elector, _, scheduler, add_supervisor, add_topology, _ = cluster
    add_supervisor("s1", [6700])
    add_topology("a-1-1", workers=1)
    add_topology("b-2-2", workers=1, launched=2)
    sched = scheduler()
    sched.schedule(elector.fence())
    assert slots(state, "a-1-1") == {"worker-0": ("s1", 6700)} and slots(state, "b-2-2") == {}

    def set_status(topology_id: str, status: str) -> None:
        base, version = state.storm_base_versioned(topology_id)
        state.update_storm(elector.fence(), topology_id,
                           StormBase(**{**base.__dict__, "status": status}), version)

    set_status("a-1-1", INACTIVE)
    sched.schedule(elector.fence())
    assert slots(state, "a-1-1") == {} and slots(state, "b-2-2") == {"worker-0": ("s1", 6700)}
    set_status("a-1-1", ACTIVE)
    set_status("b-2-2", INACTIVE)
    sched.schedule(elector.fence())
    assert slots(state, "a-1-1") == {"worker-0": ("s1", 6700)} and slots(state, "b-2-2") == {}


def test_a_deposed_leader_assigns_nothing(cluster, zk_server):
    state, elector, _, scheduler, add_supervisor, add_topology, _ = cluster
    add_supervisor("s1", [6700])
    add_topology("a-1-1", workers=1)
    fence = elector.fence()
    expire_session(state.zk, zk_server.hosts)
    wait_for(lambda: state.zk.connected, 15, "reconnection with a new session")
    with pytest.raises(NotLeaderError):
        scheduler().schedule(fence)
    assert slots(state, "a-1-1") == {}


# -- release quarantine (issue 18: a worker runs only while it is assigned) ----------------

def _set_status(state, elector, topology_id: str, status: str) -> None:
    base, version = state.storm_base_versioned(topology_id)
    state.update_storm(elector.fence(), topology_id,
                       StormBase(**{**base.__dict__, "status": status}), version)


def test_work_taken_off_a_live_supervisor_goes_elsewhere_only_after_its_lease(cluster):
    """Deactivated and activated again while the old worker may still run (its supervisor
    lives, but may not have heard): back on its own slot at once if that is free, on
    another slot only once the longest lease the old worker can hold has run out."""
    state, elector, clock, scheduler, add_supervisor, add_topology, _ = cluster
    add_supervisor("s1", [6700])
    add_supervisor("s2", [6700])
    add_topology("b-1-1", workers=1, launched=1)
    add_topology("a-2-2", workers=1, launched=2)
    _set_status(state, elector, "b-1-1", INACTIVE)
    sched = scheduler(quarantine_s=2.0)
    sched.schedule(elector.fence())
    assert slots(state, "a-2-2") == {"worker-0": ("s1", 6700)}

    _set_status(state, elector, "a-2-2", INACTIVE)
    sched.schedule(elector.fence())
    assert slots(state, "a-2-2") == {}
    # Active again at once: its own slot is free, so it goes back there.
    _set_status(state, elector, "a-2-2", ACTIVE)
    clock.now += 0.5
    sched.schedule(elector.fence())
    assert slots(state, "a-2-2") == {"worker-0": ("s1", 6700)}

    _set_status(state, elector, "a-2-2", INACTIVE)
    sched.schedule(elector.fence())
    _set_status(state, elector, "b-1-1", ACTIVE)   # the older topology takes s1:6700 first
    _set_status(state, elector, "a-2-2", ACTIVE)
    clock.now += 1.0
    sched.schedule(elector.fence())
    assert slots(state, "b-1-1") == {"worker-0": ("s1", 6700)}
    assert slots(state, "a-2-2") == {}, "placed on s2 while the s1 worker's lease may run"
    assert sched.next_release_s() == pytest.approx(1.0)
    assert sched.last_release_s() == pytest.approx(1.0)
    clock.now += 1.0
    sched.schedule(elector.fence())
    assert slots(state, "a-2-2") == {"worker-0": ("s2", 6700)}


def test_work_of_an_ended_session_moves_at_once(cluster, zk_server):
    """A supervisor whose session ended has stopped its workers already (their leases
    ended before the session could): no quarantine."""
    state, elector, clock, scheduler, add_supervisor, add_topology, _ = cluster
    add_supervisor("s1", [6700])
    doomed = add_supervisor("s2", [6700])
    add_topology("a-1-1", workers=2)
    sched = scheduler(quarantine_s=2.0)
    sched.schedule(elector.fence())
    assert slots(state, "a-1-1") == {"worker-0": ("s1", 6700), "worker-1": ("s2", 6700)}
    add_supervisor("s3", [6700])
    expire_session(doomed.zk, zk_server.hosts)
    wait_for(lambda: "s2" not in state.supervisors(), 10, "s2's node to go")
    sched.schedule(elector.fence())
    assert slots(state, "a-1-1") == {"worker-0": ("s1", 6700), "worker-1": ("s3", 6700)}


def test_a_supervisor_missing_from_the_view_only_keeps_its_work(cluster, monkeypatch):
    """The view applies a restarted supervisor's node replacement (one transaction) as a
    delete and then a create: a pass in between must not take the node to be gone."""
    state, elector, clock, scheduler, add_supervisor, add_topology, _ = cluster
    add_supervisor("s1", [6700])
    add_supervisor("s2", [6700])
    add_topology("a-1-1", workers=2)
    sched = scheduler(quarantine_s=2.0)
    sched.schedule(elector.fence())
    before = slots(state, "a-1-1")
    assert set(before.values()) == {("s1", 6700), ("s2", 6700)}
    add_supervisor("s3", [6700])
    view = sched._view
    seen = view.supervisors
    monkeypatch.setattr(view, "supervisors",
                        lambda: {k: v for k, v in seen().items() if k != "s2"})
    sched.schedule(elector.fence())
    assert slots(state, "a-1-1") == before


def take_over(state: StormClusterState, scheduler, removed_early: bool = True,
              successor: bool = True) -> Scheduler:
    """A new leader's scheduler (a 2 s quarantine). ``removed_early``: the predecessor's
    lock node was removed by its restarted nimbus, which marks the removal."""
    if removed_early:
        state.zk.set(state.leader_lock_path, StormClusterState.REMOVED_EARLY)
    sched = scheduler(quarantine_s=2.0)
    sched.reset(successor=successor)
    return sched


def test_after_an_early_removal_a_successor_holds_unplaced_work_for_a_quarantine(cluster):
    """The dead leader may have taken the work off a live supervisor just before it died:
    where that worker ran, and how long its lease may run, a successor cannot know."""
    state, elector, clock, scheduler, add_supervisor, add_topology, _ = cluster
    add_supervisor("s1", [6700])
    add_topology("a-1-1", workers=1)
    successor = take_over(state, scheduler)
    assert successor.schedule(elector.fence()) == {}
    assert not state.lock_nodes_removed_early(), "the mark is cleared once read"
    assert successor.next_release_s() == pytest.approx(2.0)
    clock.now += 1.9
    assert successor.schedule(elector.fence()) == {}
    clock.now += 0.1
    assert set(successor.schedule(elector.fence())) == {"a-1-1"}
    assert slots(state, "a-1-1") == {"worker-0": ("s1", 6700)}


def test_the_hold_covers_work_that_becomes_wanted_during_it(cluster):
    """Deactivated by the dead leader, activated again after the takeover: still held."""
    state, elector, clock, scheduler, add_supervisor, add_topology, _ = cluster
    add_supervisor("s1", [6700])
    add_topology("a-1-1", workers=1)
    _set_status(state, elector, "a-1-1", INACTIVE)
    successor = take_over(state, scheduler)
    assert successor.schedule(elector.fence()) == {}
    _set_status(state, elector, "a-1-1", ACTIVE)
    clock.now += 1.0
    assert successor.schedule(elector.fence()) == {}
    clock.now += 1.0
    assert set(successor.schedule(elector.fence())) == {"a-1-1"}


def test_a_first_pass_that_fails_keeps_the_hold(cluster, monkeypatch):
    state, elector, clock, scheduler, add_supervisor, add_topology, _ = cluster
    add_supervisor("s1", [6700])
    add_topology("a-1-1", workers=1)
    successor = take_over(state, scheduler)
    real = state.lock_nodes_removed_early
    monkeypatch.setattr(state, "lock_nodes_removed_early",
                        lambda: (_ for _ in ()).throw(ConnectionError("blip")))
    with pytest.raises(ConnectionError):
        successor.schedule(elector.fence())
    monkeypatch.setattr(state, "lock_nodes_removed_early", real)
    clock.now += 1.0
    assert successor.schedule(elector.fence()) == {}, "held: counted from the takeover"
    clock.now += 1.0
    assert set(successor.schedule(elector.fence())) == {"a-1-1"}


def test_a_successor_without_an_early_removal_places_at_once(cluster):
    """Its predecessor's session expired (T after its last write) or it handed over
    after waiting out its releases: nothing to wait for."""
    state, elector, clock, scheduler, add_supervisor, add_topology, _ = cluster
    add_supervisor("s1", [6700])
    add_topology("a-1-1", workers=1)
    successor = take_over(state, scheduler, removed_early=False)
    assert set(successor.schedule(elector.fence())) == {"a-1-1"}
    assert successor.next_release_s() is None


def test_leadership_claimed_again_on_the_same_lock_node_places_at_once(cluster):
    """No other nimbus can have led while this one's node headed the queue."""
    state, elector, clock, scheduler, add_supervisor, add_topology, _ = cluster
    add_supervisor("s1", [6700])
    add_topology("a-1-1", workers=1)
    sched = take_over(state, scheduler, successor=False)
    assert set(sched.schedule(elector.fence())) == {"a-1-1"}
    assert sched.next_release_s() is None


def test_a_successor_moves_work_of_an_ended_session_at_once(cluster, zk_server):
    """Placed on a supervisor whose session ended is not unplaced: no hold."""
    state, elector, clock, scheduler, add_supervisor, add_topology, _ = cluster
    doomed = add_supervisor("s1", [6700])
    add_topology("a-1-1", workers=1)
    scheduler().schedule(elector.fence())
    assert slots(state, "a-1-1") == {"worker-0": ("s1", 6700)}
    add_supervisor("s2", [6700])
    expire_session(doomed.zk, zk_server.hosts)
    wait_for(lambda: "s1" not in state.supervisors(), 10, "s1's node to go")
    successor = take_over(state, scheduler)
    assert set(successor.schedule(elector.fence())) == {"a-1-1"}
    assert slots(state, "a-1-1") == {"worker-0": ("s2", 6700)}


def test_a_silent_worker_goes_elsewhere_only_after_its_lease(cluster):
    """A silent worker may be hung, not gone: its supervisor lives and renews its lease
    until it reads the change, so the work waits out a release quarantine."""
    state, elector, clock, scheduler, add_supervisor, add_topology, beat = cluster
    add_supervisor("s1", [6700])
    add_topology("a-1-1", workers=1)
    sched = scheduler(quarantine_s=2.0)
    sched.schedule(elector.fence())
    assert slots(state, "a-1-1") == {"worker-0": ("s1", 6700)}
    add_supervisor("s2", [6700])
    beat("a-1-1", "s1", 6700)
    sched.schedule(elector.fence())
    clock.now += TIMEOUT_S + 1
    assert set(sched.schedule(elector.fence())) == {"a-1-1"}
    assert slots(state, "a-1-1") == {}, "placed elsewhere while the old lease may run"
    clock.now += 2.0
    sched.schedule(elector.fence())
    assert slots(state, "a-1-1") == {"worker-0": ("s2", 6700)}
