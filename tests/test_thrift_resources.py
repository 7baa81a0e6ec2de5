"""Resources of the Thrift port that one client must not be able to take from the others
(issue 19): connection threads (T3.3), submissions that wait for replication (X3), and
upload and download sessions (X1, X2).

Each test reproduces what a hostile user did, then checks that everyone else is still
served. The daemon tests run a real nimbus (in this process) on a real ZooKeeper.
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
import threading
import time

import pytest
from raw_thrift import (
    DROP_TIMEOUT_S,
    assert_dropped,
    cluster_info_request,
    framed,
    message,
    read_reply,
)
from thriftpy2.thrift import TMessageType
from tls_certs import CertificateAuthority
from waiting import wait_for

from nimbus.cluster_security import ClusterSecurity
from nimbus.config import ConfigError, load_config
from nimbus.dev.zookeeper import free_port
from nimbus.distribution import file_transfer
from nimbus.distribution.archive import pack_directory
from nimbus.distribution.file_transfer import FileTransfers, TransferError
from nimbus.distribution.local_code import LocalCodeStore
from nimbus.thrift import storm
from nimbus.thrift.server import ThriftServer, client_gone, current_client
from nimbus.thrift.tls import client_context, server_context

CLUSTER_INFO_REQUEST = cluster_info_request()
# More silent peers than Storm's default nimbus.thrift.threads (64), as in the finding.
SILENT_PEERS = 80
# "Promptly": far below any timeout that would free a thread held by a silent peer.
PROMPT_S = 2.0
SIMPLE_ACL = "org.apache.storm.security.auth.authorizer.SimpleACLAuthorizer"


class Handler:
    """Records who called and whether the client was gone while a call waited."""

    def __init__(self) -> None:
        self.callers: list[str] = []
        self.gate = threading.Event()
        self.waiting = threading.Semaphore(0)
        self.saw_gone: list[bool] = []

    def getClusterInfo(self) -> storm.ClusterSummary:
        self.callers.append(current_client())
        return storm.ClusterSummary(supervisors=[], nimbus_uptime_secs=7, topologies=[],
                                    nimbuses=[])

    def beginFileUpload(self) -> str:
        """Blocks until the gate opens (a call that takes long, like a submit)."""
        self.waiting.release()
        if not self.gate.wait(DROP_TIMEOUT_S):
            raise RuntimeError("the gate never opened")
        return "done"

    def getLeader(self) -> storm.NimbusSummary:
        """Waits until its client hangs up, as a submission waits for replication."""
        self.waiting.release()
        deadline = time.monotonic() + DROP_TIMEOUT_S
        while time.monotonic() < deadline:
            if client_gone():
                self.saw_gone.append(True)
                raise RuntimeError("the client went away")
            time.sleep(0.05)
        self.saw_gone.append(False)
        return storm.NimbusSummary(host="h", port=1, uptime_secs=0, isLeader=True)


def thrift_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("thrift-")]


@pytest.fixture
def ca(tmp_path):
    return CertificateAuthority(tmp_path / "ca")


@pytest.fixture
def make_server():
    servers: list[ThriftServer] = []

    def make(**kwargs) -> tuple[ThriftServer, Handler]:
        handler = Handler()
        server = ThriftServer(handler, "127.0.0.1", 0, **kwargs)
        server.start()
        servers.append(server)
        return server, handler

    yield make
    for server in servers:
        server.stop()
    assert thrift_threads() == [], "every thread of the server is joined on stop"


def raw(server: ThriftServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=DROP_TIMEOUT_S)


def tls_raw(server: ThriftServer, identity) -> ssl.SSLSocket:
    context = client_context(load_config(overrides=identity.conf()))
    return context.wrap_socket(raw(server), server_hostname="127.0.0.1")


def call_promptly(sock: socket.socket) -> float:
    """Send getClusterInfo on ``sock``; the seconds its reply took (TimeoutError if it
    took more than PROMPT_S)."""
    started = time.monotonic()
    sock.settimeout(PROMPT_S)
    sock.sendall(CLUSTER_INFO_REQUEST)
    assert read_reply(sock) == ("getClusterInfo", TMessageType.REPLY)
    return time.monotonic() - started


def close_all(socks: list[socket.socket]) -> None:
    for sock in socks:
        sock.close()


# -- T3.3: silent peers hold no thread ----------------------------------------------------------
def test_silent_peers_hold_no_thread_and_a_call_is_answered_at_once(make_server):
    server, handler = make_server()  # nimbus.thrift.threads: 64, Storm's default
    silent = [raw(server) for _ in range(SILENT_PEERS)]
    try:
        with raw(server) as sock:
            assert call_promptly(sock) < PROMPT_S
            assert server.open_connections == SILENT_PEERS + 1
        assert handler.callers == ["127.0.0.1"]
        wait_for(lambda: server.active_connections == 0, DROP_TIMEOUT_S, "the worker free")
        assert len([n for n in thrift_threads() if n.startswith("thrift-worker-")]) == 1
    finally:
        close_all(silent)
    wait_for(lambda: server.open_connections == 0, DROP_TIMEOUT_S, "the peers gone")


def test_silent_tls_peers_hold_no_thread(make_server, ca):
    server, handler = make_server(ssl_context=server_context(load_config(
        overrides=ca.issue("nimbus-1").conf())))
    silent = [raw(server) for _ in range(SILENT_PEERS)]
    # Half a TLS record header: a handshake that starts and then stalls.
    for sock in silent[:16]:
        sock.sendall(b"\x16\x03\x01")
    try:
        with tls_raw(server, ca.issue("alice")) as sock:
            assert call_promptly(sock) < PROMPT_S
        assert handler.callers == ["alice"], "with TLS the caller is its certificate's name"
    finally:
        close_all(silent)


@pytest.mark.parametrize("sent", [b"", b"\x00", b"\x00\x00\x00"])
def test_a_new_connection_must_send_its_first_frame_header_within_the_handshake_timeout(
        make_server, sent):
    server, _ = make_server(handshake_timeout_s=0.5, idle_timeout_s=60)
    # Before connecting: the server's clock starts when it accepts, which may come
    # before the client's connect call returns.
    started = time.monotonic()
    with raw(server) as sock:
        sock.sendall(sent)
        assert_dropped(sock)
        assert 0.5 <= time.monotonic() - started < 0.5 + PROMPT_S
    assert server.active_connections == 0


def test_a_tls_handshake_must_complete_within_the_handshake_timeout(make_server, ca):
    server, _ = make_server(handshake_timeout_s=0.5, ssl_context=server_context(
        load_config(overrides=ca.issue("nimbus-1").conf())))
    for sent in (b"", b"\x16\x03\x01"):
        started = time.monotonic()  # before connecting (see above)
        with raw(server) as sock:
            sock.sendall(sent)
            assert_dropped(sock)
            assert 0.5 <= time.monotonic() - started < 0.5 + PROMPT_S
    # A handshake that completes, then nothing: dropped all the same.
    alice = ca.issue("alice")
    started = time.monotonic()
    with tls_raw(server, alice) as sock:
        assert_dropped(sock)
        assert 0.5 <= time.monotonic() - started < 0.5 + PROMPT_S


def test_the_first_frame_must_arrive_within_the_handshake_timeout(make_server):
    server, _ = make_server(handshake_timeout_s=0.5, idle_timeout_s=60)
    with raw(server) as sock:
        sock.sendall(struct.pack("!i", 1000) + bytes(10))  # a header, then a stall
        started = time.monotonic()
        wait_for(lambda: server.active_connections == 1, DROP_TIMEOUT_S, "the frame read")
        assert_dropped(sock)
        assert time.monotonic() - started < 0.5 + PROMPT_S
    wait_for(lambda: server.active_connections == 0, DROP_TIMEOUT_S, "the worker free")


def test_a_peer_idle_after_a_call_holds_no_thread(make_server):
    server, _ = make_server(max_connections=1, idle_timeout_s=60)
    with raw(server) as idle, raw(server) as other:
        call_promptly(idle)  # then it keeps its connection and says nothing
        assert call_promptly(other) < PROMPT_S
        assert call_promptly(idle) < PROMPT_S, "an idle connection is served again"
        assert [n for n in thrift_threads() if n.startswith("thrift-worker-")] == [
            f"thrift-worker-{server.port}-1"]


def test_connections_per_address_are_limited(make_server, caplog):
    server, _ = make_server(max_connections_per_address=3, idle_timeout_s=60)
    kept = [raw(server) for _ in range(3)]
    try:
        wait_for(lambda: server.open_connections == 3, DROP_TIMEOUT_S, "three accepted")
        with raw(server) as refused:
            assert_dropped(refused, timeout_s=PROMPT_S)
        assert server.open_connections == 3
        assert call_promptly(kept[0]) < PROMPT_S
        kept.pop().close()
        wait_for(lambda: server.open_connections == 2, DROP_TIMEOUT_S, "one closed")
        with raw(server) as admitted:
            assert call_promptly(admitted) < PROMPT_S
    finally:
        close_all(kept)
    assert ("refused a Thrift connection from 127.0.0.1: it has 3 open, "
            "the most one address may have") in caplog.text


def test_at_the_open_connection_cap_the_oldest_waiting_peer_makes_room(make_server):
    server, _ = make_server(max_open_connections=8, idle_timeout_s=60)
    silent = [raw(server) for _ in range(8)]
    try:
        wait_for(lambda: server.open_connections == 8, DROP_TIMEOUT_S, "the cap reached")
        with raw(server) as sock:
            assert call_promptly(sock) < PROMPT_S
        assert_dropped(silent[0], timeout_s=PROMPT_S)
        assert server.open_connections <= 8
    finally:
        close_all(silent)


def test_calls_over_the_thread_cap_wait_for_a_free_thread(make_server):
    cap = 2
    server, handler = make_server(max_connections=cap, idle_timeout_s=60)
    busy = [raw(server) for _ in range(cap)]
    try:
        for sock in busy:
            sock.sendall(framed(message("beginFileUpload", storm.Nimbus.beginFileUpload_args())))
        for _ in range(cap):
            assert handler.waiting.acquire(timeout=DROP_TIMEOUT_S)
        assert server.active_connections == cap
        with raw(server) as queued:
            queued.sendall(CLUSTER_INFO_REQUEST)
            queued.settimeout(1.0)
            with pytest.raises(TimeoutError):
                queued.recv(1)  # every thread busy: it waits, neither served nor dropped
            assert len([n for n in thrift_threads() if n.startswith("thrift-worker-")]) == cap
            handler.gate.set()
            queued.settimeout(DROP_TIMEOUT_S)
            assert read_reply(queued) == ("getClusterInfo", TMessageType.REPLY)
        for sock in busy:
            sock.settimeout(DROP_TIMEOUT_S)
            assert read_reply(sock) == ("beginFileUpload", TMessageType.REPLY)
    finally:
        handler.gate.set()
        close_all(busy)


def test_a_call_sees_its_client_hang_up(make_server):
    server, handler = make_server(idle_timeout_s=60)
    sock = raw(server)
    sock.sendall(framed(message("getLeader", storm.Nimbus.getLeader_args())))
    assert handler.waiting.acquire(timeout=DROP_TIMEOUT_S)
    started = time.monotonic()
    sock.close()
    wait_for(lambda: handler.saw_gone, DROP_TIMEOUT_S, "the call to end")
    assert handler.saw_gone == [True]
    assert time.monotonic() - started < PROMPT_S
    wait_for(lambda: server.open_connections == 0, DROP_TIMEOUT_S, "the connection closed")


def test_server_limits_must_be_positive():
    for kwargs, text in (({"handshake_timeout_s": 0}, "nimbus.thrift.handshake.timeout.secs"),
                         ({"max_open_connections": 0}, "open connections"),
                         ({"max_connections_per_address": 0}, "connections per address")):
        with pytest.raises(ValueError, match=text):
            ThriftServer(Handler(), "127.0.0.1", 0, **kwargs)


# -- X1, X2: upload and download sessions are limited per client ---------------------------------
@pytest.fixture
def transfers(tmp_path):
    store = LocalCodeStore(tmp_path / "local")
    code = store.path("t-1-1")
    code.mkdir(parents=True)
    (code / "stormjar.jar").write_bytes(b"j" * 100)
    found = FileTransfers(tmp_path / "local", store, 1 << 20)
    yield found
    found.close()


def test_one_client_cannot_take_every_upload_session(transfers):
    limit = file_transfer.MAX_UPLOADS_PER_CLIENT
    bobs = [transfers.begin_upload("bob") for _ in range(limit)]
    with pytest.raises(TransferError) as refused:
        transfers.begin_upload("bob")
    assert str(refused.value) == (
        f"bob has {limit} uploads in progress, the most one client may have; finish or "
        f"abandon one (an upload idle for 60 s is dropped) and retry")
    assert len(list(transfers.inbox.iterdir())) == limit, "the refusal left no file"
    alices = transfers.begin_upload("alice")
    transfers.upload_chunk(alices, b"a")
    transfers.finish_upload(alices)
    transfers.upload_chunk(bobs[0], b"b")  # bob's own sessions still work


def test_one_client_cannot_take_every_download_session(transfers):
    limit = file_transfer.MAX_DOWNLOADS_PER_CLIENT
    for _ in range(limit):
        transfers.begin_download("t-1-1/stormjar.jar", "bob")
    with pytest.raises(TransferError) as refused:
        transfers.begin_download("t-1-1/stormjar.jar", "bob")
    assert str(refused.value) == (
        f"bob has {limit} downloads in progress, the most one client may have; finish or "
        f"abandon one (a download idle for 60 s is dropped) and retry")
    session = transfers.begin_download("t-1-1/stormjar.jar", "alice")
    assert transfers.download_chunk(session) == b"j" * 100


def test_all_clients_together_are_still_bounded(transfers, monkeypatch):
    monkeypatch.setattr(file_transfer, "MAX_UPLOADS", 3)
    for who in ("a", "b", "c"):
        transfers.begin_upload(who)
    with pytest.raises(TransferError) as refused:
        transfers.begin_upload("d")
    assert str(refused.value) == ("too many uploads in progress on this nimbus (3, the "
                                  "limit of all clients together); retry later")


def test_idle_sessions_expire_after_a_minute(transfers, monkeypatch):
    assert file_transfer.IDLE_EXPIRY_S == 60.0
    limit = file_transfer.MAX_UPLOADS_PER_CLIENT
    bobs = [transfers.begin_upload("bob") for _ in range(limit)]
    download = transfers.begin_download("t-1-1/stormjar.jar", "bob")
    monkeypatch.setattr(file_transfer, "IDLE_EXPIRY_S", 0.2)
    wait_for(lambda: transfers.begin_upload("bob"), DROP_TIMEOUT_S, "a slot after expiry")
    monkeypatch.setattr(file_transfer, "IDLE_EXPIRY_S", 60.0)  # the new one stays
    for location in bobs:
        with pytest.raises(TransferError, match="no open upload"):
            transfers.upload_chunk(location, b"late")
    with pytest.raises(TransferError, match="no open download"):
        transfers.download_chunk(download)
    assert len(list(transfers.inbox.iterdir())) == 1, "expired uploads left no file"


# -- the nimbus: per-user sessions over TLS, submissions whose client hangs up -------------------
@pytest.fixture
def make_nimbus(zk_server, zk_root, tmp_path):
    from nimbus.daemons.nimbus import NimbusDaemon

    daemons = []

    def make(**overrides):
        port = free_port()
        host, _, zk_port = zk_server.hosts.rpartition(":")
        conf = load_config(overrides={
            "storm.zookeeper.servers": [host], "storm.zookeeper.port": int(zk_port),
            "storm.zookeeper.root": zk_root, "storm.zookeeper.session.timeout": 4000,
            "nimbus.thrift.port": port, "nimbus.seeds": [f"127.0.0.1:{port}"],
            "storm.local.dir": str(tmp_path / f"local-{port}"), **overrides})
        daemon = NimbusDaemon(conf)
        daemons.append(daemon)
        daemon.start()
        wait_for(daemon.master.elector.is_leader, 20, "the nimbus to lead")
        return daemon

    yield make
    for daemon in daemons:
        daemon.stop()


@pytest.fixture
def topology_bundle(tmp_path) -> bytes:
    directory = tmp_path / "topology"
    directory.mkdir()
    (directory / "topology.yaml").write_text('command: ["sleep", "3600"]\n')
    return pack_directory(directory)


def connect_as(daemon, identity):
    """A Thrift client of ``daemon`` presenting ``identity``'s certificate."""
    from nimbus.thrift.client import connect

    return connect(daemon.conf["nimbus.seeds"][0], timeout_s=DROP_TIMEOUT_S,
                   security=ClusterSecurity.for_client(load_config(overrides=identity.conf())))


