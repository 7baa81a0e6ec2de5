"""A topology's conf as the UI keeps it, by the code version the topology runs: an upgrade
makes a version with a conf of its own (its ``topology.users``, its
``topology.readonly.users``), so a conf fetched for one version is never answered once the
topology runs another. Each reader kind learns the running version from its snapshot
(``ClusterSnapshot.running_versions``): the ZooKeeper reader from ``/code-versions``, the
reader inside a nimbus from that nimbus's summary, the Thrift reader from
getClusterRecords."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
from test_ui_summary_reader import Nimbus
from test_ui_topology_page import TOPOLOGY_CONF, Acl, Page, check_error
from ui_fixtures import conf_for, write_cluster
from waiting import wait_until

from nimbus.config import load_config
from nimbus.state.cluster_snapshot import ClusterSnapshot
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.code_versions import CodeVersions
from nimbus.state.records import ACTIVE, StormBase
from nimbus.thrift.handler import NimbusHandler
from nimbus.ui.https import IDENTITY_KEY
from nimbus.ui.summary_reader import SummaryReader
from nimbus.ui.thrift_reader import ThriftReader

# Version 2 of the topology: carol is no longer among its users.
UPGRADED_CONF = {**TOPOLOGY_CONF, "topology.users": []}


class Confs:
    """getTopologyConf as a nimbus answers it: the running version's conf."""

    def __init__(self) -> None:
        self.running = 1
        self.asked = 0

    def __call__(self, _topology_id: str) -> str:
        self.asked += 1
        return json.dumps(TOPOLOGY_CONF if self.running == 1 else UPGRADED_CONF)


def upgraded(state: StormClusterState, topology_id: str, running: int) -> None:
    """/code-versions/<id> of a topology upgraded to version 2, running ``running``."""
    def entry(version: int) -> dict:
        return {"version": version, "sha256": {"stormjar.jar": f"{version}" * 64},
                "submitter": "alice", "created_secs": 1_800_000_000 + version,
                "state": "running" if version == running else "previous", "error": "",
                "conf": {}}

    data = CodeVersions(versions=[entry(1), entry(2)], running=running).encode()
    path = state.code_versions_path(topology_id)
    if state.zk.exists(path) is None:
        state.zk.create(path, data, makepath=True)
    else:
        state.zk.set(path, data)


# -- the ZooKeeper reader, through the app's read and change rules ----------------------
@pytest.mark.zookeeper
def test_a_user_an_upgrade_removed_loses_access_once_the_ui_sees_it(make_zk, zk_server,
                                                                    zk_root):
    page = Page(zk_server, zk_root, make_zk, authorizer=Acl())
    try:
        confs = Confs()
        page.reader._fetch_conf = confs
        history = f"/api/v1/topology/{page.tid}/history"
        page.leader.histories["topo0"] = {"topology_id": page.tid, "versions": []}
        assert page.get(history, "carol").status_code == 200
        assert page.reader.topology_conf(page.tid) == TOPOLOGY_CONF
        # an upgrade to version 2 completes: its conf lists carol no more
        confs.running = 2
        upgraded(page.state, page.tid, running=2)
        page.reader.refresh_now()
        assert page.reader.running_version(page.tid) == 2
        assert page.reader.topology_conf(page.tid) is None, "version 1's conf is not 2's"
        check_error(page.get(history, "carol"), 403)
        check_error(page.client.post(f"/api/v1/topology/{page.tid}/version/1",
                                     environ_overrides={IDENTITY_KEY: "carol"}),
                    403)
        assert page.get(history, "dave").status_code == 200, "still a read-only user"
        assert page.reader.topology_conf(page.tid) == UPGRADED_CONF
        asked = confs.asked
        assert page.get(history, "alice").status_code == 200
        page.get(history, "dave")
        assert confs.asked == asked, "fetched once per version"
        # rolled back to version 1: its conf again
        confs.running = 1
        upgraded(page.state, page.tid, running=1)
        page.reader.refresh_now()
        assert page.get(history, "carol").status_code == 200
    finally:
        page.reader.stop()


# -- the reader inside a nimbus --------------------------------------------------------
@pytest.mark.zookeeper
def test_the_reader_inside_a_nimbus_drops_a_conf_when_the_version_changes(make_zk,
                                                                         zk_server,
                                                                         zk_root):
    state = StormClusterState(make_zk(), zk_root)
    state.setup()
    (tid,) = write_cluster(state, topologies=1)
    nimbus = Nimbus(make_zk, zk_root)
    nimbus.start()
    confs = Confs()
    reader = SummaryReader(conf_for(zk_server, zk_root), nimbus.view.state.zk,
                           nimbus.cache, fetch_conf=confs)
    reader.start()
    try:
        assert reader.wait_ready(10)
        assert reader.fetch_topology_conf(tid) == TOPOLOGY_CONF
        confs.running = 2
        upgraded(state, tid, running=2)
        wait_until(lambda: reader.running_version(tid) == 2)
        assert nimbus.cache.snapshot.running_versions == {tid: 2}
        assert reader.topology_conf(tid) is None
        assert reader.fetch_topology_conf(tid) == UPGRADED_CONF
        assert reader.topology_conf(tid) == UPGRADED_CONF
    finally:
        reader.stop()
        nimbus.stop()


# -- the Thrift reader: getClusterRecords says what runs ---------------------------------
class ThroughHandler:
    """NimbusClient.read as the Thrift reader uses it, answered by a real NimbusHandler
    whose summary the test sets."""

    def __init__(self, handler: NimbusHandler) -> None:
        self.handler = handler

    def read(self, call):
        return call(self.handler)


def test_the_thrift_reader_drops_a_conf_when_the_version_changes():
    conf = load_config()
    base = StormBase(storm_name="topo0", launch_time_secs=1, status=ACTIVE, num_workers=1,
                     owner="alice")
    cache = SimpleNamespace(snapshot=ClusterSnapshot(storms={"topo0-1-1": base},
                                                     version=1))
    handler = NimbusHandler(conf, SimpleNamespace(), None, cache, None, None, time.time(),
                            authorizer=None)
    confs = Confs()
    reader = ThriftReader(conf, fetch_conf=confs, client=ThroughHandler(handler))
    reader._reload_guarded()   # one step of its loop
    assert reader.running_version("topo0-1-1") == 1
    assert reader.fetch_topology_conf("topo0-1-1") == TOPOLOGY_CONF
    # the nimbus's summary sees the switch to version 2 end
    confs.running = 2
    cache.snapshot = ClusterSnapshot(storms={"topo0-1-1": base},
                                     running_versions={"topo0-1-1": 2}, version=2)
    assert json.loads(handler.getClusterRecords())["running_versions"] == {"topo0-1-1": 2}
    reader._reload_guarded()
    assert reader.running_version("topo0-1-1") == 2
    assert reader.topology_conf("topo0-1-1") is None
    assert reader.fetch_topology_conf("topo0-1-1") == UPGRADED_CONF
    # a nimbus of an earlier release says nothing of versions: version 1 for all
    cache.snapshot = ClusterSnapshot(storms={"topo0-1-1": base}, version=3)
    reader._reload_guarded()
    assert reader.running_version("topo0-1-1") == 1
