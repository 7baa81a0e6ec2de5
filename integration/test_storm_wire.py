"""Wire compatibility with a client that does not share our Thrift stack.

The client is generated at test time by Apache Thrift's own compiler (Debian's
thrift-compiler) and runs on Apache Thrift's Python library, the toolchain Storm's own
Python bindings are generated with. It talks framed binary Thrift to real nimbus
processes: list, submit, deactivate, activate, kill, find the leader, be refused by a
follower, and read Storm UI's page info (getTopologyPageInfo, getComponentPageInfo,
getSupervisorPageInfo) of a topology that real workers run.
"""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
IDL = Path(__file__).resolve().parents[1] / "nimbus" / "thrift" / "storm.thrift"


@pytest.fixture(scope="module")
def apache(tmp_path_factory):
    """The generated ``Nimbus`` and ``ttypes`` modules, plus Apache's transport classes."""
    if shutil.which("thrift") is None:
        pytest.fail("Apache Thrift's compiler is missing: apt-get install thrift-compiler")
    out = tmp_path_factory.mktemp("gen")
    subprocess.run(["thrift", "--gen", "py", "-out", str(out), str(IDL)], check=True)
    sys.path.insert(0, str(out))
    try:
        nimbus = importlib.import_module("nimbus_storm.Nimbus")
        ttypes = importlib.import_module("nimbus_storm.ttypes")
    finally:
        sys.path.remove(str(out))
    from thrift.protocol import TBinaryProtocol
    from thrift.transport import TSocket, TTransport

    def connect(address: str):
        host, port = address.rsplit(":", 1)
        transport = TTransport.TFramedTransport(TSocket.TSocket(host, int(port)))
        transport.open()
        return nimbus.Client(TBinaryProtocol.TBinaryProtocol(transport)), transport

    return nimbus, ttypes, connect


def test_apache_thrift_client_manages_topologies(make_cluster, bundle, apache):
    from thrift.Thrift import TApplicationException

    _, ttypes, connect = apache
    cluster = make_cluster(2)
    leader = cluster.wait_for_leader()
    follower = next(n for n in cluster.nimbuses if n is not leader)

    client, transport = connect(follower.address)
    try:
        found = client.getLeader()
        assert (f"{found.host}:{found.port}", found.isLeader) == (leader.address, True)
        with pytest.raises(TApplicationException, match=f"current leader is {leader.address}"):
            client.killTopology("anything")
    finally:
        transport.close()

    client, transport = connect(leader.address)
    try:
        location = client.beginFileUpload()
        client.uploadChunk(location, bundle)
        client.finishFileUpload(location)
        client.submitTopologyWithOpts(
            "apache-client", location, "{}",
            ttypes.StormTopology(spouts={}, bolts={}, state_spouts={}),
            ttypes.SubmitOptions(initial_status=ttypes.TopologyInitialStatus.ACTIVE))

        def status() -> str:
            info = client.getClusterInfo()
            assert sum(n.isLeader for n in info.nimbuses) == 1 and len(info.nimbuses) == 2
            return next(t.status for t in info.topologies if t.name == "apache-client")

        assert status() == "ACTIVE"
        client.deactivate("apache-client")
        assert status() == "INACTIVE"
        client.activate("apache-client")
        assert status() == "ACTIVE"
        client.killTopologyWithOpts("apache-client", ttypes.KillOptions(wait_secs=30))
        assert status() == "KILLED"
        with pytest.raises(ttypes.NotAliveException):
            client.activate("no-such-topology")
    finally:
        transport.close()


