"""This host's copy of topology code: ``<storm.local.dir>/nimbus/stormdist/<topology-id>``.

A topology's directory exists only when its code is complete: every writer builds the
code in a temporary sibling and renames it into place (:func:`atomic_dir`), so a crash
never leaves a half-written copy that the nimbus would mistake for a complete one.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from nimbus.distribution.distributors import DistributorError
from nimbus.state.component_ids import TOPOLOGY_ID_RE

TEMP_PREFIX = ".incoming-"
CLUSTER_ID_FILE = "cluster-id"


def sha256_file(path: Path) -> str:
    """The sha256 of a file, read in 1 MiB blocks (hashlib releases the GIL on them)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


class UnsafePathError(DistributorError, ValueError):
    """A name or path would escape the directory it belongs to (a DistributorError, and
    still a ValueError as in 0.1)."""


def check_topology_id(topology_id: str) -> str:
    """Return ``topology_id`` if it is a well-formed id (``name-counter-time``)."""
    if not TOPOLOGY_ID_RE.match(topology_id or "") or ".." in topology_id:
        raise UnsafePathError(f"not a valid topology id: {topology_id!r}")
    return topology_id


def check_relative_path(relative: str) -> tuple[str, ...]:
    """The parts of a relative path; refuses empty, absolute and ``..`` paths."""
    if not relative or relative.startswith(("/", "\\")) or os.path.isabs(relative):
        raise UnsafePathError(f"absolute or empty path not allowed: {relative!r}")
    parts = Path(relative).parts
    if any(p in ("..", "") for p in parts):
        raise UnsafePathError(f"path leaves its directory: {relative!r}")
    return parts


def safe_join(base: Path, relative: str) -> Path:
    """``base / relative``, refusing absolute paths, ``..`` and symlinked components."""
    parts = check_relative_path(relative)
    base = base.resolve()
    target = base.joinpath(*parts)
    probe = base
    for part in parts:
        probe = probe / part
        if probe.is_symlink():
            raise UnsafePathError(f"path goes through a symlink: {relative!r}")
    if not str(target.resolve()).startswith(str(base) + os.sep):
        raise UnsafePathError(f"path leaves its directory: {relative!r}")
    return target


