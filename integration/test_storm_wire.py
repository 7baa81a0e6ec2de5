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
