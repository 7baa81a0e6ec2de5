"""Where a worker's logs live, how their files are named and rotated, and the time index
kept beside each file (docs/logs.md).

Shared by the worker that writes them (:mod:`nimbus.worker.log_pump`), the supervisor
that keeps, sweeps and serves them (:mod:`nimbus.supervisor.log_dirs`,
:mod:`nimbus.supervisor.log_sweep`, :mod:`nimbus.supervisor.logviewer`) and so, through
the logviewer, ``nimbus-ha logs``. Storm's layout::

    <root>/<topology-id>/<port>/worker.log       what the worker writes now
                               /worker.log.1     the file before it, ... worker.log.<N>
                               /worker.log.idx   the time index of worker.log (and
                                                 worker.log.1.idx, ...)
    <root>/<topology-id>/log-meta.json           the supervisor's record of who may read
                                                 them (nimbus/supervisor/log_dirs.py)

``<root>`` is ``storm.workers.artifacts.dir`` (Storm's key; a relative path is taken
under ``storm.local.dir``), by default ``<storm.local.dir>/workers-artifacts``: outside
the worker directories, so that a worker's log outlives its directory.

**The time index.** A log file holds what the worker, its command and its JVM print, in
whatever format they print it, so its lines carry no time nimbus-ha could rely on.
Whoever writes the file (the log pump) appends to ``<file>.idx`` fixed records of
:data:`INDEX_RECORD`: ``(byte offset, epoch seconds)``, "the bytes from this offset on
were written at this time or later". A record is added for a write that comes at least
:data:`INDEX_MIN_GAP_S` after the last record and either :data:`INDEX_MIN_BYTES` bytes
or :data:`INDEX_SPAN_S` seconds after it, so every byte was written less than
:data:`INDEX_SPAN_S` after the time of the record before it (:func:`offset_since`).
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nimbus.state.component_ids import is_topology_id

ARTIFACTS_KEY = "storm.workers.artifacts.dir"
MAX_MB_KEY = "supervisor.worker.log.max.mb"
BACKUPS_KEY = "supervisor.worker.log.backups"
DEFAULT_ARTIFACTS = "workers-artifacts"
DEFAULT_MAX_MB = 100.0   # Storm's worker.xml rolls its worker.log at 100 MB ...
DEFAULT_BACKUPS = 9      # ... and keeps 9 of them
#: The smallest ``supervisor.worker.log.max.mb``: a file must hold a few lines.
MIN_MAX_BYTES = 1024
MAX_BACKUPS = 1000

LOG_FILE = "worker.log"
INDEX_SUFFIX = ".idx"
META_FILE = "log-meta.json"
_GENERATION = re.compile(r"worker\.log(?:\.([1-9][0-9]{0,3}))?")
# A file a logviewer may be asked for: a plain name, no path, no dot first.
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
MAX_FILE_PARAM = 512

INDEX_RECORD = struct.Struct("<qd")   # byte offset, epoch seconds (time.time())
INDEX_MIN_GAP_S = 1.0
INDEX_MIN_BYTES = 1024
INDEX_SPAN_S = 10.0
#: The most records one index holds: its file is rotated then, as if it were full (a
#: week and more of a line every 10 s), so that no index grows without end.
INDEX_MAX_RECORDS = 65536


@dataclass(frozen=True)
class LogSettings:
    """How a worker's log is rotated: at ``max_bytes``, keeping ``backups`` older files."""

    max_bytes: int = int(DEFAULT_MAX_MB * 1024 * 1024)
    backups: int = DEFAULT_BACKUPS

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any]) -> LogSettings:
        """``supervisor.worker.log.max.mb`` and ``...backups`` of a worker's (or a
        supervisor's) configuration; a missing or unusable value takes its default (the
        supervisor checks its own at start: nimbus/supervisor/identity.py)."""
        max_mb = conf.get(MAX_MB_KEY, DEFAULT_MAX_MB)
        backups = conf.get(BACKUPS_KEY, DEFAULT_BACKUPS)
        if isinstance(max_mb, bool) or not isinstance(max_mb, (int, float)) or max_mb <= 0:
            max_mb = DEFAULT_MAX_MB
        if isinstance(backups, bool) or not isinstance(backups, int) or backups < 0:
            backups = DEFAULT_BACKUPS
        return cls(max_bytes=max(MIN_MAX_BYTES, int(max_mb * 1024 * 1024)),
                   backups=min(backups, MAX_BACKUPS))


def log_root(conf: Mapping[str, Any]) -> Path:
    """The directory of every worker log of this host: ``storm.workers.artifacts.dir``
    (under ``storm.local.dir`` when relative), absolute."""
    local = Path(str(conf.get("storm.local.dir") or "storm-local")).expanduser().absolute()
    configured = conf.get(ARTIFACTS_KEY) or DEFAULT_ARTIFACTS
    return (local / Path(str(configured)).expanduser()).absolute()


