"""The code stream: a file of topology code sent raw, beside the Thrift control path.

Storm's ``downloadChunk`` moves a file in request/reply steps: every chunk is read,
serialised into a Thrift frame, decoded and copied again on the other side, and the two
sides take turns. That caps a download well below what loopback or a network allows. So
a download session that ``beginFileDownload`` opened (with whatever authentication the
Thrift port demands) can instead be drained over a second connection to the same port:

* the client connects (over TLS with its certificate when the port uses TLS), and sends
  :data:`MAGIC` followed by the 36-character session id;
* the nimbus answers one status byte. :data:`OK` is followed by the number of bytes
  that remain in the file (8 bytes, big-endian) and then exactly those bytes, sent with
  ``sendfile`` where the socket allows it; :data:`REFUSED` is followed by a 2-byte length
  and a UTF-8 reason (an unknown or finished session);
* the session is then finished and the connection closed.

:data:`MAGIC` read as a Thrift frame length is 1,313,362,737 bytes, a frame no nimbus
accepts (``nimbus.thrift.max_buffer_size`` is capped below it). A server that does not
know the code stream (an older nimbus-ha) drops the connection without a byte, and the
client then falls back to ``downloadChunk`` on the same session, which the attempt left
untouched.

The receiving side writes and hashes as the bytes arrive (:func:`receive_to_file`), so
the copy is verified without reading it again.
"""

from __future__ import annotations

import hashlib
import socket
import struct
import time
from pathlib import Path
from typing import Protocol

MAGIC = b"NHS1"
SESSION_ID_BYTES = 36  # str(uuid.uuid4())
OK, REFUSED = 0, 1
_SIZE = struct.Struct("!Q")
_REASON = struct.Struct("!H")
RECEIVE_BLOCK = 1 << 20
# The largest MAGIC-free frame: nimbus.thrift.max_buffer_size must stay below this.
MAX_FRAME_BYTES = struct.unpack("!i", MAGIC)[0] - 1


class StreamRefusedError(ValueError):
    """The nimbus refused the stream (unknown or finished download session)."""


class StreamUnsupportedError(ConnectionError):
    """The peer closed the connection without answering: it has no code stream."""


class DownloadSource(Protocol):
    """What serves a stream: ``FileTransfers.stream_download``."""

    def stream_download(self, session_id: str, conn: socket.socket,
                        announce: object) -> int: ...


def receive_to_file(sock: socket.socket, dest: Path, size: int) -> str:
    """Read exactly ``size`` bytes from ``sock`` into ``dest``, hashing them as they
    arrive; returns their sha256. Raises ``ConnectionError`` if the peer stops early."""
    digest = hashlib.sha256()
    buf = bytearray(RECEIVE_BLOCK)
    view = memoryview(buf)
    remaining = size
    with open(dest, "wb") as out:
        while remaining:
            n = sock.recv_into(view, min(RECEIVE_BLOCK, remaining))
            if not n:
                raise ConnectionError(f"peer closed the stream with {remaining} of "
                                      f"{size} bytes still to come")
            out.write(view[:n])
            digest.update(view[:n])  # hashlib releases the GIL for blocks this size
            remaining -= n
    return digest.hexdigest()


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError(f"connection closed after {len(data)} of {size} bytes")
        data += chunk
    return data


# -- the nimbus's side -----------------------------------------------------------------------
def serve(conn: socket.socket, source: DownloadSource, deadline: float) -> None:
    """Serve one stream request whose :data:`MAGIC` was already read from ``conn``.

    The session id must arrive by ``deadline`` (time.monotonic()). Raises on a broken
    connection; a refused request is answered and returns normally.
    """
    conn.settimeout(max(0.001, deadline - time.monotonic()))
    session_id = _recv_exactly(conn, SESSION_ID_BYTES).decode("ascii", "replace")

    def announce(size: int) -> None:
        conn.sendall(bytes([OK]) + _SIZE.pack(size))

    try:
        source.stream_download(session_id, conn, announce)
    except ValueError as exc:  # TransferError: unknown session, finished, ...
        reason = str(exc).encode("utf-8")[:1024]
        conn.sendall(bytes([REFUSED]) + _REASON.pack(len(reason)) + reason)


# -- the client's side -----------------------------------------------------------------------
def receive(sock: socket.socket, session_id: str, dest: Path) -> str:
    """Ask for the rest of download ``session_id`` on the connected ``sock`` and write it
    to ``dest``; returns the sha256 of what was written.

    Raises :class:`StreamUnsupportedError` when the peer closes or resets the
    connection before a status byte (no code stream there: the session is untouched),
    :class:`StreamRefusedError` when it refuses, ``ConnectionError`` when the stream
    breaks off.
    """
    try:
        sock.sendall(MAGIC + session_id.encode("ascii"))
        status = sock.recv(1)
    except (ConnectionResetError, BrokenPipeError) as exc:
        # A server without the code stream drops the "oversized frame" and may reset.
        raise StreamUnsupportedError(f"the nimbus dropped the connection ({exc}): "
                                     "no code stream") from None
    if not status:
        raise StreamUnsupportedError("the nimbus closed the connection: no code stream")
    if status[0] == REFUSED:
        (length,) = _REASON.unpack(_recv_exactly(sock, _REASON.size))
        raise StreamRefusedError(_recv_exactly(sock, length).decode("utf-8", "replace"))
    if status[0] != OK:
        raise ConnectionError(f"unexpected code stream status {status[0]}")
    (size,) = _SIZE.unpack(_recv_exactly(sock, _SIZE.size))
    return receive_to_file(sock, dest, size)
