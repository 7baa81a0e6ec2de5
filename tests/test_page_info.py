"""Storm 1.x's page calls: getTopologyPageInfo, getComponentPageInfo and
getSupervisorPageInfo (nimbus/thrift/page_info.py, the handler's methods).

First the mapping itself, on runtime_view's dict; then the calls over Thrift against one
real in-process nimbus and a real ZooKeeper, with supervisors' records written into
ZooKeeper as a supervisor writes them (as tests/test_rebalance_and_info.py does); then
the read rule, over TLS with client certificates (as tests/test_thrift_tls.py does).
The wire test with Apache Thrift's own client against real supervisors and workers is
integration/test_storm_wire.py.
"""

from __future__ import annotations

import io
import json
import socket
import tarfile

import pytest
from nimbus_fixtures import idle_nimbus_conf
from raw_thrift import framed, message
from tls_certs import USER, CertificateAuthority
from waiting import wait_for

from nimbus.config import load_config
from nimbus.daemons.nimbus import NimbusDaemon
from nimbus.dev.zookeeper import free_port
from nimbus.state.records import ErrorInfo, SupervisorInfo, WorkerBeat
from nimbus.thrift import handler, page_info, storm
from nimbus.thrift.client import NimbusClient, connect

PROCESS_YAML = 'command: ["sleep", "3600"]\n'
needs_zookeeper = pytest.mark.zookeeper
SIMPLE_ACL = "org.apache.storm.security.auth.authorizer.SimpleACLAuthorizer"


# -- the mapping, on runtime_view.topology_info's dict ---------------------------------------

def worker(index: int, sid: str, host: str, port: int, components: dict[str, int],
           uptime: int = 40) -> dict:
    return {"worker": f"worker-{index}", "index": index, "supervisor_id": sid, "host": host,
            "port": port, "uptime_secs": uptime, "state": "running", "alive": True,
            "beat_age_secs": 0, "backoff_secs": 0, "last_error": "", "restarts": 0,
            "memory_bytes": 0, "warm_start": False,
            "components": {name: {"batch_id": 1, "num_input_rows": rows,
                                  "input_rows_per_second": 1.0,
                                  "processed_rows_per_second": 1.0}
                           for name, rows in components.items()}}


def error(text: str, when: int, host: str = "h1", port: int = 6700) -> dict:
    return {"error": text, "time_secs": when, "host": host, "port": port}


INFO = {
    "id": "wc-1-1", "name": "wc", "status": "ACTIVE", "owner": "alice", "uptime_secs": 99,
    "num_workers": 3,
    "workers": [worker(0, "s1", "h1", 6700, {"counts": 30, "lines": 5}),
                worker(1, "s2", "h2", 6700, {"counts": 12}),
                worker(2, "s2", "h2", 6701, {}, uptime=0)],   # nothing reported yet
    "warm_workers": {}, "components": {},
    "errors": {"counts": [error("boom 2", 20), error("boom 1", 10)],
               "worker-2": [error("cannot fetch code", 30, "h2", 6701)]},
}


