"""Topology bundles: packing a directory and checking an archive before it is accepted.

A bundle is a zip (a Storm jar is one) or a tar archive, possibly compressed. Nothing in
it may leave its directory: absolute names, ``..`` components, symlinks, hard links and
device files are refused, as is a file that is not an archive at all.
"""

from __future__ import annotations

import io
import lzma
import os
import tarfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from nimbus.local_code import UnsafePathError


class BundleError(ValueError):
    """A topology bundle is not an archive or holds an unsafe entry."""


def _check_name(name: str, archive: str) -> None:
    if not name or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise BundleError(f"{archive}: entry {name!r} has an absolute path")
    if ".." in PurePosixPath(name.replace("\\", "/")).parts:
        raise BundleError(f"{archive}: entry {name!r} leaves its directory")


def check_bundle(path: Path, max_bytes: int) -> int:
    """Validate an archive and return its unpacked size; raises BundleError."""
    label = Path(path).name
    total = 0

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
        else:
            with tarfile.open(path) as tf:
                for member in tf:
                    _check_name(member.name, label)
                    if member.issym() or member.islnk():
                        raise BundleError(f"{label}: entry {member.name!r} is a link")
                    if not (member.isfile() or member.isdir()):
                        raise BundleError(f"{label}: entry {member.name!r} is not a file")
                    count(member.size)
    except (tarfile.TarError, zipfile.BadZipFile, zlib.error, lzma.LZMAError, EOFError,
            OSError) as exc:
        raise BundleError(f"{label}: not a zip or tar archive, or a damaged one ({exc})") \
            from None
    return total


def pack_directory(src: Path) -> bytes:
    """A gzip'd tar of ``src`` with relative names; refuses symlinks inside it."""
    src = Path(src)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for root, dirs, files in os.walk(src):
            dirs.sort()
            for name in sorted(dirs + files):
                full = Path(root) / name
                rel = full.relative_to(src).as_posix()
                if full.is_symlink():
                    raise UnsafePathError(f"{src}: {rel} is a symlink; bundles hold plain files")
                if full.is_file():
                    tf.add(full, arcname=rel, recursive=False)
    return buf.getvalue()
