"""A ZooKeeper blip within the session costs a nimbus pair no view reload (issue 20).

Real processes: a ZooKeeper server and 2 nimbuses with 3 topologies. Two kinds of blip:

* each nimbus reaches ZooKeeper through a loopback proxy of its own; both proxies cut
  every connection at once (the sessions live on), a client of the test's own changes the
  cluster meanwhile (a supervisor appears), and the proxies heal;
* the leader of a 3-server ensemble stops: the other two close every client connection
  while they elect a new leader, and the clients reconnect to them, within the session.

Each nimbus must then log one re-validation of its view that read only what changed (the
new supervisor; nothing after the election), never a reload from scratch; a change must show
in what each nimbus answers; the same nimbus must lead, the other never claim; and the
topologies must be as they were.
"""

from __future__ import annotations

import posixpath
import re
import time

import pytest
import yaml
from helpers import observer
from tcp_proxy import DelayProxy
from waiting import wait_for

from nimbus.dev.cluster import LocalCluster, NimbusProcess
from nimbus.dev.zookeeper import ZooKeeperEnsemble, server_mode
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.cluster_view import NIMBUS_DIRECTORIES
from nimbus.state.records import SupervisorInfo
from nimbus.thrift.client import connect

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SESSION_MS = 10000  # the blip lasts well under it
VIEW_DIRECTORIES = NIMBUS_DIRECTORIES  # what a nimbus's view holds
REVALIDATED = re.compile(
    r"nimbus: ZooKeeper connection back within the session: (\d+) nodes re-validated, "
    r"(\d+) re-read \((\d+) changed, (\d+) new, (\d+) unread\), (\d+) removed")
RELOADED = "the view was reloaded from scratch"


def test_a_blip_within_the_session_keeps_the_views_and_the_leader(tmp_path, bundle):
    cluster = LocalCluster(tmp_path / "cluster", nimbuses=2, conf={
        "storm.zookeeper.session.timeout": SESSION_MS, "nimbus.monitor.freq.secs": 1})
    proxies = [DelayProxy(cluster.zk.port).start() for _ in cluster.nimbuses]
    try:
        for nimbus, proxy in zip(cluster.nimbuses, proxies, strict=True):
            conf = yaml.safe_load(nimbus.config_file.read_text())
            conf["storm.zookeeper.port"] = proxy.port
            nimbus.config_file.write_text(yaml.safe_dump(conf))
        cluster.start()
        _blip(cluster, proxies, bundle)
    finally:
        cluster.stop()
        for proxy in proxies:
            proxy.stop()


def test_the_ensembles_leader_going_reloads_no_view(tmp_path, bundle):
    """When the leader of a 3-server ensemble stops, the others close every client
    connection while they elect a new one: every session lives on, every client blips."""
    ensemble = ZooKeeperEnsemble(tmp_path / "zookeeper", size=3).start()
    cluster = LocalCluster(
        tmp_path / "cluster", nimbuses=2, zk_servers=[s.hosts for s in ensemble.servers],
        conf={"storm.zookeeper.session.timeout": SESSION_MS, "nimbus.monitor.freq.secs": 1})
    try:
        cluster.start()
        leader, follower, topologies, before, marks = _settle(cluster, bundle)
        zk_leader = next(s for s in ensemble.servers if server_mode(s.port) == "leader")
        zk_leader.stop()  # SIGTERM
        for nimbus in cluster.nimbuses:
            wait_for(lambda n=nimbus: REVALIDATED.search(_since(n, marks)), 60,
                     f"{nimbus.address} to re-validate its view")
        for nimbus in cluster.nimbuses:
            # Every node it held checked, none read again: nothing changed.
            assert REVALIDATED.findall(_since(nimbus, marks)) == [
                (str(len(before)), "0", "0", "0", "0", "0")], nimbus.address
            assert RELOADED not in nimbus.log_text(), nimbus.address
        _assert_kept(cluster, leader, follower, topologies, marks)
        state = observer(cluster)
        assert _tree(state) == before
        state.zk.stop()
    finally:
        cluster.stop()
        ensemble.stop()


