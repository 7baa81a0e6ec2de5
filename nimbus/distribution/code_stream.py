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

**Uploads** go the other way on the same port. ``beginFileUpload`` opens the session over
Thrift (the leader check and the per-client limits apply); then:

* the client connects, sends :data:`UPLOAD_MAGIC`, a 2-byte length and the UTF-8 upload
  location ``beginFileUpload`` returned;
* the nimbus answers :data:`OK` (send) or :data:`REFUSED` with a reason;
* the client sends frames, each an 8-byte big-endian length and that many bytes (a file's
  bytes with ``sendfile``), and a frame of length 0 to end;
* the nimbus answers :data:`OK` with the number of bytes it kept, the upload then being
  finished (no ``finishFileUpload``), or :data:`REFUSED` with a reason. It may refuse
  before the end (too large, an unsafe entry): it then stops reading, and the client,
  which looks for an early answer between its sends, stops sending.

A stream that breaks off before its end frame leaves nothing: the nimbus deletes what it
received and forgets the session. :data:`UPLOAD_MAGIC` too is a frame length no nimbus
accepts, so a nimbus without upload streams drops the connection and the client uploads
the same session with ``uploadChunk`` instead.
"""

from __future__ import annotations

import hashlib
import os
import select
import socket
import ssl
import struct
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from nimbus.config import CODE_STREAM_MAGIC, MAX_FRAME_BYTES  # noqa: F401 (the stream's API)
from nimbus.distribution.archive import ChangedWhilePackedError, FileSlice, Piece

MAGIC = CODE_STREAM_MAGIC
UPLOAD_MAGIC = b"NHU1"
SESSION_ID_BYTES = 36  # str(uuid.uuid4())
MAX_LOCATION_BYTES = 4096
OK, REFUSED = 0, 1
_SIZE = struct.Struct("!Q")
_REASON = struct.Struct("!H")
RECEIVE_BLOCK = 1 << 20
# The largest MAGIC-free frame (MAX_FRAME_BYTES, from nimbus.config): nimbus.thrift.
# max_buffer_size must stay below it. (UPLOAD_MAGIC read as a length is larger still.)
# An upload's bytes go out in steps of this many, with a look for an early answer (a
# refusal) between two steps; small pieces are gathered into frames of COALESCE_BYTES.
SEND_STEP = 4 << 20
COALESCE_BYTES = 1 << 20
# How long the nimbus may take after an upload's last byte to finish checking it (a
# compressed tar is checked as it arrives, and the check may lag behind the network).
VERDICT_WAIT_S = 120.0
# A nimbus that refuses an upload before its end reads and discards what is still on the
# way for at most this long, so that its refusal is not lost to a reset connection.
REFUSAL_DRAIN_S = 5.0


class StreamRefusedError(ValueError):
    """The nimbus refused the stream (unknown or finished download session)."""


class StreamUnsupportedError(ConnectionError):
    """The peer closed the connection without answering: it has no code stream."""


class DownloadSource(Protocol):
    """What serves a stream: ``FileTransfers.stream_download``."""

    def stream_download(self, session_id: str, conn: socket.socket,
                        announce: object) -> int: ...


class UploadSink(Protocol):
    """What takes an upload stream: ``FileTransfers.stream_upload``."""

    def stream_upload(self, location: str, conn: socket.socket,
                      ready: Callable[[], None]) -> int: ...


class StreamEndpoint(DownloadSource, UploadSink, Protocol):
    """Both sides of the code stream (``FileTransfers``)."""


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


def serve_upload(conn: socket.socket, sink: UploadSink, deadline: float) -> None:
    """Take one upload stream whose :data:`UPLOAD_MAGIC` was already read from ``conn``.

    The location must arrive by ``deadline`` (time.monotonic()). ``sink.stream_upload``
    reads the frames (:func:`receive_upload`) once it has called ``ready``; a ValueError
    from it (an unknown session, too large, an unsafe bundle) is answered as a refusal.
    Raises on a broken connection.
    """
    conn.settimeout(max(0.001, deadline - time.monotonic()))
    (length,) = _REASON.unpack(_recv_exactly(conn, _REASON.size))
    if not 0 < length <= MAX_LOCATION_BYTES:
        _refuse(conn, f"an upload location of {length} bytes is not one this nimbus gives")
        return
    location = _recv_exactly(conn, length).decode("utf-8", "replace")
    try:
        size = sink.stream_upload(location, conn, lambda: conn.sendall(bytes([OK])))
    except ValueError as exc:  # TransferError, BundleError
        _refuse(conn, str(exc))
        return
    conn.sendall(bytes([OK]) + _SIZE.pack(size))


def _refuse(conn: socket.socket, reason: str) -> None:
    """Answer REFUSED with ``reason``, then drain what the peer still sends for a while:
    closing with unread bytes would reset the connection and could lose the answer."""
    data = reason.encode("utf-8")[:1024]
    conn.sendall(bytes([REFUSED]) + _REASON.pack(len(data)) + data)
    try:
        conn.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + REFUSAL_DRAIN_S
        while (left := deadline - time.monotonic()) > 0:
            conn.settimeout(left)
            if not conn.recv(RECEIVE_BLOCK):
                break
    except OSError:
        pass  # the peer went first: nothing left to protect


def receive_upload(conn: socket.socket, write: Callable[[memoryview], None]) -> int:
    """Read an upload's frames from ``conn`` up to its end frame, handing each block of
    bytes to ``write`` as it arrives (the view is reused: copy what must be kept);
    returns the number of bytes. ``ConnectionError`` if the stream breaks off first."""
    buf = bytearray(RECEIVE_BLOCK)
    view = memoryview(buf)
    total = 0
    while True:
        try:
            (length,) = _SIZE.unpack(_recv_exactly(conn, _SIZE.size))
        except EOFError as exc:
            raise ConnectionError(f"the upload broke off after {total} bytes ({exc})") \
                from None
        if not length:
            return total
        while length:
            n = conn.recv_into(view, min(RECEIVE_BLOCK, length))
            if not n:
                raise ConnectionError(f"the upload broke off after {total} bytes, "
                                      f"{length} short of a frame's end")
            write(view[:n])
            length -= n
            total += n


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


def send_upload(sock: socket.socket, location: str, pieces: Iterable[Piece],
                progress: Callable[[int], None] = lambda n: None) -> int:
    """Send ``pieces`` as the upload at ``location`` on the connected ``sock``; returns
    the number of bytes the nimbus kept. The upload is then finished.

    Raises :class:`StreamUnsupportedError` when the peer drops the connection before its
    first answer (no upload streams there: the session is untouched, upload it with
    ``uploadChunk``), :class:`StreamRefusedError` with the nimbus's reason when it
    refuses, ``ConnectionError`` when the stream breaks off, and whatever reading
    ``pieces`` raises (a file that changed while it was packed). ``progress`` is called
    with each number of bytes sent.
    """
    encoded = location.encode("utf-8")
    try:
        sock.sendall(UPLOAD_MAGIC + _REASON.pack(len(encoded)) + encoded)
        status = sock.recv(1)
    except (ConnectionResetError, BrokenPipeError) as exc:
        raise StreamUnsupportedError(f"the nimbus dropped the connection ({exc}): "
                                     "no upload stream") from None
    if not status:
        raise StreamUnsupportedError("the nimbus closed the connection: no upload stream")
    _raise_unless_ok(sock, status[0])
    # The end frame is small and followed by a wait for the answer: do not let Nagle's
    # algorithm hold it back for a delayed ACK.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sender = _UploadSender(sock, progress)
    try:
        for piece in pieces:
            if sender.add(piece):
                break  # answered early: a refusal
        else:
            sender.end()
    except (ConnectionResetError, BrokenPipeError):
        # The nimbus stopped reading: its refusal may have arrived before the reset.
        sender.answered = True
    timeout = sock.gettimeout()
    sock.settimeout(max(timeout or 0.0, VERDICT_WAIT_S + 10.0))
    try:
        status = sock.recv(1)
    except (ConnectionResetError, BrokenPipeError):
        status = b""
    if not status:
        raise ConnectionError(f"the nimbus closed the upload stream after {sender.sent} "
                              "bytes without an answer")
    _raise_unless_ok(sock, status[0])
    if sender.answered:
        raise ConnectionError("the nimbus accepted an upload it had not received in full")
    (kept,) = _SIZE.unpack(_recv_exactly(sock, _SIZE.size))
    sock.settimeout(timeout)
    if kept != sender.sent:
        raise ConnectionError(f"the nimbus kept {kept} bytes of the {sender.sent} sent")
    return kept


def _raise_unless_ok(sock: socket.socket, status: int) -> None:
    if status == REFUSED:
        (length,) = _REASON.unpack(_recv_exactly(sock, _REASON.size))
        raise StreamRefusedError(_recv_exactly(sock, length).decode("utf-8", "replace"))
    if status != OK:
        raise ConnectionError(f"unexpected code stream status {status}")


class _UploadSender:
    """Frames pieces onto an upload stream: small pieces gathered into frames of up to
    COALESCE_BYTES, each FileSlice one frame sent with ``sendfile`` (read and sent on a
    TLS socket, which ``sendfile`` cannot write to) in SEND_STEP steps."""

    def __init__(self, sock: socket.socket, progress: Callable[[int], None]):
        self.sock = sock
        self.progress = progress
        self.sent = 0
        self.answered = False  # the nimbus answered before the end: stop sending
        self._plain = not isinstance(sock, ssl.SSLSocket)
        self._gathered = bytearray()

    def add(self, piece: Piece) -> bool:
        """Send ``piece`` (or gather it); True once the nimbus has answered early."""
        if isinstance(piece, FileSlice):
            return self._flush() or self._send_file(piece)
        self._gathered += piece
        return len(self._gathered) >= COALESCE_BYTES and self._flush()

    def end(self) -> None:
        if not self._flush():
            self.sock.sendall(_SIZE.pack(0))

    def _early_answer(self) -> bool:
        pending = isinstance(self.sock, ssl.SSLSocket) and self.sock.pending() > 0
        self.answered = pending or bool(select.select([self.sock], [], [], 0)[0])
        return self.answered

    def _flush(self) -> bool:
        if self._early_answer():
            return True
        if self._gathered:
            self.sock.sendall(_SIZE.pack(len(self._gathered)) + self._gathered)
            self.sent += len(self._gathered)
            self.progress(len(self._gathered))
            self._gathered.clear()
        return False

    def _send_file(self, piece: FileSlice) -> bool:
        if not piece.size:
            return False  # a frame of length 0 would end the upload
        self.sock.sendall(_SIZE.pack(piece.size))
        offset = 0
        while offset < piece.size:
            if self._early_answer():
                return True
            step = min(SEND_STEP, piece.size - offset)
            if self._plain:
                n = self.sock.sendfile(piece.file, offset, step)
            else:
                data = os.pread(piece.file.fileno(), step, offset)
                self.sock.sendall(data)
                n = len(data)
            if not n:
                raise ChangedWhilePackedError(f"{piece.name} shrank while it was sent "
                                              f"({offset} of {piece.size} bytes); submit again")
            offset += n
            self.sent += n
            self.progress(n)
        return False