def test_apache_thrift_client_rebalances_and_reads_runtime_info(make_cluster, bundle, apache):
    """rebalance, getClusterInfo's supervisors and getTopologyInfo's executors and errors,
    decoded by Apache Thrift; the supervisor's records are written as a supervisor would."""
    from helpers import observer
    from waiting import wait_for

    from nimbus.state.records import ErrorInfo, SupervisorInfo

    _, ttypes, connect = apache
    cluster = make_cluster(1, **{"nimbus.monitor.freq.secs": 1})
    leader = cluster.wait_for_leader()
    state = observer(cluster)
    client, transport = connect(leader.address)
    try:
        state.zk.create(state.path("supervisors", "sup-a"), SupervisorInfo(
            time_secs=1, hostname="host-a", meta=[6700, 6701], uptime_secs=5,
            version="sup-1").encode(), ephemeral=True)
        location = client.beginFileUpload()
        client.uploadChunk(location, bundle)
        client.finishFileUpload(location)
        client.submitTopology("runtime", location, "{}",
                              ttypes.StormTopology(spouts={}, bolts={}, state_spouts={}))
        topology_id = next(t.id for t in client.getClusterInfo().topologies
                           if t.name == "runtime")

        client.rebalance("runtime", ttypes.RebalanceOptions(num_workers=2))
        with pytest.raises(ttypes.InvalidTopologyException, match="num_workers must be"):
            client.rebalance("runtime", ttypes.RebalanceOptions(num_workers=0))
        with pytest.raises(ttypes.NotAliveException):
            client.rebalance("no-such-topology", ttypes.RebalanceOptions(num_workers=2))

        def both_placed():
            info = client.getClusterInfo()
            used = [(s.supervisor_id, s.num_used_workers) for s in info.supervisors]
            return info if used == [("sup-a", 2)] else None

        info = wait_for(both_placed, 60, "the leader to place both workers on sup-a")
        assert [(s.host, s.uptime_secs, s.num_workers, s.version)
                for s in info.supervisors] == [("host-a", 5, 2, "sup-1")]
        assert [(t.name, t.num_workers) for t in info.topologies] == [("runtime", 2)]

        assert state.report_error(topology_id, "main", ErrorInfo(
            error="command exited with 1", error_time_secs=7, host="host-a", port=6700))
        info = client.getTopologyInfo(topology_id)
        # no worker has beaten yet: each shows as Storm's per-worker __system component
        assert [(e.component_id, e.host, e.port, e.executor_info.task_start,
                 e.executor_info.task_end) for e in info.executors] == [
            ("__system", "host-a", 6700, 1, 1), ("__system", "host-a", 6701, 2, 2)]
        assert info.errors == {"main": [ttypes.ErrorInfo(
            error="command exited with 1", error_time_secs=7, host="host-a", port=6700)]}
        with pytest.raises(ttypes.NotAliveException):
            client.getTopologyInfo("no-such-id")
    finally:
        transport.close()
        state.zk.stop()