def begin_until_refused(begin, most: int) -> tuple[int, str]:
    """Call ``begin`` until AuthorizationException (at most ``most`` times): (how many
    succeeded, the refusal's message)."""
    for opened in range(most):
        try:
            begin()
        except storm.AuthorizationException as exc:
            return opened, exc.msg
    return most, ""


def submit_as(daemon, identity, name: str, data: bytes) -> str:
    """Submit topology ``name`` as ``identity``; its id."""
    with connect_as(daemon, identity) as client:
        location = client.beginFileUpload()
        client.uploadChunk(location, data)
        client.finishFileUpload(location)
        client.submitTopology(name, location, "{}", storm.StormTopology(
            spouts={}, bolts={}, state_spouts={}))
        return [t.id for t in client.getClusterInfo().topologies if t.name == name][0]


@pytest.mark.zookeeper
def test_bob_cannot_block_alices_uploads_or_downloads(make_nimbus, ca, topology_bundle):
    tls = ca.issue("nimbus-1").conf()
    daemon = make_nimbus(**tls, **{"nimbus.authorizer": SIMPLE_ACL, "nimbus.admins": ["ops"]})
    alice, bob = ca.issue("alice"), ca.issue("bob")
    alices_jar = f"{submit_as(daemon, alice, 'alices', topology_bundle)}/stormjar.jar"
    bobs_jar = f"{submit_as(daemon, bob, 'bobs', topology_bundle)}/stormjar.jar"
    # bob opens sessions until he is refused (at most the limits of all clients together).
    with connect_as(daemon, bob) as as_bob:
        uploads, upload_refusal = begin_until_refused(as_bob.beginFileUpload,
                                                      file_transfer.MAX_UPLOADS)
        downloads, download_refusal = begin_until_refused(
            lambda: as_bob.beginFileDownload(bobs_jar), file_transfer.MAX_DOWNLOADS)
        # ... and alice still uploads and downloads.
        with connect_as(daemon, alice) as as_alice:
            assert as_alice.beginFileUpload().startswith(str(daemon.transfers.inbox))
            session = as_alice.beginFileDownload(alices_jar)
            assert as_alice.downloadChunk(session) == topology_bundle
    assert (uploads, downloads) == (8, 64)
    assert upload_refusal == ("bob has 8 uploads in progress, the most one client may have; "
                              "finish or abandon one (an upload idle for 60 s is dropped) "
                              "and retry")
    assert download_refusal == ("bob has 64 downloads in progress, the most one client may "
                                "have; finish or abandon one (a download idle for 60 s is "
                                "dropped) and retry")


