"""nimbus.state.runtime_view and report_error against a real ZooKeeper.

Records are written straight into ZooKeeper as the leader and the supervisors would write
them (docs/runtime.md); the view's dicts are compared whole.
"""

from __future__ import annotations

import pytest
from waiting import wait_until

from nimbus.state import runtime_view, worker_state
from nimbus.state.cluster_snapshot import ClusterSnapshot
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.records import (
    ACTIVE,
    Assignment,
    ErrorInfo,
    StormBase,
    SupervisorInfo,
    WorkerBeat,
)

pytestmark = pytest.mark.zookeeper

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


def write_beat(state: StormClusterState, supervisor_id: str, port: int, data: bytes) -> None:
    state.worker_heartbeat(TOPOLOGY, supervisor_id, port, data)


ASSIGNMENT = Assignment(
    master_code_dir="/code",
    node_host={"sup-a": "host-a", "sup-b": "host-b"},
    # worker-10 sorts after worker-2 by index, not by name
    executor_node_port={"worker-0": ["sup-a", 6700], "worker-2": ["sup-b", 6700],
                        "worker-10": ["sup-a", 6701]},
    executor_start_time_secs={"worker-0": 1500, "worker-2": 1900, "worker-10": 1990})


def test_supervisor_rows_count_used_slots_from_assignments():
    def info(host: str, ports: list[int], used_ports: list[int],
             uptime: int = 50) -> SupervisorInfo:
        return SupervisorInfo(time_secs=1990, hostname=host, meta=ports,
                              used_ports=used_ports, uptime_secs=uptime, version="0.2.0")

    # The supervisors' own used_ports lag behind the assignments and do not count: sup-a
    # lists one of its two assigned ports, sup-b none, sup-c one it is not assigned.
    snapshot = ClusterSnapshot(assignments={TOPOLOGY: ASSIGNMENT}, supervisors={
        "sup-c": info("host-c", [6700, 6701], [6700], uptime=7),
        "sup-a": info("host-a", [6701, 6700, 6702], [6700]),
        "sup-b": info("host-b", [6700], [])})
    assert runtime_view.supervisor_rows(snapshot) == [
        {"id": "sup-a", "host": "host-a", "slots": 3, "used_slots": 2,
         "ports": [6700, 6701, 6702], "used_ports": [6700, 6701], "uptime_secs": 50,
         "version": "0.2.0"},
        {"id": "sup-b", "host": "host-b", "slots": 1, "used_slots": 1, "ports": [6700],
         "used_ports": [6700], "uptime_secs": 50, "version": "0.2.0"},
        {"id": "sup-c", "host": "host-c", "slots": 2, "used_slots": 0,
         "ports": [6700, 6701], "used_ports": [], "uptime_secs": 7, "version": "0.2.0"},
    ]


def mtime(state: StormClusterState, *parts: str) -> int:
    """A node's mtime (ms, ZooKeeper's clock): what worker states are judged by."""
    return state.zk.exists(state.path(*parts)).mtime


def reference(state: StormClusterState, *nodes: tuple[str, ...]) -> int:
    """The newest mtime of ``nodes``: the "now" topology_info judges beats against."""
    return max(mtime(state, *node) for node in nodes)


