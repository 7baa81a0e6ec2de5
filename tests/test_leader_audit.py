"""The audit trail of leader writes, on a real ZooKeeper: every fenced write leaves one
audit node in the same multi-op, a refused write leaves none, and the checker finds a
write fenced on a lock node older than one already written with."""

from __future__ import annotations

import posixpath

import pytest

from nimbus.state import leader_audit
from nimbus.state.cluster_state import Fence, NotLeaderError, StormClusterState

pytestmark = pytest.mark.zookeeper


def lock_node(state: StormClusterState, owner: str) -> Fence:
    path = state.zk.create(posixpath.join(state.leader_lock_path, f"nimbus-{owner}-"),
                           owner.encode(), ephemeral=True, sequence=True)
    return Fence(path)


@pytest.fixture
def state(make_zk, zk_root):
    audited = StormClusterState(make_zk(), zk_root, audit_writer="127.0.0.1:6627")
    audited.setup()
    return audited


def test_every_fenced_write_leaves_one_audit_node_and_a_refused_one_none(state):
    first = lock_node(state, "a")
    state.begin_code(first, "t-1-1")
    state.begin_code(first, "t-2-2")
    second = lock_node(state, "b")
    state.zk.delete(first.lock_path)  # the first leader's session ended
    with pytest.raises(NotLeaderError):
        state.begin_code(first, "t-3-3")
    state.begin_code(second, "t-3-3")
    trail = leader_audit.read_trail(state.zk, state.root)
    assert [(w.lock, w.by) for w in trail] == [
        (first.lock_path, "127.0.0.1:6627"), (first.lock_path, "127.0.0.1:6627"),
        (second.lock_path, "127.0.0.1:6627")]
    assert [w.order for w in trail] == sorted(w.order for w in trail)
    assert leader_audit.deposed_writes(trail) == []
    # The write's own results are unchanged by the audit node (it is not returned).
    assert state.code_topologies() == ["t-1-1", "t-2-2", "t-3-3"]


def test_a_write_fenced_on_an_older_lock_node_is_reported(state):
    """If fencing were broken (both nodes alive, the later one writing first), the
    checker must catch the older leader's later write."""
    older, newer = lock_node(state, "a"), lock_node(state, "b")
    state.begin_code(newer, "t-1-1")
    state.begin_code(older, "t-2-2")
    trail = leader_audit.read_trail(state.zk, state.root)
    assert [w.lock for w in leader_audit.deposed_writes(trail)] == [older.lock_path]


def test_without_the_setting_nothing_is_audited(make_zk, zk_root):
    plain = StormClusterState(make_zk(), zk_root)
    plain.setup()
    plain.begin_code(lock_node(plain, "a"), "t-1-1")
    assert plain.zk.exists(plain.path(leader_audit.AUDIT_DIR)) is None
