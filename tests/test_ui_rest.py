"""The UI's REST API against a real ZooKeeper: Storm UI's paths and exact field names."""

from __future__ import annotations

import pytest
from ui_fixtures import FakeLeader, Harness, conf_for, write_cluster
from waiting import wait_until
from werkzeug.test import Client

from nimbus.state.cluster_state import StormClusterState
from nimbus.ui.app import URLS, UIApp
from nimbus.ui.openapi import openapi_document
from nimbus.ui.pretty import pretty_uptime
from nimbus.ui.zk_reader import ZooKeeperReader

pytestmark = pytest.mark.zookeeper

CLUSTER_KEYS = {"stormVersion", "supervisors", "topologies", "slotsTotal", "slotsUsed",
                "slotsFree", "executorsTotal", "tasksTotal", "schedulerDisplayResource",
                "totalMem", "totalCpu", "availMem", "availCpu", "memAssignedPercentUtil",
                "cpuAssignedPercentUtil"}
NIMBUS_KEYS = {"host", "port", "status", "version", "nimbusUpTime", "nimbusUpTimeSeconds",
               "nimbusLogLink"}
SUPERVISOR_KEYS = {"id", "host", "uptime", "uptimeSeconds", "slotsTotal", "slotsUsed",
                   "totalMem", "totalCpu", "usedMem", "usedCpu", "version",
                   "warmReady", "warmStarting", "warmMemoryBytes"}
TOPOLOGY_KEYS = {"id", "name", "status", "uptime", "uptimeSeconds", "tasksTotal",
                 "workersTotal", "executorsTotal", "replicationCount", "requestedMemOnHeap",
                 "requestedMemOffHeap", "requestedTotalMem", "requestedCpu",
                 "assignedMemOnHeap", "assignedMemOffHeap", "assignedTotalMem",
                 "assignedCpu"}
DETAIL_KEYS = {"id", "name", "uptime", "uptimeSeconds", "status", "tasksTotal",
               "workersTotal", "executorsTotal", "msgTimeout", "window", "windowHint",
               "schedulerDisplayResource", "replicationCount", "debug", "samplingPct",
               "assignedMemOnHeap", "assignedMemOffHeap", "assignedTotalMem", "assignedCpu",
               "requestedMemOnHeap", "requestedMemOffHeap", "requestedCpu", "topologyStats",
               "workers", "spouts", "bolts", "configuration",
               # nimbus-ha's additions
               "components", "errors"}
WORKER_KEYS = {"supervisorId", "host", "port", "topologyId", "topologyName",
               "executorsTotal", "assignedMemOnHeap", "assignedMemOffHeap", "assignedCpu",
               "componentNumTasks", "uptime", "uptimeSeconds", "workerLogLink",
               # nimbus-ha's additions (nimbus/state/worker_state.py)
               "state", "alive", "beatAgeSecs", "backoffSecs", "lastError", "restarts"}


@pytest.fixture
def ui(make_zk, zk_server, zk_root):
    state = StormClusterState(make_zk(), zk_root)
    state.setup()
    ids = write_cluster(state, topologies=2)
    harness = Harness(conf_for(zk_server, zk_root), state)
    harness.ids = ids
    yield harness
    harness.close()


def test_cluster_summary(ui):
    data = ui.client.get("/api/v1/cluster/summary").json
    assert set(data) == CLUSTER_KEYS
    assert (data["supervisors"], data["topologies"], data["slotsTotal"], data["slotsUsed"],
            data["slotsFree"], data["executorsTotal"]) == (1, 2, 4, 1, 3, 1)


def test_nimbus_summary_marks_leader(ui):
    nimbuses = ui.client.get("/api/v1/nimbus/summary").json["nimbuses"]
    assert all(set(n) == NIMBUS_KEYS for n in nimbuses)
    assert [(n["port"], n["status"]) for n in nimbuses] == [(1, "Leader"),
                                                            (2, "Not a Leader")]
    assert nimbuses[1]["nimbusUpTimeSeconds"] >= 200


def test_nimbus_summary_lists_unregistered_seed_offline(ui):
    ui.state.zk.delete(ui.state.path("nimbuses", "127.0.0.1:2"))
    ui.reader.refresh_now()
    nimbuses = ui.client.get("/api/v1/nimbus/summary").json["nimbuses"]
    assert [(n["port"], n["status"]) for n in nimbuses] == [(1, "Leader"), (2, "Offline")]


