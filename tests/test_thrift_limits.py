"""The Thrift server's limits, from a raw socket: frame size, bad bytes, idle peers, the
connection cap; and the bind address kept apart from the advertised one."""

from __future__ import annotations

import logging
import random
import socket
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
    send_then_end,
)
from thriftpy2.thrift import TMessageType
from waiting import wait_for

from nimbus.config import load_config
from nimbus.daemons.nimbus import NimbusDaemon
from nimbus.dev.zookeeper import free_port
from nimbus.state.cluster_state import StormClusterState
from nimbus.thrift import storm
from nimbus.thrift.client import CHUNK_BYTES, connect
from nimbus.thrift.server import ThriftServer

MAX_FRAME = 600 * 1024


class Handler:
    def __init__(self) -> None:
        self.chunks: list[int] = []

    def getClusterInfo(self) -> storm.ClusterSummary:
        return storm.ClusterSummary(supervisors=[], nimbus_uptime_secs=7, topologies=[],
                                    nimbuses=[])

    def uploadChunk(self, location: str, chunk: bytes) -> None:
        self.chunks.append(len(chunk))


@pytest.fixture
def make_server():
    servers: list[ThriftServer] = []

    def make(**limits) -> tuple[ThriftServer, Handler]:
        handler = Handler()
        server = ThriftServer(handler, "127.0.0.1", 0, **limits)
        server.start()
        servers.append(server)
        return server, handler

    yield make
    for server in servers:
        server.stop()
    assert [t.name for t in threading.enumerate() if t.name.startswith("thrift-")] == []






CLUSTER_INFO_REQUEST = cluster_info_request()


def raw(server: ThriftServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=DROP_TIMEOUT_S)
    return sock










def assert_serves(server: ThriftServer) -> None:
    with connect(f"127.0.0.1:{server.port}", timeout_s=DROP_TIMEOUT_S) as client:
        assert client.getClusterInfo().nimbus_uptime_secs == 7


def wait_idle(server: ThriftServer) -> None:
    wait_for(lambda: server.active_connections == 0, DROP_TIMEOUT_S, "no connection served")


@pytest.mark.parametrize("length", [MAX_FRAME + 1, 2**31 - 1, 2**30, 0, -1, -(2**31)])
def test_out_of_bounds_frame_header_is_dropped_at_once(make_server, length):
    # Idle timeout far above the drop timeout: a drop in time means the header decided it.
    server, handler = make_server(max_frame_bytes=MAX_FRAME, idle_timeout_s=60)
    with raw(server) as sock:
        sock.sendall(struct.pack("!i", length))
        assert_dropped(sock)
    wait_idle(server)
    assert_serves(server)
    assert handler.chunks == []


def test_two_gib_header_followed_by_zeros_is_refused_early(make_server):
    server, _ = make_server(max_frame_bytes=MAX_FRAME)
    total = 64 * 1024 * 1024
    sent = 0
    with raw(server) as sock:
        sock.sendall(struct.pack("!I", 2**31))  # the 2 GiB header (-2**31 as int32)
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            while sent < total:
                sent += sock.send(bytes(1024 * 1024))
    assert sent < total
    wait_idle(server)
    assert_serves(server)


def test_frame_of_exactly_the_limit_is_served_and_one_byte_more_is_not(make_server):
    server, handler = make_server(max_frame_bytes=MAX_FRAME)
    overhead = len(message("uploadChunk", storm.Nimbus.uploadChunk_args("loc", b"")))

    def upload(size: int) -> bytes:
        return framed(message("uploadChunk", storm.Nimbus.uploadChunk_args("loc", bytes(size))))

    with raw(server) as sock:
        request = upload(MAX_FRAME - overhead)
        assert len(request) == 4 + MAX_FRAME
        sock.sendall(request)
        assert read_reply(sock) == ("uploadChunk", TMessageType.REPLY)
        sock.sendall(upload(MAX_FRAME - overhead + 1))
        assert_dropped(sock)
    assert handler.chunks == [MAX_FRAME - overhead]


def test_default_limit_takes_the_clients_upload_chunks(make_server):
    server, handler = make_server()
    assert server.max_frame_bytes == 1048576
    with connect(f"127.0.0.1:{server.port}") as client:
        client.uploadChunk("a-location", bytes(CHUNK_BYTES))
    assert handler.chunks == [CHUNK_BYTES]


@pytest.mark.parametrize("seed", range(5))
def test_random_bytes_are_dropped(make_server, seed):
    server, _ = make_server(max_frame_bytes=MAX_FRAME, idle_timeout_s=60)
    noise = random.Random(seed).randbytes(64 * 1024)
    with raw(server) as sock:
        send_then_end(sock, noise)
        assert_dropped(sock)
    wait_idle(server)
    assert_serves(server)


@pytest.mark.parametrize("seed", range(5))
def test_random_bytes_in_a_valid_frame_are_dropped(make_server, seed):
    server, _ = make_server(max_frame_bytes=MAX_FRAME, idle_timeout_s=60)
    with raw(server) as sock:
        sock.sendall(framed(random.Random(seed).randbytes(1000)))
        assert_dropped(sock)
    assert_serves(server)


def test_request_claiming_more_than_its_frame_is_dropped_not_read_on(make_server):
    """A string length of 1 GiB inside a small frame: no reading on into later frames."""
    server, handler = make_server(max_frame_bytes=MAX_FRAME, idle_timeout_s=60)
    body = bytearray(message("uploadChunk", storm.Nimbus.uploadChunk_args("loc", b"xy")))
    # The chunk is the last field: type, id, 4-byte length, 2 bytes, then the stop byte.
    length_at = len(body) - 1 - 2 - 4
    assert struct.unpack("!i", body[length_at:length_at + 4]) == (2,)
    body[length_at:length_at + 4] = struct.pack("!i", 2**30)
    with raw(server) as sock:
        sock.sendall(framed(bytes(body)))
        assert_dropped(sock)
    assert handler.chunks == []


