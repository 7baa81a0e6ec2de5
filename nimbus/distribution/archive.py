"""Topology bundles: packing a directory and checking an archive before it is accepted.

A bundle is a zip (a Storm jar is one) or a tar archive, possibly compressed (gzip, bzip2,
xz). Nothing in it may leave its directory: absolute names, ``..`` components, symlinks,
hard links, device files and fifos are refused, as is a file that is not an archive at
all. A submitted bundle must also hold ``topology.py`` (a pipeline) or ``topology.yaml``
(a process topology) at its root (docs/runtime.md); :func:`bundle_kind` checks that.

The check reads headers only and is bounded whatever the archive claims: at most
``MAX_BUNDLE_ENTRIES`` entries (a zip's are counted in its central directory before it
is parsed), names of at most ``MAX_NAME_BYTES``, no single header read above
``MAX_HEADER_BYTES`` (a tar's long-name or pax header can claim gigabytes that compress
to nothing), and the declared sizes add up to at most ``max_bytes`` (a decompression
bomb is refused at the entry that crosses it; a zip entry that inflates beyond its
declared size fails its CRC check when unpacked). :func:`check_tar_stream` runs the same
check over a tar that is still arriving.

A directory is packed as a *stored* (uncompressed) tar of its regular files, made while
it is sent (:func:`directory_pieces`): the headers are built here, and a file's bytes go
from the page cache to the socket with ``sendfile``. Nothing is compressed, because
compressing costs more time than it saves: zlib at its fastest level deflates 50-90 MB/s
on one core of the machines measured (issue 21), less than a gigabit link carries, and
the large members of a bundle are usually compressed already (jars, wheels, zips,
parquet), so deflating them again is pure loss. An archive given to ``submit`` is sent
as it is. Every reader of bundles (the leader's check, the supervisor's unpack) reads a
stored tar like any other tar.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import stat
import struct
import tarfile
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from nimbus.distribution.local_code import UnsafePathError

# The size of the writes pack_directory_to hands to its output (tarfile's stream record,
# 20 KiB), whatever the sizes of the files.
PACK_BLOCK = tarfile.RECORDSIZE * 2
# Files up to this size travel inside the header's piece (one send for many small files);
# larger ones as a FileSlice, sent from the page cache.
INLINE_FILE_BYTES = 64 * 1024
# Bounds of the check (see the module docstring).
MAX_BUNDLE_ENTRIES = 100_000
MAX_NAME_BYTES = 4096
MAX_HEADER_BYTES = 1024 * 1024


class BundleError(ValueError):
    """A topology bundle is not an archive or holds an unsafe entry."""


class DamagedArchiveError(BundleError):
    """Not a zip or tar archive at all, or a damaged one (rather than one with an unsafe
    entry): what a tar check says of a zip, too."""


def _check_name(name: str, archive: str) -> None:
    if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES or any(
            len(part.encode("utf-8", "surrogateescape")) > 255 for part in name.split("/")):
        raise BundleError(f"{archive}: entry {name[:60]!r}... has a name longer than a "
                          f"file system takes ({MAX_NAME_BYTES} bytes, 255 per component)")
    if "\0" in name:
        raise BundleError(f"{archive}: entry {name!r} has a NUL byte in its name")
    if not name or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise BundleError(f"{archive}: entry {name!r} has an absolute path")
    if ".." in PurePosixPath(name.replace("\\", "/")).parts:
        raise BundleError(f"{archive}: entry {name!r} leaves its directory")


class _HeaderReader(io.RawIOBase):
    """The decompressed tar stream, for tarfile: any single read above MAX_HEADER_BYTES
    is refused. tarfile reads headers (and long-name and pax data) with read() and skips
    file contents with seek(), so only a header can ask for that much."""

    def __init__(self, stream: BinaryIO, label: str):
        super().__init__()
        self._stream = stream
        self._label = label

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0 or size > MAX_HEADER_BYTES:
            raise BundleError(f"{self._label}: an entry header claims more than "
                              f"{MAX_HEADER_BYTES} bytes (a long name or pax header bomb?)")
        return self._stream.read(size)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._stream.seek(offset, whence)

    def tell(self) -> int:
        return self._stream.tell()


def _decompressed(raw: BinaryIO) -> BinaryIO:
    """``raw`` (an open file) decompressed by its magic number: gzip, bzip2, xz or none."""
    magic = raw.read(6)
    raw.seek(0)
    if magic[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if magic[:3] == b"BZh":
        return bz2.BZ2File(raw)  # type: ignore[return-value]
    if magic == b"\xfd7zXZ\x00":
        return lzma.LZMAFile(raw)  # type: ignore[return-value]
    return raw


# What zipfile can unpack: stored, deflate, bzip2, lzma.
_ZIP_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)
_EOCD = struct.Struct("<4s4H2LH")          # end of central directory
_ZIP64_LOCATOR = struct.Struct("<4sLQL")
_ZIP64_EOCD = struct.Struct("<4sQ2H2L4Q")
_CENTRAL_ENTRY = struct.Struct("<4s4B4HL2L5H2L")


def _zip_entry_count(f: BinaryIO, label: str, limit: int) -> None:
    """Count a zip's central-directory records without parsing them; BundleError beyond
    ``limit`` (zipfile would build an object for every one before anything is checked).
    A directory that cannot be found or walked is left to zipfile to report."""
    f.seek(0, io.SEEK_END)
    size = f.tell()
    tail_start = max(0, size - (_EOCD.size + 65535))
    f.seek(tail_start)
    tail = f.read()
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < _EOCD.size:
        return
    _sig, _disk, _cd_disk, _here, total, cd_size, cd_offset, _comment = _EOCD.unpack_from(
        tail, at)
    eocd_at = tail_start + at
    locator_at = at - _ZIP64_LOCATOR.size
    if locator_at >= 0 and tail[locator_at:locator_at + 4] == b"PK\x06\x07":
        _sig, _disk, zip64_at, _disks = _ZIP64_LOCATOR.unpack_from(tail, locator_at)
        f.seek(zip64_at)
        record = f.read(_ZIP64_EOCD.size)
        if len(record) == _ZIP64_EOCD.size and record[:4] == b"PK\x06\x06":
            (_sig, _rsize, _made, _needed, _disk, _cd_disk, _here, total, cd_size,
             cd_offset) = _ZIP64_EOCD.unpack(record)
            eocd_at = zip64_at
    if total > limit:
        raise BundleError(f"{label}: more than {limit} entries ({total} by its central "
                          "directory)")
    # Data may precede the archive (a self-extracting zip): zipfile allows for it too.
    start = eocd_at - cd_size
    if start < 0:
        return
    f.seek(start)
    count = 0
    while f.tell() < eocd_at:
        header = f.read(_CENTRAL_ENTRY.size)
        if len(header) < _CENTRAL_ENTRY.size or header[:4] != b"PK\x01\x02":
            return
        fields = _CENTRAL_ENTRY.unpack(header)
        count += 1
        if count > limit:
            raise BundleError(f"{label}: more than {limit} entries")
        f.seek(fields[12] + fields[13] + fields[14], io.SEEK_CUR)


# What a worker can run (docs/runtime.md): one of these files at the bundle's root.
PIPELINE_FILE = "topology.py"
PROCESS_FILE = "topology.yaml"
PIPELINE, PROCESS = "pipeline", "process"
NO_KIND_MESSAGE = (f"bundle has neither {PIPELINE_FILE} (a pipeline) nor {PROCESS_FILE} "
                   "(a process topology) at its root")


def _root_file(name: str) -> str | None:
    """The file name if archive entry ``name`` sits at the root (``./x`` counts), else None."""
    parts = [p for p in PurePosixPath(name.replace("\\", "/")).parts if p != "."]
    return parts[0] if len(parts) == 1 else None


class _Tally:
    """Counts a bundle's entries and declared bytes, refusing either past its limit (entry
    by entry, so that a decompression bomb is stopped early), and notes its root files."""

    def __init__(self, label: str, max_bytes: int, max_entries: int):
        self.label = label
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.total = 0
        self.entries = 0
        self.roots: set[str] = set()

    def count(self, size: int) -> None:
        self.entries += 1
        if self.entries > self.max_entries:
            raise BundleError(f"{self.label}: more than {self.max_entries} entries")
        self.total += size
        if self.total > self.max_bytes:
            raise BundleError(f"{self.label}: unpacks to more than {self.max_bytes} bytes")


def _scan_zip(raw: BinaryIO, tally: _Tally) -> None:
    label = tally.label
    _zip_entry_count(raw, label, tally.max_entries)
    with zipfile.ZipFile(raw) as zf:
        for info in zf.infolist():
            _check_name(info.filename, label)
            mode = (info.external_attr >> 16) & 0o170000
            if mode == 0o120000:
                raise BundleError(f"{label}: entry {info.filename!r} is a symlink")
            if mode not in (0, 0o100000, 0o040000):  # none, a file, a directory
                raise BundleError(f"{label}: entry {info.filename!r} is not a "
                                  f"file (mode {mode:o})")
            if info.compress_type not in _ZIP_METHODS:
                raise BundleError(f"{label}: entry {info.filename!r} uses "
                                  f"compression method {info.compress_type}, "
                                  "which cannot be unpacked")
            if info.flag_bits & 0x1:
                raise BundleError(f"{label}: entry {info.filename!r} is encrypted")
            tally.count(info.file_size)
            root = _root_file(info.filename)
            if root is not None and not info.is_dir():
                tally.roots.add(root)


def _scan_tar(raw: BinaryIO, tally: _Tally) -> None:
    label = tally.label
    with _decompressed(raw) as stream, tarfile.open(
            fileobj=_HeaderReader(stream, label), mode="r:") as tf:  # type: ignore[call-overload]
        while (member := tf.next()) is not None:
            tf.members.clear()  # only this one matters: memory stays flat
            _check_name(member.name, label)
            if member.issym() or member.islnk():
                raise BundleError(f"{label}: entry {member.name!r} is a link")
            if not (member.isfile() or member.isdir()):
                raise BundleError(f"{label}: entry {member.name!r} is not a file")
            tally.count(member.size)
            root = _root_file(member.name)
            if root is not None and member.isfile():
                tally.roots.add(root)


# What a damaged archive (or one of another kind) raises from zipfile, tarfile and the
# decompressors.
_DAMAGED = (tarfile.TarError, zipfile.BadZipFile, zlib.error, lzma.LZMAError, EOFError,
            OSError, struct.error, ValueError)


def _damaged(label: str, exc: BaseException) -> DamagedArchiveError:
    return DamagedArchiveError(f"{label}: not a zip or tar archive, or a damaged one ({exc})")


def _scan(path: Path, max_bytes: int,
          max_entries: int = MAX_BUNDLE_ENTRIES) -> tuple[int, set[str]]:
    """Validate an archive; return its unpacked size and the names of its root files."""
    tally = _Tally(Path(path).name, max_bytes, max_entries)
    try:
        # A zip first, as the supervisor's unpack decides: what it unpacks is checked.
        is_zip = zipfile.is_zipfile(path)
        with open(path, "rb") as raw:
            if is_zip:
                _scan_zip(raw, tally)
            else:
                _scan_tar(raw, tally)
    except _DAMAGED as exc:
        if isinstance(exc, BundleError):
            raise
        raise _damaged(tally.label, exc) from None
    return tally.total, tally.roots


def check_tar_stream(raw: BinaryIO, label: str, max_bytes: int,
                     max_entries: int = MAX_BUNDLE_ENTRIES) -> int:
    """:func:`check_bundle` for a tar (plain or compressed) read from ``raw``, which may
    still be arriving: ``raw`` is read from its start, with forward seeks over file
    contents, and its reads may block. Returns the unpacked size.

    Raises BundleError at the first unsafe entry, and DamagedArchiveError for anything
    that is not a tar (a zip among others: the caller decides about those once the whole
    file is there, as :func:`check_bundle` does).
    """
    tally = _Tally(label, max_bytes, max_entries)
    try:
        _scan_tar(raw, tally)
    except _DAMAGED as exc:
        if isinstance(exc, BundleError):
            raise
        raise _damaged(label, exc) from None
    return tally.total


def check_bundle(path: Path, max_bytes: int, max_entries: int = MAX_BUNDLE_ENTRIES) -> int:
    """Validate an archive and return its unpacked size; raises BundleError.

    This checks safety only; :func:`bundle_kind` also checks that a worker can run it.
    """
    return _scan(path, max_bytes, max_entries)[0]


def bundle_kind(path: Path, max_bytes: int) -> str:
    """Validate an archive as :func:`check_bundle` does and return what it holds:
    ``"pipeline"`` (``topology.py`` at its root) or ``"process"`` (``topology.yaml``).

    Raises BundleError for an unsafe or damaged archive, for one with neither file at its
    root (a plain Storm jar: no worker could run it) and for one with both (which of the
    two would run is not obvious to whoever reads the bundle).
    """
    _total, roots = _scan(path, max_bytes)
    has_pipeline, has_process = PIPELINE_FILE in roots, PROCESS_FILE in roots
    if has_pipeline and has_process:
        raise BundleError(f"bundle has both {PIPELINE_FILE} and {PROCESS_FILE} at its root; "
                          "keep the one that should run")
    if has_pipeline:
        return PIPELINE
    if has_process:
        return PROCESS
    raise BundleError(NO_KIND_MESSAGE)


# -- packing --------------------------------------------------------------------------------
@dataclass(frozen=True)
class FileSlice:
    """The first ``size`` bytes of the open ``file``: a piece an uploader sends with
    ``sendfile``, from ``file``'s start. ``name`` is for messages."""

    file: BinaryIO
    size: int
    name: str = field(default="")


