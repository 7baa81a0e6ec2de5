"""TLS with client certificates on the Thrift port, and Storm's SimpleACLAuthorizer rules,
against real nimbus daemons and a real ZooKeeper (storm.thrift.transport: tls)."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys

import pytest
import yaml
from tls_certs import USER, CertificateAuthority
from waiting import wait_for

from nimbus.cluster_security import ClusterSecurity
from nimbus.config import ConfigError, load_config
from nimbus.dev.zookeeper import free_port
from nimbus.distribution.archive import pack_directory
from nimbus.thrift import storm

pytestmark = pytest.mark.zookeeper
SIMPLE_ACL = "org.apache.storm.security.auth.authorizer.SimpleACLAuthorizer"


@pytest.fixture
def ca(tmp_path):
    return CertificateAuthority(tmp_path / "ca")


def nimbus_conf(zk_server, zk_root, tmp_path, identity, port, **extra):
    host, _, zk_port = zk_server.hosts.rpartition(":")
    return load_config(overrides={
        "storm.zookeeper.servers": [host], "storm.zookeeper.port": int(zk_port),
        "storm.zookeeper.root": zk_root, "nimbus.thrift.port": port,
        "nimbus.seeds": [f"127.0.0.1:{port}"],
        "storm.local.dir": str(tmp_path / f"local-{port}"),
        "nimbus.authorizer": SIMPLE_ACL, "nimbus.admins": ["ops"],
        **identity.conf(), **extra})


@pytest.fixture
def tls_nimbus(zk_server, zk_root, tmp_path, ca):
    from nimbus.daemons.nimbus import NimbusDaemon

    port = free_port()
    conf = nimbus_conf(zk_server, zk_root, tmp_path, ca.issue("nimbus-1"), port)
    daemon = NimbusDaemon(conf)
    daemon.start()
    wait_for(daemon.master.elector.is_leader, 20, "the nimbus to lead")
    yield daemon, conf
    daemon.stop()


def conf_as(conf, identity):
    """A client's configuration of the cluster of ``conf``, with ``identity``'s
    certificate."""
    return load_config(overrides={**{k: conf[k] for k in (
        "nimbus.seeds", "storm.zookeeper.servers", "storm.zookeeper.port")},
        **identity.conf()})


def client_as(conf, identity):
    """A client presenting ``identity``'s certificate: the one of the configuration it
    is made of, whatever other clients of this process present."""
    from nimbus.thrift.client import NimbusClient

    return NimbusClient(conf_as(conf, identity), deadline_s=10)


def security_as(conf, identity) -> ClusterSecurity:
    return ClusterSecurity.for_client(conf_as(conf, identity))


def bundle(tmp_path):
    directory = tmp_path / "topology"
    directory.mkdir(exist_ok=True)
    (directory / "topology.yaml").write_text('command: ["sleep", "3600"]\n')
    return pack_directory(directory)


def test_clients_without_a_certificate_of_the_cluster_reach_no_method(tls_nimbus, tmp_path):
    daemon, conf = tls_nimbus
    port = conf["nimbus.thrift.port"]

    # Plain TCP, as a client without TLS would speak: dropped in the handshake.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as plain:
        plain.sendall(b"\x00\x00\x00\x10" + b"\x80\x01\x00\x01" + b"\x00" * 12)
        try:
            reply = plain.recv(100)
        except ConnectionResetError:
            reply = b""
        assert reply == b"" or reply[0] == 0x15, "nothing but a TLS alert comes back"
    # TLS without a client certificate: the server refuses the handshake.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(conf["storm.thrift.tls.ca.file"])
    context.check_hostname = False
    with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            with context.wrap_socket(raw) as tls:
                tls.sendall(b"\x00\x00\x00\x04ping")
                if tls.recv(10) == b"":
                    raise ConnectionResetError("closed by the server")
    # A certificate from another CA: refused too.
    stranger = CertificateAuthority(tmp_path / "other-ca").issue("mallory")
    client = client_as(conf, stranger)
    client.deadline_s = 0  # one attempt: a refusal does not pass with waiting
    from nimbus.thrift.client import NimbusUnavailableError

    with pytest.raises(NimbusUnavailableError):
        client.cluster_info()
    # No call reached the handler: the nimbus's Thrift call metric saw none.
    counted = [s for m in daemon.metrics.registry.collect()
               if m.name == "nimbus_thrift_calls" for s in m.samples
               if s.name.endswith("_total")]
    assert sum(s.value for s in counted) == 0


def test_only_submitter_users_and_admins_change_a_topology(tls_nimbus, tmp_path, ca):
    _, conf = tls_nimbus
    alice, bob, carol, ops = (ca.issue(n, USER) for n in ("alice", "bob", "carol", "ops"))
    as_alice = client_as(conf, alice)
    as_alice.submit("alices", bundle(tmp_path), {"topology.users": ["carol"],
                                                 "topology.submitter.user": "bob"})
    info = as_alice.cluster_info()
    assert [(t.name, t.owner) for t in info.topologies] == [("alices", "alice")], \
        "the owner is the certificate's identity, not what the conf claims"

    with pytest.raises(storm.AuthorizationException) as refused:
        client_as(conf, bob).deactivate("alices")
    assert refused.value.msg == ("bob may not deactivate alices: not its submitter, not in "
                                 "its topology.users, not in nimbus.admins")
    with pytest.raises(storm.AuthorizationException):
        client_as(conf, bob).kill("alices", 0)
    with pytest.raises(storm.AuthorizationException):
        client_as(conf, bob).rebalance("alices", 2)

    client_as(conf, carol).deactivate("alices")   # in topology.users
    client_as(conf, alice).activate("alices")     # the submitter
    client_as(conf, ops).rebalance("alices", 2)   # in nimbus.admins
    statuses = {t.name: t.status for t in client_as(conf, bob).cluster_info().topologies}
    assert statuses == {"alices": "ACTIVE"}, "reading is open to every authenticated client"
    client_as(conf, ops).kill("alices", 0)


def test_only_owner_users_readonly_users_and_admins_read_a_topology(tls_nimbus, tmp_path, ca):
    """Storm's read-only topology operations: getTopologyInfo, getTopologyConf and
    getTopology need the same rights as a change, or topology.readonly.users."""
    from nimbus.thrift.client import connect

    _, conf = tls_nimbus
    alice, bob, carol, dave, ops = (ca.issue(n, USER) for n in ("alice", "bob", "carol",
                                                                  "dave", "ops"))
    topology_id = client_as(conf, alice).submit("alices", bundle(tmp_path), {
        "topology.users": ["carol"], "topology.readonly.users": ["dave"]})
    seed = conf["nimbus.seeds"][0]

    def reads(identity):
        with connect(seed, security=security_as(conf, identity)) as client:
            return (client.getTopologyInfo(topology_id).id,
                    json.loads(client.getTopologyConf(topology_id))["topology.users"],
                    type(client.getTopology(topology_id)).__name__)

    for reader in (alice, carol, dave, ops):
        assert reads(reader) == (topology_id, ["carol"], "StormTopology")
    with connect(seed, security=security_as(conf, bob)) as client:
        for call in (client.getTopologyInfo, client.getTopologyConf, client.getTopology):
            with pytest.raises(storm.AuthorizationException) as refused:
                call(topology_id)
            assert refused.value.msg == (
                "bob may not read alices: not its submitter, not in its topology.users or "
                "topology.readonly.users, not in nimbus.admins")
    with pytest.raises(storm.AuthorizationException):
        client_as(conf, dave).deactivate("alices")  # read-only means read only


def test_only_readers_supervisors_nimbuses_and_admins_download_code(zk_server, zk_root,
                                                                     tmp_path, ca):
    """Issue 19, T2.11: beginFileDownload of another user's code and conf was open to any
    client; Storm allows fileDownload to admins and nimbus.supervisor.users only, and
    nimbus-ha to a topology's own readers and peer nimbuses (nimbus.daemon.users) too."""
    from nimbus.daemons.nimbus import NimbusDaemon

    conf = nimbus_conf(zk_server, zk_root, tmp_path, ca.issue("nimbus-1"), free_port(),
                       **{"nimbus.supervisor.users": ["supervisor-1"],
                          "nimbus.daemon.users": ["nimbus-2"]})
    daemon = NimbusDaemon(conf)
    daemon.start()
    try:
        wait_for(daemon.master.elector.is_leader, 20, "the nimbus to lead")
        _downloads(conf, ca, tmp_path)
    finally:
        daemon.stop()