def test_supervisor_and_topology_summaries(ui):
    sups = ui.client.get("/api/v1/supervisor/summary").json
    assert set(sups) == {"supervisors", "schedulerDisplayResource"}
    assert [set(s) for s in sups["supervisors"]] == [SUPERVISOR_KEYS]
    assert sups["supervisors"][0]["slotsUsed"] == 1
    assert sups["supervisors"][0]["uptime"] == "1m 5s"
    topos = ui.client.get("/api/v1/topology/summary").json
    assert set(topos) == {"topologies", "schedulerDisplayResource"}
    assert all(set(t) == TOPOLOGY_KEYS for t in topos["topologies"])
    assert [(t["name"], t["workersTotal"], t["replicationCount"])
            for t in topos["topologies"]] == [("topo0", 1, 1), ("topo1", 0, 1)]


def test_store_backed_replication_counts_come_from_the_nimbuses(make_zk, zk_server, zk_root):
    """s3 and hdfs register no replicas in ZooKeeper: the count the nimbuses report in
    getClusterInfo (the store's redundancy) is what the UI shows then."""
    from waiting import wait_for

    state = StormClusterState(make_zk(), zk_root)
    state.setup()
    ids = write_cluster(state, topologies=2)
    harness = Harness(conf_for(zk_server, zk_root), state,
                      fetch_replicas=lambda: {ids[1]: 3})
    try:
        def counts() -> list[int]:
            return [t["replicationCount"] for t in
                    harness.client.get("/api/v1/topology/summary").json["topologies"]]

        assert wait_for(lambda: counts() == [1, 3], 15, "the reported count")
    finally:
        harness.close()


def test_topology_detail(ui):
    response = ui.client.get(f"/api/v1/topology/{ui.ids[0]}")
    assert response.status_code == 200
    data = response.json
    assert set(data) == DETAIL_KEYS
    assert [set(w) for w in data["workers"]] == [WORKER_KEYS]
    assert data["workers"][0]["port"] == 6700 and data["replicationCount"] == 1


def test_configuration_is_redacted(ui):
    data = ui.client.get("/api/v1/cluster/configuration").json
    assert data["nimbus.codedistributor.s3.secret.key"] == "********"
    assert "hunter2-secret" not in ui.client.get("/api/v1/cluster/configuration").text


def test_actions_reach_the_leader_by_name(ui):
    tid = ui.ids[0]
    assert ui.client.post(f"/api/v1/topology/{tid}/deactivate").json == {
        "topologyOperation": "deactivate", "topologyId": tid, "status": "success"}
    ui.client.post(f"/api/v1/topology/{tid}/activate")
    ui.client.post(f"/api/v1/topology/{tid}/rebalance/5",
                   json={"rebalanceOptions": {"numWorkers": 3}})
    ui.client.post(f"/api/v1/topology/{tid}/rebalance/0?numWorkers=2")
    ui.client.post(f"/api/v1/topology/{tid}/kill/7")
    assert ui.leader.calls == [("deactivate", "topo0"), ("activate", "topo0"),
                               ("rebalance", "topo0", 3, 5), ("rebalance", "topo0", 2, 0),
                               ("kill", "topo0", 7)]


def test_dashboard_data(ui):
    data = ui.client.get("/api/v1/ui/dashboard").json
    assert data["leader"] == "127.0.0.1:1"
    held = {n["address"]: (n["codeHeld"], n["codeLive"]) for n in data["nimbuses"]}
    assert held == {"127.0.0.1:1": (2, 2), "127.0.0.1:2": (0, 2)}
    assert [t["replicationMin"] for t in data["topologies"]] == [1, 1]
    assert data["timeline"][-1]["kind"] == "leader"


