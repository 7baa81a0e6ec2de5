"""Code versions on the UI (issue 31) against a real ZooKeeper: ``GET
/api/v1/topology/:id/history`` and ``POST /api/v1/topology/:id/version/:n`` (their read
and change rules, the cross-origin refusal, bad input, the leader's refusals as HTTP
statuses), and the version facts of the topology page's data and of runtime_view's
topology_info (``topology-info --json``): the running version, a switch under way and
each worker's version."""

from __future__ import annotations

import pytest
from test_ui_topology_page import SECRET, Acl, Page, check_error

from nimbus.state import runtime_view
from nimbus.state.code_versions import CodeVersions
from nimbus.state.records import KILLED, Assignment, StormBase, SupervisorInfo
from nimbus.thrift import storm
from nimbus.thrift.client import NimbusUnavailableError

pytestmark = pytest.mark.zookeeper

MARKUP = "<img src=x onerror=window.__pwned=1>"


def versions_record() -> CodeVersions:
    """topo0 upgraded to version 2 by alice, version 3 failed, a rolling switch 2 -> 4
    under way with worker-0 switched."""
    def entry(version: int, state: str, error: str = "") -> dict:
        return {"version": version, "sha256": {"stormjar.jar": f"{version}" * 64},
                "submitter": "alice", "created_secs": 1_800_000_000 + version,
                "state": state, "error": error, "conf": {}}

    return CodeVersions(
        versions=[entry(1, "previous"), entry(2, "running"),
                  entry(3, "failed", f"build() raised {MARKUP} with {SECRET}"),
                  entry(4, "switching")],
        running=2,
        switch={"kind": "upgrade", "from": 2, "to": 4, "strategy": "rolling",
                "started_secs": 1_800_000_100, "deadline_secs": 1_800_000_400,
                "by": "alice", "switched": ["worker-0"]})


def history_of(tid: str) -> dict:
    """What the leader's getTopologyHistory answers for topo0."""
    return {"topology_id": tid, "name": "topo0", "running": 2,
            "switch": versions_record().switch,
            "versions": [{"version": v, "sha256": f"{v}" * 64, "submitter": f"alice{MARKUP}",
                          "created_secs": 1_800_000_000 + v, "state": s,
                          "error": f"boom {SECRET}" if s == "failed" else ""}
                         for v, s in ((4, "switching"), (3, "failed"), (2, "running"),
                                      (1, "previous"))]}


@pytest.fixture
def page(make_zk, zk_server, zk_root):
    made = Page(zk_server, zk_root, make_zk)
    made.leader.histories["topo0"] = history_of(made.tid)
    yield made
    made.reader.stop()


@pytest.fixture
def secured(make_zk, zk_server, zk_root):
    made = Page(zk_server, zk_root, make_zk, authorizer=Acl())
    made.leader.histories["topo0"] = history_of(made.tid)
    yield made
    made.reader.stop()


def post(page: Page, path: str, who: str | None = None, **kwargs):
    from nimbus.ui.https import IDENTITY_KEY

    return page.client.post(path, environ_overrides={IDENTITY_KEY: who} if who else None,
                            **kwargs)


# -- GET /api/v1/topology/:id/history ---------------------------------------------------
def test_history_is_the_leaders_with_worker_text_masked(page):
    answer = page.get(f"/api/v1/topology/{page.tid}/history")
    assert answer.status_code == 200, answer.text
    data = answer.json
    expected = history_of(page.tid)
    assert page.leader.calls == [("history", "topo0")]
    assert [v["error"] for v in data["versions"]] == ["", "boom ********", "", ""]
    assert data["versions"][0]["submitter"] == f"alice{MARKUP}", "text, as it was"
    for got, want in zip(data["versions"], expected["versions"], strict=True):
        assert {k: v for k, v in got.items() if k != "error"} == \
            {k: v for k, v in want.items() if k != "error"}
    assert {k: data[k] for k in ("topology_id", "name", "running", "switch")} == {
        k: expected[k] for k in ("topology_id", "name", "running", "switch")}
    assert answer.headers["Cache-Control"] == "no-store"