def upload(daemon, data: bytes) -> str:
    from nimbus.thrift.client import connect

    with connect(daemon.conf["nimbus.seeds"][0]) as client:
        location = client.beginFileUpload()
        client.uploadChunk(location, data)
        client.finishFileUpload(location)
    return location


def submit_request(name: str, location: str, topo_conf: dict) -> bytes:
    return framed(message("submitTopology", storm.Nimbus.submitTopology_args(
        name=name, uploadedJarLocation=location, jsonConf=json.dumps(topo_conf),
        topology=storm.StormTopology(spouts={}, bolts={}, state_spouts={}))))


def nothing_left_of_submissions(daemon) -> bool:
    master = daemon.master
    return (master.lifecycle.pending_ids() == set() and master.state.code_topologies() == []
            and master.state.active_storms() == [] and master.store.topologies() == set()
            and list(daemon.transfers.inbox.iterdir()) == [])


WAIT_FOREVER = {"topology.min.replication.count": 99,
                "topology.max.replication.wait.time.sec": -1}


@pytest.mark.zookeeper
def test_submissions_whose_clients_hang_up_stop_waiting(make_nimbus, topology_bundle):
    daemon = make_nimbus()
    waiting = 16
    port = daemon.conf["nimbus.thrift.port"]
    socks = []
    try:
        for i in range(waiting):
            location = upload(daemon, topology_bundle)
            sock = socket.create_connection(("127.0.0.1", port), timeout=DROP_TIMEOUT_S)
            socks.append(sock)
            sock.sendall(submit_request(f"waiter-{i}", location, WAIT_FOREVER))
        # A submission is pending from its name check on, and creates its code node a
        # moment later (after staging its copy): wait for both.
        wait_for(lambda: len(daemon.master.lifecycle.pending_ids()) == waiting and
                 len(daemon.master.state.code_topologies()) == waiting, DROP_TIMEOUT_S,
                 "every submission waiting for replicas, its code node created")
    finally:
        close_all(socks)
    wait_for(lambda: nothing_left_of_submissions(daemon), DROP_TIMEOUT_S,
             "the abandoned submissions to leave nothing behind")
    wait_for(lambda: daemon.server.active_connections == 0, DROP_TIMEOUT_S, "threads free")
    assert daemon.master.elector.is_leader()


