"""A real 3-server ZooKeeper ensemble on loopback (what the chaos soak runs on)."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient
from waiting import wait_for

from nimbus.dev.zookeeper import ZooKeeperEnsemble, server_mode

pytestmark = pytest.mark.zookeeper


def test_ensemble_survives_one_server_and_comes_back_after_losing_its_quorum(tmp_path):
    with ZooKeeperEnsemble(tmp_path / "zk", size=3) as ensemble:
        modes = sorted(server_mode(s.port) for s in ensemble.servers)
        assert modes == ["follower", "follower", "leader"]
        zk = KazooClient(hosts=ensemble.hosts, timeout=10)
        zk.start(timeout=30)
        try:
            zk.create("/kept", b"1")
            leader = next(s for s in ensemble.servers if server_mode(s.port) == "leader")
            leader.kill9()
            # Two of three still form a quorum: writes go on.
            wait_for(lambda: zk.retry(zk.set, "/kept", b"2") is not None, 30,
                     "a write with one server down")
            others = [s for s in ensemble.servers if s is not leader]
            others[0].kill9()
            wait_for(lambda: not others[1].serving(), 30, "the lone server to stop serving")
            leader.start_process()
            others[0].start_process()
            for server in ensemble.servers:
                server.wait_serving(60)
            assert zk.retry(zk.get, "/kept")[0] == b"2"
        finally:
            zk.stop()
            zk.close()