def port_dir(root: Path, topology_id: str, port: int) -> Path:
    """``<root>/<topology-id>/<port>``: one slot's logs; ValueError for an id or a port
    that may not become a path part."""
    check_topology_id(topology_id)
    check_port(port)
    return root / topology_id / str(port)


def check_topology_id(topology_id: object) -> str:
    if not is_topology_id(topology_id):
        raise ValueError(f"not a topology id: {str(topology_id)[:100]!r}")
    return str(topology_id)


def check_port(port: object) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"not a port: {str(port)[:20]!r}")
    return port


def parse_port(text: str) -> int:
    """A port written in decimal, as a directory is named (no sign, no leading zero)."""
    if not text.isdigit() or text != str(int(text)):
        raise ValueError(f"not a port: {text[:20]!r}")
    return check_port(int(text))


def check_file_name(name: str) -> str:
    """A file name a logviewer may be asked for: letters, digits, ``_ . -``, not first a
    dot, at most 128 characters."""
    if not _FILE_NAME.fullmatch(name):
        raise ValueError(f"not a log file name: {name[:140]!r}")
    return name


def parse_log_path(text: str) -> tuple[str, int, str]:
    """``<topology-id>/<port>/<file>`` (the ``file`` parameter of Storm's logviewer) as
    (topology id, port, file name); ValueError saying what is wrong with anything else
    (an absolute path, ``..``, a NUL, an empty or extra part, a long name)."""
    if len(text) > MAX_FILE_PARAM:
        raise ValueError(f"a log path has at most {MAX_FILE_PARAM} characters")
    if "\0" in text:
        raise ValueError("a log path has no NUL character")
    if text.startswith("/"):
        raise ValueError("a log path is relative to the log root: <topology-id>/<port>/<file>")
    parts = text.split("/")
    if len(parts) != 3:
        raise ValueError(f"a log path is <topology-id>/<port>/<file>, got {text[:140]!r}")
    topology_id, port, name = parts
    return check_topology_id(topology_id), parse_port(port), check_file_name(name)


def generation_name(generation: int) -> str:
    """``worker.log`` (0, the current file) or ``worker.log.<n>`` (the n-th older)."""
    return LOG_FILE if generation == 0 else f"{LOG_FILE}.{generation}"


def generation_of(name: str) -> int | None:
    """0 for ``worker.log``, n for ``worker.log.<n>``, None for any other name."""
    match = _GENERATION.fullmatch(name)
    if match is None:
        return None
    return int(match.group(1)) if match.group(1) else 0


def index_name(name: str) -> str:
    return name + INDEX_SUFFIX


def generations(directory: Path) -> list[int]:
    """The generations of worker.log in ``directory`` (regular files only), oldest
    first: ``[3, 2, 1, 0]``."""
    found = []
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                generation = generation_of(entry.name)
                if generation is not None and entry.is_file(follow_symlinks=False):
                    found.append(generation)
    except OSError:
        return []
    return sorted(found, reverse=True)


# -- the time index -------------------------------------------------------------------------
def read_record(fd: int, number: int) -> tuple[int, float]:
    """Record ``number`` of the index open as ``fd``."""
    data = os.pread(fd, INDEX_RECORD.size, number * INDEX_RECORD.size)
    if len(data) != INDEX_RECORD.size:
        raise OSError(f"index record {number} is incomplete")
    offset, when = INDEX_RECORD.unpack(data)
    return int(offset), float(when)


def record_count(fd: int) -> int:
    """Complete records of the index open as ``fd`` (a torn last one is not counted)."""
    return os.fstat(fd).st_size // INDEX_RECORD.size


def offset_since(index_fd: int | None, cutoff: float, modified: float) -> int | None:
    """Where the bytes a worker wrote at ``cutoff`` (epoch seconds) or later begin in a
    log file whose time index is open as ``index_fd`` (None: it has none) and which was
    last modified at ``modified``; None when nothing in the file is that recent.

    Never too late: every byte written at or after ``cutoff`` is at the offset returned
    or after it. It may begin up to :data:`INDEX_SPAN_S` earlier: the bytes of a
    record's interval were written within that long after its time. Bytes before the
    first record (a file written before its index, a worker's first words before its
    pump started) count as written just before it. Without an index the whole file
    counts as written when it was last modified."""
    if modified < cutoff:
        return None
    count = record_count(index_fd) if index_fd is not None else 0
    if index_fd is None or count == 0:
        return 0
    # The last record at or before the cutoff: its interval may hold bytes written at
    # or after it. Binary search: an index holds up to INDEX_MAX_RECORDS records.
    low, high = 0, count - 1
    if read_record(index_fd, 0)[1] > cutoff:
        return 0
    while low < high:
        middle = (low + high + 1) // 2
        if read_record(index_fd, middle)[1] <= cutoff:
            low = middle
        else:
            high = middle - 1
    offset, when = read_record(index_fd, low)
    if when + INDEX_SPAN_S > cutoff:
        return offset  # its interval may hold bytes written at or after the cutoff
    # Every byte of its interval was written before the cutoff: the next one begins it.
    return read_record(index_fd, low + 1)[0] if low + 1 < count else None
