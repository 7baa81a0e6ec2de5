"""Concurrent, memory-bounded S3 transfers of one file, hashed with sha256 on the way.

* :func:`upload_file` reads the file part by part into ``concurrency`` reusable buffers of
  ``part_size`` bytes. Each part goes to a worker (``UploadPart``) while the calling thread
  hashes it (hashlib releases the GIL, so hashing overlaps the network), then reads the
  next part as soon as a buffer is free. A file no larger than one part is one
  ``PutObject``. On any failure the multipart upload is aborted, once no part is in flight.
* :func:`download_file` preallocates the target and fetches it as ranged GETs of
  ``part_size`` bytes, ``concurrency`` at a time, in order; each range streams into its
  place in the file with ``pwrite``. The calling thread follows the contiguous written
  prefix and hashes it from the file, so the sha256 is of the bytes on disk, in order.

Memory is bounded by ``concurrency × part_size`` for uploads and by ``concurrency`` small
socket buffers for downloads, whatever the file size. Every S3 call goes through s3fs's
``_call_s3`` on fsspec's event loop (credentials, endpoint, retries and error
translation as for any other s3fs call); the workers are a ``ThreadPoolExecutor`` that
is shut down (joined) before either function returns.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import queue
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsspec.asyn import sync

log = logging.getLogger(__name__)

MIN_PART_SIZE = 5 * 1024 * 1024    # S3's minimum for every part but the last
MAX_PARTS = 10_000                 # S3's maximum number of parts of one upload
READ_CHUNK = 1024 * 1024           # the most one read of a GET body returns
HASH_BLOCK = 4 * 1024 * 1024       # what the hasher reads back from disk at a time

Advance = Callable[[int], None]


class TransferStopped(Exception):
    """A range fetch stopped because another part of the same transfer failed."""


class ObjectMismatch(Exception):
    """The object's size is not the size the manifest promises."""

    def __init__(self, actual: int | None, detail: str) -> None:
        super().__init__(detail)
        self.actual = actual


@dataclass(frozen=True)
class TransferResult:
    """Bytes moved and the sha256 (hex) of them, in file order."""

    size: int
    sha256: str


def effective_part_size(size: int, part_size: int) -> int:
    """``part_size``, grown if ``size`` would need more than S3's 10,000 parts."""
    return max(part_size, -(-size // MAX_PARTS))


# -- upload ---------------------------------------------------------------------------------
def upload_file(fs: Any, path: str, local: Path, part_size: int, concurrency: int,
                advance: Advance) -> TransferResult:
    """Upload ``local`` to ``path`` (``bucket/key``) through the s3fs filesystem ``fs``."""
    bucket, key, _ = fs.split_path(path)
    size = os.stat(local).st_size
    with open(local, "rb", buffering=0) as src:
        if size <= part_size:
            data = src.read(size + 1)
            result = TransferResult(len(data), hashlib.sha256(data).hexdigest())
            if result.size != size:
                raise OSError(f"{local} changed size while it was uploaded")
            fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data)
            advance(result.size)
            return result
        part_size = effective_part_size(size, part_size)
        upload_id = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key)["UploadId"]
        try:
            result, etags = _upload_parts(fs, bucket, key, upload_id, src, part_size,
                                          concurrency, advance)
            if result.size != size:
                raise OSError(f"{local} changed size while it was uploaded")
            fs.call_s3("complete_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id,
                       MultipartUpload={"Parts": [{"PartNumber": n, "ETag": etags[n]}
                                                  for n in sorted(etags)]})
        except BaseException:
            _abort(fs, bucket, key, upload_id)
            raise
    fs.invalidate_cache(path)
    return result


def _abort(fs: Any, bucket: str, key: str, upload_id: str) -> None:
    """Abort a multipart upload (no part is in flight by now); log, never raise."""
    try:
        fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)
    except Exception as exc:
        log.warning("could not abort the multipart upload of %s/%s (%s); the store's "
                    "lifecycle rules must clean up its parts: %s", bucket, key, upload_id, exc)


