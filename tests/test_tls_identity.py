"""Who a certificate makes its holder (issue 19, "Identity"): T1.8 and T2.14.

T1.8: every client (the CLI, peer nimbuses copying code, supervisors fetching it, the UI
calling the leader) accepted any certificate of the cluster's CA as a nimbus, so alice
could stand up a nimbus of her own with her user's certificate and be trusted. Now a
client accepts only a server whose certificate carries serverAuth in its extended key
usage, and a daemon will not start with a certificate that lacks it.

T2.14: a certificate without a subject common name gave the empty identity. Now the
Thrift port drops such a client after its handshake, and the UI and /metrics answer 403.

Everything runs over real TLS on 127.0.0.1, with certificates of the test CA.
"""

from __future__ import annotations

import logging
import re
import socket
import ssl

import pytest
import requests
from raw_thrift import DROP_TIMEOUT_S, assert_dropped, cluster_info_request
from tls_certs import DAEMON, SERVER, USER, CertificateAuthority
from ui_fixtures import conf_for, write_cluster

from nimbus.cluster_security import ClusterSecurity
from nimbus.config import ConfigError, load_config
from nimbus.metrics import MetricsServer, SupervisorMetrics
from nimbus.state.cluster_state import StormClusterState
from nimbus.thrift import storm
from nimbus.thrift.client import (
    CONNECTION_ERRORS,
    NimbusClient,
    NimbusUnavailableError,
    connect,
    fetch_file,
    file_fetcher,
)
from nimbus.thrift.server import ThriftServer, current_client
from nimbus.thrift.tls import client_context, server_context
from nimbus.ui.server import UIServer

HOW_TO = 'docs/security.md, "How to issue certificates"'
NAMELESS = ("the client certificate (OU=nameless,O=nimbus-ha tests) has no common name, "
            "which is the identity nimbus-ha gives its holder: use a certificate whose "
            f"subject has one ({HOW_TO})")


class FakeNimbus:
    """What alice's nimbus answers: it claims to lead, and serves "code"."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.port = 0

    def getLeader(self) -> storm.NimbusSummary:
        self.calls.append(("getLeader", current_client()))
        return storm.NimbusSummary(host="127.0.0.1", port=self.port, uptime_secs=1,
                                   isLeader=True)

    def getClusterInfo(self) -> storm.ClusterSummary:
        self.calls.append(("getClusterInfo", current_client()))
        return storm.ClusterSummary(supervisors=[], nimbus_uptime_secs=1, topologies=[],
                                    nimbuses=[])

    def beginFileDownload(self, file: str) -> str:
        self.calls.append(("beginFileDownload", current_client()))
        return "session-1"

    def downloadChunk(self, session: str) -> bytes:
        self.calls.append(("downloadChunk", current_client()))
        return b""


@pytest.fixture
def ca(tmp_path):
    return CertificateAuthority(tmp_path / "ca")


@pytest.fixture
def thrift_servers():
    """start(context) -> (ThriftServer on 127.0.0.1 with that TLS context, its handler)."""
    servers: list[ThriftServer] = []

    def start(context: ssl.SSLContext) -> tuple[ThriftServer, FakeNimbus]:
        handler = FakeNimbus()
        server = ThriftServer(handler, "127.0.0.1", 0, ssl_context=context)
        handler.port = server.port
        server.start()
        servers.append(server)
        return server, handler

    yield start
    for server in servers:
        server.stop()


def own_server_context(identity) -> ssl.SSLContext:
    """A TLS server context as anyone would build it, without nimbus-ha's checks: the
    one alice's own nimbus would use."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(identity.cert), str(identity.key))
    context.load_verify_locations(str(identity.ca))
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def conf_of(identity, **extra):
    return load_config(overrides={**identity.conf(), **extra})


def security_of(identity) -> ClusterSecurity:
    """What a process acting as ``identity`` passes to its clients."""
    return ClusterSecurity.for_client(conf_of(identity))


