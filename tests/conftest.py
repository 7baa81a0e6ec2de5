import posixpath

import pytest

from nimbus.state.cluster_state import Fence, StormClusterState

pytest_plugins = ["nimbus.testing.zookeeper"]


@pytest.fixture
def writer(make_zk, zk_root):
    """A StormClusterState on a session of its own, its layout set up: the leader's writes."""
    state = StormClusterState(make_zk(), zk_root)
    state.setup()
    return state


@pytest.fixture
def fence(writer):
    """A leader lock node of ``writer``'s session, as the fence of its writes."""
    path = writer.zk.create(posixpath.join(writer.leader_lock_path, "nimbus-w-"),
                            b"127.0.0.1:6627", ephemeral=True, sequence=True)
    return Fence(path)
