"""The topology page's REST resources (nimbus/ui/topology_page.py) against a real
ZooKeeper: ``/api/v1/topology/:id/page`` and Storm's ``/component/:component``, their
read rule, masking, and hostile ids and component names (a 4xx JSON error, never a 500).
"""

from __future__ import annotations

import json
import time

import pytest
from ui_fixtures import FakeLeader, conf_for, write_cluster
from werkzeug.test import Client

from nimbus.redaction import install_log_redaction
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.records import (
    ACTIVE,
    ErrorInfo,
    PlacementHistory,
    StormBase,
    SupervisorInfo,
    WorkerBeat,
)
from nimbus.ui.app import UIApp
from nimbus.ui.https import IDENTITY_KEY
from nimbus.ui.zk_reader import ZooKeeperReader

pytestmark = pytest.mark.zookeeper

SECRET = "hunter2-secret"   # conf_for's secret: masked wherever a worker wrote it
TOPOLOGY_CONF = {"topology.spark.checkpoint.dir": "/ckpt", "topology.users": ["carol"],
                 "topology.readonly.users": ["dave"]}
HISTORY = [[1_800_000_000 + 10 * i, 10.0 + i, 12.0, 300 + i] for i in range(5)]
PROGRESS = {"batch_id": 41, "timestamp": "2026-11-27T14:33:19.412Z",
            "sources": [{"description": "FileStreamSource[file:/in-<img src=x>]",
                         "start_offset": '{"logOffset": 40}',
                         "end_offset": f'{{"logOffset": 41, "token": "{SECRET}"}}',
                         "latest_offset": None, "num_input_rows": 5,
                         "input_rows_per_second": 1.0, "processed_rows_per_second": 2.0}],
            "sink": {"description": "FileSink[/out]", "num_output_rows": 5},
            "state_operators": [], "watermark": None,
            "duration_ms": {"triggerExecution": 40}}


class Page:
    """The UI app on a real ZooKeeper with one pipeline topology of alice's, its worker
    running ``counts`` on sup-a:6700 and two placements recorded."""

    def __init__(self, zk_server, zk_root, make_zk, authorizer: object = None) -> None:
        self.state = StormClusterState(make_zk(), zk_root)
        self.state.setup()
        (self.tid,) = write_cluster(self.state, topologies=1)
        self.state.zk.set(self.state.storm_path(self.tid), StormBase(
            storm_name="topo0", launch_time_secs=int(time.time()) - 10, status=ACTIVE,
            num_workers=1, owner="alice").encode())
        self.state.supervisor_heartbeat("sup-a", SupervisorInfo(
            time_secs=1, hostname="host-a", meta=[6700, 6701, 6702, 6703], workers={
                "6700": {"topology_id": self.tid, "state": "running", "restarts": 1}}))
        self.state.worker_heartbeat(self.tid, "sup-a", 6700, WorkerBeat(
            time_secs=1_800_000_045, topology_id=self.tid, supervisor_id="sup-a",
            host="host-a", port=6700, spark_ui_url="http://127.0.0.1:4040",
            components={"counts": {"batch_id": 41, "num_input_rows": 5,
                                   "input_rows_per_second": 1.0,
                                   "processed_rows_per_second": 2.0,
                                   "progress": PROGRESS, "history": HISTORY}}).encode())
        self.state.zk.create(self.state.placements_path(self.tid), PlacementHistory(workers={
            "worker-0": [{"supervisor_id": "sup-b", "host": "host-b", "port": 6701,
                          "since_secs": 100, "until_secs": 200},
                         {"supervisor_id": "sup-a", "host": "host-a", "port": 6700,
                          "since_secs": 200, "until_secs": 0}]}).encode())
        self.state.report_error(self.tid, "worker-0", ErrorInfo(
            error=f"cannot start <script>alert(1)</script> with {SECRET}",
            error_time_secs=1_800_000_000, host="host-a", port=6700))
        self.conf = conf_for(zk_server, zk_root)
        install_log_redaction(self.conf)
        self.reader = ZooKeeperReader(self.conf, self.state.zk,
                                      fetch_conf=lambda tid: json.dumps(TOPOLOGY_CONF))
        self.reader.start()
        assert self.reader.wait_ready(10)
        self.leader = FakeLeader()
        app = UIApp(self.conf, self.reader, self.leader)  # type: ignore[arg-type]
        # nimbus.authorizer needs TLS (tests/test_ui_tls.py has the real thing); the
        # app's rule is what is tested here, with the same decisions.
        app.authorizer = authorizer
        self.client = Client(app)

    def get(self, path: str, who: str | None = None):
        return self.client.get(path, environ_overrides={IDENTITY_KEY: who} if who else None)


@pytest.fixture
def page(make_zk, zk_server, zk_root):
    made = Page(zk_server, zk_root, make_zk)
    yield made
    assert made.leader.calls == [], "reads never reach the leader"
    made.reader.stop()