# -- T1.8: a nimbus is a certificate marked for servers ---------------------------------
@pytest.mark.parametrize("roles", [None, USER], ids=["no-extended-key-usage", "client-only"])
def test_a_users_certificate_cannot_pose_as_a_nimbus(ca, tmp_path, thrift_servers, caplog,
                                                     roles):
    """T1.8: alice's nimbus, with her certificate of the cluster's CA, was trusted by
    the CLI and by daemons. OpenSSL refuses a server whose extended key usage lacks
    serverAuth, but takes one without the extension at all (the test CA's certificates
    had none); both are refused now, with the reason logged."""
    caplog.set_level(logging.WARNING, logger="nimbus.thrift.tls")
    alice = ca.issue("alice", roles)
    server, fake = thrift_servers(own_server_context(alice))
    address = f"127.0.0.1:{server.port}"

    # bob's CLI asks its seed (alice's nimbus) for the cluster.
    bob = conf_of(ca.issue("bob", USER), **{"nimbus.seeds": [address]})
    with pytest.raises(NimbusUnavailableError):
        NimbusClient(bob, deadline_s=0).cluster_info()
    # A nimbus or a supervisor fetches code from it.
    with pytest.raises(CONNECTION_ERRORS):
        fetch_file(address, "stormdist/t-1/stormcode.ser", tmp_path / "code",
                   security=security_of(ca.issue("supervisor-1")))
    assert fake.calls == [], "no client sent alice's nimbus a call"

    # The reason, as every client of this process sees it (and logs it).
    context = client_context(conf_of(ca.issue("nimbus-2")))
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
        with pytest.raises(ssl.SSLCertVerificationError) as refused:
            context.wrap_socket(raw, server_hostname="127.0.0.1")
    if roles is None:
        expected = (f"refused the server at {address}: its certificate (CN=alice) has no "
                    "extended key usage extension, so nothing marks it as a server's")
    else:
        expected = (f"refused the server at {address}: its certificate is not marked for "
                    "servers (OpenSSL: unsuitable certificate purpose): its extended key "
                    "usage lacks TLS Web Server Authentication (serverAuth)")
    assert str(refused.value) == (
        f"{expected}; a nimbus must present a certificate with TLS Web Server "
        "Authentication (serverAuth) and TLS Web Client Authentication (clientAuth) in its "
        f"extended key usage ({HOW_TO})")
    assert str(refused.value) in caplog.messages


@pytest.mark.parametrize("roles", [(SERVER,), DAEMON],
                         ids=["server-only", "daemon"])
def test_a_certificate_marked_for_servers_is_a_nimbus(ca, thrift_servers, roles):
    server, fake = thrift_servers(server_context(conf_of(ca.issue("nimbus-1", roles))))
    address = f"127.0.0.1:{server.port}"
    bob = conf_of(ca.issue("bob", USER), **{"nimbus.seeds": [address]})
    assert NimbusClient(bob, deadline_s=5).cluster_info().nimbus_uptime_secs == 1
    assert ("getClusterInfo", "bob") in fake.calls


@pytest.mark.parametrize(("roles", "problem"), [
    (USER, "its extended key usage (clientAuth) lacks TLS Web Server Authentication "
           "(serverAuth)"),
    (None, "it has no extended key usage extension"),
], ids=["client-only", "no-extended-key-usage"])
def test_a_daemon_does_not_serve_with_a_certificate_not_marked_for_servers(ca, roles,
                                                                           problem):
    """A nimbus (or /metrics) whose every client would refuse it fails its start."""
    identity = ca.issue("nimbus-1", roles)
    with pytest.raises(ConfigError) as caught:
        server_context(conf_of(identity))
    assert str(caught.value) == (
        f"storm.thrift.tls.cert.file ({identity.cert}) is not marked for servers: "
        f"{problem}, so every client would refuse it; give each daemon (nimbus, "
        "supervisor, UI) a certificate with serverAuth and clientAuth in its extended key "
        f"usage ({HOW_TO})")


def test_a_certificate_marked_for_servers_only_cannot_call(ca):
    identity = ca.issue("nimbus-1", (SERVER,))
    with pytest.raises(ConfigError) as caught:
        client_context(conf_of(identity))
    assert str(caught.value) == (
        f"storm.thrift.tls.cert.file ({identity.cert}) is not marked for clients: its "
        "extended key usage (serverAuth) lacks TLS Web Client Authentication (clientAuth), "
        "so every nimbus would refuse it; give daemons a certificate with serverAuth and "
        f"clientAuth, users one with clientAuth ({HOW_TO})")


