"""A whole cluster with TLS on the Thrift port and the SimpleACLAuthorizer: separate
nimbus and supervisor processes, each with its certificate; the supervisor fetches code
over TLS and runs the topology; the CLI is refused or allowed by identity."""

from __future__ import annotations

import sys

import pytest
import yaml
from helpers import run_cli

from nimbus.config import load_config
from nimbus.devcluster import LocalCluster, wait_for
from nimbus.distribution.archive import pack_directory
from nimbus.testing.pipelines import WORKER_MODULE, processes_with_arg
from nimbus.testing.tls_certs import DAEMON, USER, CertificateAuthority
from nimbus.thrift.tls import configure_clients

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
    # This process's clients (the cluster helper's leader lookups, the submit) are alice.
    configure_clients(load_config(overrides=ca.issue("alice", USER).conf()))
    try:
        run_cluster(tmp_path, ca, daemons, topology)
    finally:
        configure_clients(load_config(overrides={}))


def run_cluster(tmp_path, ca, daemons, topology) -> None:
    with LocalCluster(tmp_path / "cluster", nimbuses=2, supervisors=1, slots_per_supervisor=1,
                      conf={**daemons.conf(), "nimbus.authorizer": SIMPLE_ACL,
                            "nimbus.admins": ["ops"], "nimbus.monitor.freq.secs": 1,
                            # the daemons' identity may download code (issue 19, T2.11)
                            "nimbus.supervisor.users": ["cluster"],
                            "nimbus.daemon.users": ["cluster"],
                            "supervisor.monitor.frequency.secs": 1}) as cluster:
        base = yaml.safe_load(cluster.config_file.read_text())

        def as_identity(name: str):
            path = tmp_path / f"{name}.yaml"
            path.write_text(yaml.safe_dump({**base, **ca.issue(name, USER).conf()}))
            return path

        alice, bob, ops = as_identity("alice"), as_identity("bob"), as_identity("ops")
        topology_id = cluster.client().submit("sleeper", pack_directory(topology),
                                              {"topology.min.replication.count": 2})
        wait_for(lambda: len(processes_with_arg(WORKER_MODULE, topology_id)) == 1, 60,
                 "the supervisor to fetch the code over TLS and run the worker")

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
