"""nimbus.master.runtime_view and report_error against a real ZooKeeper.

Records are written straight into ZooKeeper as the leader and the supervisors would write
them (docs/runtime.md); the view's dicts are compared whole.
"""

from __future__ import annotations

import pytest

from nimbus.master import runtime_view
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.records import (
    ACTIVE,
    Assignment,
    ErrorInfo,
    StormBase,
    SupervisorInfo,
    WorkerBeat,
)

pytestmark = pytest.mark.integration

TOPOLOGY = "wordcount-7-1000"
NOW = 2000.0


@pytest.fixture
def state(make_zk, zk_root) -> StormClusterState:
    state = StormClusterState(make_zk(), zk_root)
    state.setup()
    return state


def write_topology(state: StormClusterState, topology_id: str = TOPOLOGY,
                   assignment: Assignment | None = None) -> None:
    """The nodes a submit creates, plus an assignment as the scheduler writes it."""
    zk = state.zk
    zk.create(state.storm_path(topology_id), StormBase(
        storm_name="wordcount", launch_time_secs=1000, status=ACTIVE, num_workers=3,
        owner="alice").encode())
    zk.create(state.path("assignments", topology_id),
              (assignment or Assignment(master_code_dir="/code")).encode())
    zk.create(state.path("workerbeats", topology_id))
    zk.create(state.path("errors", topology_id))


def write_supervisor(state: StormClusterState, supervisor_id: str, host: str,
                     ports: list[int], used_ports: list[int], uptime: int = 50) -> None:
    state.supervisor_heartbeat(supervisor_id, SupervisorInfo(
        time_secs=1990, hostname=host, meta=ports, used_ports=used_ports,
        uptime_secs=uptime, version="0.2.0"))


def write_beat(state: StormClusterState, supervisor_id: str, port: int, data: bytes) -> None:
    state.worker_heartbeat(TOPOLOGY, supervisor_id, port, data)


ASSIGNMENT = Assignment(
    master_code_dir="/code",
    node_host={"sup-a": "host-a", "sup-b": "host-b"},
    # worker-10 sorts after worker-2 by index, not by name
    executor_node_port={"worker-0": ["sup-a", 6700], "worker-2": ["sup-b", 6700],
                        "worker-10": ["sup-a", 6701]},
    executor_start_time_secs={"worker-0": 1500, "worker-2": 1900, "worker-10": 1990})


def test_supervisors_count_used_slots_from_assignments(state):
    write_topology(state, assignment=ASSIGNMENT)
    # The supervisors' own used_ports lag behind the assignments and do not count: sup-a
    # lists one of its two assigned ports, sup-b none, sup-c one it is not assigned.
    write_supervisor(state, "sup-a", "host-a", [6701, 6700, 6702], [6700])
    write_supervisor(state, "sup-b", "host-b", [6700], [])
    write_supervisor(state, "sup-c", "host-c", [6700, 6701], [6700], uptime=7)
    state.zk.create(state.path("supervisors", "sup-junk"), b"not json", ephemeral=True)
    assert runtime_view.supervisors(state) == [
        {"id": "sup-a", "host": "host-a", "slots": 3, "used_slots": 2,
         "ports": [6700, 6701, 6702], "used_ports": [6700, 6701], "uptime_secs": 50,
         "version": "0.2.0"},
        {"id": "sup-b", "host": "host-b", "slots": 1, "used_slots": 1, "ports": [6700],
         "used_ports": [6700], "uptime_secs": 50, "version": "0.2.0"},
        {"id": "sup-c", "host": "host-c", "slots": 2, "used_slots": 0,
         "ports": [6700, 6701], "used_ports": [], "uptime_secs": 7, "version": "0.2.0"},
    ]


