"""Warm workers: worker processes started ahead of any topology, SparkSession up.

A pipeline's restart or move is mostly a SparkSession start (10-15 s on a small host). A
supervisor keeps ``supervisor.warm.workers`` processes (``python -m nimbus.worker --warm``,
see ``nimbus/worker/warm.py``) with Python started, pyspark imported and a session up with
the cluster's default ``topology.spark.*`` settings. A slot that starts a pipeline takes
one whose settings fixed at Spark's start match the topology's
(:func:`~nimbus.worker_protocol.spark_settings.warm_mismatch`); otherwise the worker
starts cold and the supervisor logs why.

What a warm worker is not: it holds no lease, is in no slot, writes no beat and touches no
checkpoint until it is taken. When its supervisor dies (EOF on its lease pipe) it waits
up to a minute for the supervisor's next process, which keeps it (:meth:`WarmPool.adopt`),
and exits if none comes. A taken one is replaced, but only once no worker of this
supervisor is still starting: a new JVM competes for the CPU that a taken worker's first
batch needs.

Everything here runs on the supervisor's monitor thread, except :meth:`WarmPool._on_status`
(a reader thread) and the read-only :meth:`WarmPool.summary`.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nimbus.supervisor.cgroups import WorkerCgroups, kill_cgroup, unified_root
from nimbus.supervisor.run_as_user import RUN_AS_USER_KEY
from nimbus.supervisor.takeover import Orphan, cgroup_of, find_warm_orphans
from nimbus.supervisor.worker_handle import LOG_FILE, WorkerHandle, stop_all, tidy_warm_dir
from nimbus.worker_protocol.spark_settings import warm_mismatch
from nimbus.worker_protocol.spec import SpecError, WorkerSpec
from nimbus.worker_protocol.warm import WARM_FILE

log = logging.getLogger(__name__)

WARM_KEY = "supervisor.warm.workers"
# A warm worker that dies before it is ready is started again after this long, doubling
# with each failure in a row (pyspark missing, too little memory) up to the maximum.
RETRY_S = 5.0
RETRY_MAX_S = 300.0
#: What :meth:`WarmPool.take` says when a matching warm worker is still starting.
WAIT = "a warm worker is starting"


@dataclass(frozen=True)
class WarmSummary:
    """What is reported of the warm workers (heartbeat, metrics, topology-info, UI)."""

    ready: int
    starting: int
    memory_bytes: int


class WarmPool:
    """Keeps ``size`` warm workers (see the module docstring)."""

    def __init__(self, size: int, root: Path, command: tuple[str, ...],
                 spec: Callable[[int, int, int], WorkerSpec],
                 env: Callable[[], dict[str, str]], cgroups: WorkerCgroups | None,
                 start_timeout_s: float, wake: Callable[[], None]):
        """``spec(n, lease_fd, status_fd)`` makes warm worker ``n``'s ``warm.json``
        contents (the cluster's default worker configuration); ``command`` runs one
        (its directory is appended); ``wake`` is called when one becomes ready or exits."""
        self.size = size
        self.root = root
        self._command = command
        self._spec = spec
        self._env = env
        self._cgroups = cgroups
        self._start_timeout_s = start_timeout_s
        self._wake = wake
        self._handles: list[WorkerHandle] = []
        self._specs: dict[int, WorkerSpec] = {}   # id(handle) -> its warm.json contents
        self._counter = 0
        self._failures = 0
        self._not_before = 0.0

    # -- the monitor thread ---------------------------------------------------------------
    def clear_leftovers(self, in_use: Collection[Path] = ()) -> None:
        """Remove the directories of an earlier run's warm workers (they died with it),
        except those in ``in_use``: a warm worker taken for a slot outlives its
        supervisor's kill on its lease, and its JVM works in the warm directory."""
        if self.root.is_dir():
            for child in self.root.iterdir():
                number = child.name.removeprefix("warm-")
                if number.isdigit():  # new ones never reuse a name (or its cgroup)
                    self._counter = max(self._counter, int(number))
                if child not in in_use:
                    tidy_warm_dir(child)

    def adopt(self, orphans: list[Orphan], cgroup_root: Path | None) -> list[Path]:
        """Keep the warm workers an earlier process of this supervisor left waiting
        (:func:`~nimbus.supervisor.takeover.find_warm_orphans`), up to the pool's size;
        the others are ended. Returns the directories of those kept."""
        kept: list[Path] = []
        for orphan in orphans:
            try:
                spec = WorkerSpec.load(orphan.worker_dir / WARM_FILE)
            except (OSError, SpecError) as exc:
                spec, why = None, f"its {WARM_FILE} is unusable: {exc}"
            else:
                why = "the pool is full" if len(self._handles) >= self.size else ""
            if spec is None or why:
                log.info("ending warm worker %s, left by this supervisor's earlier "
                         "process: %s", orphan.name, why)
                orphan.kill()
                if self._cgroups is not None:
                    kill_cgroup(self._cgroups.path(orphan.worker_dir.name))
                continue
            handle = WorkerHandle.taken_over(orphan, 0, self._on_status,
                                             lambda _h: self._wake())
            handle.kind = "pipeline"  # what it will run
            handle.warm, handle.warm_dir = "ready", orphan.worker_dir
            handle.child_fds = orphan.child_fds
            cgroup = cgroup_of(orphan.pid, cgroup_root) if cgroup_root is not None else None
            if self._cgroups is not None and cgroup is not None and \
                    cgroup.parent == self._cgroups.base:
                handle.cgroups, handle.cgroup = self._cgroups, cgroup
            self._specs[id(handle)] = spec
            self._handles.append(handle)
            kept.append(orphan.worker_dir)
            log.info("kept warm worker %s, left ready by this supervisor's earlier process",
                     orphan.name)
        return kept

    def fill(self, busy: bool) -> None:
        """Reap warm workers that died, kill those that never got ready, and start what
        is missing, unless ``busy`` (a worker of this supervisor is still starting)."""
        now = time.monotonic()
        for handle in list(self._handles):
            code = handle.exit_code()
            overdue = handle.warm == "warming" and now - handle.started_at > self._start_timeout_s
            if code is None and not overdue:
                continue
            self._handles.remove(handle)
            if overdue and code is None:
                log.warning("warm worker %s not ready after %.0f s "
                            "(supervisor.worker.start.timeout.secs); killed", handle.worker_dir,
                            self._start_timeout_s)
            was_ready = handle.warm == "ready"
            handle.release()
            self._specs.pop(id(handle), None)
            if was_ready and code is not None:
                log.warning("warm worker %s exited with code %s while waiting; replacing "
                            "it", handle.worker_dir, code)
                continue
            self._failures += 1
            delay = min(RETRY_MAX_S, RETRY_S * 2 ** (self._failures - 1))
            self._not_before = now + delay
            log.warning("warm worker %s exited with code %s before it was ready (see %s); "
                        "next try in %.0f s", handle.worker_dir, code,
                        handle.worker_dir / LOG_FILE, delay)
        if busy or now < self._not_before:
            return
        while len(self._handles) < self.size:
            self._start_one()

    def _start_one(self) -> None:
        self._counter += 1
        n = self._counter
        directory = self.root / f"warm-{n}"
        if directory.exists():
            shutil.rmtree(directory, ignore_errors=True)
        handle = WorkerHandle("warm", n, directory, session_id=0, restarts=0,
                              on_status=self._on_status, on_closed=lambda _h: self._wake(),
                              command=self._command)
        handle.warm = "warming"
        handle.warm_dir = directory  # removed when the process is gone (release)
        if self._cgroups is not None:
            handle.cgroups = self._cgroups
            handle.cgroup = self._cgroups.make(f"warm-{n}")

        def write_spec(lease_fd: int, status_fd: int) -> None:
            spec = self._spec(n, lease_fd, status_fd)
            self._specs[id(handle)] = spec
            spec.dump(directory / WARM_FILE)

        handle.start(write_spec, env=self._env())
        self._handles.append(handle)
        log.info("starting warm worker %s (pid %s)", directory, handle.pid)

    def take(self, wanted: WorkerSpec,
             waiting_ahead: int = 0) -> tuple[WorkerHandle | None, str]:
        """A ready warm worker whose session can run ``wanted`` (removed from the pool);
        else None and why not, :data:`WAIT` meaning that one is still starting.

        Waiting for a starting warm worker is never slower than a cold start: the warm
        one does the same work and began earlier. A cold start beside it would only take
        half of its CPU. But each starting one is waited for by one slot only:
        ``waiting_ahead`` slots already wait (this pass), so they have the first that
        many, and a slot beyond the starting ones starts cold at once rather than after
        the warm one is taken by another."""
        # Every warm worker is started with the same settings: a topology that differs
        # from them is told why, whether or not one is ready right now.
        why = warm_mismatch(self._spec(0, -1, -1), wanted) or ""
        if why:
            return None, why
        alive = [h for h in self._handles if h.exit_code() is None]
        if not alive:
            return None, "no warm worker ready"
        starting = 0
        for handle in sorted(alive, key=lambda h: h.warm != "ready"):
            why = warm_mismatch(self._specs[id(handle)], wanted) or ""
            if why:
                continue
            if handle.warm != "ready":
                starting += 1
                if starting > waiting_ahead:
                    return None, WAIT
                why = "the warm workers starting are each awaited by another slot"
                continue
            self._handles.remove(handle)
            self._specs.pop(id(handle), None)
            handle.warm = "taken"
            self._failures = 0
            return handle, ""
        return None, why

    def stop(self, grace_s: float) -> None:
        """Stop every warm worker (their directories go with them)."""
        handles, self._handles = self._handles, []
        if handles:
            stop_all(handles, grace_s)

    # -- other threads --------------------------------------------------------------------
    def _on_status(self, handle: WorkerHandle, status: dict[str, Any]) -> None:
        # A reader thread. Before it is taken, a warm worker runs none of a tenant's code:
        # its only line is the readiness it reports.
        warm = status.get("warm")
        if isinstance(warm, dict) and warm.get("ready") is True and handle.warm == "warming":
            handle.warm = "ready"
            log.info("warm worker %s ready (Spark up in %ss)", handle.worker_dir,
                     warm.get("startup_secs"))
            self._wake()

    def summary(self) -> WarmSummary:
        """Ready and starting warm workers and their resident memory (any thread)."""
        handles = list(self._handles)
        return WarmSummary(ready=sum(h.warm == "ready" for h in handles),
                           starting=sum(h.warm == "warming" for h in handles),
                           memory_bytes=sum(h.memory_bytes() for h in handles))


def make_warm_pool(size: int, root: Path, command: tuple[str, ...] | None,
                   spec: Callable[[int, int, int], WorkerSpec],
                   env: Callable[[], dict[str, str]], cgroups: WorkerCgroups | None,
                   start_timeout_s: float, wake: Callable[[], None], *, run_as_user: bool,
                   in_use: Collection[Path]) -> WarmPool | None:
    """The ``size`` warm workers of a supervisor starting (``supervisor.warm.workers``),
    or None, saying why not; it keeps those its earlier process left waiting, and clears
    the other directories of that run but ``in_use`` (its taken workers'). ``command``
    is None for a worker command without a warm mode."""
    if size == 0:
        return None
    why = ""
    if run_as_user:
        why = (f"workers run as their topology's account ({RUN_AS_USER_KEY}), and a warm "
               "worker is started before it knows which")
    elif command is None:
        why = "this supervisor's worker command has no warm mode"
    elif importlib.util.find_spec("pyspark") is None:
        why = "pyspark is not installed for this Python"
    if why:
        log.warning("%s %d ignored: %s", WARM_KEY, size, why)
        return None
    assert command is not None
    pool = WarmPool(size, root, command, spec, env, cgroups, start_timeout_s, wake=wake)
    cgroup_root = unified_root() if cgroups is not None else None
    kept = pool.adopt(find_warm_orphans(pool.root, cgroup_root), cgroup_root)
    pool.clear_leftovers(set(in_use) | set(kept))
    log.info("keeping %d warm workers ready (%s)", size, WARM_KEY)
    return pool
