"""What a supervisor writes down about each worker's lease, for its next process.

A worker whose supervisor is killed runs on to the end of its lease and then, in a cgroup
of its own, freezes (nimbus/worker/lease.py). The supervisor's next process may thaw it
only with the proof a thaw always needs: the worker's assignment unchanged since the
round trip of its last renewal (its ``mzxid``), so its work cannot have moved away and
back meanwhile. A frozen worker cannot say which ``mzxid`` that was, so the supervisor
keeps it here, one file per slot under ``<supervisor-dir>/leases`` (its own directory,
mode 0600), with what identifies the worker.

The record is written *after* the line it describes went to the worker. A process killed
in between leaves an older ``mzxid`` than the worker's, and since every write to the
node raises its ``mzxid``, an older one never matches the node again: the worker is
killed, not thawed. Stale or missing records cost a restart, never a second copy.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

RECORDS_DIR = "leases"
MAX_RECORD_BYTES = 4096


@dataclass(frozen=True)
class LeaseRecord:
    """One worker, as its supervisor last renewed it."""

    pid: int
    topology_id: str
    port: int
    worker_index: int
    num_workers: int
    restarts: int
    cgroup: str                # the worker's cgroup directory (absolute path)
    assignment_version: int    # the mzxid its newest recorded renewal read
    code_version: int = 1      # the code version it runs (1 in records of earlier releases)

    def save(self, path: Path) -> None:
        """Write atomically (a reader sees the old record or this one), mode 0600."""
        path.parent.mkdir(mode=0o700, exist_ok=True)
        temporary = path.with_name(path.name + ".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(asdict(self), out, sort_keys=True)
        os.replace(temporary, path)


def record_path(supervisor_dir: Path, topology_id: str, port: int) -> Path:
    """Where the record of slot ``port`` running ``topology_id`` lives."""
    return supervisor_dir / RECORDS_DIR / f"{topology_id}-{port}.json"


def load_record(path: Path) -> LeaseRecord | None:
    """The record at ``path``, or None if there is none or it is not a whole one."""
    try:
        with open(path, "rb") as source:
            raw = source.read(MAX_RECORD_BYTES + 1)
    except OSError:
        return None
    try:
        if len(raw) > MAX_RECORD_BYTES:
            raise ValueError("overlong")
        fields = json.loads(raw)
        record = LeaseRecord(**fields)
        for name in ("pid", "port", "worker_index", "num_workers", "restarts",
                     "assignment_version"):
            value = getattr(record, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} is not a count")
        if not isinstance(record.topology_id, str) or not isinstance(record.cgroup, str):
            raise ValueError("topology or cgroup is not a string")
        if not isinstance(record.code_version, int) or isinstance(record.code_version, bool) \
                or record.code_version < 1:
            raise ValueError("code_version is not a version")
    except (ValueError, TypeError) as exc:
        log.warning("ignoring the lease record %s: %s", path, exc)
        return None
    return record


def remove_record(path: Path, pid: int | None) -> None:
    """Remove the record at ``path`` if it is the one of worker ``pid`` (a later worker
    of the same slot may have written its own there meanwhile)."""
    record = load_record(path)
    if record is not None and record.pid == pid:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def clear_records(directory: Path, keep: set[str]) -> None:
    """Remove every record under ``directory`` but those of the slots named in ``keep``
    (``<topology>-<port>``): at a start, once the workers left running are known."""
    if not directory.is_dir():
        return
    for path in directory.iterdir():
        if path.name.removesuffix(".json") not in keep:
            with contextlib.suppress(OSError):
                path.unlink()