def test_apache_thrift_client_reads_the_page_info_of_a_running_topology(tmp_path, bundle,
                                                                       apache):
    """getTopologyPageInfo, getComponentPageInfo and getSupervisorPageInfo (Storm UI's
    pages), decoded by Apache Thrift, from the leader and from a follower, about a
    process topology whose two workers run on a real supervisor."""
    from helpers import observer
    from waiting import wait_for

    from nimbus.dev.cluster import LocalCluster
    from nimbus.state.records import ErrorInfo

    _, ttypes, connect = apache
    cluster = LocalCluster(tmp_path / "paged", 2, supervisors=1, slots_per_supervisor=2, conf={
        "supervisor.monitor.frequency.secs": 1, "supervisor.heartbeat.frequency.secs": 1,
        "worker.heartbeat.frequency.secs": 1})
    state = None
    clients = []
    try:
        cluster.start()
        leader = cluster.wait_for_leader()
        follower = next(n for n in cluster.nimbuses if n is not leader)
        sup = cluster.supervisors[0]
        state = observer(cluster)
        clients = [connect(leader.address), connect(follower.address)]
        client = clients[0][0]
        location = client.beginFileUpload()
        client.uploadChunk(location, bundle)
        client.finishFileUpload(location)
        client.submitTopology("paged", location,
                              '{"topology.workers": 2, "my.api.token": "s3cret"}',
                              ttypes.StormTopology(spouts={}, bolts={}, state_spouts={}))
        topology_id = next(t.id for t in client.getClusterInfo().topologies
                           if t.name == "paged")

        def running():
            info = client.getTopologyInfo(topology_id)
            return info if [(e.component_id, e.uptime_secs > 0) for e in info.executors] \
                == [("main", True)] * 2 else None

        wait_for(running, 90, "both workers to run and report their component")
        # Both nimbuses hold the code (a follower's topology_conf comes from its copy),
        # and both see the supervisor (getSupervisorPageInfo: getClusterInfo's).
        for c, _ in clients:
            wait_for(lambda c=c: [(t.replication_count, [s.num_used_workers
                                                         for s in i.supervisors])
                                  for i in [c.getClusterInfo()] for t in i.topologies]
                     == [(2, [2])], 60, "the code on both nimbuses, both workers placed")
        assert state.report_error(topology_id, "main", ErrorInfo(
            error="main: exited with 3", error_time_secs=7, host="127.0.0.1",
            port=sup.ports[0]))
        error = ttypes.ErrorInfo(error="main: exited with 3", error_time_secs=7,
                                 host="127.0.0.1", port=sup.ports[0])

        for c, _ in clients:  # any nimbus answers, as getTopologyInfo
            info = c.getTopologyInfo(topology_id)
            page = c.getTopologyPageInfo(topology_id, "600", False)
            assert (page.id, page.name, page.status, page.num_workers, page.num_executors,
                    page.num_tasks, page.replication_count, page.owner) == (
                topology_id, "paged", "ACTIVE", 2, 2, 2, 2, info.owner)
            assert page.num_executors == len(info.executors)
            assert 0 <= page.uptime_secs <= 300
            conf = json.loads(page.topology_conf)
            assert (conf["topology.workers"], conf["my.api.token"]) == (2, "********")
            assert page.id_to_spout_agg_stats == {}
            assert page.id_to_bolt_agg_stats == {"main": ttypes.ComponentAggregateStats(
                type=ttypes.ComponentType.BOLT,
                common_stats=ttypes.CommonAggregateStats(
                    num_executors=2, num_tasks=2, emitted=0, transferred=0, acked=0,
                    failed=0),
                specific_stats=ttypes.SpecificAggregateStats(bolt=ttypes.BoltAggregateStats(
                    execute_latency_ms=0.0, process_latency_ms=0.0, executed=0,
                    capacity=0.0)),
                last_error=error)}
            assert page.topology_stats == ttypes.TopologyStats(
                window_to_emitted={"600": 0}, window_to_transferred={"600": 0},
                window_to_complete_latencies_ms={"600": 0.0}, window_to_acked={"600": 0},
                window_to_failed={"600": 0})
            assert sorted((w.supervisor_id, w.host, w.port, w.topology_id, w.topology_name,
                           w.num_executors, w.component_to_num_tasks)
                          for w in page.workers) == [
                (sup.id, "127.0.0.1", port, topology_id, "paged", 1, {"main": 1})
                for port in sorted(sup.ports)]
            assert all(w.uptime_secs > 0 for w in page.workers)
            with_sys = c.getTopologyPageInfo(topology_id, None, True)
            assert list(with_sys.topology_stats.window_to_emitted) == [":all-time"]
            assert list(with_sys.id_to_bolt_agg_stats) == ["main"]

            component = c.getComponentPageInfo(topology_id, "main", "10800", False)
            assert (component.component_id, component.component_type, component.topology_id,
                    component.topology_name, component.topology_status,
                    component.num_executors, component.num_tasks) == (
                "main", ttypes.ComponentType.BOLT, topology_id, "paged", "ACTIVE", 2, 2)
            assert list(component.window_to_stats) == ["10800"]
            assert component.window_to_stats["10800"] == page.id_to_bolt_agg_stats["main"]
            assert sorted((e.exec_summary.host, e.exec_summary.port,
                           e.exec_summary.component_id, e.stats.common_stats.num_executors)
                          for e in component.exec_stats) == [
                ("127.0.0.1", port, "main", 1) for port in sorted(sup.ports)]
            assert sorted(e.exec_summary.executor_info.task_start
                          for e in component.exec_stats) == [1, 2]
            assert component.errors == [error]
            with pytest.raises(ttypes.NotAliveException, match="has no component 'spout'"):
                c.getComponentPageInfo(topology_id, "spout", "600", False)
            with pytest.raises(ttypes.NotAliveException, match="no live topology"):
                c.getTopologyPageInfo("no-such-1-1", "600", False)
            with pytest.raises(ttypes.NotAliveException, match="no live topology"):
                c.getComponentPageInfo("no-such-1-1", "main", "600", False)

            by_id = c.getSupervisorPageInfo(sup.id, None, False)
            by_host = c.getSupervisorPageInfo(None, "127.0.0.1", False)
            for supervisor_page in (by_id, by_host):
                assert [(s.supervisor_id, s.host, s.num_workers, s.num_used_workers)
                        for s in supervisor_page.supervisor_summaries] == [
                    (sup.id, "127.0.0.1", 2, 2)]
                assert [(w.port, w.topology_id, w.num_executors, w.component_to_num_tasks)
                        for w in supervisor_page.worker_summaries] == [
                    (port, topology_id, 1, {"main": 1}) for port in sorted(sup.ports)]
            with pytest.raises(ttypes.NotAliveException, match="no live supervisor with id"):
                c.getSupervisorPageInfo("no-such-supervisor", None, False)
            with pytest.raises(ttypes.NotAliveException, match="no live supervisor on host"):
                c.getSupervisorPageInfo(None, "no-such-host", False)
    except BaseException:
        for daemon in [*cluster.nimbuses, *cluster.supervisors]:
            print(f"--- {daemon.log_file.name} ---\n{daemon.log_text()[-4000:]}")
        raise
    finally:
        for _, transport in clients:
            transport.close()
        if state is not None:
            state.zk.stop()
        cluster.stop()
