"""Topology bundles: packing a directory and checking an archive before it is accepted.

A bundle is a zip (a Storm jar is one) or a tar archive, possibly compressed. Nothing in
it may leave its directory: absolute names, ``..`` components, symlinks, hard links and
device files are refused, as is a file that is not an archive at all. A submitted bundle
must also hold ``topology.py`` (a pipeline) or ``topology.yaml`` (a process topology) at
its root (docs/runtime.md); :func:`bundle_kind` checks that.
"""

from __future__ import annotations

import io
import lzma
import os
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


class BundleError(ValueError):
    """A topology bundle is not an archive or holds an unsafe entry."""


def _check_name(name: str, archive: str) -> None:
    if not name or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise BundleError(f"{archive}: entry {name!r} has an absolute path")
    if ".." in PurePosixPath(name.replace("\\", "/")).parts:
        raise BundleError(f"{archive}: entry {name!r} leaves its directory")


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


def _scan(path: Path, max_bytes: int) -> tuple[int, set[str]]:
    """Validate an archive; return its unpacked size and the names of its root files."""
    label = Path(path).name
    total = 0
    roots: set[str] = set()

    def count(size: int) -> None:
        # Checked entry by entry, so a decompression bomb is stopped early.
        nonlocal total
        total += size
        if total > max_bytes:
            raise BundleError(f"{label}: unpacks to more than {max_bytes} bytes")

    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zf:
                for info in zf.infolist():
                    _check_name(info.filename, label)
                    mode = (info.external_attr >> 16) & 0o170000
                    if mode == 0o120000:
                        raise BundleError(f"{label}: entry {info.filename!r} is a symlink")
                    count(info.file_size)
                    root = _root_file(info.filename)
                    if root is not None and not info.is_dir():
                        roots.add(root)
        else:
            with tarfile.open(path) as tf:
                for member in tf:
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
            OSError) as exc:
        raise BundleError(f"{label}: not a zip or tar archive, or a damaged one ({exc})") \
            from None
    return total, roots


def check_bundle(path: Path, max_bytes: int) -> int:
    """Validate an archive and return its unpacked size; raises BundleError.

    This checks safety only; :func:`bundle_kind` also checks that a worker can run it.
    """
    return _scan(path, max_bytes)[0]


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