def test_topology_page_maps_components_to_bolts_with_getTopologyInfos_executors():
    page = page_info.topology_page(INFO, "600", False, '{"a": 1}', 2)
    assert (page.id, page.name, page.status, page.owner, page.uptime_secs,
            page.replication_count, page.topology_conf) == (
        "wc-1-1", "wc", "ACTIVE", "alice", 99, 2, '{"a": 1}')
    # getTopologyInfo's executors: counts@0, lines@0, counts@1, __system@2
    assert (page.num_workers, page.num_executors, page.num_tasks) == (3, 4, 4)
    assert page.id_to_spout_agg_stats == {}
    assert sorted(page.id_to_bolt_agg_stats) == ["counts", "lines", "worker-2"]
    counts = page.id_to_bolt_agg_stats["counts"]
    assert counts == storm.ComponentAggregateStats(
        type=storm.ComponentType.BOLT,
        common_stats=storm.CommonAggregateStats(num_executors=2, num_tasks=2, emitted=42,
                                                transferred=42, acked=0, failed=0),
        specific_stats=storm.SpecificAggregateStats(bolt=storm.BoltAggregateStats(
            execute_latency_ms=0.0, process_latency_ms=0.0, executed=42, capacity=0.0)),
        last_error=storm.ErrorInfo(error="boom 2", error_time_secs=20, host="h1", port=6700))
    # errors of the worker itself: a component with no executor, so that they show
    only_errors = page.id_to_bolt_agg_stats["worker-2"]
    assert only_errors.common_stats.num_executors == 0
    assert only_errors.last_error.error == "cannot fetch code"
    assert page.id_to_bolt_agg_stats["lines"].last_error is None
    assert page.topology_stats == storm.TopologyStats(
        window_to_emitted={"600": 47}, window_to_transferred={"600": 47},
        window_to_complete_latencies_ms={"600": 0.0}, window_to_acked={"600": 0},
        window_to_failed={"600": 0})
    assert [(w.supervisor_id, w.host, w.port, w.num_executors, w.component_to_num_tasks,
             w.uptime_secs, w.topology_id, w.topology_name) for w in page.workers] == [
        ("s1", "h1", 6700, 2, {"counts": 1, "lines": 1}, 40, "wc-1-1", "wc"),
        ("s2", "h2", 6700, 1, {"counts": 1}, 40, "wc-1-1", "wc"),
        ("s2", "h2", 6701, 1, {}, 0, "wc-1-1", "wc")]
    assert sum(w.num_executors for w in page.workers) == page.num_executors


def test_system_components_are_listed_only_when_asked_for():
    page = page_info.topology_page(INFO, None, True, None, None)
    system = page.id_to_bolt_agg_stats["__system"]
    assert system.common_stats.num_executors == 1 and system.common_stats.emitted == 0
    assert page.workers[2].component_to_num_tasks == {"__system": 1}
    assert page.num_executors == 4, "executors count system ones either way, as Storm"
    assert page.topology_conf is None and page.replication_count is None


@pytest.mark.parametrize("window", [None, "", ":all-time", "600", "10800", "86400",
                                    "3600", "not-a-window"])
def test_every_window_gets_the_current_numbers_under_its_own_key(window):
    key = window or ":all-time"
    page = page_info.topology_page(INFO, window, False, None, 1)
    assert page.topology_stats.window_to_emitted == {key: 47}
    assert page.topology_stats.window_to_acked == {key: 0}
    component = page_info.component_page(INFO, "counts", window, False)
    assert list(component.window_to_stats) == [key]
    assert component.window_to_stats[key] == page.id_to_bolt_agg_stats["counts"]


def test_component_page_lists_one_executor_per_worker_and_every_kept_error():
    page = page_info.component_page(INFO, "counts", "600", False)
    assert (page.component_id, page.component_type, page.topology_id, page.topology_name,
            page.topology_status, page.num_executors, page.num_tasks) == (
        "counts", storm.ComponentType.BOLT, "wc-1-1", "wc", "ACTIVE", 2, 2)
    assert [(e.exec_summary.host, e.exec_summary.port, e.exec_summary.executor_info.task_start,
             e.exec_summary.component_id, e.stats.common_stats.emitted,
             e.stats.common_stats.num_executors) for e in page.exec_stats] == [
        ("h1", 6700, 1, "counts", 30, 1), ("h2", 6700, 2, "counts", 12, 1)]
    assert [e.error for e in page.errors] == ["boom 2", "boom 1"]
    assert (page.gsid_to_input_stats, page.sid_to_output_stats) == ({}, {})
    assert page.eventlog_host is None and page.debug_options is None
    # system and error-only components have a page too
    assert page_info.component_page(INFO, "__system", None, False).num_executors == 1
    assert page_info.component_page(INFO, "worker-2", None, False).exec_stats == []


def test_an_unknown_component_is_not_alive_naming_the_known_ones():
    with pytest.raises(storm.NotAliveException) as refused:
        page_info.component_page(INFO, "nope", "600", True)
    assert refused.value.msg == ("topology 'wc' (wc-1-1) has no component 'nope'; its "
                                 "components: '__system', 'counts', 'lines', 'worker-2'")
    empty = {**INFO, "workers": [], "errors": {}}
    with pytest.raises(storm.NotAliveException, match="its components: none yet"):
        page_info.component_page(empty, "x" * 5000, None, False)