@pytest.mark.zookeeper
def test_the_replication_wait_is_capped_cluster_wide(make_nimbus, topology_bundle):
    from nimbus.thrift.client import NimbusClient

    daemon = make_nimbus(**{"nimbus.max.replication.wait.time.sec": 1})
    client = NimbusClient(daemon.conf, deadline_s=DROP_TIMEOUT_S)
    for name, wait in (("forever", -1), ("an-hour", 3600)):
        started = time.monotonic()
        client.submit(name, topology_bundle, {"topology.min.replication.count": 99,
                                              "topology.max.replication.wait.time.sec": wait})
        assert 1.0 <= time.monotonic() - started < 1.0 + PROMPT_S
    assert sorted((t.name, t.replication_count) for t in client.cluster_info().topologies) == [
        ("an-hour", 1), ("forever", 1)]


@pytest.mark.zookeeper
def test_a_replication_wait_below_minus_one_is_refused(make_nimbus, topology_bundle):
    from nimbus.thrift.client import connect

    daemon = make_nimbus()
    location = upload(daemon, topology_bundle)
    with connect(daemon.conf["nimbus.seeds"][0]) as client:
        with pytest.raises(storm.InvalidTopologyException) as refused:
            client.submitTopology("bad-wait", location, json.dumps(
                {"topology.max.replication.wait.time.sec": -2}),
                storm.StormTopology(spouts={}, bolts={}, state_spouts={}))
    assert refused.value.msg == ("topology conf: 'topology.max.replication.wait.time.sec' "
                                 "must be -1 (up to nimbus.max.replication.wait.time.sec) "
                                 "or 0 or more, got -2")
    assert nothing_left_of_submissions(daemon)