def test_dashboard_and_topology_page_show_each_workers_state(ui):
    """Issue 29: a crashed worker showed as alive on the dashboard. The dashboard and
    /api/v1/topology/:id judge workers as topology-info does (worker_state)."""
    from nimbus.state.records import SupervisorInfo, WorkerBeat

    tid = ui.ids[0]
    beat = WorkerBeat(time_secs=1, topology_id=tid, supervisor_id="sup-a", host="host-a",
                      port=6700, restarts=1, components={"main": {
                          "batch_id": 2, "processed_rows_per_second": 7.5}})

    def say(state: str, **slot: object) -> None:
        ui.state.supervisor_heartbeat("sup-a", SupervisorInfo(
            time_secs=1, hostname="host-a", meta=[6700, 6701, 6702, 6703], workers={
                "6700": {"topology_id": tid, "state": state, **slot}}))

    def shown() -> tuple:
        entry = next(t for t in ui.client.get("/api/v1/ui/dashboard").json["topologies"]
                     if t["id"] == tid)
        return (entry["workersAlive"], entry["workerStates"], entry["restarts"],
                entry["recordsPerSecond"])

    def states(**counts: int) -> dict[str, int]:
        return {s: counts.get(s, 0) for s in ("starting", "running", "frozen", "restarting",
                                              "dead")}

    ui.state.worker_heartbeat(tid, "sup-a", 6700, beat.encode())
    wait_until(lambda: shown() == (1, states(running=1), 1, 7.5), 15)
    # The supervisor says, after the beat, that it crashed: not alive, no rate.
    say("restarting", restarts=3, backoff_secs=2, last_error="boom")
    wait_until(lambda: shown() == (0, states(restarting=1), 3, 0.0), 15)
    (worker,) = ui.client.get(f"/api/v1/topology/{tid}").json["workers"]
    assert {k: worker[k] for k in ("state", "alive", "backoffSecs", "lastError",
                                   "restarts", "uptimeSeconds")} == {
        "state": "restarting", "alive": False, "backoffSecs": 2, "lastError": "boom",
        "restarts": 3, "uptimeSeconds": 0}
    # Its supervisor gone: dead.
    ui.state.zk.delete(ui.state.path("supervisors", "sup-a"))
    wait_until(lambda: shown() == (0, states(dead=1), 1, 0.0), 15)


def test_openapi_covers_every_route():
    doc = openapi_document()
    for rule in URLS.iter_rules():
        path = rule.rule.replace("<topology_id>", "{id}").replace("<name>", "{name}") \
            .replace("<component>", "{component}").replace("<version>", "{n}")
        if "<any(" in path:
            head, _, tail = path.partition("/<any(")
            names, _, rest = tail.partition(")")
            for name in names.split(", "):
                rest_path = rest.replace(":action>", "").replace("<wait_time>",
                                                                  "{wait-time}")
                assert head + "/" + name + rest_path in doc["paths"], name
        else:
            assert path in doc["paths"], path


@pytest.mark.parametrize("secs,text", [(0, "0s"), (59, "59s"), (61, "1m 1s"),
                                       (3600, "1h 0m 0s"), (90061, "1d 1h 1m 1s")])
def test_pretty_uptime(secs, text):
    assert pretty_uptime(secs) == text


def test_supervisor_summary_shows_warm_workers(ui):
    from nimbus.state.records import SupervisorInfo

    ui.state.supervisor_heartbeat("sup-a", SupervisorInfo(
        time_secs=1, hostname="host-a", meta=[6700, 6701], warm_ready=1, warm_starting=1,
        warm_memory_bytes=420 * 2**20))
    ui.reader.refresh_now()
    (sup,) = ui.client.get("/api/v1/supervisor/summary").json["supervisors"]
    assert (sup["warmReady"], sup["warmStarting"], sup["warmMemoryBytes"]) == (
        1, 1, 420 * 2**20)


def test_a_ui_started_before_any_nimbus_names_the_root_then_shows_the_cluster(
        make_zk, zk_server, zk_root):
    """Never an empty cluster: until a nimbus sets the root up, every read says why (503,
    naming the root); its watch then brings the cluster in without a restart."""
    reader = ZooKeeperReader(conf_for(zk_server, zk_root), make_zk(),
                             fetch_conf=lambda t: "{}")
    reader.start()
    try:
        client = Client(UIApp(conf_for(zk_server, zk_root), reader, FakeLeader()))
        assert reader.wait_ready(10) is False  # returns once it knows why: no snapshot
        response = client.get("/api/v1/cluster/summary")
        assert response.status_code == 503
        assert response.json["errorMessage"] == (
            f"no nimbus has set the cluster up under {zk_root} yet (start a nimbus, or "
            "check storm.zookeeper.root and storm.zookeeper.servers): the UI is waiting "
            "for one")
        state = StormClusterState(make_zk(), zk_root)
        state.setup()
        write_cluster(state, topologies=1)
        wait_until(lambda: client.get("/api/v1/cluster/summary").status_code == 200, 15)
        assert client.get("/api/v1/cluster/summary").json["topologies"] == 1
        # A layout directory gone later (a wiped ZooKeeper) is an error, never "empty".
        state.zk.delete(state.path("supervisors"), recursive=True)
        reader.refresh_now()
        response = client.get("/api/v1/supervisor/summary")
        assert response.status_code == 503
        assert response.json["errorMessage"].startswith(
            f"{zk_root}/supervisors does not exist: ZooKeeper was wiped")
    finally:
        reader.stop()