def test_half_frame_then_close_frees_the_connection(make_server):
    server, _ = make_server(max_frame_bytes=MAX_FRAME, idle_timeout_s=60)
    with raw(server) as sock:
        sock.sendall(struct.pack("!i", 1000) + bytes(500))
        wait_for(lambda: server.active_connections == 1, DROP_TIMEOUT_S, "the connection")
    wait_idle(server)
    assert_serves(server)


def test_half_frame_left_open_is_dropped_after_the_frame_timeout(make_server):
    server, _ = make_server(max_frame_bytes=MAX_FRAME, idle_timeout_s=60,
                            frame_timeout_s=0.5)
    with raw(server) as sock:
        started = time.monotonic()
        sock.sendall(struct.pack("!i", 1000) + bytes(500))
        assert_dropped(sock)
        assert time.monotonic() - started >= 0.5
    assert_serves(server)


def test_a_frame_trickled_byte_by_byte_is_dropped_at_the_frame_timeout(make_server):
    """Each byte comes well within the idle timeout, but the frame never completes in
    time: the connection is dropped instead of holding its thread for ever."""
    server, _ = make_server(max_frame_bytes=MAX_FRAME, idle_timeout_s=60,
                            frame_timeout_s=1.0)
    with raw(server) as sock:
        sock.sendall(struct.pack("!i", 1000))
        started = time.monotonic()
        wait_for(lambda: server.active_connections == 1, DROP_TIMEOUT_S, "the connection")
        dropped = False
        for _ in range(100):  # the slow peer: one byte every 0.1 s, 10 s at most
            try:
                sock.sendall(b"\0")
            except (BrokenPipeError, ConnectionResetError):
                dropped = True
                break
            if server.active_connections == 0:
                dropped = True
                break
            time.sleep(0.1)
        assert dropped, "the trickling peer kept its connection"
        assert 1.0 <= time.monotonic() - started < 5.0
    assert_serves(server)


def test_idle_connections_over_the_cap_hold_no_thread(make_server):
    """More idle connections than threads: a request behind them is answered at once,
    and no more threads than the cap ever run (tests/test_thrift_resources.py has the
    requests over the cap, which wait for a free thread)."""
    cap = 2
    server, _ = make_server(max_connections=cap, idle_timeout_s=60)

    def conn_threads() -> int:
        return sum(t.name.startswith("thrift-worker-") for t in threading.enumerate())

    idle = [raw(server) for _ in range(cap + 10)]
    waiting = raw(server)
    try:
        waiting.settimeout(2.0)
        waiting.sendall(CLUSTER_INFO_REQUEST)
        assert read_reply(waiting) == ("getClusterInfo", TMessageType.REPLY)
        assert server.open_connections == cap + 11
        assert conn_threads() <= cap
    finally:
        for sock in idle:
            sock.close()
        waiting.close()
    wait_idle(server)
    assert_serves(server)


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="nimbus.thrift.threads must be at least 1"):
        ThriftServer(Handler(), "127.0.0.1", 0, max_connections=0)
    with pytest.raises(ValueError, match="nimbus.thrift.max_buffer_size must be positive"):
        ThriftServer(Handler(), "127.0.0.1", 0, max_frame_bytes=0)


def test_loopback_bind_with_a_remote_advertised_host_warns(caplog):
    caplog.set_level(logging.WARNING, logger="nimbus.thrift.server")
    for advertised in ("localhost", "127.0.0.1"):
        ThriftServer(Handler(), "127.0.0.1", 0, advertised_host=advertised).stop()
    assert caplog.records == []
    ThriftServer(Handler(), "127.0.0.1", 0, advertised_host="nimbus-1.example.com").stop()
    assert [r.getMessage() for r in caplog.records] == [
        "nimbus.host nimbus-1.example.com is advertised, but the Thrift server binds "
        "127.0.0.1 only: other hosts cannot reach it (set nimbus.thrift.bind.address)"]


@pytest.mark.zookeeper
def test_daemon_binds_the_bind_address_and_advertises_nimbus_host(zk_server, zk_root,
                                                                   make_zk, tmp_path):
    """nimbus.host goes into ZooKeeper and redirects; the socket binds loopback."""
    port = free_port()
    conf = load_config(overrides={
        "storm.zookeeper.servers": ["127.0.0.1"], "storm.zookeeper.port": zk_server.port,
        "storm.zookeeper.root": zk_root, "storm.zookeeper.session.timeout": 4000,
        "nimbus.host": "localhost", "nimbus.thrift.bind.address": "127.0.0.1",
        "nimbus.thrift.port": port, "nimbus.seeds": [f"127.0.0.1:{port}"],
        "storm.local.dir": str(tmp_path / "local")})
    daemon = NimbusDaemon(conf)
    try:
        daemon.start()
        assert daemon.server.host == "127.0.0.1"
        assert daemon.server.bound_address == ("127.0.0.1", port)
        state = StormClusterState(make_zk(), zk_root)
        assert [(n.host, n.port) for n in state.nimbuses()] == [("localhost", port)]
        queue = wait_for(state.leader_queue, 30, "the leader lock node")
        assert [address for _, address in queue] == [f"localhost:{port}"]
        with connect(f"127.0.0.1:{port}") as client:
            summary = wait_for(lambda: [n for n in client.getClusterInfo().nimbuses
                                        if n.isLeader], 30, "the leader in the summary")
            assert [(n.host, n.port) for n in summary] == [("localhost", port)]
            assert (client.getLeader().host, client.getLeader().port) == ("localhost", port)
    finally:
        daemon.stop()
