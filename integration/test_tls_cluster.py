"""A whole cluster with TLS on the Thrift port, the SimpleACLAuthorizer and ZooKeeper
digest auth: separate nimbus and supervisor processes, each with its certificate; the
supervisor fetches code over TLS and runs the topology; the CLI is refused or allowed by
identity, and its read commands work from a host with no ZooKeeper credentials, each user
seeing what the read rules allow."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
import requests
import yaml
from helpers import run_cli
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from tls_certs import DAEMON, USER, CertificateAuthority
from waiting import wait_for

from nimbus.dev.cluster import LocalCluster
from nimbus.dev.feed import WORKER_MODULE, processes_with_arg
from nimbus.dev.zookeeper import free_port
from nimbus.distribution.archive import pack_directory
from nimbus.thrift import storm
from nimbus.thrift.client import NimbusClient

pytestmark = [pytest.mark.slow, pytest.mark.integration]
SIMPLE_ACL = "org.apache.storm.security.auth.authorizer.SimpleACLAuthorizer"


def test_a_tls_cluster_runs_topologies_and_authorizes_by_identity(tmp_path):
    ca = CertificateAuthority(tmp_path / "ca")
    # Every daemon of this cluster presents this one: it serves and calls.
    daemons = ca.issue("cluster", DAEMON)
    topology = tmp_path / "sleeper"
    topology.mkdir()
    (topology / "topology.yaml").write_text(yaml.safe_dump(
        {"command": [sys.executable, "-c", "import time; time.sleep(3600)"]}))
    run_cluster(tmp_path, ca, daemons, topology)


def run_cluster(tmp_path, ca, daemons, topology) -> None:
    with LocalCluster(tmp_path / "cluster", nimbuses=2, supervisors=1, slots_per_supervisor=1,
                      conf={**daemons.conf(), "nimbus.authorizer": SIMPLE_ACL,
                            "nimbus.admins": ["ops"], "nimbus.monitor.freq.secs": 1,
                            # the daemons' identity may download code (issue 19, T2.11)
                            "nimbus.supervisor.users": ["cluster"],
                            "nimbus.daemon.users": ["cluster"],
                            "nimbus.ui.users": ["ui"],
                            "supervisor.monitor.frequency.secs": 1,
                            # Only the daemons hold the ZooKeeper credential.
                            "storm.zookeeper.auth.scheme": "digest",
                            "storm.zookeeper.auth.payload": "daemons:zk-secret"}) as cluster:
        daemons_conf = yaml.safe_load(cluster.config_file.read_text())
        # Client hosts: nimbus.seeds and a certificate, no ZooKeeper credential.
        base = {k: v for k, v in daemons_conf.items()
                if not k.startswith("storm.zookeeper.auth.")}

        def as_identity(name: str):
            path = tmp_path / f"{name}.yaml"
            path.write_text(yaml.safe_dump({**base, **ca.issue(name, USER).conf()}))
            return path

        alice, bob, ops = as_identity("alice"), as_identity("bob"), as_identity("ops")
        carol = as_identity("carol")
        # This process's client presents alice's certificate (the cluster helper's own
        # leader lookups present the daemons'): she submits.
        as_alice = NimbusClient(cluster.client_conf(**ca.issue("alice", USER).conf()),
                                deadline_s=60)
        topology_id = as_alice.submit("sleeper", pack_directory(topology),
                                              {"topology.min.replication.count": 2,
                                               "topology.readonly.users": ["carol"]})
        wait_for(lambda: len(processes_with_arg(WORKER_MODULE, topology_id)) == 1, 60,
                 "the supervisor to fetch the code over TLS and run the worker")
        reads_without_zookeeper_credentials(cluster, topology_id, alice, bob, carol)
        # The cluster's records are for UIs (nimbus.ui.users) and admins: alice submitted
        # a topology and is neither.
        with pytest.raises(storm.AuthorizationException, match="alice may not read the "
                           "cluster's records"):
            as_alice.read(lambda c: c.getClusterRecords())
        ui_without_zookeeper_credentials(tmp_path, ca, base, topology_id)

        refused = run_cli("kill", "sleeper", "--wait", "0", "--config", str(bob))
        assert refused.returncode == 1
        assert "bob may not kill sleeper" in refused.stderr
        no_cert = tmp_path / "anonymous.yaml"
        no_cert.write_text(yaml.safe_dump({**base, "storm.thrift.transport":
                                           "org.apache.storm.security.auth.SimpleTransportPlugin"}))
        assert run_cli("list", "--config", str(no_cert)).returncode == 1
        run_cli("deactivate", "sleeper", "--config", str(alice), check=True)
        wait_for(lambda: processes_with_arg(WORKER_MODULE, topology_id) == [], 60,
                 "the worker to stop")
        run_cli("kill", "sleeper", "--wait", "0", "--config", str(ops), check=True)


def reads_without_zookeeper_credentials(cluster, topology_id, alice, bob, carol) -> None:
    """topology-info, errors and top from a client with nimbus.seeds and a certificate
    only: the submitter and a read-only user see the topology, anyone else does not."""
    # Without the credential ZooKeeper itself refuses: the answers below come from a nimbus.
    zk = KazooClient(hosts=cluster.zk.hosts)
    zk.start(timeout=30)
    try:
        with pytest.raises(NoAuthError):
            zk.get_children("/storm/storms")
    finally:
        zk.stop()
        zk.close()

    def running(path) -> bool:
        info = json.loads(run_cli("topology-info", "sleeper", "--json", "--config",
                                  str(path), check=True).stdout)
        return [w["state"] for w in info["workers"]] == ["running"]

    for reader in (alice, carol):
        wait_for(lambda reader=reader: running(reader), 30, "the worker shown running")
        info = json.loads(run_cli("topology-info", "sleeper", "--json", "--config",
                                  str(reader), check=True).stdout)
        assert (info["id"], info["name"], info["owner"]) == (topology_id, "sleeper", "alice")
        assert json.loads(run_cli("errors", "sleeper", "--json", "--config", str(reader),
                                  check=True).stdout) == {}
        top = run_cli("top", "--once", "--config", str(reader), check=True).stdout
        assert topology_id in top and "1/1" in top, top
    for command in (["topology-info", "sleeper"], ["errors", "sleeper"]):
        refused = run_cli(*command, "--config", str(bob))
        assert refused.returncode == 1
        assert refused.stderr.strip().splitlines()[-1] == (
            "Error: bob may not read sleeper: not its submitter, not in its topology.users "
            "or topology.readonly.users, not in nimbus.admins"), refused.stderr
    top = run_cli("top", "--once", "--config", str(bob), check=True).stdout
    assert topology_id not in top and "(no topologies)" in top, top


def ui_without_zookeeper_credentials(tmp_path, ca, base, topology_id) -> None:
    """``nimbus-ha ui`` with ``ui.source: thrift`` on a host with no ZooKeeper credential:
    it shows the cluster through a nimbus, each user what the read rules allow."""
    port = free_port()
    config = tmp_path / "ui.yaml"
    config.write_text(yaml.safe_dump({**base, **ca.issue("ui", DAEMON).conf(),
                                      "ui.source": "thrift", "ui.thrift.poll.secs": 0.5,
                                      "ui.host": "127.0.0.1", "ui.port": port}))
    url = f"https://127.0.0.1:{port}"
    # Re-issued (new files, same names): the rules know users by name.
    users = {name: ca.issue(name, USER) for name in ("carol", "bob")}
    with (tmp_path / "ui.log").open("w") as log:
        ui = subprocess.Popen([sys.executable, "-m", "nimbus.cli", "ui", "--config",
                               str(config)], stdout=log, stderr=subprocess.STDOUT)
        try:
            def get(path: str, who: str = "carol") -> requests.Response:
                assert ui.poll() is None, (tmp_path / "ui.log").read_text()
                user = users[who]
                return requests.get(url + path, timeout=10, verify=str(user.ca),
                                    cert=(str(user.cert), str(user.key)))

            wait_for(lambda: get("/api/v1/topology/summary").status_code == 200, 60,
                     "the UI to read the cluster through a nimbus", interval_s=0.2)
            summary = get("/api/v1/topology/summary").json()
            assert [(t["id"], t["name"]) for t in summary["topologies"]] == [
                (topology_id, "sleeper")]
            assert get("/api/v1/cluster/summary").json()["supervisors"] == 1
            # The dashboard's live numbers come from getTopologyRows.
            seen: list[dict] = []

            def dashboard_running() -> bool:
                seen[:] = [get("/api/v1/ui/dashboard").json()]
                return [t["workersAlive"] for t in seen[0]["topologies"]] == [1]

            try:
                wait_for(dashboard_running, 30, "the dashboard to show the worker running")
            except TimeoutError:
                raise AssertionError(f"{seen}\n{(tmp_path / 'ui.log').read_text()}") from None
            page = get(f"/api/v1/topology/{topology_id}")  # carol: a read-only user
            assert page.status_code == 200, page.text
            assert [w["state"] for w in page.json()["workers"]] == ["running"]
            refused = get(f"/api/v1/topology/{topology_id}", "bob")
            assert refused.status_code == 403, refused.text
        finally:
            ui.send_signal(signal.SIGTERM)
            ui.wait(timeout=30)
