"""Worker logs kept for ``logviewer.cleanup.age.mins`` once no worker writes them, then
removed: the supervisor's log sweep (docs/logs.md).

A slot's log directory (``<root>/<topology-id>/<port>``, nimbus/state/worker_logs.py)
stays on the host after its worker is gone, whatever the reason: the topology moved
away, was rebalanced, killed, or the worker crashed and its work went elsewhere. The
thread ``supervisor-log-sweep`` (a :class:`~nimbus.background_loop.BackgroundLoop`)
removes a directory that no worker of this supervisor uses (``in_use()``: running,
assigned here, or left by its earlier process) once nothing in it is younger than the
retention: its files' and its own modification times (the supervisor touches it when a
worker starts and ends there, so the retention counts from the worker's end). A
topology's directory goes with its last slot, its record of readers with it.

Never through a link: a symbolic link where a directory should be is left alone (only
the directory it sits in is removed, without following it).
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

from nimbus.background_loop import BackgroundLoop
from nimbus.state.component_ids import is_topology_id
from nimbus.state.worker_logs import META_FILE

log = logging.getLogger(__name__)

RETENTION_KEY = "logviewer.cleanup.age.mins"
#: The sweep's period: a tenth of the retention, within these bounds.
MIN_PERIOD_S = 1.0
MAX_PERIOD_S = 600.0

InUse = Callable[[], set[tuple[str, int]]]


def sweep_period(retention_s: float) -> float:
    return min(MAX_PERIOD_S, max(MIN_PERIOD_S, retention_s / 10))


def newest_time(directory: Path) -> float:
    """The latest modification time of ``directory`` and of the entries in it (not
    followed: a link counts by its own time)."""
    newest = directory.lstat().st_mtime
    with os.scandir(directory) as entries:
        for entry in entries:
            try:
                newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
            except FileNotFoundError:
                continue  # rotated away meanwhile
    return newest


class LogSweeper:
    """Removes the log directories under ``root`` that no worker uses and nothing wrote
    to for ``retention_s``; see the module docstring. :meth:`start`, :meth:`stop`."""

    def __init__(self, root: Path, retention_s: float, in_use: InUse,
                 lock: threading.Lock | None = None, clock: Callable[[], float] = time.time):
        """``lock``: held while a topology's directory is swept, and by whoever makes a
        slot's directory (:class:`nimbus.supervisor.log_dirs.LogDirs`), so that a
        worker starting there meanwhile never loses its directory or its record."""
        self.root = root
        self.retention_s = retention_s
        self._in_use = in_use
        self._lock = lock if lock is not None else threading.Lock()
        self._clock = clock
        self.loop = BackgroundLoop("supervisor-log-sweep", self.sweep,
                                   sweep_period(retention_s), wait_first=True)

    def start(self) -> LogSweeper:
        self.loop.start()
        return self

    def stop(self) -> None:
        self.loop.stop(join_timeout=30)

    def sweep(self) -> list[Path]:
        """One pass; returns the slot directories removed."""
        try:
            topologies = [e for e in os.scandir(self.root)
                          if e.is_dir(follow_symlinks=False) and is_topology_id(e.name)]
        except FileNotFoundError:
            return []
        removed = []
        for topology in topologies:
            if self.loop.stopping:
                break
            with self._lock:
                removed += self._sweep_topology(Path(topology.path), self._in_use(),
                                                self._clock() - self.retention_s)
        return removed

    def _sweep_topology(self, topology_dir: Path, in_use: set[tuple[str, int]],
                        cutoff: float) -> list[Path]:
        removed = []
        left = 0
        try:
            with os.scandir(topology_dir) as entries:
                slots = [e for e in entries if e.name != META_FILE]
        except OSError:
            return []
        for entry in slots:
            port = int(entry.name) if entry.name.isdigit() else None
            if port is not None and (topology_dir.name, port) in in_use:
                left += 1
                continue
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
                if stat.S_ISDIR(mode):
                    if newest_time(Path(entry.path)) > cutoff:
                        left += 1
                        continue
                    shutil.rmtree(entry.path)  # never follows a link inside
                elif entry.stat(follow_symlinks=False).st_mtime > cutoff:
                    left += 1
                    continue
                else:
                    os.unlink(entry.path)  # something else left here: no log of ours
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.warning("cannot remove the worker logs %s: %s", entry.path, exc)
                left += 1
                continue
            removed.append(Path(entry.path))
            log.info("removed the worker logs %s: no worker of this supervisor wrote there "
                     "for %.0f min (%s)", entry.path, self.retention_s / 60, RETENTION_KEY)
        if not left:
            try:
                (topology_dir / META_FILE).unlink(missing_ok=True)
                topology_dir.rmdir()
            except OSError:
                pass  # a worker started there meanwhile: swept another time
        return removed
