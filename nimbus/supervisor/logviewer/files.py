"""The files a logviewer may serve: regular files two directories below the log root,
``<topology-id>/<port>/<file>``, reached without following any link.

Whatever a request names, a file is opened only through directory descriptors, one
component at a time, each with ``O_NOFOLLOW``: no ``..`` or absolute path passes the
name checks (nimbus/state/worker_logs.py), and a symbolic link anywhere below the root
(one a tenant made in its own log directory, pointing at /etc/shadow or at another
topology's logs) is refused rather than followed, with no window between a check and the
open. A file is opened ``O_NONBLOCK`` and served only if it is a regular file: a FIFO
put in a log directory cannot hold a worker thread.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from nimbus.state.component_ids import is_topology_id
from nimbus.state.worker_logs import INDEX_SUFFIX, generation_of, index_name, parse_port

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: The most files listed of one slot's directory (a tenant may fill its own with names).
MAX_FILES_PER_DIR = 1024


class LogFileError(Exception):
    """A file that cannot be served; ``status`` is the HTTP status that says why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class LogFile:
    """One file of a slot's directory, as listed."""

    topology_id: str
    port: int
    name: str
    size: int
    modified: float
    inode: int

    @property
    def path(self) -> str:
        """``<topology-id>/<port>/<name>``: Storm's ``file`` parameter."""
        return f"{self.topology_id}/{self.port}/{self.name}"

    @property
    def generation(self) -> int | None:
        """0 for worker.log, n for worker.log.<n> (older), None for another file."""
        return generation_of(self.name)


@dataclass
class OpenLog:
    """A log file open for reading, and its time index if it has one."""

    fd: int
    size: int
    modified: float
    inode: int
    index_fd: int | None

    def read(self, offset: int, length: int) -> bytes:
        return os.pread(self.fd, max(0, length), max(0, offset))

    def close(self) -> None:
        for fd in (self.fd, self.index_fd):
            if fd is not None and fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)


def _refusal(exc: OSError, what: str) -> LogFileError:
    if exc.errno == errno.ELOOP:
        return LogFileError(403, f"{what} is a symbolic link, which the logviewer never "
                                 "follows")
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return LogFileError(404, f"{what} was not found on this host")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return LogFileError(403, f"{what} may not be read by the logviewer")
    return LogFileError(404, f"{what} cannot be read: {os.strerror(exc.errno or errno.EIO)}")


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


class LogRoot:
    """The worker log root of this supervisor (``storm.workers.artifacts.dir``)."""

    def __init__(self, root: Path):
        self.root = Path(root)

    @contextlib.contextmanager
    def _dir(self, *parts: str) -> Iterator[int]:
        """A descriptor of ``<root>/<parts...>``, each part opened without following a
        link. The root itself is the operator's (it may be a link they made)."""
        fds: list[int] = []
        try:
            try:
                fds.append(os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
            except OSError as exc:
                raise _refusal(exc, "the log root") from None
            for depth, part in enumerate(parts):
                try:
                    fds.append(os.open(part, _DIR_FLAGS, dir_fd=fds[-1]))
                except OSError as exc:
                    # O_DIRECTORY | O_NOFOLLOW on a link fails as "not a directory".
                    if exc.errno == errno.ENOTDIR and _is_link(part, fds[-1]):
                        exc = OSError(errno.ELOOP, os.strerror(errno.ELOOP))
                    raise _refusal(exc, "/".join(parts[:depth + 1])) from None
            yield fds[-1]
        finally:
            for fd in fds:
                os.close(fd)

    def open(self, topology_id: str, port: int, name: str) -> OpenLog:
        """Open ``<topology-id>/<port>/<name>`` (names already checked); LogFileError
        for a link, a missing file, anything but a regular file."""
        what = f"{topology_id}/{port}/{name}"
        with self._dir(topology_id, str(port)) as port_fd:
            try:
                fd = os.open(name, _FILE_FLAGS, dir_fd=port_fd)
            except OSError as exc:
                raise _refusal(exc, what) from None
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                os.close(fd)
                raise LogFileError(404, f"{what} is not a log file (not a regular file)")
            index_fd = None
            if not name.endswith(INDEX_SUFFIX):
                with contextlib.suppress(OSError):
                    index_fd = os.open(index_name(name), _FILE_FLAGS, dir_fd=port_fd)
                    if not stat.S_ISREG(os.fstat(index_fd).st_mode):
                        os.close(index_fd)
                        index_fd = None
            return OpenLog(fd, info.st_size, info.st_mtime, info.st_ino, index_fd)

    def topologies(self) -> list[str]:
        """The topologies with logs here (directories with a topology id's name)."""
        try:
            with self._dir() as root_fd, os.scandir(root_fd) as entries:
                return sorted(e.name for e in entries
                              if is_topology_id(e.name) and e.is_dir(follow_symlinks=False))
        except LogFileError as exc:
            if exc.status == 404:  # no worker wrote here yet
                return []
            raise

    def ports(self, topology_id: str) -> list[int]:
        """The slots of ``topology_id`` with logs here; [] if it has none."""
        try:
            with self._dir(topology_id) as topology_fd, os.scandir(topology_fd) as entries:
                found = []
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        with contextlib.suppress(ValueError):
                            found.append(parse_port(entry.name))
                return sorted(found)
        except LogFileError as exc:
            if exc.status == 404:
                return []
            raise

    def files(self, topology_id: str, port: int) -> list[LogFile]:
        """The regular files of a slot's directory but the time indexes: its
        worker.log first, then its older files (worker.log.1, .2, ...), then any
        other, by name; at most :data:`MAX_FILES_PER_DIR`."""
        out = []
        try:
            with self._dir(topology_id, str(port)) as port_fd, \
                    os.scandir(port_fd) as entries:
                for entry in entries:
                    if len(out) >= MAX_FILES_PER_DIR:
                        break
                    if entry.name.endswith(INDEX_SUFFIX) or \
                            not entry.is_file(follow_symlinks=False):
                        continue
                    with contextlib.suppress(FileNotFoundError):
                        info = entry.stat(follow_symlinks=False)
                        out.append(LogFile(topology_id, port, entry.name, info.st_size,
                                           info.st_mtime, info.st_ino))
        except LogFileError as exc:
            if exc.status == 404:
                return []
            raise

        def order(log_file: LogFile) -> tuple[int, int, str]:
            generation = log_file.generation
            return (0, generation, "") if generation is not None else (1, 0, log_file.name)
        return sorted(out, key=order)