#: A run of a bundle's bytes: literal bytes, or a file's contents.
Piece = bytes | FileSlice


class ChangedWhilePackedError(BundleError):
    """A file of the directory changed (shrank, or went away) while it was packed."""


def _bundle_files(src: Path) -> Iterator[tuple[Path, str]]:
    """(path, relative name) of each file under ``src``, sorted; refuses symlinks."""
    for root, dirs, files in os.walk(src):
        dirs.sort()
        for name in sorted(dirs + files):
            full = Path(root) / name
            rel = full.relative_to(src).as_posix()
            if full.is_symlink():
                raise UnsafePathError(f"{src}: {rel} is a symlink; bundles hold plain files")
            if full.is_file():
                yield full, rel


def _member_header(rel: str, st: os.stat_result) -> bytes:
    """The tar header block(s) of a regular file: pax where a name or size needs it.
    Owner fields stay empty: a bundle does not carry its submitter's user names, and
    the supervisor's unpack ignores ownership anyway."""
    info = tarfile.TarInfo(rel)
    info.size = st.st_size
    info.mtime = int(st.st_mtime)
    info.mode = stat.S_IMODE(st.st_mode)
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


# zipfile.is_zipfile, which the leader's check and the supervisor's unpack ask before
# anything else, looks for a zip's end record anywhere in a file's last 64 KiB + 22
# bytes: a stored tar whose last member is a zip (a jar, a wheel) would pass for that
# zip. So a packed tar ends with more zeros than that window (readers stop at the first
# two zero blocks; the rest is padding to them).
_ZIP_END_WINDOW = (1 << 16) + 22


