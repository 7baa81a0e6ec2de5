"""Where each worker has run (nimbus.master.placement_history): the pure rule, then the
leader's scheduler writing it on a real ZooKeeper, fenced, in the assignment's own
transaction, only when a placement changes, and the node removed with the topology.
"""

from __future__ import annotations

import pytest
from faults import expire_session
from test_scheduler import _set_status, cluster, slots  # noqa: F401 - cluster: a fixture
from waiting import wait_for

from nimbus.master import placement_history as ph
from nimbus.state import runtime_view
from nimbus.state.cluster_state import NotLeaderError
from nimbus.state.records import (
    ACTIVE,
    INACTIVE,
    Assignment,
    PlacementHistory,
    RecordError,
    StormBase,
)


def assignment(start: int, **slots_of: tuple[str, int]) -> Assignment:
    """worker_0=("s1", 6700) -> worker-0 on s1:6700, placed at ``start``."""
    placed = {name.replace("_", "-"): [sid, port] for name, (sid, port) in slots_of.items()}
    return Assignment(master_code_dir="/code",
                      node_host={sid: f"host-{sid}" for sid, _ in placed.values()},
                      executor_node_port=placed,
                      executor_start_time_secs={name: start for name in placed})


EMPTY = Assignment(master_code_dir="/code")


def entry(sid: str, port: int, since: int, until: int = 0) -> dict:
    return {"supervisor_id": sid, "host": f"host-{sid}", "port": port, "since_secs": since,
            "until_secs": until}


def test_a_move_closes_the_old_placement_and_opens_a_new_one():
    first = assignment(100, worker_0=("s1", 6700), worker_1=("s2", 6700))
    history = ph.advance(None, EMPTY, first, now_secs=100)
    assert history.workers == {"worker-0": [entry("s1", 6700, 100)],
                               "worker-1": [entry("s2", 6700, 100)]}
    moved = assignment(200, worker_0=("s1", 6700), worker_1=("s3", 6701))
    moved.executor_start_time_secs["worker-0"] = 100   # it stayed: its start is kept
    history = ph.advance(history, first, moved, now_secs=200)
    assert history.workers == {
        "worker-0": [entry("s1", 6700, 100)],
        "worker-1": [entry("s2", 6700, 100, 200), entry("s3", 6701, 200)]}
    # Unchanged placements: nothing to write.
    assert ph.advance(history, moved, moved, now_secs=300) is None
    # Deactivated: every open placement ends; activated again: new ones.
    off = ph.advance(history, moved, EMPTY, now_secs=400)
    assert [e["until_secs"] for e in off.workers["worker-0"]] == [400]
    back = ph.advance(off, EMPTY, assignment(500, worker_0=("s1", 6700)), now_secs=500)
    assert back.workers["worker-0"] == [entry("s1", 6700, 100, 400), entry("s1", 6700, 500)]
    assert runtime_view.placements_of(back, "worker-0")[0] == entry("s1", 6700, 500)


def test_a_history_stays_bounded():
    history = None
    old = EMPTY
    for i in range(50):   # one worker moved 50 times
        new = assignment(i, worker_0=(f"s{i % 3}", 6700 + i))
        history = ph.advance(history, old, new, now_secs=i)
        old = new
    assert len(history.workers["worker-0"]) == ph.MAX_PER_WORKER
    assert history.workers["worker-0"][-1]["port"] == 6749
    big = assignment(1, **{f"worker_{i}": ("s1", 1000 + i) for i in range(3000)})
    history = ph.advance(None, EMPTY, big, now_secs=1)
    assert sum(len(e) for e in history.workers.values()) <= ph.MAX_ENTRIES
    assert len(PlacementHistory.decode(history.encode()).workers) == ph.MAX_ENTRIES


@pytest.mark.parametrize("data", [
    b'{"format": 1, "workers": {"w0": []}}',
    b'{"format": 1, "workers": {"worker-0": [{"host": "h"}]}}',
    b'{"format": 1, "workers": {"worker-0": [{"supervisor_id": "s", "host": "h", '
    b'"port": true, "since_secs": 1, "until_secs": 0}]}}',
    b'{"format": 2, "workers": {}}'])
