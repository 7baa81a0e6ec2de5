"""Prometheus metrics (nimbus/metrics.py): served over real HTTP, parsed with
prometheus_client's own parser; a real nimbus daemon on a real ZooKeeper; ``top``;
and the Grafana dashboard names only metrics the daemons export."""

from __future__ import annotations

import json
import re
import socket
import threading
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from thriftpy2.thrift import TApplicationException
from waiting import wait_for

from nimbus.config import ConfigError, load_config
from nimbus.metrics import (
    MetricsServer,
    NimbusMetrics,
    SupervisorMetrics,
    exported_metric_names,
    min_replication_reader,
)
from nimbus.state.cluster_snapshot import ClusterSnapshot
from nimbus.state.records import ACTIVE, INACTIVE, KILLED, StormBase
from nimbus.supervisor.warm_pool import WarmSummary
from nimbus.thrift import NOT_LEADER_PREFIX, storm

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "conf" / "grafana-dashboard.json"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    """Every sample of ``url`` as {(name, labels): value}, parsed by prometheus_client."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def sample(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _base(name: str, status: str) -> StormBase:
    return StormBase(storm_name=name, launch_time_secs=1000, status=status)


@pytest.fixture
def serve():
    """serve(registry) -> a started MetricsServer on a free port; all stopped after."""
    servers: list[MetricsServer] = []

    def start(registry) -> MetricsServer:
        server = MetricsServer(registry, "127.0.0.1", 0, f"test-metrics-{len(servers)}")
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.stop()


# -- nimbus metrics ----------------------------------------------------------------------------
def test_nimbus_metrics_report_leadership_topologies_and_replication(serve, tmp_path):
    leader = [False]
    snapshot = ClusterSnapshot(
        storms={"a-1-1": _base("a", ACTIVE), "b-2-2": _base("b", ACTIVE),
                "c-3-3": _base("c", INACTIVE)},
        replication={"a-1-1": 3, "b-2-2": 1})
    (tmp_path / "a-1-1").mkdir()
    (tmp_path / "a-1-1" / "stormconf.json").write_text(
        json.dumps({"topology.min.replication.count": 2}))
    (tmp_path / "b-2-2").mkdir()
    (tmp_path / "b-2-2" / "stormconf.json").write_text("{}")   # the cluster's default
    clock = FakeClock()
    metrics = NimbusMetrics(
        "localfs", is_leader=lambda: leader[0], snapshot=lambda: snapshot,
        min_replication=min_replication_reader(lambda t: tmp_path / t / "stormconf.json", 1),
        clock=clock)
    server = serve(metrics.registry)

    got = scrape(server.url)
    assert sample(got, "nimbus_is_leader") == 0
    assert sample(got, "nimbus_topologies", status=ACTIVE) == 2
    assert sample(got, "nimbus_topologies", status=INACTIVE) == 1
    assert sample(got, "nimbus_topologies", status=KILLED) == 0
    assert sample(got, "nimbus_topology_replication_count", topology_id="a-1-1",
                  topology="a") == 3
    assert sample(got, "nimbus_topology_replication_count", topology_id="c-3-3",
                  topology="c") == 0
    assert sample(got, "nimbus_topology_min_replication_count", topology_id="a-1-1",
                  topology="a") == 2
    assert sample(got, "nimbus_topology_min_replication_count", topology_id="b-2-2",
                  topology="b") == 1
    # c's configuration is not held here: no minimum rather than a guessed one.
    assert ("nimbus_topology_min_replication_count",
            frozenset({"topology_id": "c-3-3", "topology": "c"}.items())) not in got
    assert sample(got, "nimbus_leader_changes_total", change="gained") == 0

    # Queued at 100, leader at 107.5: one change, one wait of 7.5 s.
    metrics.on_queued()
    clock.now = 107.5
    leader[0] = True
    metrics.on_leadership(True)
    got = scrape(server.url)
    assert sample(got, "nimbus_is_leader") == 1
    assert sample(got, "nimbus_leader_changes_total", change="gained") == 1
    assert sample(got, "nimbus_leadership_wait_seconds_count") == 1
    assert sample(got, "nimbus_leadership_wait_seconds_sum") == 7.5
    assert sample(got, "nimbus_leadership_wait_seconds_bucket", le="5.0") == 0
    assert sample(got, "nimbus_leadership_wait_seconds_bucket", le="10.0") == 1

    # Lost at 200, gained again at 202: the second wait runs from the loss.
    clock.now = 200.0
    leader[0] = False
    metrics.on_leadership(False)
    clock.now = 202.0
    leader[0] = True
    metrics.on_leadership(True)
    got = scrape(server.url)
    assert sample(got, "nimbus_leader_changes_total", change="lost") == 1
    assert sample(got, "nimbus_leader_changes_total", change="gained") == 2
    assert sample(got, "nimbus_leadership_wait_seconds_sum") == 9.5


def test_code_sync_bytes_and_durations_per_distributor(serve, tmp_path):
    metrics = NimbusMetrics("torrent", is_leader=lambda: False,
                            snapshot=ClusterSnapshot)
    code = tmp_path / "t-1-1"
    (code / "sub").mkdir(parents=True)
    (code / "stormjar.jar").write_bytes(b"x" * 1000)
    (code / "sub" / "more").write_bytes(b"y" * 24)
    metrics.on_code_fetch("t-1-1", 0.3, code)
    metrics.on_code_fetch("t-2-2", 2.0, None)   # a failed download: time, no bytes
    got = scrape(serve(metrics.registry).url)
    assert sample(got, "nimbus_code_sync_bytes_total", distributor="torrent") == 1024
    assert sample(got, "nimbus_code_sync_duration_seconds_count", distributor="torrent",
                  outcome="ok") == 1
    assert sample(got, "nimbus_code_sync_duration_seconds_sum", distributor="torrent",
                  outcome="ok") == 0.3
    assert sample(got, "nimbus_code_sync_duration_seconds_count", distributor="torrent",
                  outcome="error") == 1


class _Handler:
    def getLeader(self) -> str:
        return "leader"

    def activate(self, name: str) -> None:
        raise storm.NotAliveException(msg=f"no {name}")

    def killTopology(self, name: str) -> None:
        raise TApplicationException(TApplicationException.INTERNAL_ERROR,
                                    f"{NOT_LEADER_PREFIX}127.0.0.1:6627")


def test_thrift_calls_are_counted_by_method_and_outcome(serve):
    metrics = NimbusMetrics("localfs", is_leader=lambda: False, snapshot=ClusterSnapshot)
    handler = metrics.instrument(_Handler())
    assert handler.getLeader() == "leader"
    assert handler.getLeader() == "leader"
    with pytest.raises(storm.NotAliveException, match="no wc"):
        handler.activate("wc")   # passes through unchanged: Storm's contract holds
    with pytest.raises(TApplicationException):
        handler.killTopology("wc")
    got = scrape(serve(metrics.registry).url)
    assert sample(got, "nimbus_thrift_calls_total", method="getLeader", outcome="ok") == 2
    assert sample(got, "nimbus_thrift_calls_total", method="activate",
                  outcome="NotAliveException") == 1
    assert sample(got, "nimbus_thrift_calls_total", method="killTopology",
                  outcome="not_leader") == 1
    assert sample(got, "nimbus_thrift_call_duration_seconds_count", method="getLeader") == 2


# -- supervisor metrics ------------------------------------------------------------------------
class FakeWorker:
    """What the collector reads of a WorkerHandle (compared by identity, like it)."""

    def __init__(self, topology_id: str, port: int, memory: int = 0, frozen: bool = False):
        self.topology_id = topology_id
        self.port = port
        self.memory = memory
        self.frozen = frozen

    def memory_bytes(self) -> int:
        return self.memory

    def is_frozen(self) -> bool:
        return self.frozen


def test_supervisor_metrics_report_restarts_rates_and_batch_age(serve):
    clock = FakeClock()
    running = FakeWorker("wc-1-1", 6700, memory=300 * 2**20)
    gone = FakeWorker("wc-1-1", 6701)
    frozen = FakeWorker("wc-2-1", 6702, frozen=True)
    handles = [running, frozen]
    restarts = {("wc-1-1", 6700): 2, ("wc-1-1", 6701): 0}
    metrics = SupervisorMetrics(lambda: list(handles), lambda: dict(restarts), clock=clock,
                                warm=lambda: WarmSummary(ready=1, starting=1,
                                                         memory_bytes=700 * 2**20))
    beat = {"count": {"batch_id": 4, "input_rows_per_second": 12.5,
                      "processed_rows_per_second": 10.0, "num_input_rows": 25},
            "main": {"pid": 42}}   # a process topology's component: no batches
    metrics.progress.observe(running, beat)
    metrics.progress.observe(gone, beat)   # not running any more: not exported
    clock.now = 103.0
    metrics.progress.observe(running, beat)   # same batch: its age keeps growing
    clock.now = 105.0
    server = serve(metrics.registry)

    got = scrape(server.url)
    count = {"topology_id": "wc-1-1", "port": "6700", "component": "count"}
    main = {**count, "component": "main"}
    assert sample(got, "supervisor_workers") == 2
    assert sample(got, "supervisor_workers_frozen") == 1
    assert sample(got, "supervisor_worker_restarts_total", topology_id="wc-1-1",
                  port="6700") == 2
    assert sample(got, "supervisor_worker_memory_bytes", topology_id="wc-1-1",
                  port="6700") == 300 * 2**20
    assert sample(got, "supervisor_warm_workers", state="ready") == 1
    assert sample(got, "supervisor_warm_workers", state="starting") == 1
    assert sample(got, "supervisor_warm_workers_memory_bytes") == 700 * 2**20
    assert sample(got, "supervisor_component_input_rows_per_second", **count) == 12.5
    assert sample(got, "supervisor_component_processed_rows_per_second", **count) == 10.0
    assert sample(got, "supervisor_component_batch_id", **count) == 4
    assert sample(got, "supervisor_component_batch_age_seconds", **count) == 5.0
    assert sample(got, "supervisor_component_input_rows_per_second", **main) == 0
    assert ("supervisor_component_batch_age_seconds", frozenset(main.items())) not in got
    assert not any(labels and dict(labels).get("port") == "6701"
                   and name.startswith("supervisor_component") for name, labels in got)

    clock.now = 110.0
    metrics.progress.observe(running, {**beat, "count": {**beat["count"], "batch_id": 5}})
    clock.now = 111.0
    got = scrape(server.url)
    assert sample(got, "supervisor_component_batch_id", **count) == 5
    assert sample(got, "supervisor_component_batch_age_seconds", **count) == 1.0


def test_supervisor_metrics_follow_the_worker_states(serve):
    """supervisor_worker_state has a series per state of every assigned slot; a worker
    that is not running exports no component numbers (its last ones are history)."""
    running = FakeWorker("wc-1-1", 6700)
    stale = FakeWorker("wc-1-1", 6701)
    states = {("wc-1-1", 6700): "running", ("wc-1-1", 6701): "dead",
              ("wc-2-1", 6702): "restarting"}
    metrics = SupervisorMetrics(lambda: [running, stale], dict, states=lambda: states,
                                frozen_orphans=lambda: 2)
    beat = {"count": {"batch_id": 4, "input_rows_per_second": 12.5,
                      "processed_rows_per_second": 10.0}}
    metrics.progress.observe(running, beat)
    metrics.progress.observe(stale, beat)
    got = scrape(serve(metrics.registry).url)
    exported = {(labels["topology_id"], labels["port"], labels["state"]): value
                for (name, frozen), value in got.items()
                if name == "supervisor_worker_state" for labels in [dict(frozen)]}
    assert exported == {
        (topology, str(port), state): float(state == current)
        for (topology, port), current in states.items()
        for state in ("starting", "running", "frozen", "restarting", "dead")}
    assert sample(got, "supervisor_component_batch_id", topology_id="wc-1-1", port="6700",
                  component="count") == 4
    assert not any(name.startswith("supervisor_component") and dict(labels).get("port")
                   == "6701" for name, labels in got)
    assert sample(got, "supervisor_frozen_orphans") == 2


# -- the server --------------------------------------------------------------------------------
def test_server_thread_is_named_and_joined_and_its_port_freed():
    metrics = SupervisorMetrics(list, dict)
    server = MetricsServer(metrics.registry, "127.0.0.1", 0, "supervisor-metrics")
    server.start()
    names = {t.name for t in threading.enumerate()}
    assert f"supervisor-metrics-{server.port}" in names
    assert "supervisor_workers" in {name for name, _ in scrape(server.url)}
    server.stop()
    server.stop()   # twice is harmless
    assert f"supervisor-metrics-{server.port}" not in {t.name for t in threading.enumerate()}
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2).close()


def test_taken_port_is_a_clear_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=rf"cannot serve metrics on 127\.0\.0\.1:{port}"):
            MetricsServer(SupervisorMetrics(list, dict).registry, "127.0.0.1", port, "m")


def test_metrics_port_keys_are_checked():
    conf = load_config(overrides={})
    assert conf["nimbus.metrics.port"] == 0 and conf["supervisor.metrics.port"] == 0
    assert conf["nimbus.metrics.bind.address"] == "127.0.0.1"
    for key in ("nimbus.metrics.port", "supervisor.metrics.port"):
        with pytest.raises(ConfigError, match=re.escape(key)):
            load_config(overrides={key: 70000})


# -- the Grafana dashboard ---------------------------------------------------------------------
def _expressions(node: object) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for value in node.values() for e in _expressions(value)]
    if isinstance(node, list):
        return [e for value in node for e in _expressions(value)]
    return []


def test_dashboard_uses_only_exported_metrics():
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert dashboard["schemaVersion"] >= 39
    assert dashboard["templating"]["list"][0]["type"] == "datasource"
    expressions = _expressions(dashboard["panels"])
    used = {name for expr in expressions
            for name in re.findall(r"\b((?:nimbus|supervisor)_[a-z_]+)\b", expr)}
    nimbus = NimbusMetrics("localfs", is_leader=lambda: False, snapshot=ClusterSnapshot)
    supervisor = SupervisorMetrics(list, dict)
    exported = exported_metric_names(nimbus.registry) | exported_metric_names(
        supervisor.registry)
    assert used, "the dashboard names no metric"
    assert used <= exported, f"not exported: {sorted(used - exported)}"
    # Every family is on the dashboard: leader, topologies, replication, code sync,
    # Thrift, restarts, rows/s and batch age.
    for name in ("nimbus_is_leader", "nimbus_leader_changes_total",
                 "nimbus_leadership_wait_seconds_bucket", "nimbus_topologies",
                 "nimbus_topology_replication_count", "nimbus_topology_min_replication_count",
                 "nimbus_code_sync_bytes_total", "nimbus_code_sync_duration_seconds_bucket",
                 "nimbus_thrift_calls_total", "supervisor_worker_restarts_total",
                 "supervisor_component_input_rows_per_second",
                 "supervisor_component_processed_rows_per_second",
                 "supervisor_component_batch_age_seconds"):
        assert name in used, name


# -- a real nimbus -----------------------------------------------------------------------------
@pytest.mark.zookeeper
def test_a_nimbus_serves_its_metrics_and_stops_them(zk_server, zk_root, tmp_path):
    from nimbus.daemons.nimbus import NimbusDaemon
    from nimbus.dev.zookeeper import free_port
    from nimbus.thrift.client import NimbusClient

    host, _, zk_port = zk_server.hosts.rpartition(":")
    thrift_port, metrics_port = free_port(), free_port()
    conf = load_config(overrides={
        "storm.zookeeper.servers": [host], "storm.zookeeper.port": int(zk_port),
        "storm.zookeeper.root": zk_root, "nimbus.thrift.port": thrift_port,
        "nimbus.seeds": [f"127.0.0.1:{thrift_port}"], "nimbus.metrics.port": metrics_port,
        "storm.local.dir": str(tmp_path / "local")})
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    daemon = NimbusDaemon(conf)
    try:
        daemon.start()
        # The gain is counted by the cycle right after the step that claimed the lock.
        got = wait_for(lambda: (s := scrape(url)) and s[("nimbus_is_leader", frozenset())]
                       == 1 and sample(s, "nimbus_leader_changes_total", change="gained")
                       and s, 30, "the nimbus to lead")
        assert sample(got, "nimbus_leader_changes_total", change="gained") == 1
        assert sample(got, "nimbus_leadership_wait_seconds_count") == 1
        assert sample(got, "nimbus_topologies", status=ACTIVE) == 0
        client = NimbusClient(conf)
        client.cluster_info()
        client.cluster_info()
        got = scrape(url)
        assert sample(got, "nimbus_thrift_calls_total", method="getClusterInfo",
                      outcome="ok") >= 2
    finally:
        daemon.stop()
    assert not [t for t in threading.enumerate() if t.name.startswith("nimbus-metrics")]
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)


@pytest.mark.zookeeper
def test_top_once_lists_every_topology(make_zk, zk_root):
    import io

    from rich.console import Console

    from nimbus import top
    from nimbus.master.topology_rows import topology_rows
    from nimbus.state.cluster_state import StormClusterState
    from nimbus.state.records import Assignment, ErrorInfo, SupervisorInfo, WorkerBeat

    state = StormClusterState(make_zk(), zk_root)
    state.setup()
    zk = state.zk
    topology_id = "wordcount-7-1000"
    zk.create(state.storm_path(topology_id), StormBase(
        storm_name="wordcount", launch_time_secs=1000, status=ACTIVE,
        num_workers=2).encode())
    zk.create(state.path("assignments", topology_id), Assignment(
        master_code_dir="/code", node_host={"sup-a": "host-a"},
        executor_node_port={"worker-0": ["sup-a", 6700], "worker-1": ["sup-a", 6701]},
    ).encode())
    zk.create(state.path("workerbeats", topology_id))
    zk.create(state.path("errors", topology_id))
    for port, rate, restarts in ((6700, 10.0, 1), (6701, 5.5, 2)):
        state.worker_heartbeat(topology_id, "sup-a", port, WorkerBeat(
            time_secs=1990, topology_id=topology_id, supervisor_id="sup-a", host="host-a",
            port=port, restarts=restarts, components={"count": {
                "batch_id": port - 6690, "input_rows_per_second": rate,
                "processed_rows_per_second": rate * 2}}).encode())
    # Said after the beats: the worker on 6701 crashed since its last one (restarting).
    state.supervisor_heartbeat("sup-a", SupervisorInfo(
        time_secs=1995, hostname="host-a", meta=[6700, 6701], workers={"6701": {
            "topology_id": topology_id, "state": "restarting", "restarts": 4,
            "backoff_secs": 8, "last_error": "boom"}}))
    state.report_error(topology_id, "count", ErrorInfo(
        error="ValueError: bad row\n  at line 3", error_time_secs=1995, host="host-a",
        port=6700))
    zk.create(state.storm_path("idle-8-1000"), StormBase(
        storm_name="idle", launch_time_secs=1000, status=INACTIVE).encode())

    # The rows a nimbus sends (getTopologyRows), rendered as top renders them.
    out = io.StringIO()
    snapshot = ClusterSnapshot(storms={t: state.storm_base(t) for t in state.active_storms()})
    top.run(lambda: topology_rows(state, snapshot), Console(file=out, width=240), 1.0,
            once=True)
    lines = {line.split()[1]: line for line in out.getvalue().splitlines()
             if line.strip().startswith("│") and len(line.split()) > 2}
    row = [cell.strip() for cell in lines["wordcount"].strip("│ ").split("│")]
    # Running workers only in the rates; restarts as the supervisor counts them.
    assert row == ["wordcount", topology_id, ACTIVE, "1/2 (1 restarting)", "5", "10.0",
                   "20.0", "11", "count: ValueError: bad row"]
    idle = [cell.strip() for cell in lines["idle"].strip("│ ").split("│")]
    assert idle == ["idle", "idle-8-1000", INACTIVE, "0/1", "0", "0.0", "0.0", "-", "-"]


def test_top_refreshes_until_stopped_and_survives_a_failed_read():
    import io

    from rich.console import Console

    from nimbus import top
    from nimbus.thrift.client import NimbusUnavailableError

    stop = threading.Event()
    reads = []

    def read_rows() -> list[dict]:
        reads.append(1)
        if len(reads) == 2:
            # One failed read (the nimbus asked went away): shown, and top goes on.
            raise NimbusUnavailableError("no nimbus reachable via nimbus.seeds")
        if len(reads) >= 3:
            stop.set()
        return []

    out = io.StringIO()
    top.run(read_rows, Console(file=out, width=200), 0.05, once=False, stop=stop)
    assert len(reads) == 3
    assert "(no topologies)" in out.getvalue()
    # The failed read's table says why it is empty.
    def failing() -> list[dict]:
        raise NimbusUnavailableError("no nimbus reachable")

    shown = io.StringIO()
    Console(file=shown, width=200).print(top.snapshot(failing))
    assert "no answer, retrying: NimbusUnavailableError: no nimbus reachable" in \
        shown.getvalue()