def test_a_worker_of_a_topology_the_caller_may_not_read_has_no_components():
    summary = page_info.worker_summary(INFO, INFO["workers"][0], True, readable=False)
    assert summary.component_to_num_tasks is None
    assert (summary.host, summary.port, summary.num_executors, summary.topology_name) == (
        "h1", 6700, 2, "wc")


def test_the_system_component_is_the_handlers():
    assert page_info.SYSTEM_COMPONENT == handler.SYSTEM_COMPONENT


# -- the calls over Thrift, one in-process nimbus ----------------------------------------------

def tar_bundle(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def add_supervisor(daemon: NimbusDaemon, zk, supervisor_id: str, host: str,
                   ports: list[int], uptime: int) -> None:
    """Register a supervisor the way one does: an ephemeral node of its own session."""
    zk.create(daemon.master.state.path("supervisors", supervisor_id), SupervisorInfo(
        time_secs=1, hostname=host, meta=ports, uptime_secs=uptime,
        version="sup-1.0").encode(), ephemeral=True)


def in_snapshot(daemon: NimbusDaemon, supervisors: set[str], topology_id: str) -> None:
    wait_for(lambda: supervisors <= set(daemon.master.cache.snapshot.supervisors)
             and topology_id in daemon.master.cache.snapshot.assignments, 30,
             "the supervisors and the assignment in the nimbus's summary")


@pytest.fixture
def cluster(zk_server, zk_root, tmp_path, make_zk):
    """(daemon, conf, a second ZooKeeper session acting as supervisors); duties run
    when the test calls run_cycle."""
    conf_file = idle_nimbus_conf(zk_server, zk_root, tmp_path)
    conf = load_config(str(conf_file))
    daemon = NimbusDaemon(conf)
    daemon.start()
    try:
        wait_for(daemon.master.elector.is_leader, 30, "the nimbus to lead")
        yield daemon, conf, make_zk()
    finally:
        daemon.stop()


@pytest.fixture
def running(cluster):
    """wc with 2 workers: worker-0 on sup-a (host-a:6700) beats with components counts
    (30 rows) and lines (0 rows); worker-1 on sup-b (host-b:6700) has sent nothing yet.
    counts has 2 errors, worker-1 one. sup-c on host-a has no worker."""
    daemon, conf, sup_zk = cluster
    add_supervisor(daemon, sup_zk, "sup-a", "host-a", [6700, 6701], 11)
    add_supervisor(daemon, sup_zk, "sup-b", "host-b", [6700], 22)
    topology_id = NimbusClient(conf).submit(
        "wc", tar_bundle({"topology.yaml": PROCESS_YAML}),
        {"topology.workers": 2, "topology.submitter.user": "bob",
         "my.db.password": "hunter2"})
    daemon.master.run_cycle()
    assert daemon.master.state.assignment_info(topology_id).executor_node_port == {
        "worker-0": ["sup-a", 6700], "worker-1": ["sup-b", 6700]}
    add_supervisor(daemon, sup_zk, "sup-c", "host-a", [6702], 33)
    beat = WorkerBeat(time_secs=1, topology_id=topology_id, supervisor_id="sup-a",
                      host="host-a", port=6700, restarts=0, components={
                          "counts": {"batch_id": 9, "num_input_rows": 30},
                          "lines": {"batch_id": 4}})
    sup_zk.create(daemon.master.state.path("workerbeats", topology_id, "sup-a-6700"), beat.encode())
    for i, (component, port) in enumerate([("counts", 6700), ("counts", 6700),
                                           ("worker-1", 6700)]):
        assert daemon.master.state.report_error(topology_id, component, ErrorInfo(
            error=f"boom {i}", error_time_secs=1_700_000_000 + i,
            host="host-a" if component == "counts" else "host-b", port=port))
    in_snapshot(daemon, {"sup-a", "sup-b", "sup-c"}, topology_id)
    return daemon, conf, topology_id


@needs_zookeeper
def test_topology_page_info_over_thrift(running):
    daemon, _, topology_id = running
    with connect(daemon.address) as client:
        page = client.getTopologyPageInfo(topology_id, "600", False)
        info = client.getTopologyInfo(topology_id)
        with_sys = client.getTopologyPageInfo(topology_id, None, True)  # window unset
        unset = client.getTopologyPageInfo(topology_id, None, None)  # both unset
    assert (page.id, page.name, page.status, page.owner, page.replication_count) == (
        topology_id, "wc", "ACTIVE", "bob", 1)
    assert 0 <= page.uptime_secs <= 60
    # the same executors as getTopologyInfo: counts and lines on worker-0, __system on 1
    assert (page.num_workers, page.num_executors, page.num_tasks) == (2, 3, 3)
    assert page.num_executors == len(info.executors)
    conf = json.loads(page.topology_conf)
    assert (conf["topology.workers"], conf["my.db.password"]) == (2, "********")
    assert sorted(page.id_to_bolt_agg_stats) == ["counts", "lines", "worker-1"]
    counts = page.id_to_bolt_agg_stats["counts"]
    assert (counts.type, counts.common_stats.num_executors, counts.common_stats.emitted,
            counts.specific_stats.bolt.executed, counts.last_error) == (
        storm.ComponentType.BOLT, 1, 30, 30,
        storm.ErrorInfo(error="boom 1", error_time_secs=1_700_000_001, host="host-a",
                        port=6700))
    assert page.id_to_bolt_agg_stats["worker-1"].last_error.error == "boom 2"
    assert page.topology_stats.window_to_emitted == {"600": 30}
    assert [(w.supervisor_id, w.host, w.port, w.num_executors, w.component_to_num_tasks)
            for w in page.workers] == [("sup-a", "host-a", 6700, 2, {"counts": 1, "lines": 1}),
                                       ("sup-b", "host-b", 6700, 1, {})]
    assert page.workers[1].uptime_secs == 0, "not running: no uptime, as getTopologyInfo"
    assert with_sys.topology_stats.window_to_emitted == {":all-time": 30}
    assert with_sys.id_to_bolt_agg_stats["__system"].common_stats.num_executors == 1
    assert with_sys.workers[1].component_to_num_tasks == {"__system": 1}
    assert "__system" not in unset.id_to_bolt_agg_stats, "is_include_sys unset: false"
    assert unset.topology_stats.window_to_emitted == {":all-time": 30}


@needs_zookeeper
def test_component_page_info_over_thrift(running):
    daemon, _, topology_id = running
    with connect(daemon.address) as client:
        page = client.getComponentPageInfo(topology_id, "counts", "86400", True)
        quiet = client.getComponentPageInfo(topology_id, "worker-1", None, None)
        with pytest.raises(storm.NotAliveException) as refused:
            client.getComponentPageInfo(topology_id, "nope", ":all-time", False)
        with pytest.raises(storm.NotAliveException) as unknown:
            client.getComponentPageInfo("nope-1-1", "counts", ":all-time", False)
    assert (page.component_type, page.topology_name, page.topology_status,
            page.num_executors, list(page.window_to_stats)) == (
        storm.ComponentType.BOLT, "wc", "ACTIVE", 1, ["86400"])
    assert [(e.exec_summary.host, e.exec_summary.port, e.exec_summary.executor_info.task_start,
             e.stats.common_stats.emitted) for e in page.exec_stats] == [("host-a", 6700, 1, 30)]
    assert [(e.error, e.error_time_secs) for e in page.errors] == [
        ("boom 1", 1_700_000_001), ("boom 0", 1_700_000_000)]
    assert (quiet.num_executors, quiet.exec_stats, [e.error for e in quiet.errors]) == (
        0, [], ["boom 2"])
    assert refused.value.msg == ("topology 'wc' (" + topology_id + ") has no component "
                                 "'nope'; its components: '__system', 'counts', 'lines', "
                                 "'worker-1'")
    assert unknown.value.msg == "no live topology with id 'nope-1-1'"


@needs_zookeeper
def test_supervisor_page_info_by_id_and_by_host(running):
    daemon, _, topology_id = running
    with connect(daemon.address) as client:
        by_id = client.getSupervisorPageInfo("sup-a", None, False)
        by_host = client.getSupervisorPageInfo(None, "host-a", True)
        id_wins = client.getSupervisorPageInfo("sup-b", "host-a", True)
        refusals = []
        for args in (("sup-x", None, False), (None, "host-x", False), (None, None, False),
                     ("", "", True), ("../storms/" + topology_id, None, False)):
            with pytest.raises(storm.NotAliveException) as refused:
                client.getSupervisorPageInfo(*args)
            refusals.append(refused.value.msg)
    assert by_id.supervisor_summaries == [storm.SupervisorSummary(
        host="host-a", uptime_secs=11, num_workers=2, num_used_workers=1,
        supervisor_id="sup-a", version="sup-1.0")]
    assert [(w.supervisor_id, w.host, w.port, w.topology_id, w.topology_name,
             w.num_executors, w.component_to_num_tasks) for w in by_id.worker_summaries] == [
        ("sup-a", "host-a", 6700, topology_id, "wc", 2, {"counts": 1, "lines": 1})]
    assert [(s.supervisor_id, s.num_workers, s.num_used_workers)
            for s in by_host.supervisor_summaries] == [("sup-a", 2, 1), ("sup-c", 1, 0)]
    assert [w.supervisor_id for w in by_host.worker_summaries] == ["sup-a"]
    assert [(w.host, w.component_to_num_tasks, w.uptime_secs)
            for w in id_wins.worker_summaries] == [("host-b", {"__system": 1}, 0)]
    assert refusals == [
        "no live supervisor with id 'sup-x'", "no live supervisor on host 'host-x'",
        "getSupervisorPageInfo: give a supervisor id or a host",
        "getSupervisorPageInfo: give a supervisor id or a host",
        f"no live supervisor with id '../storms/{topology_id}'"]


@needs_zookeeper
def test_unknown_topologies_are_not_alive(cluster):
    daemon, _, _ = cluster
    with connect(daemon.address) as client:
        for bad in ("nope-1-1", "../../x", "x" * 300):
            with pytest.raises(storm.NotAliveException, match="no live topology with id"):
                client.getTopologyPageInfo(bad, ":all-time", False)
            with pytest.raises(storm.NotAliveException, match="no live topology with id"):
                client.getComponentPageInfo(bad, "main", ":all-time", False)


@needs_zookeeper
def test_only_the_arguments_storm_lets_clients_leave_unset_may_be_missing(cluster):
    """A Storm client asking by host sends no id at all (Java's null); window and
    is_include_sys may be missing too. The ids of the topology calls may not."""
    daemon, _, _ = cluster
    port = int(daemon.address.rsplit(":", 1)[1])
    requests = {
        "by host": ("getSupervisorPageInfo",
                    storm.Nimbus.getSupervisorPageInfo_args(host="nowhere")),
        "no window": ("getTopologyPageInfo", storm.Nimbus.getTopologyPageInfo_args(id="x-1-1")),
        "no topology id": ("getComponentPageInfo",
                           storm.Nimbus.getComponentPageInfo_args(component_id="c")),
    }
    answers = {}
    for what, (method, args) in requests.items():
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(framed(message(method, args)))
            answers[what] = sock.recv(65536)
    assert b"no live supervisor on host 'nowhere'" in answers["by host"]
    assert b"no live topology with id 'x-1-1'" in answers["no window"]
    assert b"getComponentPageInfo: argument 'topology_id' is missing" in \
        answers["no topology id"]


# -- the read rule, over TLS ---------------------------------------------------------------------

@pytest.fixture
def ca(tmp_path):
    return CertificateAuthority(tmp_path / "ca")


@pytest.fixture
def tls_cluster(zk_server, zk_root, tmp_path, ca, make_zk):
    """A nimbus with the SimpleACLAuthorizer (ops is an admin), sup-a registered; alice's
    "alices" (readonly user dave) and bob's "bobs" each with one worker on it."""
    host, _, zk_port = zk_server.hosts.rpartition(":")
    port = free_port()
    conf = load_config(overrides={
        "storm.zookeeper.servers": [host], "storm.zookeeper.port": int(zk_port),
        "storm.zookeeper.root": zk_root, "nimbus.thrift.port": port,
        "nimbus.seeds": [f"127.0.0.1:{port}"], "storm.local.dir": str(tmp_path / "local"),
        "nimbus.monitor.freq.secs": 3600, "nimbus.leader.watchdog.secs": 0,
        "nimbus.authorizer": SIMPLE_ACL, "nimbus.admins": ["ops"],
        **ca.issue("nimbus-1").conf()})
    daemon = NimbusDaemon(conf)
    daemon.start()
    try:
        wait_for(daemon.master.elector.is_leader, 20, "the nimbus to lead")
        sup_zk = make_zk()
        add_supervisor(daemon, sup_zk, "sup-a", "host-a", [6700, 6701], 5)
        bundle = tar_bundle({"topology.yaml": PROCESS_YAML})
        alices = as_user(conf, ca, "alice").submit("alices", bundle,
                                                   {"topology.readonly.users": ["dave"]})
        bobs = as_user(conf, ca, "bob").submit("bobs", bundle, {})
        daemon.master.run_cycle()
        in_snapshot(daemon, {"sup-a"}, alices)
        in_snapshot(daemon, {"sup-a"}, bobs)
        yield daemon, conf, alices, bobs
    finally:
        daemon.stop()


def as_user(conf, ca, name: str) -> NimbusClient:
    """A client with ``name``'s certificate (``.security``: for connect() too)."""
    mine = load_config(overrides={"nimbus.seeds": conf["nimbus.seeds"],
                                  **ca.issue(name, USER).conf()})
    return NimbusClient(mine, deadline_s=10)


@needs_zookeeper
def test_topology_and_component_pages_follow_the_read_rule(tls_cluster, ca):
    daemon, conf, alices, _ = tls_cluster
    for reader in ("alice", "dave", "ops"):  # submitter, topology.readonly.users, admin
        with connect(daemon.address, security=as_user(conf, ca, reader).security) as client:
            assert client.getTopologyPageInfo(alices, "600", False).name == "alices"
            assert client.getComponentPageInfo(alices, "__system", "600", True).num_executors \
                == 1
    with connect(daemon.address, security=as_user(conf, ca, "bob").security) as client:
        for call in (lambda: client.getTopologyPageInfo(alices, ":all-time", False),
                     lambda: client.getComponentPageInfo(alices, "__system", None, True)):
            with pytest.raises(storm.AuthorizationException) as refused:
                call()
            assert refused.value.msg == (
                "bob may not read alices: not its submitter, not in its topology.users or "
                "topology.readonly.users, not in nimbus.admins")
        with pytest.raises(storm.NotAliveException):  # unknown before unauthorised
            client.getTopologyPageInfo("nope-1-1", "600", False)


@needs_zookeeper
def test_supervisor_page_hides_the_components_of_topologies_the_caller_may_not_read(
        tls_cluster, ca):
    """Storm's getSupervisorPageInfo is open to every user, and leaves
    component_to_num_tasks out of the workers of topologies the user may not read."""
    daemon, conf, alices, bobs = tls_cluster

    def seen_by(name: str) -> dict:
        with connect(daemon.address, security=as_user(conf, ca, name).security) as client:
            page = client.getSupervisorPageInfo("sup-a", None, True)
        assert [s.num_used_workers for s in page.supervisor_summaries] == [2]
        return {w.topology_name: w.component_to_num_tasks for w in page.worker_summaries}

    assert seen_by("ops") == {"alices": {"__system": 1}, "bobs": {"__system": 1}}
    assert seen_by("dave") == {"alices": {"__system": 1}, "bobs": None}
    assert seen_by("bob") == {"alices": None, "bobs": {"__system": 1}}
    assert seen_by("carol") == {"alices": None, "bobs": None}
    with connect(daemon.address, security=as_user(conf, ca, "carol").security) as client:
        workers = client.getSupervisorPageInfo(None, "host-a", False).worker_summaries
    placed = {topology_id: daemon.master.state.assignment_info(topology_id).executor_node_port[
        "worker-0"][1] for topology_id in (alices, bobs)}
    assert sorted(placed.values()) == [6700, 6701]
    assert [(w.topology_id, w.port, w.num_executors) for w in workers] == sorted(
        [(topology_id, port, 1) for topology_id, port in placed.items()],
        key=lambda w: w[1]), "sorted by supervisor and port"
