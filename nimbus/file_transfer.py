"""Chunked file transfers of the Thrift API: uploads into an inbox, downloads of code.

Uploads land in ``<storm.local.dir>/nimbus/inbox`` under names the nimbus chooses; a
client can only append to a location this nimbus handed out, up to a size limit.
Downloads serve only files of topology code held by this nimbus. Idle sessions expire.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from nimbus.local_code import LocalCodeStore

DOWNLOAD_CHUNK_BYTES = 2 * 1024 * 1024
IDLE_EXPIRY_S = 600.0
# Each open session holds a file descriptor: bound them so no client can exhaust them.
MAX_UPLOADS = 32
MAX_DOWNLOADS = 256


class TransferError(ValueError):
    """A transfer request names an unknown session or breaks a limit."""


@dataclass
class _Session:
    path: Path
    handle: BinaryIO | None
    size: int = 0
    touched: float = 0.0
    finished: bool = False


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
        self._lock = threading.Lock()

    def _expire(self) -> None:
        cutoff = time.monotonic() - IDLE_EXPIRY_S
        for table in (self._uploads, self._downloads):
            for key, session in list(table.items()):
                if session.touched < cutoff:
                    if session.handle:
                        session.handle.close()
                    if table is self._uploads:
                        session.path.unlink(missing_ok=True)
                    del table[key]

    # -- uploads ----------------------------------------------------------------------------
    def begin_upload(self) -> str:
        with self._lock:
            self._expire()
            if len(self._uploads) >= MAX_UPLOADS:
                raise TransferError(f"too many uploads in progress ({MAX_UPLOADS}); retry later")
            path = self.inbox / f"stormjar-{uuid.uuid4()}.jar"
            self._uploads[str(path)] = _Session(path, open(path, "wb"), touched=time.monotonic())
            return str(path)

    def upload_chunk(self, location: str, chunk: bytes) -> None:
        with self._lock:
            session = self._uploads.get(location)
            if session is None or session.finished or session.handle is None:
                raise TransferError(f"no open upload at {location!r}")
            if session.size + len(chunk) > self._max:
                session.handle.close()
                session.path.unlink(missing_ok=True)
                del self._uploads[location]
                raise TransferError(f"upload larger than nimbus.max.topology.bytes={self._max}")
            session.handle.write(chunk)
            session.size += len(chunk)
            session.touched = time.monotonic()

    def finish_upload(self, location: str) -> None:
        with self._lock:
            session = self._uploads.get(location)
            if session is None or session.handle is None:
                raise TransferError(f"no open upload at {location!r}")
            session.handle.close()
            session.handle = None
            session.finished = True
            session.touched = time.monotonic()

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
    def begin_download(self, requested: str) -> str:
        path = self._store.resolve_served_file(requested)
        with self._lock:
            self._expire()
            if len(self._downloads) >= MAX_DOWNLOADS:
                raise TransferError(
                    f"too many downloads in progress ({MAX_DOWNLOADS}); retry later")
            session_id = str(uuid.uuid4())
            self._downloads[session_id] = _Session(path, open(path, "rb"),
                                                   touched=time.monotonic())
            return session_id

    def download_chunk(self, session_id: str) -> bytes:
        with self._lock:
            session = self._downloads.get(session_id)
            if session is None or session.handle is None:
                raise TransferError(f"no open download {session_id!r}")
            chunk = session.handle.read(DOWNLOAD_CHUNK_BYTES)
            session.touched = time.monotonic()
            if not chunk:
                session.handle.close()
                del self._downloads[session_id]
            return chunk

    def close(self) -> None:
        with self._lock:
            for session in [*self._uploads.values(), *self._downloads.values()]:
                if session.handle:
                    session.handle.close()
            self._uploads.clear()
            self._downloads.clear()