def test_topology_info_workers_components_and_errors(state):
    write_topology(state, assignment=ASSIGNMENT)
    # sup-a keeps warm workers; sup-b has no heartbeat node (gone): left out.
    state.supervisor_heartbeat("sup-a", SupervisorInfo(
        time_secs=1990, hostname="host-a", meta=[6700, 6701], warm_ready=1, warm_starting=1,
        warm_memory_bytes=700 * 2**20))
    write_beat(state, "sup-a", 6700, WorkerBeat(
        time_secs=1995, topology_id=TOPOLOGY, supervisor_id="sup-a", host="host-a",
        port=6700, uptime_secs=490, restarts=2, memory_bytes=350 * 2**20, warm_start=True,
        components={
            "counts": {"batch_id": 41, "num_input_rows": 100, "input_rows_per_second": 2.5,
                       "processed_rows_per_second": 2.0, "timestamp": "t"},
            "lines": {"batch_id": 7, "num_input_rows": 10, "input_rows_per_second": 0.5,
                      "processed_rows_per_second": 0.25, "timestamp": "t"}}).encode())
    write_beat(state, "sup-b", 6700, WorkerBeat(
        time_secs=1995, topology_id=TOPOLOGY, supervisor_id="sup-b", host="host-b",
        port=6700, components={
            "counts": {"batch_id": 44, "num_input_rows": 1, "input_rows_per_second": 1.5,
                       "processed_rows_per_second": 1.0},
            # a process topology's component: a pid, no batch yet
            "main": {"pid": 4242, "batch_id": None}}).encode())
    # worker-10's beat node exists but holds nothing readable: alive, no numbers
    write_beat(state, "sup-a", 6701, b"{garbage")
    for i in range(12):
        state.report_error(TOPOLOGY, "counts", ErrorInfo(
            error=f"boom {i}", error_time_secs=1000 + i, host="host-a", port=6700))
    state.report_error(TOPOLOGY, "lines", ErrorInfo(error="once", error_time_secs=1500))

    info = runtime_view.topology_info(state, TOPOLOGY, now=NOW)

    counts = [{"error": f"boom {i}", "time_secs": 1000 + i, "host": "host-a", "port": 6700}
              for i in range(11, 1, -1)]
    assert info == {
        "id": TOPOLOGY, "name": "wordcount", "status": "ACTIVE", "owner": "alice",
        "uptime_secs": 1000, "num_workers": 3,
        "workers": [
            {"worker": "worker-0", "index": 0, "supervisor_id": "sup-a", "host": "host-a",
             "port": 6700, "uptime_secs": 500, "alive": True, "restarts": 2,
             "memory_bytes": 350 * 2**20, "warm_start": True,
             "components": {
                 "counts": {"batch_id": 41, "num_input_rows": 100,
                            "input_rows_per_second": 2.5, "processed_rows_per_second": 2.0},
                 "lines": {"batch_id": 7, "num_input_rows": 10,
                           "input_rows_per_second": 0.5,
                           "processed_rows_per_second": 0.25}}},
            {"worker": "worker-2", "index": 2, "supervisor_id": "sup-b", "host": "host-b",
             "port": 6700, "uptime_secs": 100, "alive": True, "restarts": 0,
             "memory_bytes": 0, "warm_start": False,
             "components": {
                 "counts": {"batch_id": 44, "num_input_rows": 1,
                            "input_rows_per_second": 1.5, "processed_rows_per_second": 1.0},
                 "main": {"batch_id": None, "num_input_rows": 0,
                          "input_rows_per_second": 0.0, "processed_rows_per_second": 0.0}}},
            {"worker": "worker-10", "index": 10, "supervisor_id": "sup-a", "host": "host-a",
             "port": 6701, "uptime_secs": 10, "alive": True, "restarts": 0,
             "memory_bytes": 0, "warm_start": False, "components": {}},
        ],
        "warm_workers": {"sup-a": {"host": "host-a", "ready": 1, "starting": 1,
                                   "memory_bytes": 700 * 2**20}},
        "components": {
            "counts": {"host_ports": ["host-a:6700", "host-b:6700"], "batch_id": 44,
                       "num_input_rows": 101, "input_rows_per_second": 4.0,
                       "processed_rows_per_second": 3.0},
            "lines": {"host_ports": ["host-a:6700"], "batch_id": 7, "num_input_rows": 10,
                      "input_rows_per_second": 0.5, "processed_rows_per_second": 0.25},
            "main": {"host_ports": ["host-b:6700"], "batch_id": None, "num_input_rows": 0,
                     "input_rows_per_second": 0.0, "processed_rows_per_second": 0.0},
        },
        "errors": {
            "counts": counts,
            "lines": [{"error": "once", "time_secs": 1500, "host": "", "port": 0}],
        },
    }
    assert runtime_view.errors(state, TOPOLOGY) == info["errors"]