@contextlib.contextmanager
def atomic_dir(dest: Path) -> Iterator[Path]:
    """Yield a temporary directory that becomes ``dest`` only if the block succeeds.

    On an exception the temporary directory is removed and ``dest`` is left untouched.
    Code distributors use this in ``download`` so that ``dest`` is complete or absent.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX + dest.name + "-", dir=dest.parent))
    try:
        yield tmp
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def leftover_copies(meta_dir: Path, suffix: str,
                    code_dir: Path) -> Iterator[tuple[str, Path, Path]]:
    """(topology id, metafile, code directory) of each copy an earlier run left on disk.

    Distributors re-verify these at start-up. A metafile whose code is gone is deleted.
    """
    for metafile in sorted(Path(meta_dir).glob(f"*{suffix}")):
        topology_id = metafile.name[: -len(suffix)]
        code = Path(code_dir) / topology_id
        if code.is_dir():
            yield topology_id, metafile, code
        else:
            metafile.unlink(missing_ok=True)


def discard_copy(metafile: Path, code: Path) -> None:
    """Delete a copy that failed verification, so that the code sync fetches a good one."""
    shutil.rmtree(code, ignore_errors=True)
    metafile.unlink(missing_ok=True)


def list_files(root: Path) -> list[Path]:
    """Regular files under ``root`` (relative paths, sorted); symlinks are refused."""
    out = []
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            raise UnsafePathError(f"symlink in topology code: {path.relative_to(root)}")
        if path.is_file():
            out.append(path.relative_to(root))
    return out


class _Pinned:
    """A directory held open: while it is, its inode cannot be given to another, so the
    same device and inode number at the same path mean the same directory (a file
    system reuses the inode of a directory wiped and made again at once)."""

    def __init__(self, path: Path):
        self._fd = -1  # (closed by __del__ even if the open below fails)
        self._fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        got = os.fstat(self._fd)
        self.identity = (got.st_dev, got.st_ino)

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        self.close()


class LocalCodeStore:
    """The directory of complete topology copies on this host."""

    #: A listing is kept only if the directory's last change was at least this much older
    #: than the listing: a file system stamps changes with a coarse clock (a few ms), so
    #: a change made during a listing could otherwise leave the mtime as it was.
    QUIET_NS = 100_000_000

    def __init__(self, local_dir: Path):
        self.root = Path(local_dir) / "nimbus" / "stormdist"
        self.root.mkdir(parents=True, exist_ok=True)
        self._sweep_temporaries()
        # ((inode, mtime) of the directory, or None if it was not quiet then; the ids
        # listed; time.monotonic() of the listing; the directory listed): topologies().
        self._listing: tuple[tuple[int, int] | None, set[str], float, _Pinned] | None = None
        self._listing_lock = threading.Lock()  # the code sync's and the cycle's threads

    def _sweep_temporaries(self) -> None:
        # Leftovers of a crash during a download or a submit are never complete copies.
        for path in self.root.glob(TEMP_PREFIX + "*"):
            shutil.rmtree(path, ignore_errors=True)

    def path(self, topology_id: str) -> Path:
        return self.root / check_topology_id(topology_id)

    def claim(self, cluster_id: str) -> str | None:
        """Mark this store as holding code of ``cluster_id``.

        Returns None when the store is this cluster's (or empty, or unmarked, as stores
        made by earlier releases are), and otherwise the id of the cluster whose code it
        holds: that code must not be mistaken for code of removed topologies.
        """
        marker = self.root.parent / CLUSTER_ID_FILE
        try:
            previous = marker.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            previous = ""
        if previous and previous != cluster_id and self.topologies():
            return previous
        marker.write_text(cluster_id + "\n", encoding="utf-8")
        return None

    def has(self, topology_id: str) -> bool:
        """Whether the complete copy of ``topology_id`` is here (one stat). A copy found
        is added to the kept listing: callers of ``topologies(max_age_s)`` stat only
        what was added since they last asked."""
        check_topology_id(topology_id)
        if not os.path.isdir(os.path.join(self.root, topology_id)):
            return False
        with self._listing_lock:
            if self._listing is not None:
                self._listing[1].add(topology_id)
        return True

    def topologies(self, max_age_s: float = 0.0) -> set[str]:
        """Ids of every complete copy held here: one directory listing (no stat per
        entry where the file system reports entry types), however many there are.

        The last listing is answered again while the directory's inode and mtime are
        those it had then (one stat): every copy is added by a rename into this
        directory and removed from it, which sets its mtime, whoever does it (a
        distributor's download, an operator wiping the disk).

        ``max_age_s`` > 0 also answers a listing at most that old when the directory
        changed since: it may lack copies added since, which a caller checks with
        :meth:`has`, and hold copies removed since by anyone but this store's
        :meth:`remove` (an operator's deletion is then seen that much later; a directory
        wiped and made again, or replaced, is listed at once: the one listed is held open
        meanwhile, so its inode number cannot come back). A leader
        taking submissions changes the directory several times a second, and a listing
        of 10,000 copies costs milliseconds at each of its checks.
        """
        try:
            stat = os.stat(self.root)
        except (FileNotFoundError, NotADirectoryError):
            return set()
        key = (stat.st_dev, stat.st_ino, stat.st_mtime_ns)
        with self._listing_lock:
            kept = self._listing
            if kept is not None and (kept[0] == key or (
                    max_age_s > 0 and time.monotonic() - kept[2] <= max_age_s
                    and kept[3].identity == (stat.st_dev, stat.st_ino))):
                return set(kept[1])
        started, listed_at = time.time_ns(), time.monotonic()
        try:
            pinned = _Pinned(self.root)
            with os.scandir(self.root) as entries:
                ids = {e.name for e in entries
                       if e.is_dir() and not e.name.startswith(TEMP_PREFIX)}
        except (FileNotFoundError, NotADirectoryError):
            return set()
        # Kept by its key only if the directory was quiet: a file system stamps changes
        # with a coarse clock, so a change made during the listing could leave the
        # mtime as it was. Kept by its age always.
        quiet = started - stat.st_mtime_ns >= self.QUIET_NS
        with self._listing_lock:
            before, self._listing = self._listing, (
                key if quiet else None, set(ids), listed_at, pinned)
        if before is not None:
            before[3].close()
        return ids

    def replaced(self) -> bool:
        """Whether the directory this store listed last is no longer its directory (wiped
        whole, or replaced), or none was listed yet: one stat. A caller that keeps what
        listings and stats told it (the code sync by change) lists again when it is."""
        try:
            got = os.stat(self.root)
        except OSError:  # gone, or unreadable: the caller's listing says which
            return True
        with self._listing_lock:
            return self._listing is None or \
                self._listing[3].identity != (got.st_dev, got.st_ino)

    def remove(self, topology_id: str) -> None:
        shutil.rmtree(self.path(topology_id), ignore_errors=True)
        with self._listing_lock:
            if self._listing is not None:
                # A listing answered by its age must not name a copy this store removed.
                self._listing[1].discard(topology_id)

    def resolve_served_file(self, requested: str) -> Path:
        """Map a file a peer asks for (``<id>/<file>`` or an absolute path) to a file here."""
        requested = str(requested)
        if os.path.isabs(requested):
            # An assignment's master_code_dir names the leader's own path; every nimbus
            # serves the same <id>/<file> from its own store, wherever that lives.
            marker = f"{os.sep}nimbus{os.sep}stormdist{os.sep}"
            if marker not in requested:
                raise UnsafePathError(f"{requested!r} is not topology code held by this nimbus")
            requested = requested.rsplit(marker, 1)[1]
        target = safe_join(self.root, requested)
        check_topology_id(Path(requested).parts[0])
        if not target.is_file():
            raise FileNotFoundError(f"no such file: {requested}")
        return target