def _downloads(conf, ca, tmp_path) -> None:
    from nimbus.thrift.client import connect

    alice, bob, dave = (ca.issue(n, USER) for n in ("alice", "bob", "dave"))
    topology_id = client_as(conf, alice).submit("alices", bundle(tmp_path), {
        "topology.readonly.users": ["dave"]})
    seed = conf["nimbus.seeds"][0]

    def download(identity, name="stormconf.json") -> str:
        with connect(seed, security=security_as(conf, identity)) as client:
            return client.beginFileDownload(f"{topology_id}/{name}")

    for allowed in ("alice", "dave", "ops", "supervisor-1", "nimbus-2"):
        assert download(ca.issue(allowed)), allowed
    for name in ("stormconf.json", "stormjar.jar"):
        with pytest.raises(storm.AuthorizationException) as refused:
            download(bob, name)
        assert refused.value.msg == (
            "bob may not read alices: not its submitter, not in its topology.users or "
            "topology.readonly.users, not in nimbus.admins (nor download its code: not in "
            "nimbus.supervisor.users or nimbus.daemon.users)")
    with pytest.raises(storm.AuthorizationException, match="may not download"):
        with connect(seed, security=security_as(conf, bob)) as client:
            client.beginFileDownload("nosuch-1-1/stormconf.json")
    assert download(dave)  # the rule did not stick on the refusals


