"""Each worker in a cgroup (v2) of its own, so that nothing it starts outlives it.

A worker runs in a process group of its own, and stopping it signals the group. A
command that calls ``setsid()`` or double-forks (a daemon) leaves the group and would
keep running after its work has moved elsewhere. A cgroup cannot be left that way: the
supervisor makes ``<cgroup2>/nimbus-ha/<supervisor-id>/<topology>-<port>``, starts the
worker inside it, and ends every process in it with ``cgroup.kill`` (Linux 5.14+) when
the worker stops; the worker does the same when its lease runs out
(``NIMBUS_HA_CGROUP`` names its cgroup).

Where no cgroup v2 hierarchy is mounted, or it cannot be written (not root, a container
without delegation), :func:`worker_cgroups` says why and the supervisor logs it at start:
workers are then stopped by their process groups only (docs/runtime.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path

from nimbus.worker_protocol.frozen_cgroup import clear_mark

log = logging.getLogger(__name__)

#: Names the worker's cgroup in its environment (the worker kills it on lease loss).
CGROUP_ENV = "NIMBUS_HA_CGROUP"


def unified_root(mounts: str = "/proc/mounts") -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup`` on a pure v2 host,
    ``/sys/fs/cgroup/unified`` in hybrid mode), or None."""
    try:
        lines = Path(mounts).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def kill_cgroup(path: Path) -> bool:
    """SIGKILL every process in the cgroup at ``path`` (``cgroup.kill``); False if that
    could not be done."""
    try:
        (path / "cgroup.kill").write_text("1")
        return True
    except OSError:
        return False


def is_frozen(path: Path) -> bool:
    """Whether the cgroup at ``path`` is asked to be frozen (its ``cgroup.freeze`` reads
    1): a worker whose lease ran out froze itself (nimbus/worker/lease.py)."""
    try:
        return (path / "cgroup.freeze").read_bytes().strip() == b"1"
    except OSError:
        return False


def thaw(path: Path) -> bool:
    """Thaw the cgroup at ``path``; False if that failed. Only after a renewal was written
    to every worker in it: a worker thawed without one must not run on."""
    try:
        (path / "cgroup.freeze").write_text("0")
    except OSError as exc:
        log.warning("cgroup %s not thawed: %s", path, exc)
        return False
    clear_mark(path)  # its reaper leaves (nimbus/worker/frozen.py)
    return True


def in_cgroup(path: Path, command: list[str]) -> list[str]:
    """``command`` run so that it joins the cgroup ``path`` before it executes: a shell
    writes its own pid into ``cgroup.procs`` and execs the command (no ``preexec_fn``,
    which is unsafe in a threaded process). The shell calls itself ``nimbus-ha`` (its
    ``$0``), which is how it signs what it prints if the command cannot be run."""
    return ["/bin/sh", "-c", 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"',
            "nimbus-ha", str(path), *command]


class WorkerCgroups:
    """The cgroups of one supervisor's workers, under ``base``."""

    def __init__(self, base: Path):
        self.base = base

    def path(self, name: str) -> Path:
        return self.base / name

    def make(self, name: str) -> Path:
        """A fresh, empty cgroup for a worker (one left by an earlier run is emptied)."""
        path = self.path(name)
        if path.is_dir():
            self.remove(path)
        path.mkdir(exist_ok=True)
        return path

    def remove(self, path: Path, timeout_s: float = 5.0) -> None:
        """Kill whatever is left in ``path``, then remove it (once the kernel has seen
        every process go); a cgroup still busy after ``timeout_s`` is left, logged."""
        kill_cgroup(path)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:  # EBUSY while processes are exiting
                if time.monotonic() >= deadline:
                    log.warning("cgroup %s not removed: %s", path, exc)
                    return
            time.sleep(0.05)



def worker_cgroups(supervisor_id: str) -> tuple[WorkerCgroups | None, str]:
    """(the supervisor's worker cgroups, "") where cgroups can be used; (None, why)
    otherwise."""
    root = unified_root()
    if root is None:
        return None, "no cgroup v2 hierarchy is mounted"
    base = root / "nimbus-ha" / supervisor_id
    try:
        base.mkdir(parents=True, exist_ok=True)
        probe = base / f".probe-{os.getpid()}"
        probe.mkdir(exist_ok=True)
        try:
            if not (probe / "cgroup.kill").exists():
                return None, "this kernel has no cgroup.kill (Linux 5.14 or later needed)"
        finally:
            with contextlib.suppress(OSError):
                probe.rmdir()
    except OSError as exc:
        return None, f"cannot make cgroups under {root}: {exc.strerror}"
    return WorkerCgroups(base), ""
