"""The code stream beside the Thrift control path: a download session drained raw.

Against a real ThriftServer and FileTransfers on loopback: the stream delivers the exact
bytes with their sha256 and no downloadChunk call; it finishes its session; a server
without it is read with downloadChunk instead; unknown sessions are refused with the
reason; broken requests are dropped and the server goes on serving.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from pathlib import Path

import pytest
from raw_thrift import assert_dropped, connect_raw, send_then_end
from tls_certs import CertificateAuthority

from nimbus.cluster_security import ClusterSecurity
from nimbus.config import ConfigError, load_config
from nimbus.distribution import code_stream
from nimbus.distribution.file_transfer import DOWNLOAD_CHUNK_BYTES, FileTransfers, TransferError
from nimbus.distribution.local_code import LocalCodeStore
from nimbus.thrift.client import connect, fetch_file, file_fetcher
from nimbus.thrift.server import ThriftServer
from nimbus.thrift.tls import server_context

TOPOLOGY = "streamed-1-1"
SIZE = 5 * 1024 * 1024 + 123  # three chunks, the last one short


class CountingFileServer:
    """The Nimbus calls a code download uses, counting downloadChunk."""

    def __init__(self, transfers: FileTransfers):
        self.transfers = transfers
        self.chunk_calls = 0

    def beginFileDownload(self, file: str) -> str:
        return self.transfers.begin_download(file)

    def downloadChunk(self, id: str) -> bytes:  # noqa: A002 - Storm's argument name
        self.chunk_calls += 1
        return self.transfers.download_chunk(id)

    def getClusterInfo(self):
        from nimbus.thrift import storm
        return storm.ClusterSummary(supervisors=[], nimbus_uptime_secs=3, topologies=[],
                                    nimbuses=[])


@pytest.fixture
def serve(tmp_path):
    """serve(streams=True) -> (server, handler, sha256 of the served file)."""
    servers: list[ThriftServer] = []
    store = LocalCodeStore(tmp_path / "local")
    code = store.root / TOPOLOGY
    code.mkdir()
    data = os.urandom(SIZE)
    (code / "stormjar.jar").write_bytes(data)

    def make(streams: bool = True):
        transfers = FileTransfers(tmp_path / "local", store, 1 << 30)
        handler = CountingFileServer(transfers)
        server = ThriftServer(handler, "127.0.0.1", 0,
                              downloads=transfers if streams else None)
        server.start()
        servers.append(server)
        return server, handler, hashlib.sha256(data).hexdigest()

    yield make
    for server in servers:
        server.stop()
    assert [t.name for t in threading.enumerate() if t.name.startswith("thrift-")] == []


def test_stream_delivers_the_exact_bytes_without_a_chunk_call(serve, tmp_path):
    server, handler, digest = serve()
    dest = tmp_path / "copy.jar"
    got = fetch_file(f"127.0.0.1:{server.port}", f"{TOPOLOGY}/stormjar.jar", dest)
    assert got == digest
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == digest
    assert dest.stat().st_size == SIZE
    assert handler.chunk_calls == 0


def test_a_streamed_session_is_finished(serve, tmp_path):
    server, handler, _ = serve()
    with connect(f"127.0.0.1:{server.port}") as client:
        session = client.beginFileDownload(f"{TOPOLOGY}/stormjar.jar")
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            code_stream.receive(sock, session, tmp_path / "copy.jar")
        with pytest.raises(TransferError, match="no open download"):
            handler.transfers.download_chunk(session)
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock, \
                pytest.raises(code_stream.StreamRefusedError, match="no open download"):
            code_stream.receive(sock, session, tmp_path / "again.jar")


def test_stream_sends_what_the_chunks_left(serve, tmp_path):
    server, handler, _ = serve()
    source = (handler.transfers._store.root / TOPOLOGY / "stormjar.jar").read_bytes()
    with connect(f"127.0.0.1:{server.port}") as client:
        session = client.beginFileDownload(f"{TOPOLOGY}/stormjar.jar")
        first = client.downloadChunk(session)
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            rest_digest = code_stream.receive(sock, session, tmp_path / "rest.jar")
    assert len(first) == DOWNLOAD_CHUNK_BYTES
    assert (tmp_path / "rest.jar").read_bytes() == source[DOWNLOAD_CHUNK_BYTES:]
    assert rest_digest == hashlib.sha256(source[DOWNLOAD_CHUNK_BYTES:]).hexdigest()


def test_a_server_without_the_stream_is_read_with_chunks(serve, tmp_path):
    server, handler, digest = serve(streams=False)
    dest = tmp_path / "copy.jar"
    assert fetch_file(f"127.0.0.1:{server.port}", f"{TOPOLOGY}/stormjar.jar", dest) == digest
    # Three chunks with data, then the empty one that ends the download.
    assert handler.chunk_calls == 4


def test_an_unknown_session_is_refused_with_the_reason(serve):
    server, _, _ = serve()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock, \
            pytest.raises(code_stream.StreamRefusedError,
                          match="no open download 'not-a-session"):
        code_stream.receive(sock, "not-a-session-" + "x" * 22, Path(os.devnull))


@pytest.mark.parametrize("request_bytes", [
    code_stream.MAGIC,                      # the magic and then nothing
    code_stream.MAGIC + b"\xff" * 10,       # half a session id
])
def test_a_truncated_stream_request_is_dropped_and_the_server_goes_on(serve, request_bytes):
    server, _, _ = serve()
    sock = connect_raw(server.port)
    send_then_end(sock, request_bytes)
    assert_dropped(sock)
    with connect(f"127.0.0.1:{server.port}") as client:
        assert client.getClusterInfo().nimbus_uptime_secs == 3


def test_the_magic_is_no_stream_after_the_first_frame(serve, caplog):
    """Only a connection's first bytes can ask for a stream; later, MAGIC is an oversized
    frame header like any other."""
    server, _, _ = serve()
    with connect(f"127.0.0.1:{server.port}") as client:
        client.getClusterInfo()
        sock = client._iprot.trans.sock
        send_then_end(sock, code_stream.MAGIC + b"0" * code_stream.SESSION_ID_BYTES)
        assert_dropped(sock)
    assert "frame of 1313362737 bytes is over nimbus.thrift.max_buffer_size" in caplog.text


def test_max_buffer_size_stays_below_the_magic(tmp_path):
    conf = tmp_path / "storm.yaml"
    conf.write_text(f"nimbus.thrift.max_buffer_size: {code_stream.MAX_FRAME_BYTES + 1}\n")
    with pytest.raises(ConfigError, match="reserved for the code stream"):
        load_config(conf)
    with pytest.raises(ValueError, match="reserved for the code stream"):
        ThriftServer(object(), "127.0.0.1", 0, max_frame_bytes=code_stream.MAX_FRAME_BYTES + 1)


def test_over_tls_the_stream_needs_a_certificate_and_carries_the_code(serve, tmp_path):
    """With TLS on the port, the stream runs after the same handshake as every Thrift call:
    a client of the cluster's CA gets the code by stream; a plain client gets nothing."""
    ca = CertificateAuthority(tmp_path / "ca")
    server_conf = load_config(overrides=ca.issue("nimbus-1").conf())
    store = LocalCodeStore(tmp_path / "tls-local")
    (store.root / TOPOLOGY).mkdir()
    data = os.urandom(3 * 1024 * 1024)
    (store.root / TOPOLOGY / "stormjar.jar").write_bytes(data)
    transfers = FileTransfers(tmp_path / "tls-local", store, 1 << 30)
    handler = CountingFileServer(transfers)
    server = ThriftServer(handler, "127.0.0.1", 0, ssl_context=server_context(server_conf),
                          downloads=transfers)
    server.start()
    try:
        # As a peer's root binds it: fetch_file with the process's security.
        fetch = file_fetcher(ClusterSecurity.for_client(
            load_config(overrides=ca.issue("peer").conf())))
        dest = tmp_path / "copy.jar"
        got = fetch(f"127.0.0.1:{server.port}", f"{TOPOLOGY}/stormjar.jar", dest)
        assert got == hashlib.sha256(data).hexdigest()
        assert dest.read_bytes() == data
        assert handler.chunk_calls == 0
        plain = connect_raw(server.port)
        send_then_end(plain, code_stream.MAGIC + b"0" * code_stream.SESSION_ID_BYTES)
        assert_dropped(plain)
    finally:
        server.stop()
