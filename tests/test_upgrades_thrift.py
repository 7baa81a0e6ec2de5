"""Upgrades through Thrift (upgradeTopology, rollbackTopology, getTopologyHistory) and
NimbusClient, on one real in-process nimbus and a real ZooKeeper: the master's upgrades
wired into its duties (an upgrade call wakes them), the leader's answers and refusals.

Supervisors are not run: their records are written into ZooKeeper as a supervisor writes
them (with the slots' "version" and "committed").
"""

from __future__ import annotations

import io
import json
import tarfile

import pytest
from nimbus_fixtures import idle_nimbus_conf
from waiting import wait_for

from nimbus.config import load_config
from nimbus.daemons.nimbus import NimbusDaemon
from nimbus.state.records import SupervisorInfo
from nimbus.thrift import storm
from nimbus.thrift.client import NimbusClient, connect

pytestmark = pytest.mark.zookeeper
SUPERVISORS = ("sup-a", "sup-b")


def bundle(text: str) -> bytes:
    data = f'command: ["echo", "{text}"]\n'.encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo("topology.yaml")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def cluster(zk_server, zk_root, tmp_path, make_zk):
    """(daemon, client, supervisor session); two supervisors with two slots each."""
    conf = load_config(str(idle_nimbus_conf(zk_server, zk_root, tmp_path)))
    daemon = NimbusDaemon(conf)
    daemon.start()
    try:
        wait_for(daemon.master.elector.is_leader, 30, "the nimbus to lead")
        sup_zk = make_zk()
        for supervisor_id in SUPERVISORS:
            sup_zk.create(daemon.master.state.path("supervisors", supervisor_id),
                          SupervisorInfo(time_secs=1, hostname=f"host-{supervisor_id[-1]}",
                                         meta=[6700, 6701]).encode(), ephemeral=True)
        yield daemon, NimbusClient(conf), sup_zk
    finally:
        daemon.stop()


def say(daemon, sup_zk, topology_id: str, version: int) -> None:
    """Every supervisor says its slots' workers of ``topology_id`` run ``version`` and
    committed on it."""
    state = daemon.master.state
    assignment = state.assignment_info(topology_id)
    workers: dict[str, dict] = {s: {} for s in SUPERVISORS}
    for supervisor_id, port in assignment.executor_node_port.values():
        workers[supervisor_id][str(port)] = {
            "topology_id": topology_id, "state": "running", "restarts": 0,
            "backoff_secs": 0, "last_error": "", "version": version, "committed": True,
            "failures": 0}
    for supervisor_id in SUPERVISORS:
        sup_zk.set(state.path("supervisors", supervisor_id), SupervisorInfo(
            time_secs=1, hostname=f"host-{supervisor_id[-1]}", meta=[6700, 6701],
            workers=workers[supervisor_id]).encode())


def test_upgrade_history_and_rollback_through_thrift(cluster):
    daemon, client, sup_zk = cluster
    master = daemon.master
    topology_id = client.submit("wc", bundle("v1"), {"topology.workers": 2})
    master.run_cycle()
    assert len(master.state.assignment_info(topology_id).executor_node_port) == 2

    answer = client.upgrade("wc", bundle("v2"), {"my.setting": "new"}, "rolling")
    assert answer == {"topology_id": topology_id, "version": 2}
    # the call woke the duties: the switch is applied without waiting for their period
    wait_for(lambda: master.state.assignment_info(topology_id).code_version == 2, 30,
             "the duties to apply the switch")
    assert master.state.assignment_info(topology_id).worker_versions == {"worker-1": 1}
    history = client.history("wc")
    assert (history["running"], history["switch"]["strategy"], history["switch"]["to"],
            [(v["version"], v["state"]) for v in history["versions"]]) == (
        1, "rolling", 2, [(2, "switching"), (1, "running")])

    with pytest.raises(storm.InvalidTopologyException, match="already switching"):
        client.upgrade("wc", bundle("v3"), {}, "all")
    with pytest.raises(storm.InvalidTopologyException, match="rebalance is refused"):
        client.rebalance("wc", 3)
    with pytest.raises(storm.AlreadyAliveException, match="nimbus-ha upgrade wc PATH"):
        client.submit("wc", bundle("again"), {})

    say(daemon, sup_zk, topology_id, 2)
    master.run_cycle()
    say(daemon, sup_zk, topology_id, 2)
    master.run_cycle()
    history = client.history("wc")
    assert (history["running"], history["switch"]) == (2, None)
    # Storm's getTopologyConf answers the conf the topology runs with now
    with connect(daemon.address) as thrift:
        assert json.loads(thrift.getTopologyConf(topology_id))["my.setting"] == "new"

    assert client.rollback("wc") == {"topology_id": topology_id, "version": 1}
    wait_for(lambda: master.state.assignment_info(topology_id).code_version == 1, 30,
             "the duties to apply the rollback")
    say(daemon, sup_zk, topology_id, 1)
    master.run_cycle()
    history = client.history("wc")
    assert [(v["version"], v["state"]) for v in history["versions"]] == [
        (2, "rolled back"), (1, "running")]