# -- T2.14: no common name, no caller ---------------------------------------------------
def test_a_certificate_without_a_common_name_reaches_no_method(ca, thrift_servers, caplog):
    """T2.14: its empty identity could match an empty owner. Now it is dropped after
    its handshake, before any call."""
    caplog.set_level(logging.INFO, logger="nimbus.thrift.server")
    server, fake = thrift_servers(server_context(conf_of(ca.issue("nimbus-1"))))
    nameless = ca.issue("nameless", USER, with_common_name=False)
    with pytest.raises(CONNECTION_ERRORS):
        with connect(f"127.0.0.1:{server.port}", timeout_s=DROP_TIMEOUT_S,
                     security=security_of(nameless)) as client:
            client.getClusterInfo()
    context = client_context(conf_of(nameless))
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            local_port = sock.getsockname()[1]
            sock.sendall(cluster_info_request())
            assert_dropped(sock)
    assert fake.calls == []
    assert f"dropped Thrift connection from 127.0.0.1:{local_port}: {NAMELESS}" in \
        caplog.messages
    # A certificate with one is served as before.
    with connect(f"127.0.0.1:{server.port}",
                 security=security_of(ca.issue("bob", USER))) as client:
        client.getClusterInfo()
    assert fake.calls == [("getClusterInfo", "bob")]


def https_args(identity) -> dict:
    return {"cert": (str(identity.cert), str(identity.key)), "verify": str(identity.ca),
            "timeout": 10}


def assert_refused_403(url: str, nameless, caplog, server_name: str) -> None:
    answer = requests.get(url, **https_args(nameless))
    assert (answer.status_code, answer.json()) == (403, {"error": "Forbidden",
                                                          "errorMessage": NAMELESS})
    pattern = re.compile(rf"{re.escape(server_name)}: refused 127\.0\.0\.1:\d+ with 403: "
                         + re.escape(NAMELESS))
    assert any(pattern.fullmatch(m) for m in caplog.messages), caplog.messages


def test_the_ui_refuses_a_certificate_without_a_common_name(ca, make_zk, zk_server, zk_root,
                                                           caplog):
    caplog.set_level(logging.INFO, logger="nimbus.web.gate")
    state = StormClusterState(make_zk(), zk_root)
    state.setup()
    write_cluster(state)
    ui = UIServer(conf_for(zk_server, zk_root, **ca.issue("ui").conf()), zk=make_zk(),
                  port=0, host="127.0.0.1").start()
    try:
        url = f"{ui.url}/api/v1/cluster/summary"
        nameless = ca.issue("nameless", USER, with_common_name=False)
        assert_refused_403(url, nameless, caplog, "ui-http")
        assert requests.get(url, **https_args(ca.issue("bob", USER))).status_code == 200
    finally:
        ui.stop()


def test_metrics_refuse_a_certificate_without_a_common_name(ca, caplog):
    caplog.set_level(logging.INFO, logger="nimbus.web.gate")
    server = MetricsServer(SupervisorMetrics(list, dict).registry, "127.0.0.1", 0,
                           "test-metrics", conf=conf_of(ca.issue("supervisor-1")))
    server.start()
    try:
        nameless = ca.issue("nameless", USER, with_common_name=False)
        assert_refused_403(server.url, nameless, caplog, f"test-metrics-{server.port}")
        scrape = requests.get(server.url, **https_args(ca.issue("prometheus", USER)))
        assert scrape.status_code == 200 and "supervisor_workers 0.0" in scrape.text
    finally:
        server.stop()


# -- Issue 28: one security object per process, passed, never global -----------------------
SIMPLE_ACL = "org.apache.storm.security.auth.authorizer.SimpleACLAuthorizer"