def test_worker_without_a_beat_is_not_alive(state):
    write_topology(state, assignment=Assignment(
        master_code_dir="/code", node_host={"sup-a": "host-a"},
        executor_node_port={"worker-0": ["sup-a", 6700]}))
    info = runtime_view.topology_info(state, TOPOLOGY, now=NOW)
    # no start time recorded: uptime 0
    assert info["workers"] == [
        {"worker": "worker-0", "index": 0, "supervisor_id": "sup-a", "host": "host-a",
         "port": 6700, "uptime_secs": 0, "alive": False, "restarts": 0, "memory_bytes": 0,
         "warm_start": False, "components": {}}]
    assert (info["components"], info["errors"]) == ({}, {})


def test_unknown_topology_has_no_info(state):
    assert runtime_view.topology_info(state, "nope-1-1") is None
    assert runtime_view.errors(state, "nope-1-1") == {}


def test_unreadable_error_records_are_skipped(state):
    write_topology(state)
    state.report_error(TOPOLOGY, "c", ErrorInfo(error="first", error_time_secs=1))
    state.zk.create(state.path("errors", TOPOLOGY, "c", "e"), b"junk", sequence=True)
    state.zk.create(state.path("errors", TOPOLOGY, "c", "e"), b'{"format": 1}',
                    sequence=True)  # decodes, but lacks the required fields
    state.report_error(TOPOLOGY, "c", ErrorInfo(error="last", error_time_secs=2))
    assert [e["error"] for e in runtime_view.errors(state, TOPOLOGY)["c"]] == [
        "last", "first"]


# -- report_error never brings back a removed topology's errors ---------------------------

def test_report_error_below_an_existing_topology(state):
    write_topology(state)
    assert state.report_error(TOPOLOGY, "c", ErrorInfo(error="x", error_time_secs=1))
    assert state.error_components(TOPOLOGY) == ["c"]


def test_report_error_of_a_removed_topology_writes_nothing(state):
    assert state.report_error("gone-1-1", "c", ErrorInfo(error="x", error_time_secs=1)) \
        is False
    assert state.zk.exists(state.path("errors", "gone-1-1")) is None
    assert state.error_topologies() == []


def test_report_error_after_removal_does_not_resurrect(state):
    write_topology(state)
    assert state.report_error(TOPOLOGY, "c", ErrorInfo(error="x", error_time_secs=1))
    state.zk.delete(state.path("errors", TOPOLOGY), recursive=True)  # as remove_storm does
    assert state.report_error(TOPOLOGY, "c", ErrorInfo(error="y", error_time_secs=2)) \
        is False
    assert state.zk.exists(state.path("errors", TOPOLOGY)) is None


def test_newest_error_is_the_newest_of_any_component(state):
    write_topology(state)
    assert runtime_view.newest_error(state, TOPOLOGY) is None
    state.report_error(TOPOLOGY, "counts", ErrorInfo(error="old", error_time_secs=1000))
    state.report_error(TOPOLOGY, "worker-0", ErrorInfo(
        error="build() raised AnalysisException: Path does not exist: in\n  at x",
        error_time_secs=1200))
    state.report_error(TOPOLOGY, "counts", ErrorInfo(error="older", error_time_secs=1100))
    assert runtime_view.newest_error(state, TOPOLOGY) == (
        "worker-0: build() raised AnalysisException: Path does not exist: in")


def test_the_demo_names_the_newest_error_while_it_waits(state, monkeypatch, capsys):
    """A failing pipeline reads as its error, not as a bare timeout (issue 17)."""
    from nimbus import runtime_demo

    write_topology(state)
    state.report_error(TOPOLOGY, "worker-0", ErrorInfo(
        error="build() raised AnalysisException: Path does not exist: in",
        error_time_secs=1200))
    monkeypatch.setattr(runtime_demo, "TIMEOUT_S", 0.3)
    watch = runtime_demo.ErrorWatch(state, "wordcount", TOPOLOGY)
    with pytest.raises(TimeoutError) as waited:
        watch.wait(lambda: False, "the records to be committed")
    assert str(waited.value) == (
        "timed out after 0.3s waiting for the records to be committed; the pipeline's "
        "newest error: worker-0: build() raised AnalysisException: Path does not exist: in "
        "(nimbus-ha errors wordcount shows them all)")
    assert capsys.readouterr().err == (
        f"{TOPOLOGY} reported an error: worker-0: build() raised AnalysisException: Path "
        "does not exist: in\n")
