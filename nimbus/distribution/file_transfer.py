"""Chunked file transfers of the Thrift API: uploads into an inbox, downloads of code.

Uploads land in ``<storm.local.dir>/nimbus/inbox`` under names the nimbus chooses; a
client can only append to a location this nimbus handed out, up to a size limit.
Downloads serve only files of topology code held by this nimbus.

Each open session holds a file descriptor, so sessions are bounded: per client (the
caller the Thrift server names, ``nimbus.thrift.server.current_client``: a certificate's
common name with TLS, else an address), so that one client that opens sessions and
abandons them blocks only itself, and for all clients together, which bounds the
descriptors. A session idle for ``IDLE_EXPIRY_S`` is dropped the next time any client
begins one, and no longer counts.

Locking: ``FileTransfers._lock`` guards the session tables only and is never held during
disk I/O. Each session has its own I/O lock, held while its file is written, read or
closed, so transfers of different sessions proceed in parallel and a slow disk stalls only
its own session. A session counts the threads using it; expiry skips a session in use, and
a session removed from its table while in use (:meth:`FileTransfers.close`) is disposed of
by the last thread that leaves it, never under a thread that is reading or writing it.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from nimbus.distribution.local_code import LocalCodeStore

DOWNLOAD_CHUNK_BYTES = 2 * 1024 * 1024
# A client uploads its chunks one after another and drains a download at once: a minute
# without a chunk means it has gone.
IDLE_EXPIRY_S = 60.0
# Each open session holds a file descriptor: bound them so no client can exhaust them.
MAX_UPLOADS = 32
MAX_DOWNLOADS = 256
# What one client may hold of those. Without TLS a client is an address, which every
# supervisor and nimbus of a one-host cluster shares.
MAX_UPLOADS_PER_CLIENT = 8
MAX_DOWNLOADS_PER_CLIENT = 64


class TransferError(ValueError):
    """A transfer request names an unknown session or breaks a limit."""


@dataclass(eq=False)
class _Session:
    path: Path
    handle: BinaryIO | None
    upload: bool
    owner: str = ""  # the client that began it
    size: int = 0
    touched: float = field(default_factory=time.monotonic)
    finished: bool = False
    # Guarded by FileTransfers._lock:
    users: int = 0  # threads between _acquire and _release
    detached: bool = False  # removed from its table while in use: the last user disposes
    # Held during this session's disk I/O (taken before FileTransfers._lock, never after):
    io: threading.Lock = field(default_factory=threading.Lock)

    def dispose(self, delete: bool) -> None:
        """Close the file (waiting for any I/O on it); ``delete`` removes an upload's file."""
        with self.io:
            if self.handle is not None:
                self.handle.close()
                self.handle = None
            if delete and self.upload:
                self.path.unlink(missing_ok=True)