def test_refusals_of_the_extension(cluster):
    daemon, client, _sup_zk = cluster
    with pytest.raises(storm.NotAliveException, match="no topology named nope"):
        client.history("nope")
    with pytest.raises(storm.NotAliveException, match="no live topology named 'nope'"):
        client.upgrade("nope", bundle("v2"), {}, "all")
    with pytest.raises(storm.NotAliveException):
        client.rollback("nope")
    client.submit("wc", bundle("v1"), {})
    with pytest.raises(storm.InvalidTopologyException, match="strategy must be all or "
                                                             "rolling"):
        client.upgrade("wc", bundle("v2"), {}, "sideways")
    with pytest.raises(storm.InvalidTopologyException, match="never upgraded"):
        client.rollback("wc")
    with connect(daemon.address) as thrift:
        with pytest.raises(storm.InvalidTopologyException, match="not a finished upload"):
            thrift.upgradeTopology("wc", "no-such-upload", "{}", "all")
    assert daemon.master.upgrades.history("wc")["running"] == 1


def test_owner_actions_rule_and_read_rule(cluster):
    """With nimbus.authorizer: upgrade and rollback follow kill's rule (the owner, its
    topology.users, nimbus.admins), history getTopologyInfo's read rule; the caller is
    recorded as who asked."""
    from nimbus.thrift.authorizer import SimpleAclAuthorizer
    from nimbus.thrift.tls import set_caller

    daemon, client, _sup_zk = cluster
    client.submit("wc", bundle("v1"), {"topology.submitter.user": "alice",
                                       "topology.readonly.users": ["reader"]})
    handler = daemon.handler
    handler.authorizer = SimpleAclAuthorizer(["admin"])

    def upload() -> str:
        location = daemon.transfers.begin_upload("test")
        daemon.transfers.upload_chunk(location, bundle("v2"))
        daemon.transfers.finish_upload(location)
        return location

    try:
        for who in ("mallory", "reader"):
            set_caller(who)
            with pytest.raises(storm.AuthorizationException,
                               match=f"{who} may not upgrade wc"):
                handler.upgradeTopology("wc", upload(), "{}", "all")
            with pytest.raises(storm.AuthorizationException,
                               match=f"{who} may not rollback wc"):
                handler.rollbackTopology("wc", 0)
        with pytest.raises(storm.AuthorizationException):
            set_caller("mallory")
            handler.getTopologyHistory("wc")
        set_caller("reader")
        assert json.loads(handler.getTopologyHistory("wc"))["running"] == 1
        set_caller("alice")
        answer = json.loads(handler.upgradeTopology("wc", upload(), "{}", "all"))
        assert answer["version"] == 2
        set_caller("admin")
        assert json.loads(handler.rollbackTopology("wc", 1))["version"] == 1
        history = json.loads(handler.getTopologyHistory("wc"))
        assert (history["versions"][0]["submitter"], history["switch"]["by"]) == (
            "alice", "admin")
    finally:
        set_caller(None)
        handler.authorizer = None