@pytest.mark.parametrize("path", ["/api/v1/topology/nope-1-1/history",
                                  "/api/v1/topology/..%2F..%2Fetc/history"])
def test_history_of_an_unknown_or_hostile_id_is_404(page, path):
    check_error(page.get(path), 404)
    assert page.leader.calls == []


def test_history_follows_the_read_rule(secured):
    path = f"/api/v1/topology/{secured.tid}/history"
    for who in (None, "bob"):
        check_error(secured.get(path, who), 403)
    assert secured.leader.calls == [], "a refused caller's request never reaches the leader"
    for who in ("alice", "carol", "dave", "ops"):   # owner, users, readonly.users, admin
        assert secured.get(path, who).status_code == 200, who


@pytest.mark.parametrize("failure, status", [
    (NimbusUnavailableError("no leader"), 503),
    (storm.NotAliveException(msg="no topology named topo0"), 404),
    (storm.AuthorizationException(msg="ui may not getTopologyHistory topo0"), 403)])
def test_history_the_leader_cannot_give(page, failure, status):
    page.leader.fail = failure
    answer = page.get(f"/api/v1/topology/{page.tid}/history")
    check_error(answer, status)
    if status == 403:
        assert "the leader refused the UI's own identity" in answer.json["errorMessage"]


# -- POST /api/v1/topology/:id/version/:n -----------------------------------------------
def test_switch_to_a_kept_version(page):
    answer = post(page, f"/api/v1/topology/{page.tid}/version/1")
    assert answer.status_code == 200, answer.text
    assert answer.json == {"topologyOperation": "version", "topologyId": page.tid,
                           "status": "success", "version": 1}
    assert page.leader.calls == [("rollback", "topo0", 1)]
    # A same-origin browser POST, and one with an empty JSON body, are the same.
    assert post(page, f"/api/v1/topology/{page.tid}/version/3", json={},
                headers={"Origin": "http://localhost"}).status_code == 200
    assert page.leader.calls[-1] == ("rollback", "topo0", 3)


@pytest.mark.parametrize("version", ["0", "x", "-1", "1234567", "2.0", "%20", "\u00b2",
                                     "\u0663", "%C2%B2", "%D9%A3", "1\u00b2", "+1"])
def test_a_version_that_is_no_number_is_400(page, version):
    check_error(post(page, f"/api/v1/topology/{page.tid}/version/{version}"), 400)
    assert page.leader.calls == []


def test_bad_bodies_wrong_methods_and_unknown_ids(page):
    check_error(post(page, f"/api/v1/topology/{page.tid}/version/1", data=b"{x",
                     headers={"Content-Type": "application/json"}), 400)
    check_error(post(page, f"/api/v1/topology/{page.tid}/version/1",
                     data=b"x" * (1024 * 1024 + 10)), 413)
    check_error(page.get(f"/api/v1/topology/{page.tid}/version/1"), 405)
    check_error(page.client.put(f"/api/v1/topology/{page.tid}/history"), 405)
    check_error(post(page, "/api/v1/topology/nope-1-1/version/1"), 404)
    assert page.leader.calls == []


def test_a_cross_origin_post_is_refused(page):
    answer = post(page, f"/api/v1/topology/{page.tid}/version/1",
                  headers={"Origin": "https://evil.example"})
    check_error(answer, 403)
    assert answer.json["errorMessage"] == "cross-origin POST refused"
    assert page.leader.calls == []


def test_switching_follows_the_change_rule(secured):
    path = f"/api/v1/topology/{secured.tid}/version/1"
    for who in (None, "bob", "dave"):   # dave may only read it
        answer = post(secured, path, who)
        check_error(answer, 403)
        assert answer.json["errorMessage"] == (
            f"{who or 'an unauthenticated client'} may not rollback topo0: not its "
            "submitter, not in its topology.users, not in nimbus.admins")
    assert secured.leader.calls == []
    for who in ("alice", "carol", "ops"):
        assert post(secured, path, who).status_code == 200, who
    assert secured.leader.calls == [("rollback", "topo0", 1)] * 3


