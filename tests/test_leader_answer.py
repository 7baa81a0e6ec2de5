"""Who getLeader and getClusterInfo name as leader, right after a failover: the nimbus
that leads now knows it at once, while its summary cache may still name the dead one."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from kazoo.exceptions import ConnectionLoss, SessionExpiredError
from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.thrift import TApplicationException
from thriftpy2.utils import deserialize

from nimbus.config import load_config
from nimbus.state.cluster_snapshot import ClusterSnapshot
from nimbus.state.records import ACTIVE, NimbusInfo, StormBase
from nimbus.thrift import NOT_LEADER_PREFIX, nimbus_ha
from nimbus.thrift.handler import NimbusHandler
from nimbus.thrift.server import EncodedResult


def handler(leading: bool, cached_leader: str) -> NimbusHandler:
    conf = load_config(overrides={"nimbus.host": "127.0.0.1", "nimbus.thrift.port": 7002})
    infos = [NimbusInfo(host="127.0.0.1", port=port, start_time_secs=int(time.time()),
                        version="t") for port in (7001, 7002)]
    cache = SimpleNamespace(snapshot=ClusterSnapshot(nimbuses=infos, leader=cached_leader))
    elector = SimpleNamespace(is_leader=lambda: leading, zookeeper_answering=lambda: True,
                              get_leader_address=lambda: "127.0.0.1:7002")
    return NimbusHandler(conf, elector, None, cache, None, None, time.time(),
                         authorizer=None)


def test_a_new_leader_names_itself_even_before_its_cache_catches_up():
    fresh = handler(leading=True, cached_leader="127.0.0.1:7001")  # the dead one
    assert [(s.port, s.isLeader) for s in fresh._nimbus_summaries()] == [
        (7001, False), (7002, True)]
    assert fresh.getLeader().port == 7002


def test_a_follower_names_the_leader_its_cache_knows():
    follower = handler(leading=False, cached_leader="127.0.0.1:7001")
    assert [(s.port, s.isLeader) for s in follower._nimbus_summaries()] == [
        (7001, True), (7002, False)]



@pytest.mark.parametrize("still_leading,failure", [(True, ConnectionLoss()),
                                                    (False, SessionExpiredError())])
def test_zookeeper_failing_under_a_leader_call_redirects_the_client(still_leading, failure):
    """A connection loss or expired session in the middle of a leader call is answered
    with the "not a leader" redirect (the client then asks whoever leads now: this nimbus
    itself if it still leads), never with a plain internal error the client gives up on."""
    leading = {"now": True}

    def fail() -> None:
        leading["now"] = still_leading  # what the elector knows once the call failed
        raise failure

    made = handler(leading=True, cached_leader="127.0.0.1:7002")
    made.elector = SimpleNamespace(is_leader=lambda: leading["now"],
                                   zookeeper_answering=lambda: True,
                                   get_leader_address=lambda: "127.0.0.1:7002")
    made.cache = SimpleNamespace(wake=lambda: None)
    with pytest.raises(TApplicationException) as raised:
        made._leader_call(fail)
    assert raised.value.message == f"{NOT_LEADER_PREFIX}127.0.0.1:7002"


def _never(*_args: object) -> str:
    raise AssertionError("ZooKeeper was asked while it does not answer (a read would hang)")


@pytest.mark.parametrize(("cached_leader", "named"), [
    ("127.0.0.1:7001", "127.0.0.1:7001"),
    # the cache still names this nimbus (it led until it was cut off): never itself
    ("127.0.0.1:7002", "unknown (this nimbus gets no answer from ZooKeeper and knows of no "
                       "other leader)"),
    (None, "unknown (this nimbus gets no answer from ZooKeeper and knows of no other "
           "leader)"),
])
def test_a_nimbus_cut_from_zookeeper_refuses_leader_calls_from_memory(cached_leader, named):
    """Issue 18, bug 3: a leader-only call to a nimbus that gets no answer from ZooKeeper
    is refused at once, naming the last leader it knew of, without a ZooKeeper read."""
    cut = handler(leading=False, cached_leader=cached_leader)
    def lookup(timeout_s: float) -> str:
        assert timeout_s <= 1.0, "a bounded look at ZooKeeper only"
        raise TimeoutError("no answer")

    cut.elector = SimpleNamespace(is_leader=lambda: False, zookeeper_answering=lambda: False,
                                  get_leader_address=_never, leader_address_within=lookup)
    with pytest.raises(TApplicationException) as refused:
        cut.activate("wc")
    assert refused.value.message == f"{NOT_LEADER_PREFIX}{named}"
    if cached_leader == "127.0.0.1:7001":
        assert cut.getLeader().port == 7001
    else:
        with pytest.raises(TApplicationException, match="^no leader known: this nimbus gets "
                                                        "no answer from ZooKeeper"):
            cut.getLeader()


def _decoded(encoded: EncodedResult) -> Any:
    return deserialize(nimbus_ha.NimbusHa.getClusterInfo_result(), encoded.data,
                       TBinaryProtocolFactory()).success


def test_the_encoded_cluster_summary_is_shared_only_while_nothing_it_shows_changed(
        monkeypatch):
    """getClusterInfo encodes its answer once per snapshot, second and leadership: the
    calls in between get the very same bytes, and a change of any of the three gives a
    new answer that shows it."""
    clock = {"now": 1_800_000_000.25}
    monkeypatch.setattr("nimbus.thrift.handler.time.time", lambda: clock["now"])
    leading = {"now": False}
    made = handler(leading=False, cached_leader="127.0.0.1:7001")
    made.elector = SimpleNamespace(is_leader=lambda: leading["now"],
                                   zookeeper_answering=lambda: True,
                                   get_leader_address=lambda: "127.0.0.1:7001")
    first = made.getClusterInfo()
    assert isinstance(first, EncodedResult)
    assert made.getClusterInfo() is first
    clock["now"] += 0.5  # the same second
    assert made.getClusterInfo() is first

    clock["now"] += 1.0
    later = made.getClusterInfo()
    assert later is not first
    assert _decoded(later).nimbus_uptime_secs == _decoded(first).nimbus_uptime_secs + 1

    leading["now"] = True
    led = _decoded(made.getClusterInfo())
    assert [(s.port, s.isLeader) for s in led.nimbuses] == [(7001, False), (7002, True)]

    made.cache = SimpleNamespace(snapshot=ClusterSnapshot(
        nimbuses=made.cache.snapshot.nimbuses, leader="127.0.0.1:7002",
        storms={"t-1-1": StormBase(storm_name="t", launch_time_secs=1_799_999_990,
                                   status=ACTIVE, num_workers=1)}))
    assert [(t.id, t.name, t.uptime_secs) for t in _decoded(made.getClusterInfo()).topologies] \
        == [("t-1-1", "t", 11)]


def test_a_leader_its_summary_does_not_list_yet_still_names_itself():
    """A nimbus restarted moments before it took the lock: its first summary is not
    loaded yet (no nimbus in it). getLeader names it all the same, and getClusterInfo
    lists it as leader; a follower in that state knows no leader."""
    empty = ClusterSnapshot(nimbuses=[], leader=None)
    fresh = handler(leading=True, cached_leader="127.0.0.1:7001")
    fresh.cache = SimpleNamespace(snapshot=empty)
    assert (fresh.getLeader().host, fresh.getLeader().port, fresh.getLeader().isLeader) == (
        "127.0.0.1", 7002, True)
    assert [(s.port, s.isLeader) for s in _decoded(fresh.getClusterInfo()).nimbuses] == [
        (7002, True)]
    follower = handler(leading=False, cached_leader=None)
    follower.cache = SimpleNamespace(snapshot=empty)
    assert follower._nimbus_summaries() == []
