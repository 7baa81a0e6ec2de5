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
declared size fails its CRC check when unpacked).
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import struct
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from nimbus.distribution.local_code import UnsafePathError

# The size of the writes the packer hands to its output (tarfile's stream record, 20 KiB);
# the input files are read 16 KiB at a time.
PACK_BLOCK = tarfile.RECORDSIZE * 2
# Bounds of the check (see the module docstring).
MAX_BUNDLE_ENTRIES = 100_000
MAX_NAME_BYTES = 4096
MAX_HEADER_BYTES = 1024 * 1024


class BundleError(ValueError):
    """A topology bundle is not an archive or holds an unsafe entry."""


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


def _scan(path: Path, max_bytes: int,
          max_entries: int = MAX_BUNDLE_ENTRIES) -> tuple[int, set[str]]:
    """Validate an archive; return its unpacked size and the names of its root files."""
    label = Path(path).name
    total = 0
    entries = 0
    roots: set[str] = set()

    def count(size: int) -> None:
        # Checked entry by entry, so a decompression bomb is stopped early.
        nonlocal total, entries
        entries += 1
        if entries > max_entries:
            raise BundleError(f"{label}: more than {max_entries} entries")
        total += size
        if total > max_bytes:
            raise BundleError(f"{label}: unpacks to more than {max_bytes} bytes")

    try:
        if zipfile.is_zipfile(path):
            with open(path, "rb") as raw:
                _zip_entry_count(raw, label, max_entries)
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
                            raise BundleError(f"{label}: entry {info.filename!r} is "
                                              "encrypted")
                        count(info.file_size)
                        root = _root_file(info.filename)
                        if root is not None and not info.is_dir():
                            roots.add(root)
        else:
            with open(path, "rb") as raw, _decompressed(raw) as stream, tarfile.open(
                    fileobj=_HeaderReader(stream, label), mode="r:") as tf:  # type: ignore[call-overload]
                while (member := tf.next()) is not None:
                    tf.members.clear()  # only this one matters: memory stays flat
                    _check_name(member.name, label)
                    if member.issym() or member.islnk():
                        raise BundleError(f"{label}: entry {member.name!r} is a link")
                    if not (member.isfile() or member.isdir()):
                        raise BundleError(f"{label}: entry {member.name!r} is not a file")
                    count(member.size)
                    root = _root_file(member.name)
                    if root is not None and member.isfile():
                        roots.add(root)
    except (tarfile.TarError, zipfile.BadZipFile, zlib.error, lzma.LZMAError, EOFError,
            OSError, struct.error, ValueError) as exc:
        if isinstance(exc, BundleError):
            raise
        raise BundleError(f"{label}: not a zip or tar archive, or a damaged one ({exc})") \
            from None
    return total, roots


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


def pack_directory_to(src: Path, out: BinaryIO) -> None:
    """Write a gzip'd tar of ``src`` (relative names, no symlinks) to ``out`` as a stream.

    Files are read and compressed piece by piece and ``out`` receives writes of
    ``PACK_BLOCK`` bytes (the last one adds what the compressor still held), so memory use
    does not depend on the bundle's size. ``out`` need not be seekable (a pipe will do).
    """
    src = Path(src)
    with tarfile.open(fileobj=out, mode="w|gz", bufsize=PACK_BLOCK) as tf:
        for full, rel in _bundle_files(src):
            tf.add(full, arcname=rel, recursive=False)


def pack_directory_file(src: Path, dest: Path) -> int:
    """Pack ``src`` into the file ``dest`` (see :func:`pack_directory_to`); returns its size."""
    dest = Path(dest)
    with open(dest, "wb") as out:
        pack_directory_to(src, out)
    return dest.stat().st_size


def pack_directory(src: Path) -> bytes:
    """:func:`pack_directory_to` into memory: for small bundles (tests, the demo) only.

    The CLI packs into a temporary file with :func:`pack_directory_file` instead.
    """
    buf = io.BytesIO()
    pack_directory_to(src, buf)
    return buf.getvalue()