class FileTransfers:
    """Upload and download sessions of one nimbus."""

    def __init__(self, local_dir: Path, store: LocalCodeStore, max_upload_bytes: int):
        self.inbox = Path(local_dir) / "nimbus" / "inbox"
        self.inbox.mkdir(parents=True, exist_ok=True)
        for stale in self.inbox.iterdir():  # uploads of a previous run cannot be resumed
            stale.unlink(missing_ok=True)
        self._store = store
        self._max = max_upload_bytes
        self._uploads: dict[str, _Session] = {}
        self._downloads: dict[str, _Session] = {}
        self._lock = threading.Lock()  # the two tables and each session's users/detached

    # -- session bookkeeping ----------------------------------------------------------------
    def _expire(self) -> None:
        """Dispose of sessions idle for IDLE_EXPIRY_S that no thread is using."""
        cutoff = time.monotonic() - IDLE_EXPIRY_S
        expired = []
        with self._lock:
            for table in (self._uploads, self._downloads):
                for key, session in list(table.items()):
                    if session.users == 0 and session.touched < cutoff:
                        del table[key]
                        expired.append(session)
        for session in expired:  # nobody can reach them any more: close outside the lock
            session.dispose(delete=True)

    def _acquire(self, table: dict[str, _Session], key: str, what: str) -> _Session:
        with self._lock:
            session = table.get(key)
            if session is None:
                raise TransferError(f"no open {what} {key!r}")
            session.users += 1
            session.touched = time.monotonic()
            return session

    def _release(self, session: _Session) -> None:
        with self._lock:
            session.users -= 1
            session.touched = time.monotonic()
            orphaned = session.detached and session.users == 0
        if orphaned:
            session.dispose(delete=False)

    def _forget(self, table: dict[str, _Session], key: str, session: _Session) -> None:
        with self._lock:
            if table.get(key) is session:
                del table[key]

    def _admit(self, owner: str, upload: bool) -> None:
        """Raise TransferError, naming the limit, unless ``owner`` may begin a session.
        Module limits are read at each call (tests lower them)."""
        if upload:
            table, limit, per_client = self._uploads, MAX_UPLOADS, MAX_UPLOADS_PER_CLIENT
            what, one = "uploads", "an upload"
        else:
            table, limit, per_client = (self._downloads, MAX_DOWNLOADS,
                                        MAX_DOWNLOADS_PER_CLIENT)
            what, one = "downloads", "a download"
        if sum(1 for session in table.values() if session.owner == owner) >= per_client:
            raise TransferError(
                f"{owner or 'this client'} has {per_client} {what} in progress, the most "
                f"one client may have; finish or abandon one ({one} idle for "
                f"{IDLE_EXPIRY_S:.0f} s is dropped) and retry")
        if len(table) >= limit:
            raise TransferError(f"too many {what} in progress on this nimbus ({limit}, the "
                                "limit of all clients together); retry later")

    # -- uploads ----------------------------------------------------------------------------
    def begin_upload(self, owner: str = "") -> str:
        """A new upload location for client ``owner``; TransferError over a limit."""
        self._expire()
        with self._lock:
            self._admit(owner, upload=True)
        path = self.inbox / f"stormjar-{uuid.uuid4()}.jar"
        session = _Session(path, open(path, "wb"), upload=True, owner=owner)
        try:
            with self._lock:
                self._admit(owner, upload=True)  # others got in meanwhile
                self._uploads[str(path)] = session
        except TransferError:
            session.dispose(delete=True)
            raise
        return str(path)

    def upload_chunk(self, location: str, chunk: bytes) -> None:
        session = self._acquire(self._uploads, location, "upload at")
        try:
            with session.io:
                if session.handle is None:  # finished, or discarded by another thread
                    raise TransferError(f"no open upload at {location!r}")
                if session.size + len(chunk) > self._max:
                    session.handle.close()
                    session.handle = None
                    session.path.unlink(missing_ok=True)
                    self._forget(self._uploads, location, session)
                    raise TransferError(
                        f"upload larger than nimbus.max.topology.bytes={self._max}")
                session.handle.write(chunk)
                session.size += len(chunk)
        finally:
            self._release(session)

    def finish_upload(self, location: str) -> None:
        session = self._acquire(self._uploads, location, "upload at")
        try:
            with session.io:
                if session.handle is None:
                    raise TransferError(f"no open upload at {location!r}")
                session.handle.close()
                session.handle = None
                session.finished = True
        finally:
            self._release(session)

    def take_upload(self, location: str) -> Path:
        """The finished upload at ``location``; the caller deletes it when done."""
        with self._lock:
            session = self._uploads.get(location)
            if session is not None and session.finished:
                del self._uploads[location]
        if session is None or not session.finished:
            raise TransferError(f"{location!r} is not a finished upload on this nimbus "
                                "(upload with beginFileUpload/uploadChunk/finishFileUpload)")
        return session.path

    # -- downloads --------------------------------------------------------------------------
    def begin_download(self, requested: str, owner: str = "") -> str:
        """A download session of a served file for client ``owner``; TransferError over
        a limit."""
        path = self._store.resolve_served_file(requested)
        self._expire()
        with self._lock:
            self._admit(owner, upload=False)
        session = _Session(path, open(path, "rb"), upload=False, owner=owner)
        session_id = str(uuid.uuid4())
        try:
            with self._lock:
                self._admit(owner, upload=False)
                self._downloads[session_id] = session
        except TransferError:
            session.dispose(delete=False)
            raise
        return session_id

    def download_chunk(self, session_id: str) -> bytes:
        session = self._acquire(self._downloads, session_id, "download")
        try:
            with session.io:
                if session.handle is None:
                    raise TransferError(f"no open download {session_id!r}")
                chunk = session.handle.read(DOWNLOAD_CHUNK_BYTES)
                if not chunk:
                    session.handle.close()
                    session.handle = None
                    self._forget(self._downloads, session_id, session)
                return chunk
        finally:
            self._release(session)

    def stream_download(self, session_id: str, conn: socket.socket,
                        announce: Callable[[int], None]) -> int:
        """Send the rest of download ``session_id`` down ``conn`` (the code stream, see
        :mod:`nimbus.distribution.code_stream`) and finish the session.

        ``announce(size)`` is called with the number of bytes that follow, before they are
        sent. Returns that number. Raises :class:`TransferError` for an unknown or finished
        session. If sending fails the session is finished too: the file's position is no
        longer known, so the client must begin a new download.
        """
        session = self._acquire(self._downloads, session_id, "download")
        try:
            with session.io:
                handle = session.handle
                if handle is None:
                    raise TransferError(f"no open download {session_id!r}")
                try:
                    offset = handle.tell()
                    size = os.fstat(handle.fileno()).st_size - offset
                    announce(size)
                    if size:
                        # os.sendfile on a plain socket: no copy through Python.
                        conn.sendfile(handle, offset, size)
                finally:
                    handle.close()
                    session.handle = None
                    self._forget(self._downloads, session_id, session)
                return size
        finally:
            self._release(session)

    def close(self) -> None:
        """Close every session; one in use is closed when its last user leaves it."""
        with self._lock:
            sessions = [*self._uploads.values(), *self._downloads.values()]
            self._uploads.clear()
            self._downloads.clear()
            idle = []
            for session in sessions:
                session.detached = True
                if session.users == 0:
                    idle.append(session)
        for session in idle:
            session.dispose(delete=False)