def _read_full(src: Any, view: memoryview) -> int:
    """Fill ``view`` from ``src``; fewer bytes only at the end of the file."""
    filled = 0
    while filled < len(view):
        n = src.readinto(view[filled:])
        if not n:
            break
        filled += n
    return filled


def _part_buffer(size: int) -> io.BytesIO:
    """A ``BytesIO`` that owns ``size`` bytes of its own.

    Parts are sent as ``BytesIO`` bodies: aiohttp then streams them in small chunks, where
    a ``bytes``/``bytearray`` body would be sliced and joined into whole-part copies. The
    file is read straight into the buffer (``getbuffer``), which is not shared with any
    ``bytes`` object, so no one copies it either."""
    buffer = io.BytesIO()
    buffer.seek(size - 1)
    buffer.write(b"\0")
    buffer.seek(0)
    return buffer


def _upload_parts(fs: Any, bucket: str, key: str, upload_id: str, src: Any, part_size: int,
                  concurrency: int, advance: Advance) -> tuple[TransferResult, dict[int, str]]:
    """Send every part of ``src``; returns the hash of all bytes and each part's ETag."""
    free: queue.SimpleQueue[io.BytesIO] = queue.SimpleQueue()
    for _ in range(concurrency):
        free.put(_part_buffer(part_size))
    failed = threading.Event()
    etags: dict[int, str] = {}

    def send(number: int, buffer: io.BytesIO) -> None:
        try:
            etags[number] = fs.call_s3("upload_part", Bucket=bucket, Key=key,
                                       UploadId=upload_id, PartNumber=number,
                                       Body=buffer)["ETag"]
        except BaseException:
            failed.set()
            raise
        finally:
            free.put(buffer)  # the buffer is free again: the caller may read the next part

    digest = hashlib.sha256()
    total = 0
    pending: deque[tuple[int, Future[None]]] = deque()
    with ThreadPoolExecutor(concurrency, thread_name_prefix="s3-upload") as pool:
        try:
            number = 0
            length = part_size
            while length == part_size:
                buffer = free.get()  # blocks while ``concurrency`` parts are in flight
                if failed.is_set():
                    break  # the failed part's error is raised below
                buffer.seek(0)
                with buffer.getbuffer() as view:
                    length = _read_full(src, view)
                    if length == part_size:
                        number += 1
                        pending.append((length, pool.submit(send, number, buffer)))
                        digest.update(view)  # overlaps the part's upload
                    else:
                        digest.update(view[:length])
                if 0 < length < part_size:  # the last part: shrink it, then send it
                    buffer.truncate(length)
                    number += 1
                    pending.append((length, pool.submit(send, number, buffer)))
                total += length
                while pending and pending[0][1].done():
                    done, future = pending.popleft()
                    future.result()
                    advance(done)
            while pending:
                done, future = pending.popleft()
                future.result()  # the first failed part's error, if any
                advance(done)
        except BaseException:
            for _, future in pending:
                future.cancel()
            raise
        # leaving the block joins the workers: no part is in flight after it
    return TransferResult(total, digest.hexdigest()), etags


# -- download -------------------------------------------------------------------------------
class _Prefix:
    """The contiguous written prefix of a file fetched as ranges, shared across threads."""

    def __init__(self, ranges: list[tuple[int, int]]) -> None:
        self._cond = threading.Condition()
        self._lengths = [end - start for start, end in ranges]
        self._written = [0] * len(ranges)
        self._first_open = 0     # first range not yet complete
        self._complete = 0       # bytes in the complete ranges before it
        self.error: BaseException | None = None

    def wrote(self, index: int, written: int) -> None:
        """Range ``index`` now has its first ``written`` bytes on disk."""
        with self._cond:
            self._written[index] = written
            while (self._first_open < len(self._lengths)
                   and self._written[self._first_open] == self._lengths[self._first_open]):
                self._complete += self._lengths[self._first_open]
                self._first_open += 1
            self._cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        """Record the first failure and wake the hasher."""
        with self._cond:
            if self.error is None:
                self.error = exc
            self._cond.notify_all()

    def _prefix(self) -> int:
        partial = (self._written[self._first_open]
                   if self._first_open < len(self._lengths) else 0)
        return self._complete + partial

    def wait_past(self, offset: int) -> int:
        """Block until more than ``offset`` bytes are contiguous; return how many are.
        Raises the first failure of any range instead."""
        with self._cond:
            while self.error is None and self._prefix() <= offset:
                self._cond.wait()
            if self.error is not None:
                raise self.error
            return self._prefix()


