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

An upload may also arrive over the code stream (:meth:`FileTransfers.stream_upload`, see
:mod:`nimbus.distribution.code_stream`). Its bundle is checked while it arrives: a thread
of its own (``upload-check-...``) reads the file behind the writer, waiting for bytes
that have not come yet, and runs the bundle check over it
(:func:`nimbus.distribution.archive.check_tar_stream`), so an unsafe entry stops the
upload where it is and a safe bundle is known to be safe when its last byte lands. A zip
is checked once it is complete (its directory is at its end; that check reads headers
only). The submission checks the bundle again before accepting it
(``lifecycle.submit``): for the stored tar ``nimbus-ha submit`` sends and for a zip, that
costs milliseconds. A stream that breaks off or is refused leaves no file and no session.
"""

from __future__ import annotations

import io
import logging
import os
import socket
import threading
import time
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from nimbus.distribution import code_stream
from nimbus.distribution.archive import (
    BundleError,
    DamagedArchiveError,
    check_bundle,
    check_tar_stream,
)
from nimbus.distribution.local_code import LocalCodeStore

log = logging.getLogger(__name__)

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


class UploadAbandonedError(Exception):
    """The upload a reader follows broke off or was refused. Neither an OSError nor a
    ValueError, so that the bundle check cannot mistake it for a damaged archive."""


class _Arrival:
    """How much of an upload's file is written, for a reader that follows the writer."""

    def __init__(self, written: int):
        self._changed = threading.Condition()
        self._written = written
        self._ended = False
        self._abandoned = False
        # What the reader waits for: it is woken once, when that has arrived, not at
        # every block (a tar's next header may lie hundreds of megabytes ahead).
        self._wanted: int | None = None

    def advance(self, written: int) -> None:
        with self._changed:
            self._written = written
            if self._wanted is not None and written >= self._wanted:
                self._changed.notify_all()

    def end(self) -> None:
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def abandon(self) -> None:
        with self._changed:
            self._abandoned = True
            self._changed.notify_all()

    def wait_for(self, end: int | None) -> int:
        """The bytes written, once ``end`` of them are (None: all of them) or the upload
        ended; UploadAbandonedError once it is abandoned. The writer ends or abandons
        every upload it begins, so this wait always finishes; the timeout of each round
        only bounds how long a missed wake-up could go unseen."""
        with self._changed:
            while not self._abandoned and not self._ended and (
                    end is None or self._written < end):
                self._wanted = end
                self._changed.wait(1.0)
            self._wanted = None
            if self._abandoned:
                raise UploadAbandonedError("the upload broke off")
            return self._written


class _FollowingReader(io.RawIOBase):
    """Reads an upload's file while it is being written: a read past what has arrived
    waits for it (a read at the end returns what there is, as at the end of a file)."""

    def __init__(self, path: Path, arrival: _Arrival):
        super().__init__()
        self._fd = os.open(path, os.O_RDONLY)
        self._arrival = arrival
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        out = memoryview(buffer).cast("B")
        available = self._arrival.wait_for(self._pos + len(out)) - self._pos
        if available <= 0:
            return 0
        data = os.pread(self._fd, min(len(out), available), self._pos)
        out[:len(data)] = data
        self._pos += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            self._pos = offset
        elif whence == io.SEEK_CUR:
            self._pos += offset
        else:
            self._pos = self._arrival.wait_for(None) + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