@pytest.mark.parametrize("failure, status", [
    (storm.InvalidTopologyException(msg="topo0 is switching from version 2 to 4: wait "
                                        "for it to end"), 409),
    (storm.InvalidTopologyException(msg="version 7 of topo0 is not kept (kept: 1, 2)"), 409),
    (storm.NotAliveException(msg="no topology named topo0"), 404),
    (NimbusUnavailableError("no leader answered within 5s"), 503)])
def test_the_leaders_refusals_as_statuses(page, failure, status):
    page.leader.fail = failure
    answer = post(page, f"/api/v1/topology/{page.tid}/version/7")
    check_error(answer, status)
    if isinstance(failure, storm.InvalidTopologyException):
        assert answer.json["errorMessage"] == failure.msg


def test_a_killed_topology_is_not_switched(page):
    page.state.zk.set(page.state.storm_path(page.tid), StormBase(
        storm_name="topo0", launch_time_secs=1, status=KILLED, num_workers=1,
        owner="alice").encode())
    check_error(post(page, f"/api/v1/topology/{page.tid}/version/1"), 409)
    assert page.leader.calls == []


# -- the version facts of topology_info and the page ------------------------------------
def upgrade_under_way(page: Page) -> None:
    """/code-versions/<id> with a switch 2 -> 4, worker-0 switched; worker-1 (sup-a:6701)
    still on version 2 by the assignment; sup-a says what each runs."""
    state, tid = page.state, page.tid
    state.zk.create(state.code_versions_path(tid), versions_record().encode(),
                    makepath=True)
    state.zk.set(state.path("assignments", tid), Assignment(
        master_code_dir="/code", node_host={"sup-a": "host-a"},
        executor_node_port={"worker-0": ["sup-a", 6700], "worker-1": ["sup-a", 6701]},
        executor_start_time_secs={"worker-0": 1, "worker-1": 1},
        code_sha256={"stormjar.jar": "4" * 64}, code_version=4,
        worker_versions={"worker-1": 2},
        version_sha256={"2": {"stormjar.jar": "2" * 64}}).encode())
    state.supervisor_heartbeat("sup-a", SupervisorInfo(
        time_secs=1, hostname="host-a", meta=[6700, 6701], workers={
            "6700": {"topology_id": tid, "state": "running", "restarts": 0, "version": 4,
                     "committed": True, "failures": 0},
            "6701": {"topology_id": tid, "state": "running", "restarts": 0, "version": 2,
                     "committed": True, "failures": 0}}))


def test_topology_info_says_what_runs_and_the_switch_under_way(page):
    upgrade_under_way(page)
    info = runtime_view.topology_info(page.state, page.tid)
    assert (info["code_version"], info["switch"]) == (2, versions_record().switch)
    assert [(v["version"], v["state"]) for v in info["code_versions"]] == [
        (4, "switching"), (3, "failed"), (2, "running"), (1, "previous")]
    assert [(w["worker"], w["version"], w["assigned_version"]) for w in info["workers"]] \
        == [("worker-0", 4, 4), ("worker-1", 2, 2)]
    # The page's data: the same, the failed version's error masked.
    data = page.get(f"/api/v1/topology/{page.tid}/page").json
    assert (data["code_version"], data["switch"]) == (2, versions_record().switch)
    assert data["code_versions"][1]["error"] == f"build() raised {MARKUP} with ********"
    assert [w["version"] for w in data["workers"]] == [4, 2]
    assert page.leader.calls == [], "the page's own data never asks the leader"


def test_an_unreadable_versions_node_shows_version_1(page):
    page.state.zk.create(page.state.code_versions_path(page.tid), b"{garbage",
                         makepath=True)
    info = runtime_view.topology_info(page.state, page.tid)
    assert (info["code_version"], info["switch"]) == (1, None)
    # a worker whose supervisor says no version: its beat's (1 from earlier releases)
    assert [w["version"] for w in info["workers"]] == [1]