def _content_total(response: dict[str, Any]) -> int | None:
    """The object's full size from a (ranged) GET response, if the store says."""
    content_range = response.get("ContentRange") or ""
    if "/" in content_range:
        total = content_range.rsplit("/", 1)[1]
        return int(total) if total.isdigit() else None
    length = response.get("ContentLength")
    return int(length) if length is not None else None


async def _fetch_range(fs: Any, bucket: str, key: str, fd: int, index: int,
                       ranges: list[tuple[int, int]], size: int, prefix: _Prefix,
                       stop: threading.Event) -> None:
    """GET range ``index`` and ``pwrite`` it in place as it streams in."""
    start, end = ranges[index]
    extra = {"Range": f"bytes={start}-{end - 1}"} if end > start else {}
    response = await fs._call_s3("get_object", Bucket=bucket, Key=key, **extra)
    body = response["Body"]
    try:
        total = _content_total(response)
        if total is not None and total != size:
            raise ObjectMismatch(total, f"the object holds {total} bytes")
        offset = start
        while not stop.is_set():
            chunk = await body.read(READ_CHUNK)
            if not chunk:
                break
            if offset + len(chunk) > end:
                raise ObjectMismatch(None, f"range {start}-{end - 1} returned more bytes")
            view = memoryview(chunk)
            while view:
                written = os.pwrite(fd, view, offset)
                view = view[written:]
                offset += written
            prefix.wrote(index, offset - start)
        if stop.is_set():
            raise TransferStopped()
        if offset != end:
            raise ObjectMismatch(None, f"range {start}-{end - 1} ended after "
                                       f"{offset - start} bytes")
    finally:
        body.close()


def download_file(fs: Any, path: str, target: Path, size: int, part_size: int,
                  concurrency: int, advance: Advance) -> TransferResult:
    """Fetch ``path`` (``bucket/key``), which the manifest says holds ``size`` bytes, into
    ``target``; return the size and sha256 of what is on disk. A store object of another
    size raises :class:`ObjectMismatch`."""
    bucket, key, _ = fs.split_path(path)
    ranges = [(start, min(start + part_size, size)) for start in range(0, size, part_size)]
    ranges = ranges or [(0, 0)]  # an empty file is one plain GET
    prefix = _Prefix(ranges)
    stop = threading.Event()

    def fetch(index: int) -> None:
        try:
            if stop.is_set():
                raise TransferStopped()
            sync(fs.loop, _fetch_range, fs, bucket, key, fd, index, ranges, size, prefix, stop)
        except BaseException as exc:
            prefix.fail(exc)
            raise

    digest = hashlib.sha256()
    hashed = 0
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, size)
        with open(target, "rb", buffering=0) as reader, ThreadPoolExecutor(
                min(concurrency, len(ranges)), thread_name_prefix="s3-download") as pool:
            futures = [pool.submit(fetch, index) for index in range(len(ranges))]
            try:
                block = memoryview(bytearray(HASH_BLOCK))
                while hashed < size:
                    ready = prefix.wait_past(hashed)
                    while hashed < ready:
                        n = os.preadv(reader.fileno(), [block[:min(HASH_BLOCK, ready - hashed)]],
                                      hashed)
                        if not n:
                            raise OSError(f"{target} is shorter than its written prefix")
                        digest.update(block[:n])
                        hashed += n
                        advance(n)
                for future in futures:
                    future.result()  # the empty file's GET; errors of ranges past the end
            except BaseException:
                stop.set()
                for future in futures:
                    future.cancel()
                raise
            # leaving the block joins the workers: nothing writes to ``fd`` after it
    finally:
        os.close(fd)
    return TransferResult(hashed, digest.hexdigest())
