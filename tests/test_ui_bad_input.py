"""Bad input to the UI's REST API: a 4xx with a JSON error, and nothing changes."""

from __future__ import annotations

import pytest
from thriftpy2.thrift import TApplicationException
from ui_fixtures import Harness, conf_for, write_cluster

from nimbus.state.cluster_state import StormClusterState
from nimbus.state.records import KILLED
from nimbus.thrift import storm
from nimbus.thrift.client import NimbusUnavailableError

pytestmark = pytest.mark.zookeeper


@pytest.fixture
def ui(make_zk, zk_server, zk_root):
    state = StormClusterState(make_zk(), zk_root)
    state.setup()
    ids = write_cluster(state, topologies=1)
    harness = Harness(conf_for(zk_server, zk_root), state)
    harness.ids = ids
    yield harness
    assert harness.leader.calls == [], "bad input must not reach the leader"
    harness.close()


def check_error(response, status: int) -> None:
    assert response.status_code == status, response.text
    assert response.mimetype == "application/json"
    assert set(response.json) == {"error", "errorMessage"}


@pytest.mark.parametrize("path", [
    "/api/v1/topology/nope-1-1",
    "/api/v1/topology/../../etc/passwd",
    "/api/v1/topology/..%2F..%2Fetc%2Fpasswd",
    "/api/v1/topology/..",
    "/api/v1/topology/%00",
    "/api/v1/nothing",
    "/static/../app.py",
    "/static/..%2Fapp.py",
])
def test_unknown_paths_and_ids_are_404(ui, path):
    check_error(ui.client.get(path), 404)


@pytest.mark.parametrize("action", ["activate", "deactivate", "kill/0", "rebalance/0"])
def test_actions_on_unknown_or_traversing_ids(ui, action):
    for tid in ("nope-1-1", "..", "..%2F..%2Fstorms"):
        check_error(ui.client.post(f"/api/v1/topology/{tid}/{action}",
                                   json={"rebalanceOptions": {"numWorkers": 2}}), 404)


def test_wrong_methods_are_405(ui):
    tid = ui.ids[0]
    check_error(ui.client.get(f"/api/v1/topology/{tid}/kill/0"), 405)
    check_error(ui.client.delete(f"/api/v1/topology/{tid}"), 405)
    check_error(ui.client.post("/api/v1/cluster/summary"), 405)
    response = ui.client.put(f"/api/v1/topology/{tid}/activate")
    check_error(response, 405)
    assert "POST" in response.headers["Allow"]


def test_huge_and_malformed_bodies(ui):
    tid = ui.ids[0]
    check_error(ui.client.post(f"/api/v1/topology/{tid}/deactivate",
                               data=b"x" * (2 * 1024 * 1024),
                               content_type="application/json"), 413)
    check_error(ui.client.post(f"/api/v1/topology/{tid}/rebalance/0", data=b"{not json",
                               content_type="application/json"), 400)
    check_error(ui.client.post(f"/api/v1/topology/{tid}/rebalance/0", data=b"\xff\xfe",
                               content_type="application/json"), 400)
    check_error(ui.client.post(f"/api/v1/topology/{tid}/rebalance/0", json=[1, 2]), 400)


@pytest.mark.parametrize("body,query", [
    ({}, ""), ({"rebalanceOptions": {"numWorkers": 0}}, ""),
    ({"rebalanceOptions": {"numWorkers": "many"}}, ""),
    ({"rebalanceOptions": {"numWorkers": True}}, ""),
    ({"rebalanceOptions": "2"}, ""), ({}, "?numWorkers=-1"), ({}, "?numWorkers=1e9"),
    ({"rebalanceOptions": {"numWorkers": 2, "executors": {"a": 3}}}, ""),
    # digits str.isdigit() accepts but that are no ASCII digits: int() refuses the first
    # (a 500 once) and reads the second as 3
    ({"rebalanceOptions": {"numWorkers": "\u00b2"}}, ""),
    ({"rebalanceOptions": {"numWorkers": "\u0663"}}, ""), ({}, "?numWorkers=%C2%B2"),
    ({}, "?numWorkers=%D9%A3"),
])
def test_bad_rebalance_values_are_400(ui, body, query):
    check_error(ui.client.post(f"/api/v1/topology/{ui.ids[0]}/rebalance/0{query}",
                               json=body), 400)


@pytest.mark.parametrize("wait", ["-1", "x", "1.5", "9999999999", "\u00b2", "\u0663",
                                  "1\u00b2", "%C2%B2", "%D9%A3", "+1", " 1"])
def test_bad_wait_times_are_400(ui, wait):
    check_error(ui.client.post(f"/api/v1/topology/{ui.ids[0]}/kill/{wait}"), 400)
    check_error(ui.client.post(f"/api/v1/topology/{ui.ids[0]}/rebalance/{wait}",
                               json={"rebalanceOptions": {"numWorkers": 2}}), 400)


@pytest.mark.parametrize("query", ["worker=%C2%B2", "worker=%D9%A3", "worker=0&bytes=%C2%B2",
                                   "worker=0&bytes=%D9%A3", "worker=", "worker=-1"])
def test_bad_log_numbers_are_400(ui, query):
    check_error(ui.client.get(f"/api/v1/topology/{ui.ids[0]}/logs?{query}"), 400)


def test_cross_origin_post_is_403(ui):
    check_error(ui.client.post(f"/api/v1/topology/{ui.ids[0]}/kill/0",
                               headers={"Origin": "http://evil.example"}), 403)


def test_killed_topology_is_409(ui):
    tid = ui.ids[0]
    base, version = ui.state.storm_base_versioned(tid)
    base.status, base.kill_at_secs = KILLED, 2 ** 31
    ui.state.zk.set(ui.state.storm_path(tid), base.encode(), version)
    for action in ("activate", "deactivate", "kill/0"):
        check_error(ui.client.post(f"/api/v1/topology/{tid}/{action}"), 409)


@pytest.mark.parametrize("failure,status", [
    (NimbusUnavailableError("no leader"), 503),
    (ConnectionRefusedError("refused"), 503),
    (TApplicationException(TApplicationException.INTERNAL_ERROR, "changed"), 503),
    (storm.NotAliveException(msg="gone"), 404),
    (storm.InvalidTopologyException(msg="topology 'x' is being killed"), 409),
    (storm.InvalidTopologyException(msg="bad value"), 400),
    (storm.AuthorizationException(msg="no"), 403),  # the leader refused the UI itself
    # a switch of code version under way: deactivate declares no InvalidTopologyException,
    # so the refusal comes as an internal error with the leader's words
    (TApplicationException(TApplicationException.INTERNAL_ERROR,
                           "Internal error processing deactivate: InvalidTopologyException: "
                           "topology 'topo0' is switching from code version 1 to 2 "
                           "(upgrade, all): deactivate is refused until the switch ends; "
                           "wait for it (see `nimbus-ha history topo0`) or roll it back "
                           "(`nimbus-ha rollback topo0`); kill is allowed"), 409),
    (storm.InvalidTopologyException(
        msg="topology 'topo0' is switching from code version 1 to 2 (upgrade, all): "
            "rebalance is refused until the switch ends; wait for it"), 409),
])
def test_leader_failures_map_to_statuses(ui, failure, status):
    ui.leader.fail = failure
    check_error(ui.client.post(f"/api/v1/topology/{ui.ids[0]}/deactivate"), status)


def test_zookeeper_gone_is_503(ui):
    ui.state.zk.stop()
    check_error(ui.client.get("/api/v1/topology/summary"), 503)
    check_error(ui.client.get(f"/api/v1/topology/{ui.ids[0]}"), 503)
