"""The leader's index of each supervisor's work, and a supervisor's reader of its own
assignments, against a real ZooKeeper: what the leader writes (fenced, converging), and
what a supervisor reads per assignment change (its own topologies only)."""

from __future__ import annotations

import threading

import pytest
from waiting import wait_until

from nimbus.master.assignment_index import AssignmentIndex
from nimbus.state.cluster_state import NotLeaderError, StormClusterState
from nimbus.state.cluster_view import ClusterView
from nimbus.state.records import INACTIVE, Assignment, StormBase, SupervisorAssignments
from nimbus.supervisor.own_assignments import OwnAssignments, assignment_reader


@pytest.fixture
def view(make_zk, zk_root, writer):
    made = ClusterView(StormClusterState(make_zk(), zk_root), name="test")
    made.start()
    yield made
    made.close()


def tid(i: int) -> str:
    return f"t{i}-1-1700000000"


def place(writer, fence, topology_id: str, slots: dict[str, list]) -> None:
    assignment = Assignment(master_code_dir="/code", executor_node_port=slots)
    if writer.zk.exists(writer.path("assignments", topology_id)):
        writer.zk.set(writer.path("assignments", topology_id), assignment.encode())
        return
    writer.activate_storm(fence, topology_id, StormBase(topology_id, 1, INACTIVE, 1),
                          assignment)


def index(writer, supervisor_id: str) -> list[str] | None:
    path = writer.supervisor_index_path(supervisor_id)
    if not writer.zk.exists(path):
        return None
    return SupervisorAssignments.decode(writer.zk.get(path)[0]).topologies


def test_the_index_follows_the_assignments(writer, fence, view):
    place(writer, fence, tid(1), {"worker-0": ["a", 1], "worker-1": ["b", 2]})
    place(writer, fence, tid(2), {"worker-0": ["a", 3]})
    built = AssignmentIndex(writer, view)
    assert built.sync(fence, fresh=True) == 2
    assert (index(writer, "a"), index(writer, "b")) == ([tid(1), tid(2)], [tid(1)])
    assert built.sync(fence, fresh=True) == 0, "nothing differs: nothing written"
    # A move (a's share of t1 goes to c), and t2 killed.
    place(writer, fence, tid(1), {"worker-0": ["c", 1], "worker-1": ["b", 2]})
    writer.remove_storm(fence, tid(2))
    assert built.sync(fence, fresh=True) == 2
    assert (index(writer, "a"), index(writer, "b"), index(writer, "c")) == \
        (None, [tid(1)], [tid(1)])


def test_a_new_leader_reads_what_is_there_and_corrects_it(writer, fence, view):
    place(writer, fence, tid(1), {"worker-0": ["a", 1]})
    writer.write_supervisor_index(fence, {"a": ["stale-9-9"], "ghost": [tid(1)]}, set())
    successor = AssignmentIndex(writer, view)
    assert successor.sync(fence, fresh=True) == 2
    assert (index(writer, "a"), index(writer, "ghost")) == ([tid(1)], None)


def test_a_deposed_leader_writes_no_index(writer, fence, view):
    place(writer, fence, tid(1), {"worker-0": ["a", 1]})
    writer.zk.delete(fence.lock_path)
    with pytest.raises(NotLeaderError):
        AssignmentIndex(writer, view).sync(fence, fresh=True)
    assert index(writer, "a") is None


class Counted:
    """Counts a kazoo client's reads (every sync read goes through its async form)."""

    READS = ("get_async", "get_children_async", "exists_async")

    def __init__(self, zk):
        self.count = 0
        for name in self.READS:
            original = getattr(zk, name)

            def counted(*args, _original=original, **kwargs):
                self.count += 1
                return _original(*args, **kwargs)

            setattr(zk, name, counted)