def test_each_client_presents_the_certificate_it_was_given(ca, thrift_servers, tmp_path):
    """A process may act as several identities: each client presents the certificate of
    its own configuration or security, whatever other clients were made since (a
    process-wide setting made the last one win)."""
    server, fake = thrift_servers(server_context(conf_of(ca.issue("nimbus-1"))))
    address = f"127.0.0.1:{server.port}"
    seeds = {"nimbus.seeds": [address]}
    as_alice = NimbusClient(conf_of(ca.issue("alice", USER), **seeds), deadline_s=5)
    as_bob = NimbusClient(conf_of(ca.issue("bob", USER), **seeds), deadline_s=5)
    for client in (as_alice, as_bob, as_alice):
        client.cluster_info()
    # A root binds fetch_file with its process's security (DistributorContext, the
    # supervisor's code fetches).
    fetch = file_fetcher(security_of(ca.issue("supervisor-1")))
    fetch(address, "t-1/stormconf.json", tmp_path / "stormconf.json")
    with connect(address, security=security_of(ca.issue("carol", USER))) as client:
        client.getClusterInfo()
    assert [who for call, who in fake.calls if call in ("getClusterInfo",
                                                        "beginFileDownload")] == [
        "alice", "bob", "alice", "supervisor-1", "carol"]
    # Without a security a connection is plain TCP, which a TLS port does not answer.
    with pytest.raises(CONNECTION_ERRORS):
        with connect(address, timeout_s=DROP_TIMEOUT_S) as client:
            client.getClusterInfo()
    assert len(fake.calls) == 9, "the plain connection reached no method"


def test_a_configurations_security_is_made_once_and_again_when_its_files_change(ca):
    conf = conf_of(ca.issue("alice", USER))
    first = ClusterSecurity.for_client(conf)
    assert first.tls and first.client_context is not None and first.authorizer is None
    assert ClusterSecurity.for_client(conf_of(ca.issue("alice", USER))) is not first, \
        "new files at the same paths are read again"
    again = ClusterSecurity.for_client(conf)
    assert ClusterSecurity.for_client(load_config(overrides=dict(conf.items()))) is again
    assert NimbusClient(conf).security is again
    plain = ClusterSecurity.for_client(load_config(overrides={}))
    assert (plain.tls, plain.client_context, plain.server_context()) == (False, None, None)


def test_a_daemons_security_has_its_authorizer_and_one_server_context(ca):
    conf = conf_of(ca.issue("nimbus-1"), **{"nimbus.authorizer": SIMPLE_ACL,
                                            "nimbus.admins": ["ops"]})
    daemon = ClusterSecurity.for_daemon(conf)
    assert daemon.client_context is ClusterSecurity.for_client(conf).client_context
    assert daemon.authorizer is not None and daemon.authorizer.is_admin("ops")
    assert ClusterSecurity.for_client(conf).authorizer is None, "a client authorizes nobody"
    served = daemon.server_context()
    assert served is not None and daemon.server_context() is served, \
        "every server of the process shares it"
    # A user's certificate: a daemon that serves nothing needs no server role; the first
    # server it binds fails as it always did.
    user = conf_of(ca.issue("alice", USER))
    lazy = ClusterSecurity.for_daemon(user)
    with pytest.raises(ConfigError, match="is not marked for servers"):
        lazy.server_context()
    with pytest.raises(ConfigError, match="is not marked for servers"):
        ClusterSecurity.for_daemon(user, serves=True)


def test_the_cli_names_pem_files_it_cannot_load(ca, tmp_path):
    """The command's security is made when its configuration is loaded: unusable PEM
    files fail the command there, with the error they always had."""
    from click.testing import CliRunner

    from nimbus.cli import main

    alice = ca.issue("alice", USER)
    broken = tmp_path / "broken.key"
    broken.write_text("-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
    broken.chmod(0o600)
    sets = [f"{key}={value}" for key, value in
            {**alice.conf(), "storm.thrift.tls.key.file": str(broken)}.items()]
    result = CliRunner().invoke(main, ["leader", *(a for s in sets for a in ("--set", s))])
    assert result.exit_code == 1
    assert result.output.startswith("Error: storm.thrift.tls: "), result.output
    missing = CliRunner().invoke(main, ["leader", "--set", "storm.thrift.transport=tls"])
    assert missing.exit_code == 1
    assert "Error: storm.thrift.tls.ca.file must name a PEM file when " \
           "storm.thrift.transport is tls (got None)" in missing.output
