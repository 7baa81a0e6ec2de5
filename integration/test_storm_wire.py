"""Wire compatibility with a client that does not share our Thrift stack.

The client is generated at test time by Apache Thrift's own compiler (Debian's
thrift-compiler) and runs on Apache Thrift's Python library, the toolchain Storm's own
Python bindings are generated with. It talks framed binary Thrift to real nimbus
processes: list, submit, deactivate, activate, kill, find the leader, and be refused by
a follower.
"""

from __future__ import annotations

import importlib
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

    from nimbus.devcluster import wait_for
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
