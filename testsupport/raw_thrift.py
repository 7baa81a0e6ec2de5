"""A raw-socket Thrift peer for tests: frames what no Thrift client would send, and
checks how the server answered (or hung up).

Used by the server's own limit tests and by the multi-process hostile-peer test.
"""

from __future__ import annotations

import errno
import socket
import struct

from thriftpy2.protocol import TBinaryProtocol
from thriftpy2.thrift import TMessageType
from thriftpy2.transport import TMemoryBuffer

from nimbus.thrift import storm

DROP_TIMEOUT_S = 10.0


def message(name: str, args: object, seqid: int = 1) -> bytes:
    """A binary-protocol CALL of ``name`` with ``args`` (unframed)."""
    buf = TMemoryBuffer()
    proto = TBinaryProtocol(buf)
    proto.write_message_begin(name, TMessageType.CALL, seqid)
    proto.write_struct(args)
    proto.write_message_end()
    return buf.getvalue()


def framed(body: bytes) -> bytes:
    return struct.pack("!i", len(body)) + body


def cluster_info_request() -> bytes:
    """A complete, framed getClusterInfo call."""
    return framed(message("getClusterInfo", storm.Nimbus.getClusterInfo_args()))


def connect_raw(port: int, timeout_s: float = DROP_TIMEOUT_S) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout_s)


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        more = sock.recv(size - len(data))
        assert more, f"connection closed after {len(data)} of {size} bytes"
        data += more
    return data


def read_reply(sock: socket.socket) -> tuple[str, int]:
    """(method name, message type) of the next framed reply on ``sock``."""
    (size,) = struct.unpack("!i", recv_exactly(sock, 4))
    name, ttype, _ = TBinaryProtocol(TMemoryBuffer(recv_exactly(sock, size))) \
        .read_message_begin()
    return name, ttype


def send_then_end(sock: socket.socket, data: bytes) -> None:
    """Send ``data`` and end the stream; the server may hang up half-way (that is a drop)."""
    try:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
    except OSError as exc:
        assert exc.errno in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN), exc


def assert_dropped(sock: socket.socket, timeout_s: float = DROP_TIMEOUT_S) -> None:
    """The server closed ``sock`` without answering (TimeoutError if it did not)."""
    sock.settimeout(timeout_s)
    try:
        data = sock.recv(1)
    except ConnectionResetError:
        return
    assert data == b"", f"the server answered {data!r} instead of dropping the connection"