class _UploadCheck:
    """The bundle check of an upload that is still arriving, on a thread of its own.

    ``refusal`` is set at the first unsafe entry (the writer then stops taking bytes),
    ``damaged`` when the file reads as no tar (say, a zip: judged at its end).
    """

    def __init__(self, path: Path, max_bytes: int, arrival: _Arrival):
        self.path = path
        self.refusal: BundleError | None = None
        self.damaged: DamagedArchiveError | None = None
        self._max = max_bytes
        self._arrival = arrival
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"upload-check-{path.stem[-12:]}")

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            with _FollowingReader(self.path, self._arrival) as reader:
                check_tar_stream(reader, self.path.name, self._max)
        except UploadAbandonedError:
            pass
        except DamagedArchiveError as exc:
            self.damaged = exc
        except BundleError as exc:
            self.refusal = exc
        except Exception:  # a bug here: the submission's own check still decides
            log.exception("checking the upload %s as it arrived failed", self.path.name)

    def verdict(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the check of the complete file; BundleError if
        the bundle is unsafe or no archive, as check_bundle would find it."""
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.info("the check of upload %s was still running %.0f s after its last byte; "
                     "the submission's own check decides", self.path.name, timeout_s)
            return
        if self.refusal is not None:
            raise self.refusal
        # As check_bundle and the supervisor decide: a file that is a zip is a zip.
        if zipfile.is_zipfile(self.path):
            check_bundle(self.path, self._max)
        elif self.damaged is not None:
            raise self.damaged

    def stop(self) -> None:
        """Abandon the check (if it still runs) and join its thread."""
        self._arrival.abandon()
        self._thread.join(code_stream.VERDICT_WAIT_S)


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
        # Bytes of code sent to downloaders (peers and supervisors), over both transports:
        # the nimbus's code egress (nimbus_code_served_bytes_total).
        self._served = 0
        self._served_lock = threading.Lock()

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

    def stream_upload(self, location: str, conn: socket.socket,
                      ready: Callable[[], None]) -> int:
        """Take the bytes of upload ``location`` from the code stream on ``conn``
        (:func:`code_stream.receive_upload`), checking the bundle as it arrives, and
        finish the upload; returns its size.

        ``ready()`` is called once the session is found, before any byte is read. Raises
        TransferError for an unknown or finished session or one over the size limit,
        BundleError for an unsafe bundle (at its first unsafe entry) or a file that is
        no archive, ConnectionError when the stream breaks off. On any of these the
        upload's file is deleted and its session forgotten.
        """
        session = self._acquire(self._uploads, location, "upload at")
        try:
            with session.io:
                handle = session.handle
                if handle is None:
                    raise TransferError(f"no open upload at {location!r}")
                ready()
                arrival = _Arrival(session.size)
                check = _UploadCheck(session.path, self._max, arrival)
                check.start()
                kept = False
                try:
                    def write(block: memoryview) -> None:
                        if check.refusal is not None:
                            raise check.refusal
                        if session.size + len(block) > self._max:
                            raise TransferError(
                                f"upload larger than nimbus.max.topology.bytes={self._max}")
                        try:
                            handle.write(block)
                            handle.flush()  # the check reads the file through another handle
                        except OSError as exc:  # a full disk: a refusal, not a broken stream
                            raise TransferError(f"cannot store the upload: {exc}") from None
                        session.size += len(block)
                        arrival.advance(session.size)

                    code_stream.receive_upload(conn, write)
                    handle.close()
                    session.handle = None
                    arrival.end()
                    check.verdict(code_stream.VERDICT_WAIT_S)
                    session.finished = True
                    kept = True
                    return session.size
                finally:
                    check.stop()
                    if not kept:
                        if session.handle is not None:
                            session.handle.close()
                            session.handle = None
                        session.path.unlink(missing_ok=True)
                        self._forget(self._uploads, location, session)
        finally:
            self._release(session)

    def uploads_in_progress(self) -> int:
        """Upload sessions open or finished and not yet taken by a submission."""
        with self._lock:
            return len(self._uploads)

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
                self._count_served(len(chunk))
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
                        self._count_served(conn.sendfile(handle, offset, size))
                finally:
                    handle.close()
                    session.handle = None
                    self._forget(self._downloads, session_id, session)
                return size
        finally:
            self._release(session)

    def _count_served(self, n: int) -> None:
        with self._served_lock:
            self._served += n

    @property
    def served_bytes(self) -> int:
        """Bytes of code this nimbus has sent to downloaders since it started."""
        with self._served_lock:
            return self._served

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