def test_the_page_data_is_topology_info_with_what_the_page_needs(page):
    data = page.get(f"/api/v1/topology/{page.tid}/page").json
    assert data["id"] == page.tid and data["may_change"] is True
    assert isinstance(data["generated_at"], int)
    (worker,) = data["workers"]
    assert (worker["state"], worker["alive"], worker["spark_ui_url"]) == (
        "running", True, "http://127.0.0.1:4040")
    assert [(p["host"], p["port"], p["until_secs"]) for p in worker["placements"]] == [
        ("host-a", 6700, 0), ("host-b", 6701, 200)]
    counts = data["components"]["counts"]
    assert counts["history"] == HISTORY and counts["history_end_secs"] == 1_800_000_045
    assert counts["checkpoint"] == f"/ckpt/{page.tid}/counts"
    source = counts["progress"]["sources"][0]
    assert source["description"] == "FileStreamSource[file:/in-<img src=x>]", \
        "JSON carries tenant text as it is; the page sets it as text"
    assert SECRET not in json.dumps(data) and "***" in source["end_offset"]
    (error,) = data["errors"]["worker-0"]
    assert error["error"].startswith("cannot start <script>alert(1)</script> with ")


def test_storms_component_resource_with_nimbus_has_details(page):
    answer = page.get(f"/api/v1/topology/{page.tid}/component/counts")
    assert answer.status_code == 200, answer.text
    detail = answer.json
    assert {k: detail[k] for k in ("id", "name", "user", "topologyId", "topologyStatus",
                                   "componentType", "executors", "tasks", "window")} == {
        "id": "counts", "name": "topo0", "user": "alice", "topologyId": page.tid,
        "topologyStatus": "ACTIVE", "componentType": "bolt", "executors": 1, "tasks": 1,
        "window": ":all-time"}
    (executor,) = detail["executorStats"]
    assert (executor["host"], executor["port"], executor["executed"], executor["state"]) == (
        "host-a", 6700, 5, "running")
    assert detail["boltStats"][0]["executed"] == 5 and detail["componentErrors"] == []
    assert (detail["batchId"], detail["history"], detail["historyEndSecs"]) == (
        41, HISTORY, 1_800_000_045)
    assert detail["checkpoint"] == f"/ckpt/{page.tid}/counts"
    assert detail["sparkUiUrls"] == ["http://127.0.0.1:4040"]
    assert SECRET not in answer.text
    # A component that only has errors (the worker's own) is one too, Storm's way.
    errors_only = page.get(f"/api/v1/topology/{page.tid}/component/worker-0").json
    assert errors_only["executors"] == 0
    (error,) = errors_only["componentErrors"]
    assert (error["errorTime"], error["errorHost"], error["errorPort"]) == (
        1_800_000_000_000, "host-a", 6700)


def check_error(response, status: int) -> None:
    assert response.status_code == status, response.text
    assert response.mimetype == "application/json"
    assert set(response.json) == {"error", "errorMessage"}


@pytest.mark.parametrize("path", [
    "/api/v1/topology/nope-1-1/page",
    "/api/v1/topology/..%2F..%2Fetc/page",
    "/api/v1/topology/%00/page",
    "/api/v1/topology/nope-1-1/component/counts",
    "/api/v1/topology/{tid}/component/nope",
    "/api/v1/topology/{tid}/component/..",
    "/api/v1/topology/{tid}/component/%3Cscript%3E",
    "/api/v1/topology/{tid}/component/a%2Fb",
    "/api/v1/topology/{tid}/component/" + "x" * 65,
    "/api/v1/topology/{tid}/component/%C3%A9",
    "/api/v1/topology/{tid}/component/",
    "/api/v1/topology/{tid}/component/a/b",
])
def test_unknown_and_hostile_ids_and_component_names_are_404(page, path):
    check_error(page.get(path.format(tid=page.tid)), 404)


def test_wrong_methods_are_405(page):
    check_error(page.client.post(f"/api/v1/topology/{page.tid}/page"), 405)
    check_error(page.client.delete(f"/api/v1/topology/{page.tid}/component/counts"), 405)


class Acl:
    """SimpleACLAuthorizer's decisions (nimbus.topology_acl), nimbus.admins = [ops]."""

    def permit(self, who: str | None, owner: str, users) -> bool:
        return bool(who) and (who == "ops" or who == owner or who in set(users))

    def permit_read(self, who: str | None, owner: str, users, readonly) -> bool:
        return self.permit(who, owner, users) or (bool(who) and who in set(readonly))


def test_the_read_rule_of_a_topology_applies(make_zk, zk_server, zk_root):
    secured = Page(zk_server, zk_root, make_zk, authorizer=Acl())
    try:
        paths = [f"/api/v1/topology/{secured.tid}/page",
                 f"/api/v1/topology/{secured.tid}/component/counts"]
        for path in paths:
            for who in (None, "bob", "alice", "carol", "dave", "ops"):
                # The answer /api/v1/topology/:id gives the same caller.
                expected = secured.get(f"/api/v1/topology/{secured.tid}", who).status_code
                assert expected == (403 if who in (None, "bob") else 200)
                answer = secured.get(path, who)
                assert answer.status_code == expected, (path, who, answer.text)
                if expected == 403:
                    check_error(answer, 403)
        # The page's buttons: for who may change it, not for a read-only user.
        secured.reader.fetch_topology_conf(secured.tid)   # cached, as the dashboard has it
        assert [secured.get(paths[0], who).json["may_change"]
                for who in ("alice", "carol", "dave", "ops")] == [True, True, False, True]
    finally:
        secured.reader.stop()
