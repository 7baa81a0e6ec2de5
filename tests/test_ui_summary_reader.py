"""A UI inside a nimbus (``nimbus.ui.enabled``) shows that nimbus's summary
(nimbus/ui/summary_reader.py): the same REST answers as a UI reading ZooKeeper itself,
each new snapshot of the summary, nothing until the summary's first load (the UI starts
before the master), and the summary's reason while the cluster's layout is missing."""

from __future__ import annotations

import json
import time
import urllib.request
from types import SimpleNamespace

import pytest
from ui_fixtures import FakeLeader, Harness, conf_for, write_cluster
from waiting import wait_until
from werkzeug.test import Client

from nimbus.master.summary_cache import ClusterSummaryCache
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.cluster_view import ClusterView
from nimbus.state.records import ACTIVE, Assignment, StormBase
from nimbus.ui.app import UIApp
from nimbus.ui.server import UIServer
from nimbus.ui.summary_reader import SummaryReader

pytestmark = pytest.mark.zookeeper

PATHS = ("/api/v1/cluster/summary", "/api/v1/nimbus/summary", "/api/v1/supervisor/summary",
         "/api/v1/topology/summary")


class Nimbus:
    """What a nimbus holds for its UI: the watched view, its session and the summary
    built from it (a distributor that counts the registered replicas, as localfs)."""

    def __init__(self, make_zk, zk_root: str):
        self.view = ClusterView(StormClusterState(make_zk(), zk_root), name="test")
        self.cache = ClusterSummaryCache(self.view.state, SimpleNamespace(
            get_replication_count=lambda t: len(self.view.replica_hosts(t))), self.view)

    def start(self) -> None:
        """Start, and load the first summary."""
        self.view.start()
        self.cache.start()
        assert self.cache.refresh_now().loaded

    def stop(self) -> None:
        self.cache.stop()
        self.view.close()


@pytest.fixture
def state(make_zk, zk_root) -> StormClusterState:
    made = StormClusterState(make_zk(), zk_root)
    made.setup()
    return made


@pytest.fixture
def nimbus(make_zk, zk_root, state):
    made = Nimbus(make_zk, zk_root)
    yield made
    made.stop()


def reader_of(nimbus: Nimbus, conf) -> SummaryReader:
    reader = SummaryReader(conf, nimbus.view.state.zk, nimbus.cache,
                           fetch_conf=lambda t: "{}")
    reader.start()
    return reader


def answers(client: Client, paths: tuple[str, ...]) -> list[tuple[int, object]]:
    return [(r.status_code, r.json) for r in (client.get(p) for p in paths)]


def test_the_same_answers_as_a_ui_reading_zookeeper(zk_server, zk_root, state, nimbus):
    ids = write_cluster(state, topologies=2)
    conf = conf_for(zk_server, zk_root)
    nimbus.start()
    reader = reader_of(nimbus, conf)
    own = Harness(conf, state)
    try:
        inside = Client(UIApp(conf, reader, FakeLeader()))  # type: ignore[arg-type]
        wait_until(lambda: inside.get(PATHS[0]).status_code == 200, 10)
        assert reader.snapshot() is nimbus.cache.snapshot, "no copy: the nimbus's own"
        paths = (*PATHS, f"/api/v1/topology/{ids[0]}", f"/api/v1/topology/{ids[0]}/page")
        # Uptimes are whole seconds: the two agree within one.
        wait_until(lambda: answers(inside, paths) == answers(own.client, paths), 10)
        assert all(status == 200 for status, _ in answers(inside, paths))
        # A change shows as soon as the summary has it.
        now = int(time.time())
        added = f"late-3-{now}"
        state.zk.create(state.storm_path(added), StormBase(
            storm_name="late", launch_time_secs=now, status=ACTIVE, num_workers=1).encode())
        state.zk.create(state.path("assignments", added),
                        Assignment(master_code_dir="/code").encode())
        wait_until(lambda: inside.get(PATHS[0]).json["topologies"] == 3, 10)
        # The dashboard and the timeline: what the UI saw since it started.
        board = inside.get("/api/v1/ui/dashboard").json
        assert [t["replicationCount"] for t in board["topologies"]] == [0, 1, 1]
        assert any(e["message"] == "late submitted (ACTIVE)" for e in board["timeline"])
    finally:
        own.close()
        reader.stop()


def test_nothing_until_the_summary_loads_then_the_cluster(zk_server, zk_root, state,
                                                          nimbus):
    """The UI is served before the nimbus's master starts: it does not wait for it."""
    write_cluster(state)
    conf = conf_for(zk_server, zk_root)
    reader = reader_of(nimbus, conf)
    try:
        started = time.monotonic()
        assert reader.wait_ready(15) is False
        assert time.monotonic() - started < 1.0
        client = Client(UIApp(conf, reader, FakeLeader()))  # type: ignore[arg-type]
        response = client.get(PATHS[0])
        assert (response.status_code, response.json["errorMessage"]) == (
            503, "the UI has not read the cluster state yet")
        nimbus.start()
        wait_until(lambda: client.get(PATHS[0]).status_code == 200, 10)
        assert client.get(PATHS[0]).json["topologies"] == 1
    finally:
        reader.stop()


def test_a_missing_layout_is_said_never_shown_empty(zk_server, zk_root, state, nimbus):
    write_cluster(state)
    conf = conf_for(zk_server, zk_root)
    nimbus.start()
    reader = reader_of(nimbus, conf)
    try:
        client = Client(UIApp(conf, reader, FakeLeader()))  # type: ignore[arg-type]
        wait_until(lambda: client.get(PATHS[2]).status_code == 200, 10)
        state.zk.delete(state.path("supervisors"), recursive=True)
        wait_until(lambda: client.get(PATHS[2]).status_code == 503, 10)
        assert client.get(PATHS[2]).json["errorMessage"].startswith(
            f"{zk_root}/supervisors does not exist: ZooKeeper was wiped")
    finally:
        reader.stop()


def test_the_ui_server_given_a_summary_shows_it_and_leaves_it_running(
        zk_server, zk_root, state, nimbus):
    write_cluster(state)
    nimbus.start()
    conf = conf_for(zk_server, zk_root)
    with pytest.raises(ValueError, match="give zk too"):
        UIServer(conf, summary=nimbus.cache)
    server = UIServer(conf, zk=nimbus.view.state.zk, port=0, summary=nimbus.cache).start()
    try:
        assert isinstance(server.reader, SummaryReader)

        def topologies() -> int | None:
            with urllib.request.urlopen(f"{server.url}{PATHS[0]}", timeout=5) as reply:
                return json.load(reply)["topologies"]

        wait_until(lambda: topologies() == 1, 10)
    finally:
        server.stop()
    version = nimbus.cache.snapshot.version
    assert nimbus.cache.refresh_now().version > version, "the summary goes on"
    assert nimbus.view.state.zk.connected, "the nimbus's session stays open"