def test_topology_info_workers_components_and_errors(state):
    write_topology(state, assignment=ASSIGNMENT)
    # sup-a keeps warm workers; sup-b has no heartbeat node (gone): left out, and its
    # worker is dead whatever its last beat said.
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
        port=6700, memory_bytes=10, components={
            "counts": {"batch_id": 44, "num_input_rows": 1, "input_rows_per_second": 1.5,
                       "processed_rows_per_second": 1.0},
            # a process topology's component: a pid, no batch yet
            "main": {"pid": 4242, "batch_id": None}}).encode())
    # worker-10's beat node exists but holds nothing readable: running, no numbers
    write_beat(state, "sup-a", 6701, b"{garbage")
    for i in range(12):
        state.report_error(TOPOLOGY, "counts", ErrorInfo(
            error=f"boom {i}", error_time_secs=1000 + i, host="host-a", port=6700))
    state.report_error(TOPOLOGY, "lines", ErrorInfo(error="once", error_time_secs=1500))

    info = runtime_view.topology_info(state, TOPOLOGY, now=NOW)

    beats = [("workerbeats", TOPOLOGY, node) for node in ("sup-a-6700", "sup-b-6700",
                                                          "sup-a-6701")]
    now_ms = reference(state, ("assignments", TOPOLOGY), ("supervisors", "sup-a"), *beats)
    ages = [(now_ms - mtime(state, *node)) // 1000 for node in beats]
    counts = [{"error": f"boom {i}", "time_secs": 1000 + i, "host": "host-a", "port": 6700}
              for i in range(11, 1, -1)]
    zero = {"num_input_rows": 0, "input_rows_per_second": 0.0,
            "processed_rows_per_second": 0.0}

    def details(worker: str, live: bool) -> dict:
        # Beats without Spark's progress (an earlier release's, or a process's).
        return {"progress": None, "history": [], "history_end_secs": 1995,
                "reported_by": worker, "live": live, "details_cut": False,
                "checkpoint": None}

    assert info == {
        "id": TOPOLOGY, "name": "wordcount", "status": "ACTIVE", "owner": "alice",
        "uptime_secs": 1000, "num_workers": 3,
        "workers": [
            {"worker": "worker-0", "index": 0, "supervisor_id": "sup-a", "host": "host-a",
             "port": 6700, "uptime_secs": 500, "state": "running", "alive": True,
             "beat_age_secs": ages[0], "backoff_secs": 0, "last_error": "", "restarts": 2,
             "memory_bytes": 350 * 2**20, "warm_start": True, "spark_ui_url": "",
             "placements": [], "version": 1, "assigned_version": 1,
             "components": {
                 "counts": {"batch_id": 41, "num_input_rows": 100,
                            "input_rows_per_second": 2.5, "processed_rows_per_second": 2.0},
                 "lines": {"batch_id": 7, "num_input_rows": 10,
                           "input_rows_per_second": 0.5,
                           "processed_rows_per_second": 0.25}}},
            # Its supervisor is gone: its last numbers are history, not rates.
            {"worker": "worker-2", "index": 2, "supervisor_id": "sup-b", "host": "host-b",
             "port": 6700, "uptime_secs": 0, "state": "dead", "alive": False,
             "beat_age_secs": ages[1], "backoff_secs": 0,
             "last_error": "its supervisor sup-b is gone", "restarts": 0,
             "memory_bytes": 0, "warm_start": False, "spark_ui_url": "", "placements": [],
             "version": 1, "assigned_version": 1,
             "components": {"counts": {"batch_id": 44, **zero},
                            "main": {"batch_id": None, **zero}}},
            {"worker": "worker-10", "index": 10, "supervisor_id": "sup-a", "host": "host-a",
             "port": 6701, "uptime_secs": 10, "state": "running", "alive": True,
             "beat_age_secs": ages[2], "backoff_secs": 0, "last_error": "", "restarts": 0,
             "memory_bytes": 0, "warm_start": False, "spark_ui_url": "", "placements": [],
             "version": None, "assigned_version": 1,   # no readable beat: unknown
             "components": {}},
        ],
        "warm_workers": {"sup-a": {"host": "host-a", "ready": 1, "starting": 1,
                                   "memory_bytes": 700 * 2**20}},
        "components": {
            # The running worker's details first, though the dead one's beat is newer.
            "counts": {"host_ports": ["host-a:6700", "host-b:6700"], "batch_id": 44,
                       "num_input_rows": 100, "input_rows_per_second": 2.5,
                       "processed_rows_per_second": 2.0, **details("worker-0", True)},
            "lines": {"host_ports": ["host-a:6700"], "batch_id": 7, "num_input_rows": 10,
                      "input_rows_per_second": 0.5, "processed_rows_per_second": 0.25,
                      **details("worker-0", True)},
            "main": {"host_ports": ["host-b:6700"], "batch_id": None, **zero,
                     **details("worker-2", False)},
        },
        "errors": {
            "counts": counts,
            "lines": [{"error": "once", "time_secs": 1500, "host": "", "port": 0}],
        },
        # Never upgraded: version 1 alone, submitted at launch.
        "code_version": 1, "switch": None,
        "code_versions": [{"version": 1, "state": "running", "error": "",
                           "created_secs": 1000}],
    }
    assert runtime_view.errors(state, TOPOLOGY) == info["errors"]


ONE_WORKER = Assignment(master_code_dir="/code", node_host={"sup-a": "host-a"},
                        executor_node_port={"worker-0": ["sup-a", 6700]},
                        executor_start_time_secs={"worker-0": 1500})
BEAT = WorkerBeat(time_secs=1995, topology_id=TOPOLOGY, supervisor_id="sup-a",
                  host="host-a", port=6700, restarts=1, components={
                      "main": {"batch_id": 3, "num_input_rows": 5,
                               "input_rows_per_second": 1.0,
                               "processed_rows_per_second": 1.0}})


def say(cluster: StormClusterState, /, **slot: object) -> None:
    """sup-a's heartbeat, saying ``slot`` of its port 6700 (nothing if empty)."""
    workers = {"6700": {"topology_id": TOPOLOGY, **slot}} if slot else {}
    cluster.supervisor_heartbeat("sup-a", SupervisorInfo(
        time_secs=1990, hostname="host-a", meta=[6700], workers=workers))


def worker(state: StormClusterState, timeout_s: float = 30.0) -> dict:
    info = runtime_view.topology_info(state, TOPOLOGY, now=NOW, timeout_s=timeout_s)
    (only,) = info["workers"]
    return {k: only[k] for k in ("state", "alive", "backoff_secs", "last_error",
                                 "restarts", "uptime_secs", "components")}


def test_worker_without_a_beat_is_starting_and_without_a_supervisor_dead(state):
    write_topology(state, assignment=ONE_WORKER)
    info = runtime_view.topology_info(state, TOPOLOGY, now=NOW)
    assert info["workers"] == [
        {"worker": "worker-0", "index": 0, "supervisor_id": "sup-a", "host": "host-a",
         "port": 6700, "uptime_secs": 0, "state": "dead", "alive": False,
         "beat_age_secs": None, "backoff_secs": 0,
         "last_error": "its supervisor sup-a is gone", "restarts": 0, "memory_bytes": 0,
         "warm_start": False, "spark_ui_url": "", "placements": [], "version": None,
         "assigned_version": 1, "components": {}}]
    assert (info["components"], info["errors"]) == ({}, {})
    # Its supervisor is there and says nothing of it (it has not read the assignment
    # yet, or is of an earlier release): on its way.
    say(state)
    assert worker(state)["state"] == "starting"


def test_a_beat_older_than_the_task_timeout_by_zookeepers_clock_is_dead(state):
    write_topology(state, assignment=ONE_WORKER)
    say(state, state="running", restarts=1)
    write_beat(state, "sup-a", 6700, BEAT.encode())
    beat_ms = mtime(state, "workerbeats", TOPOLOGY, "sup-a-6700")
    assert worker(state, timeout_s=0.5)["state"] == "running"
    # Its supervisor's heartbeats go on (their mtimes are "now"); the beat does not.
    wait_until(lambda: say(state, state="running", restarts=1) or
               mtime(state, "supervisors", "sup-a") - beat_ms > 1000)
    age = (mtime(state, "supervisors", "sup-a") - beat_ms) // 1000
    assert worker(state, timeout_s=0.5) == {
        "state": "dead", "alive": False, "backoff_secs": 0,
        "last_error": f"no beat for {age}s (nimbus.task.timeout.secs 0.5)", "restarts": 1,
        "uptime_secs": 0, "components": {"main": {
            "batch_id": 3, "num_input_rows": 0, "input_rows_per_second": 0.0,
            "processed_rows_per_second": 0.0}}}
    assert worker(state, timeout_s=30.0)["state"] == "running"


def test_what_the_supervisor_says_after_the_last_beat_wins(state):
    write_topology(state, assignment=ONE_WORKER)
    write_beat(state, "sup-a", 6700, BEAT.encode())
    # Written after the beat: the worker crashed since it last beat.
    say(state, state="restarting", restarts=6, backoff_secs=16,
        last_error="command exited with code 7")
    assert worker(state) == {
        "state": "restarting", "alive": False, "backoff_secs": 16,
        "last_error": "command exited with code 7", "restarts": 6, "uptime_secs": 0,
        "components": {"main": {"batch_id": 3, "num_input_rows": 0,
                                "input_rows_per_second": 0.0,
                                "processed_rows_per_second": 0.0}}}
    say(state, state="frozen", restarts=6)
    assert (worker(state)["state"], worker(state)["restarts"]) == ("frozen", 6)
    say(state, state="starting", restarts=6, last_error="command exited with code 7")
    assert (worker(state)["state"], worker(state)["last_error"]) == (
        "starting", "command exited with code 7")
    # A beat written after the statement: it runs (again).
    wait_until(lambda: write_beat(state, "sup-a", 6700, BEAT.encode()) or
               mtime(state, "workerbeats", TOPOLOGY, "sup-a-6700")
               > mtime(state, "supervisors", "sup-a"))
    assert worker(state) == {
        "state": "running", "alive": True, "backoff_secs": 0, "last_error": "",
        "restarts": 6, "uptime_secs": 500, "components": {"main": {
            "batch_id": 3, "num_input_rows": 5, "input_rows_per_second": 1.0,
            "processed_rows_per_second": 1.0}}}


@pytest.mark.parametrize("entry", [
    {"state": "exploded"}, {"state": "restarting", "restarts": -1},
    {"state": "restarting", "backoff_secs": "soon"}, {"state": "dead"},
    {"state": "restarting", "last_error": 7}])
def test_a_statement_this_release_cannot_use_counts_as_none(state, entry):
    write_topology(state, assignment=ONE_WORKER)
    write_beat(state, "sup-a", 6700, BEAT.encode())
    say(state, **entry)
    assert (worker(state)["state"], worker(state)["restarts"]) == ("running", 1)


def judged(said: worker_state.Statement | None = None, beat_ms: int | None = 1000,
           supervisor_ms: int | None = 2000, assignment_ms: int = 0,
           now_ms: int = 2000) -> tuple[str, int | None, str]:
    """(state, beat age, last error) of a worker of sup-a (None: no node) at ``now_ms``,
    with a task timeout of 30 s; every time a ZooKeeper mtime."""
    got = worker_state.judge(
        supervisor_id="sup-a",
        supervisor=None if supervisor_ms is None else (None, supervisor_ms), said=said,
        beat_mtime_ms=beat_ms, assignment_mtime_ms=assignment_ms, reference_ms=now_ms,
        timeout_s=30.0)
    return got.state, got.beat_age_secs, got.last_error


def said(state: str, error: str = "") -> worker_state.Statement:
    return worker_state.Statement(TOPOLOGY, state, 2, 4, error)


def test_the_rule_by_zookeepers_clock():
    # Fresh up to and including the timeout; the age is whole seconds.
    assert judged(beat_ms=1000, now_ms=31_000) == ("running", 30, "")
    assert judged(beat_ms=1000, now_ms=31_001, supervisor_ms=31_001) == (
        "dead", 30, "no beat for 30s (nimbus.task.timeout.secs 30)")
    # Its supervisor said nothing of it since the leader placed it: on its way, even
    # with a stale beat of the slot's earlier worker.
    assert judged(beat_ms=1000, supervisor_ms=40_000, assignment_ms=50_000,
                  now_ms=50_000) == ("starting", 49, "")
    # A supervisor whose node holds nothing readable is there, and says nothing.
    assert judged(beat_ms=None) == ("starting", None, "")
    assert judged(supervisor_ms=None) == ("dead", 1, "its supervisor sup-a is gone")
    # Said after the beat: the statement; before it: the (fresh) beat.
    assert judged(said("restarting", "boom"), beat_ms=1000, supervisor_ms=1000) == (
        "restarting", 1, "boom")
    assert judged(said("restarting", "boom"), beat_ms=1500, supervisor_ms=1000) == (
        "running", 0, "")
    # "running" said, but no fresh beat: dead, with the error it last knew of.
    assert judged(said("running", "old"), beat_ms=None) == ("dead", None, "old")
    assert judged(said("running"), beat_ms=None) == ("dead", None, "no beat")


def test_a_statement_names_its_topology_and_port():
    info = SupervisorInfo(time_secs=1, hostname="h", workers={
        "6700": {"topology_id": TOPOLOGY, "state": "restarting", "restarts": 3,
                 "backoff_secs": 8, "last_error": "first line\nsecond"}})
    assert worker_state.statement(info, TOPOLOGY, 6700) == worker_state.Statement(
        TOPOLOGY, "restarting", 3, 8, "first line")
    assert worker_state.statement(info, "other-1-1", 6700) is None
    assert worker_state.statement(info, TOPOLOGY, 6701) is None
    assert worker_state.statement(None, TOPOLOGY, 6700) is None


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
    from nimbus.dev import demo

    write_topology(state)
    state.report_error(TOPOLOGY, "worker-0", ErrorInfo(
        error="build() raised AnalysisException: Path does not exist: in",
        error_time_secs=1200))
    monkeypatch.setattr(demo, "TIMEOUT_S", 0.3)
    watch = demo.ErrorWatch(state, "wordcount", TOPOLOGY)
    with pytest.raises(TimeoutError) as waited:
        watch.wait(lambda: False, "the records to be committed")
    assert str(waited.value) == (
        "timed out after 0.3s waiting for the records to be committed; the pipeline's "
        "newest error: worker-0: build() raised AnalysisException: Path does not exist: in "
        "(nimbus-ha errors wordcount shows them all)")
    assert capsys.readouterr().err == (
        f"{TOPOLOGY} reported an error: worker-0: build() raised AnalysisException: Path "
        "does not exist: in\n")


PROGRESS = {"batch_id": 9, "timestamp": "2026-11-27T14:33:19.412Z",
            "sources": [{"description": "FileStreamSource[file:/in]", "start_offset": None,
                         "end_offset": '{"logOffset": 3}', "latest_offset": None,
                         "num_input_rows": 5, "input_rows_per_second": 1.0,
                         "processed_rows_per_second": 2.0}],
            "sink": {"description": "FileSink[/out]", "num_output_rows": 5},
            "state_operators": [], "watermark": None, "duration_ms": {"triggerExecution": 40}}


def spark_beat(port: int, batch: int, history: list, url: str = "") -> bytes:
    return WorkerBeat(time_secs=1995, topology_id=TOPOLOGY, supervisor_id="sup-a",
                      host="host-a", port=port, spark_ui_url=url, components={
                          "counts": {"batch_id": batch, "num_input_rows": 5,
                                     "input_rows_per_second": 1.0,
                                     "processed_rows_per_second": 2.0,
                                     "progress": {**PROGRESS, "batch_id": batch},
                                     "history": history}}).encode()


def test_components_carry_the_newest_progress_history_and_checkpoint(state):
    write_topology(state, assignment=Assignment(
        master_code_dir="/code", node_host={"sup-a": "host-a"},
        executor_node_port={"worker-0": ["sup-a", 6700], "worker-1": ["sup-a", 6701]},
        executor_start_time_secs={"worker-0": 1500, "worker-1": 1500}))
    say(state, state="running")   # of port 6700 only; 6701 is judged by its beat
    history = [[1800, 1.0, 2.0, 40], [1810, 1.5, 2.5, None]]
    write_beat(state, "sup-a", 6701, spark_beat(6701, 3, [[1700, 9.0, 9.0, 9]]))
    write_beat(state, "sup-a", 6700, spark_beat(6700, 9, history + [["bad"]],
                                                url="http://127.0.0.1:4040"))
    info = runtime_view.topology_info(state, TOPOLOGY, now=NOW, topology_conf={
        "topology.spark.checkpoint.dir": "s3a://bucket/ckpt/"})
    counts = info["components"]["counts"]
    # Both workers report it (a rebalance's leftovers); both run: the newest beat wins.
    assert {k: counts[k] for k in ("progress", "history", "history_end_secs", "reported_by",
                                   "live", "details_cut", "checkpoint")} == {
        "progress": PROGRESS, "history": history, "history_end_secs": 1995,
        "reported_by": "worker-0", "live": True, "details_cut": False,
        "checkpoint": f"s3a://bucket/ckpt/{TOPOLOGY}/counts"}
    assert [w["spark_ui_url"] for w in info["workers"]] == ["http://127.0.0.1:4040", ""]
    # Read elsewhere without the configuration, completed here: a local root.
    again = runtime_view.topology_info(state, TOPOLOGY, now=NOW)
    assert again["components"]["counts"]["checkpoint"] is None
    runtime_view.set_checkpoints(again, {"topology.spark.checkpoint.dir": "/ck"})
    assert again["components"]["counts"]["checkpoint"] == f"/ck/{TOPOLOGY}/counts"
    runtime_view.set_checkpoints(again, {})   # not named: unknown here
    assert again["components"]["counts"]["checkpoint"] is None
    # A worker that does not run shows no Spark UI: its address leads nowhere.
    say(state, state="restarting", restarts=1, backoff_secs=2, last_error="boom")
    stopped = runtime_view.topology_info(state, TOPOLOGY, now=NOW)
    assert stopped["workers"][0]["spark_ui_url"] == ""


def test_a_process_topology_has_no_progress_and_no_checkpoint(state):
    write_topology(state, assignment=ONE_WORKER)
    say(state, state="running")
    write_beat(state, "sup-a", 6700, WorkerBeat(
        time_secs=1995, topology_id=TOPOLOGY, supervisor_id="sup-a", host="host-a",
        port=6700, components={"main": {"pid": 42, "progress": "not one"}}).encode())
    info = runtime_view.topology_info(state, TOPOLOGY, now=NOW, topology_conf={
        "topology.spark.checkpoint.dir": "/ck"})
    main = info["components"]["main"]
    assert (main["progress"], main["history"], main["checkpoint"]) == (None, [], None)
