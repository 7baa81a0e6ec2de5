"""Who getLeader and getClusterInfo name as leader, right after a failover: the nimbus
that leads now knows it at once, while its summary cache may still name the dead one."""

from __future__ import annotations

import time
from types import SimpleNamespace

from nimbus.config import load_config
from nimbus.master.summary_cache import ClusterSnapshot
from nimbus.state.records import NimbusInfo
from nimbus.thrift.handler import NimbusHandler


def handler(leading: bool, cached_leader: str) -> NimbusHandler:
    conf = load_config(overrides={"nimbus.host": "127.0.0.1", "nimbus.thrift.port": 7002})
    infos = [NimbusInfo(host="127.0.0.1", port=port, start_time_secs=int(time.time()),
                        version="t") for port in (7001, 7002)]
    cache = SimpleNamespace(snapshot=ClusterSnapshot(nimbuses=infos, leader=cached_leader))
    elector = SimpleNamespace(is_leader=lambda: leading,
                              get_leader_address=lambda: "127.0.0.1:7002")
    return NimbusHandler(conf, elector, None, cache, None, None, time.time())


def test_a_new_leader_names_itself_even_before_its_cache_catches_up():
    fresh = handler(leading=True, cached_leader="127.0.0.1:7001")  # the dead one
    assert [(s.port, s.isLeader) for s in fresh._nimbus_summaries()] == [
        (7001, False), (7002, True)]
    assert fresh.getLeader().port == 7002


def test_a_follower_names_the_leader_its_cache_knows():
    follower = handler(leading=False, cached_leader="127.0.0.1:7001")
    assert [(s.port, s.isLeader) for s in follower._nimbus_summaries()] == [
        (7001, True), (7002, False)]