def test_a_history_this_release_cannot_use_is_refused(data):
    with pytest.raises(RecordError):
        PlacementHistory.decode(data)


def test_the_leader_records_placements_with_its_assignments_and_removes_them(cluster):  # noqa: F811
    state, elector, _, scheduler, add_supervisor, add_topology, _ = cluster
    add_supervisor("s1", [6700, 6701])
    add_supervisor("s2", [6700])
    add_topology("a-1-1", workers=2)
    sched = scheduler()
    sched.schedule(elector.fence())
    history, version = state.placement_history("a-1-1")
    placed = slots(state, "a-1-1")
    assert {w: [(e["supervisor_id"], e["port"], e["until_secs"]) for e in entries]
            for w, entries in history.workers.items()} == {
        w: [(sid, port, 0)] for w, (sid, port) in placed.items()}
    # A pass that changes nothing writes nothing: the node keeps its version.
    assert sched.schedule(elector.fence()) == {}
    assert state.placement_history("a-1-1")[1] == version
    # Deactivated: the placements end; what topology-info shows, newest first.
    _set_status(state, elector, "a-1-1", INACTIVE)
    sched.schedule(elector.fence())
    assert slots(state, "a-1-1") == {}
    _set_status(state, elector, "a-1-1", ACTIVE)
    sched.schedule(elector.fence())
    assert len(slots(state, "a-1-1")) == 2
    info = runtime_view.topology_info(state, "a-1-1")
    for worker in info["workers"]:
        newest, previous = worker["placements"][:2]
        assert newest["until_secs"] == 0 and previous["until_secs"] > 0
        assert (newest["supervisor_id"], newest["port"]) == (worker["supervisor_id"],
                                                             worker["port"])
        assert newest["host"] == f"host-{worker['supervisor_id']}"
    # Removed with the topology.
    state.remove_storm(elector.fence(), "a-1-1")
    assert state.zk.exists(state.placements_path("a-1-1")) is None


def test_an_unreadable_history_is_left_alone_and_the_assignment_still_written(cluster):  # noqa: F811
    state, elector, _, scheduler, add_supervisor, add_topology, _ = cluster
    add_supervisor("s1", [6700])
    add_topology("a-1-1", workers=1)
    state.zk.create(state.placements_path("a-1-1"), b'{"format": 9}')
    scheduler().schedule(elector.fence())
    assert slots(state, "a-1-1") == {"worker-0": ("s1", 6700)}
    assert state.zk.get(state.placements_path("a-1-1"))[0] == b'{"format": 9}'
    assert runtime_view.topology_info(state, "a-1-1")["workers"][0]["placements"] == []


def test_a_deposed_leader_records_no_placement(cluster, zk_server):  # noqa: F811
    state, elector, _, scheduler, add_supervisor, add_topology, _ = cluster
    add_supervisor("s1", [6700])
    add_topology("a-1-1", workers=1)
    fence = elector.fence()
    expire_session(state.zk, zk_server.hosts)
    wait_for(lambda: state.zk.connected, 15, "reconnection with a new session")
    with pytest.raises(NotLeaderError):
        ph.write_assignment(state, fence, "a-1-1", EMPTY,
                            assignment(1, worker_0=("s1", 6700)))
    assert state.placement_history("a-1-1") == (None, None)
    assert slots(state, "a-1-1") == {}


def test_topologies_placed_by_an_earlier_release_get_a_history_from_their_next_change(
        cluster):  # noqa: F811
    state, elector, _, scheduler, add_supervisor, add_topology, _ = cluster
    add_supervisor("s1", [6700, 6701])
    state.activate_storm(elector.fence(), "old-1-1", StormBase(
        storm_name="old", launch_time_secs=1, status=ACTIVE, num_workers=2),
        assignment(50, worker_0=("s1", 6700)))
    scheduler().schedule(elector.fence())   # worker-1 is placed now; worker-0 stays
    history, _version = state.placement_history("old-1-1")
    assert history.workers["worker-0"] == [entry("s1", 6700, 50)]
    assert [(e["port"], e["until_secs"]) for e in history.workers["worker-1"]] == [(6701, 0)]