def _tar_end(offset: int) -> bytes:
    """What ends a tar written up to ``offset``: the two zero blocks of its end, zeros
    over zipfile's search window, then zeros to a whole record."""
    zeros = 2 * tarfile.BLOCKSIZE + _ZIP_END_WINDOW
    return bytes(zeros + (-(offset + zeros) % tarfile.RECORDSIZE))


def _open_member(full: Path, rel: str, src: Path) -> BinaryIO:
    # O_NOFOLLOW: a file swapped for a symlink after the walk is refused, not followed.
    fd = os.open(full, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    handle = os.fdopen(fd, "rb", buffering=0)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        handle.close()
        raise UnsafePathError(f"{src}: {rel} is no longer a regular file")
    return handle  # type: ignore[return-value]


def _read_exactly(handle: BinaryIO, size: int, name: str) -> bytes:
    data = b""
    while len(data) < size:
        more = handle.read(size - len(data))
        if not more:
            raise ChangedWhilePackedError(f"{name} shrank while it was packed ({len(data)} "
                                          f"of {size} bytes); submit again")
        data += more
    return data


def directory_pieces(src: Path) -> Iterator[Piece]:
    """The stored tar of ``src``'s regular files (relative names, sorted; symlinks
    refused) as it is made: header blocks as bytes, with a small file's contents
    inline, and each larger file as a :class:`FileSlice` of its open file.

    Close the iterator if it is not consumed to its end (it holds the current file
    open). A file that shrinks while it is packed is :class:`ChangedWhilePackedError`
    (raised here, or by whoever sends a FileSlice and finds it short); one that grows is
    cut at the size its header gave.
    """
    src = Path(src)
    offset = 0
    for full, rel in _bundle_files(src):
        with _open_member(full, rel, src) as handle:
            st = os.fstat(handle.fileno())
            header = _member_header(rel, st)
            padding = bytes(-st.st_size % tarfile.BLOCKSIZE)
            if st.st_size <= INLINE_FILE_BYTES:
                yield header + _read_exactly(handle, st.st_size, str(full)) + padding
            else:
                yield header
                yield FileSlice(handle, st.st_size, str(full))
                if padding:
                    yield padding
            offset += len(header) + st.st_size + len(padding)
    yield _tar_end(offset)


def packed_size(src: Path) -> int:
    """The size of the stored tar :func:`directory_pieces` makes of ``src`` as it is now;
    walks the directory (refusing symlinks) but reads no file."""
    src = Path(src)
    offset = 0
    for full, rel in _bundle_files(src):
        st = full.stat()
        offset += len(_member_header(rel, st)) + st.st_size + (-st.st_size % tarfile.BLOCKSIZE)
    return offset + len(_tar_end(offset))


def bundle_pieces(source: Path | bytes) -> Iterator[Piece]:
    """The bytes to upload for ``source``: a directory packed by :func:`directory_pieces`
    as they are sent, a file (an archive) as it is, ``bytes`` as they are."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        yield bytes(source)
        return
    source = Path(source)
    if source.is_dir():
        yield from directory_pieces(source)
        return
    with open(source, "rb") as handle:
        yield FileSlice(handle, os.fstat(handle.fileno()).st_size, str(source))


class PieceReader(io.RawIOBase):
    """Pieces as a readable stream: each read is filled across pieces (a FileSlice is
    read from its file) until it is full or the pieces end. Closing it closes the
    pieces' iterator."""

    def __init__(self, pieces: Iterable[Piece]):
        super().__init__()
        self._pieces = iter(pieces)
        self._bytes = memoryview(b"")
        self._slice: FileSlice | None = None
        self._left = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        out = memoryview(buffer).cast("B")
        filled = 0
        while filled < len(out):
            if self._bytes:
                n = min(len(self._bytes), len(out) - filled)
                out[filled:filled + n] = self._bytes[:n]
                self._bytes = self._bytes[n:]
            elif self._slice is not None:
                want = min(self._left, len(out) - filled)
                n = self._slice.file.readinto(out[filled:filled + want])  # type: ignore[attr-defined]
                if not n:
                    raise ChangedWhilePackedError(
                        f"{self._slice.name} shrank while it was packed; submit again")
                self._left -= n
                if not self._left:
                    self._slice = None
            else:
                piece = next(self._pieces, None)
                if piece is None:
                    break
                if isinstance(piece, FileSlice):
                    self._slice, self._left = (piece, piece.size) if piece.size else (None, 0)
                else:
                    self._bytes = memoryview(piece)
                continue
            filled += n
        return filled

    def close(self) -> None:
        close = getattr(self._pieces, "close", None)
        if close is not None:
            close()  # a generator: its open file is closed now, not whenever it is collected
        super().close()


def pack_directory_to(src: Path, out: BinaryIO) -> None:
    """Write the stored tar of ``src`` (see :func:`directory_pieces`) to ``out``.

    ``out`` receives writes of ``PACK_BLOCK`` bytes (the last one shorter), so memory use
    does not depend on the bundle's size. ``out`` need not be seekable (a pipe will do).
    """
    with PieceReader(directory_pieces(Path(src))) as reader:
        while block := reader.read(PACK_BLOCK):
            out.write(block)


def pack_directory_file(src: Path, dest: Path) -> int:
    """Pack ``src`` into the file ``dest`` (see :func:`pack_directory_to`); returns its size."""
    dest = Path(dest)
    with open(dest, "wb") as out:
        pack_directory_to(src, out)
    return dest.stat().st_size


def pack_directory(src: Path) -> bytes:
    """:func:`pack_directory_to` into memory: for small bundles (tests, the demo) only.

    ``nimbus-ha submit`` packs a directory while it uploads it instead.
    """
    buf = io.BytesIO()
    pack_directory_to(src, buf)
    return buf.getvalue()