def test_a_supervisor_reads_only_its_own_assignments(make_zk, zk_root, writer, fence, view):
    """40 topologies elsewhere, 1 here. Changing the 40 costs this supervisor no read
    (a supervisor watching every assignment: at least one each); changing its own costs
    one; a topology given to it costs the index and that assignment."""
    for i in range(40):
        place(writer, fence, tid(i), {"worker-0": ["elsewhere", 6700 + i]})
    place(writer, fence, tid(99), {"worker-0": ["me", 6700]})
    leader_index = AssignmentIndex(writer, view)
    leader_index.sync(fence, fresh=True)
    mine_zk, all_zk = make_zk(), make_zk()
    mine = OwnAssignments(StormClusterState(mine_zk, zk_root), "me")
    everything = ClusterView(StormClusterState(all_zk, zk_root), ("assignments",))
    changes: list[str] = []
    mine.listen(lambda _d, topology_id: changes.append(topology_id))
    mine.start()
    everything.start()
    try:
        wait_until(lambda: mine.assignment_ids() == [tid(99)])
        own, whole = Counted(mine_zk), Counted(all_zk)
        for i in range(40):
            place(writer, fence, tid(i), {"worker-0": ["elsewhere", 7700 + i]})
        view.barrier()
        everything.barrier()
        assert own.count == 0
        assert whole.count >= 40
        place(writer, fence, tid(99), {"worker-0": ["me", 6701]})
        wait_until(lambda: mine.assignment(tid(99))[0].executor_node_port
                   == {"worker-0": ["me", 6701]})
        assert own.count == 1
        place(writer, fence, tid(50), {"worker-0": ["me", 6702]})
        leader_index.sync(fence, fresh=True)
        wait_until(lambda: mine.assignment_ids() == [tid(50), tid(99)])
        assert own.count == 3   # the index, then the new assignment
        # Killed: its assignment goes, and so does it from what this supervisor reads.
        writer.remove_storm(fence, tid(99))
        wait_until(lambda: mine.assignment_ids() == [tid(50)])
        leader_index.sync(fence, fresh=True)
        wait_until(lambda: tid(99) not in mine._watches)
        assert tid(99) in changes
    finally:
        mine.close()
        everything.close()


def test_a_cluster_without_the_index_is_read_whole(make_zk, zk_root, writer):
    writer.zk.delete(writer.path("supervisor-assignments"))
    reader = assignment_reader(StormClusterState(make_zk(), zk_root), "me", 0)
    assert isinstance(reader, ClusterView)
    writer.zk.create(writer.path("supervisor-assignments"))
    reader = assignment_reader(StormClusterState(make_zk(), zk_root), "me", 0)
    assert isinstance(reader, OwnAssignments)


def test_after_a_lost_session_nothing_is_served_until_read_again(
        make_zk, zk_root, zk_server, writer, fence, view):
    """Like the whole-directory view: what was held before a lost session is never acted
    on; the new session's reads are (here, a move made while the session was lost)."""
    from faults import expire_session

    from nimbus.state.cluster_view import ViewNotLoadedError

    place(writer, fence, tid(1), {"worker-0": ["me", 6700]})
    index = AssignmentIndex(writer, view)
    index.sync(fence, fresh=True)
    zk = make_zk()
    mine = OwnAssignments(StormClusterState(zk, zk_root), "me")
    # Hold the re-read back until the test has seen that nothing is served meanwhile.
    release = threading.Event()
    read_again = mine._read_again
    mine._read_again = lambda: (release.wait(30), read_again())
    mine.start()
    try:
        wait_until(lambda: mine.assignment_ids() == [tid(1)])
        expire_session(zk, zk_server.hosts)
        place(writer, fence, tid(1), {"worker-0": ["me", 6701]})
        place(writer, fence, tid(2), {"worker-0": ["me", 6702]})
        index.sync(fence, fresh=True)
        with pytest.raises(ViewNotLoadedError):
            mine.assignment_ids()
        release.set()
        wait_until(lambda: _served(mine) == [tid(1), tid(2)])
        assert mine.assignment(tid(1))[0].executor_node_port == {"worker-0": ["me", 6701]}
    finally:
        mine.close()


def _served(reader: OwnAssignments) -> list[str] | None:
    from nimbus.state.cluster_view import ViewNotLoadedError

    try:
        return reader.assignment_ids()
    except ViewNotLoadedError:
        return None