def test_peer_nimbuses_copy_code_over_tls(zk_server, zk_root, tmp_path, ca):
    """Replication between nimbuses (localfs: Thrift downloads) works with TLS on."""
    from nimbus.daemons.nimbus import NimbusDaemon

    ports = [free_port(), free_port()]
    daemons = []
    try:
        for i, port in enumerate(ports):
            conf = nimbus_conf(zk_server, zk_root, tmp_path, ca.issue(f"nimbus-{i}"), port,
                               **{"nimbus.seeds": [f"127.0.0.1:{p}" for p in ports],
                                  "nimbus.daemon.users": ["nimbus-0", "nimbus-1"]})
            daemons.append(NimbusDaemon(conf))
            daemons[-1].start()
        # Each daemon fetches from its peer with its own certificate (nimbus.daemon.users),
        # whoever this process's clients are: here a user.
        client = client_as(daemons[0].conf, ca.issue("alice", USER))
        topology_id = client.submit("replicated", bundle(tmp_path),
                                    {"topology.min.replication.count": 2})
        assert all(d.master.store.has(topology_id) for d in daemons)
        assert [t.replication_count for t in client.cluster_info().topologies] == [2]
    finally:
        for daemon in daemons:
            daemon.stop()


@pytest.mark.parametrize(("overrides", "message"), [
    ({"nimbus.authorizer": SIMPLE_ACL},
     "nimbus.authorizer needs callers with an identity: set storm.thrift.transport to tls"),
    ({"nimbus.authorizer": "com.example.Other"},
     f"nimbus.authorizer: only {SIMPLE_ACL} is supported, got 'com.example.Other'"),
    ({"storm.thrift.transport": "tls"},
     "storm.thrift.tls.ca.file must name a PEM file when storm.thrift.transport is tls "
     "(got None)"),
])
def test_unusable_security_settings_are_named(overrides, message):
    """A daemon's security object, made once at its start, refuses them."""
    conf = load_config(overrides=overrides)
    with pytest.raises(ConfigError) as caught:
        ClusterSecurity.for_daemon(conf, serves=True)
    assert str(caught.value) == message


def test_the_cli_speaks_tls_with_its_certificate(tls_nimbus, tmp_path, ca):
    _, conf = tls_nimbus
    config = tmp_path / "alice.yaml"
    config.write_text(yaml.safe_dump({
        "nimbus.seeds": conf["nimbus.seeds"],
        "storm.zookeeper.servers": conf["storm.zookeeper.servers"],
        "storm.zookeeper.port": conf["storm.zookeeper.port"],
        **ca.issue("alice", USER).conf()}))
    done = subprocess.run([sys.executable, "-m", "nimbus.cli", "leader", "--config",
                           str(config)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"127.0.0.1:{conf['nimbus.thrift.port']}"


def test_a_nimbus_that_will_refuse_every_supervisor_says_so_at_start(
        zk_server, zk_root, tmp_path, ca, caplog):
    """An authorizer with no nimbus.supervisor.users: every supervisor's Thrift download
    would be refused, and the only trace used to be each supervisor's own WARNING."""
    from nimbus.daemons.nimbus import NimbusDaemon

    warning = "nimbus.authorizer is set but nimbus.supervisor.users is empty"
    for users, expected in (([], 1), (["cluster"], 0)):
        caplog.clear()
        conf = nimbus_conf(zk_server, zk_root, tmp_path, ca.issue("nimbus-1"), free_port(),
                           **{"nimbus.supervisor.users": users})
        with caplog.at_level("WARNING", logger="nimbus.master.daemon"):
            daemon = NimbusDaemon(conf)
        try:
            said = [r.getMessage() for r in caplog.records if warning in r.getMessage()]
            assert len(said) == expected, said
        finally:
            daemon._release()