@pytest.mark.zookeeper
def test_a_topology_conf_is_checked_as_storm_yaml_is(make_nimbus, topology_bundle):
    """A known key of the wrong type is refused by the configuration loader's own check,
    naming the key, before anything is written; a topology's own keys pass."""
    from nimbus.thrift.client import connect

    daemon = make_nimbus()
    location = upload(daemon, topology_bundle)
    with connect(daemon.conf["nimbus.seeds"][0]) as client:
        with pytest.raises(storm.InvalidTopologyException) as refused:
            client.submitTopology("bad-stall", location, json.dumps(
                {"topology.stall.timeout.secs": "five minutes", "my.input.dir": "/in"}),
                storm.StormTopology(spouts={}, bolts={}, state_spouts={}))
    assert refused.value.msg == ("topology conf: key 'topology.stall.timeout.secs' must be "
                                 "an integer, got a string 'five minutes'")
    assert nothing_left_of_submissions(daemon)


@pytest.mark.parametrize(("overrides", "text"), [
    ({"nimbus.thrift.handshake.timeout.secs": 0},
     "key 'nimbus.thrift.handshake.timeout.secs' must be at least 1, got 0"),
    ({"nimbus.max.replication.wait.time.sec": -1},
     "key 'nimbus.max.replication.wait.time.sec' must be 0 or more, got -1"),
])
def test_bad_limits_in_the_configuration_are_named(overrides, text):
    with pytest.raises(ConfigError) as refused:
        load_config(overrides=overrides)
    assert str(refused.value) == text


def test_defaults_of_the_new_keys():
    conf = load_config(overrides={})
    assert conf["nimbus.thrift.handshake.timeout.secs"] == 5
    assert conf["nimbus.max.replication.wait.time.sec"] == 300