def _settle(cluster: LocalCluster, bundle: bytes) -> tuple[
        NimbusProcess, NimbusProcess, dict[str, tuple[str, str]],
        dict[str, tuple[int, int]], dict[str, int]]:
    """Submit 3 topologies and wait until both nimbuses hold them replicated. Returns
    (leader, follower, topologies as the leader answers them, the view directories as
    ZooKeeper holds them, where each nimbus's log ends now)."""
    client = cluster.client()
    ids = sorted(client.submit(f"quiet-{i}", bundle, {
        "topology.min.replication.count": 2,
        "topology.max.replication.wait.time.sec": -1}) for i in range(3))
    # Each nimbus's own view holds both replica registrations of every topology: nothing
    # the nimbuses write is left in flight when the blip begins.
    for nimbus in cluster.nimbuses:
        wait_for(lambda n=nimbus: _replication(n) == dict.fromkeys(ids, 2), 60,
                 f"{nimbus.address} to see every topology replicated twice")
    leader = cluster.wait_for_leader()
    follower = next(n for n in cluster.nimbuses if n is not leader)
    state = observer(cluster)
    before = _tree(state)
    state.zk.stop()
    topologies = _topologies(leader)
    assert sorted(topologies) == ids
    marks = {n.address: len(n.log_text()) for n in cluster.nimbuses}
    return leader, follower, topologies, before, marks


def _assert_kept(cluster: LocalCluster, leader: NimbusProcess, follower: NimbusProcess,
                 topologies: dict[str, tuple[str, str]], marks: dict[str, int]) -> None:
    """The same nimbus leads, the other never claimed, both answer the same topologies."""
    assert cluster.wait_for_leader(timeout_s=60) is leader
    assert "gained leadership" not in _since(follower, marks)
    for nimbus in cluster.nimbuses:
        assert _topologies(nimbus) == topologies, nimbus.address


def _blip(cluster: LocalCluster, proxies: list[DelayProxy], bundle: bytes) -> None:
    leader, follower, topologies, before, marks = _settle(cluster, bundle)
    state = observer(cluster)

    for proxy in proxies:
        proxy.cut()
    for nimbus in cluster.nimbuses:  # both of its sessions: the elector's and the view's
        wait_for(lambda n=nimbus: _since(n, marks).count("Transition to CONNECTING") >= 2,
                 30, f"{nimbus.address} to see its ZooKeeper connections drop")
        assert _topologies(nimbus) == topologies, "cut off, it answers from its view"
    state.supervisor_heartbeat("blip-supervisor", SupervisorInfo(
        time_secs=int(time.time()), hostname="blip-host"))  # no slots: nothing to schedule
    for proxy in proxies:
        proxy.heal()

    for nimbus in cluster.nimbuses:
        wait_for(lambda n=nimbus: REVALIDATED.search(_since(n, marks)), 60,
                 f"{nimbus.address} to re-validate its view")
    for nimbus in cluster.nimbuses:
        # Every node it held checked, only the new supervisor read: no reload.
        assert REVALIDATED.findall(_since(nimbus, marks)) == [
            (str(len(before)), "1", "0", "1", "0", "0")], nimbus.address
        assert RELOADED not in nimbus.log_text(), nimbus.address
        wait_for(lambda n=nimbus: "blip-host" in _supervisor_hosts(n), 30,
                 f"{nimbus.address} to show the supervisor that joined during the blip")
    _assert_kept(cluster, leader, follower, topologies, marks)
    after = _tree(state)
    assert {p: v for p, v in after.items() if "/supervisors/" not in p} == before
    state.zk.stop()


def _since(nimbus: NimbusProcess, marks: dict[str, int]) -> str:
    return nimbus.log_text()[marks[nimbus.address]:]


def _replication(nimbus: NimbusProcess) -> dict[str, int]:
    with connect(nimbus.address, timeout_s=10) as client:
        return {t.id: t.replication_count for t in client.getClusterInfo().topologies}


def _topologies(nimbus: NimbusProcess) -> dict[str, tuple[str, str]]:
    """id -> (name, status) as ``nimbus`` answers it."""
    with connect(nimbus.address, timeout_s=10) as client:
        return {t.id: (t.name, t.status) for t in client.getClusterInfo().topologies}


def _supervisor_hosts(nimbus: NimbusProcess) -> set[str]:
    with connect(nimbus.address, timeout_s=10) as client:
        return {s.host for s in client.getClusterInfo().supervisors}


def _tree(state: StormClusterState) -> dict[str, tuple[int, int]]:
    """path -> (czxid, mzxid) of every node under the directories a nimbus's view holds,
    the directories included."""
    out: dict[str, tuple[int, int]] = {}
    level = [state.path(d) for d in VIEW_DIRECTORIES]
    while level:
        for path in level:
            stat = state.zk.exists(path)
            out[path] = (stat.czxid, stat.mzxid)
        level = [posixpath.join(p, c) for p in level for c in state.zk.get_children(p)]
    return out
