"""Workers that outlived what started them, and frozen ones.

* Orphans: workers an earlier process of this supervisor left running (or frozen),
  found at start (:mod:`nimbus.supervisor.takeover`). The first complete reconcile pass
  takes each over if the assignment still wants it on its slot, or ends it. A slot whose
  worker could not be identified starts nothing until that worker's lease has surely
  ended (:attr:`Adoption.held_until`).
* A lost session kills every worker but those frozen on a lapsed lease with a known
  assignment version (:meth:`Adoption.end_with_session`); the next session adopts them
  (:meth:`Adoption.adopt_frozen`), and its first renewal thaws each whose assignment is
  unchanged.
* A worker frozen longer than ``supervisor.worker.timeout.secs`` is killed
  (:meth:`Adoption.end_frozen`); frozen workers of this host past their end, whichever
  supervisor left them, are ended every :data:`FROZEN_SWEEP_S`
  (:mod:`nimbus.supervisor.orphans`, their reapers' fallback).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from nimbus.state.worker_logs import LOG_FILE, port_dir
from nimbus.supervisor.cgroups import WorkerCgroups, kill_cgroup, unified_root
from nimbus.supervisor.code_cache import CodeCache
from nimbus.supervisor.lease import LeaseKeeper
from nimbus.supervisor.lease_record import RECORDS_DIR, clear_records, record_path
from nimbus.supervisor.orphans import count_orphans, end_overdue
from nimbus.supervisor.policy import DesiredWorker
from nimbus.supervisor.registration import hex_session
from nimbus.supervisor.reporting import Reporter
from nimbus.supervisor.slots import WorkerTable
from nimbus.supervisor.takeover import Orphan, cgroup_of, find_orphans
from nimbus.supervisor.worker_handle import WorkerHandle, tidy_warm_dir

log = logging.getLogger(__name__)

# How often a supervisor ends the frozen workers of this host that are past their end
# (nimbus/supervisor/orphans.py): their reapers' fallback.
FROZEN_SWEEP_S = 60.0


class Adoption:
    """Orphans to take over or end, and frozen workers to keep, adopt or end; see the
    module doc. Monitor thread, but for :meth:`end_with_session` (kazoo's) and
    :meth:`frozen_orphans` (metrics).

    ``code()``, ``cgroups()`` and ``warm_root()`` are read when needed: the supervisor
    finds its cgroups and makes its warm pool when it starts.
    """

    def __init__(self, table: WorkerTable, reporter: Reporter, lease: LeaseKeeper, *,
                 supervisor_dir: Path, timeout_s: float, connected: threading.Event,
                 beat_now: Callable[[], None], code: Callable[[], CodeCache],
                 cgroups: Callable[[], WorkerCgroups | None],
                 warm_root: Callable[[], Path | None], log_root: Path | None = None):
        self._table = table
        self._reporter = reporter
        self._lease = lease
        self._supervisor_dir = supervisor_dir
        self._timeout_s = timeout_s
        self._connected = connected
        self._beat_now = beat_now
        self._code = code
        self._cgroups = cgroups
        self._warm_root = warm_root
        self._log_root = log_root   # the workers' logs (nimbus/state/worker_logs.py)
        # Workers an earlier process of this supervisor left running, by port: taken over
        # or ended by the first complete reconcile pass (nimbus/supervisor/takeover.py).
        self.orphans: dict[int, Orphan] = {}
        # Slots where a worker of the earlier process could not be identified: nothing
        # starts there before this time.monotonic(), when its lease has surely ended.
        self.held_until: dict[int, float] = {}
        self._next_frozen_sweep = 0.0   # time.monotonic(); monitor thread only

    # -- orphans of an earlier process ----------------------------------------------------
    def find(self, workers_dir: Path, ports: list[int], hold_s: float) -> None:
        """Find the workers an earlier process left (at start); a slot whose worker
        cannot be identified is held for ``hold_s``, the longest lease it may have."""
        found = find_orphans(workers_dir, ports,
                             unified_root() if self._cgroups() is not None else None,
                             records_dir=self._supervisor_dir / RECORDS_DIR)
        self.orphans = found.orphans
        clear_records(self._supervisor_dir / RECORDS_DIR,
                      keep={f"{o.topology_id}-{o.port}" for o in found.orphans.values()})
        if found.unidentified:
            self.held_until = dict.fromkeys(found.unidentified, time.monotonic() + hold_s)

    def held(self, port: int) -> bool:
        """Whether nothing may start on ``port`` yet (an unidentified worker's lease)."""
        held = self.held_until.get(port)
        if held is None:
            return False
        if time.monotonic() < held:
            return True
        del self.held_until[port]
        return False

    def take_over_for(self, want: DesiredWorker, num_workers: int, session: int) -> bool:
        """Make the orphan on ``want``'s slot its worker, if it runs what ``want`` is
        (True); else end it, if there is one (False: start a worker)."""
        orphan = self.orphans.pop(want.port, None)
        return orphan is not None and self.take_over(orphan, (want, num_workers), session)

    def keep_unreadable(self, unreadable: set[str], session: int) -> None:
        """Take over the orphans of topologies whose assignment cannot be read: kept,
        as their workers are."""
        for port, orphan in list(self.orphans.items()):
            if orphan.topology_id in unreadable:
                del self.orphans[port]
                self.take_over(orphan, None, session)

    def take_over(self, orphan: Orphan, wanted: tuple[DesiredWorker, int] | None,
                  session: int) -> bool:
        """Make ``orphan`` the slot's worker if it runs what the assignment wants there,
        ``wanted`` = (the slot's desired worker, the topology's worker count), or None
        for a topology whose assignment cannot be read (True); else end it (False: the
        slot starts a worker as usual)."""
        if wanted is not None:
            want, num_workers = wanted
            if (orphan.topology_id, orphan.worker_index, orphan.num_workers) != \
                    (want.topology_id, want.worker_index, num_workers):
                self.end_orphan(orphan, "the assignment wants another worker on its slot")
                return False
            if orphan.code_version != want.version:
                # Switched while no supervisor ran here: the slot starts the wanted
                # version anew (from the topology's checkpoint, as after any restart).
                self.end_orphan(orphan, f"it runs version {orphan.code_version}, the "
                                        f"assignment wants version {want.version} there")
                return False
        # What it runs is read from the code here, not taken from what it says.
        resources = self._code().resources(orphan.code_key)
        if not resources.is_dir():
            self.end_orphan(orphan, "its topology's code is not on this host")
            return False
        cgroup = self.orphan_cgroup(orphan)
        working_dirs = orphan.working_dirs()
        handle = WorkerHandle.taken_over(orphan, session, self._reporter.on_status,
                                         self._reporter.on_closed)
        handle.kind = "process" if (resources / "topology.yaml").exists() else "pipeline"
        handle.record_path = record_path(self._supervisor_dir, orphan.topology_id,
                                         orphan.port)
        handle.log_file = self._log_file(orphan)
        if orphan.frozen:
            # Ended by end_frozen unless a renewal thaws it within the worker timeout.
            handle.lease_deadline = time.monotonic()
        warm_root = self._warm_root()
        if warm_root is not None:  # tidied when it is gone, as a taken warm worker's is
            handle.warm_dir = next((d for d in working_dirs if d.parent == warm_root), None)
        if cgroup is not None:
            handle.cgroups, handle.cgroup = self._cgroups(), cgroup
        if handle.exit_code() is not None:
            handle.release()
            log.info("worker %s ended before it could be taken over", orphan.name)
            return False
        record = self._table.record(orphan.topology_id, orphan.port)
        record.restarts = orphan.restarts
        self._table.add(handle)
        # Said at once: a statement written before the take-over (this process's first)
        # counted no restarts for the slot, and readers believe the supervisor's count.
        self._beat_now()
        # Renewed by the next round trip that shows its assignment, if its lease lasts.
        self._lease.wake()
        log.info("took over worker %s, left %s by this supervisor's earlier process",
                 orphan.name, "frozen" if orphan.frozen else "running")
        if not self._connected.is_set():
            handle.kill("lost")
        return True

    def _log_file(self, orphan: Orphan) -> Path | None:
        """The log the orphan writes: its slot's under the log root, or None for a
        worker of an earlier release, which writes ``<worker-dir>/worker.log`` until
        it ends (it is neither rotated nor served)."""
        if self._log_root is None:
            return None
        try:
            path = port_dir(self._log_root, orphan.topology_id, orphan.port) / LOG_FILE
        except ValueError:
            return None
        return path if path.exists() else None

    def orphan_cgroup(self, orphan: Orphan) -> Path | None:
        """The worker cgroup an orphan runs in (``<topology>-<port>``, or ``warm-<n>``
        for one that was warm), if it is one of this supervisor's."""
        cgroups = self._cgroups()
        if cgroups is None:
            return None
        root = unified_root()
        cgroup = cgroup_of(orphan.pid, root) if root is not None else None
        return cgroup if cgroup is not None and cgroup.parent == cgroups.base else None

    def end_orphan(self, orphan: Orphan, why: str) -> None:
        log.info("ending worker %s, left running by this supervisor's earlier process: %s",
                 orphan.name, why)
        cgroup = self.orphan_cgroup(orphan)
        warm_root = self._warm_root()
        warm_dirs = [d for d in orphan.working_dirs()
                     if warm_root is not None and d.parent == warm_root]
        orphan.kill()
        if cgroup is not None:  # what left its process group too
            kill_cgroup(cgroup)
        for directory in warm_dirs:
            tidy_warm_dir(directory)

    def end_orphans(self, why: str) -> None:
        orphans, self.orphans = self.orphans, {}
        for orphan in orphans.values():
            self.end_orphan(orphan, why)

    # -- frozen workers -------------------------------------------------------------------
    def end_with_session(self) -> tuple[int, int]:
        """At a lost session: kill every worker but those frozen on a lapsed lease with
        a known assignment version, which act no more than dead ones and are kept for
        the next session (:meth:`adopt_frozen`); (killed, kept). Kazoo's event thread:
        signals only."""
        handles = [h for h in self._table.running() if not h.ended_by]
        killed = kept = 0
        for handle in handles:
            if handle.assignment_version is not None and handle.run_as is None and \
                    handle.is_frozen():
                kept += 1
                continue
            killed += handle.exit_code() is None   # one may have died of its lease already
            handle.kill("lost")
        return killed, kept

    def adopt_frozen(self, session: int) -> None:
        """Make the workers kept frozen through a lost session (:meth:`end_with_session`)
        this ``session``'s: its renewals thaw each whose assignment's mzxid is the one its
        last renewal read. Its work cannot have moved away and back meanwhile, since every
        move rewrites the assignment; one whose assignment was rewritten is killed
        (:meth:`WorkerHandle.renew`)."""
        adopted = 0
        for handle in self._table.running():
            if not handle.ended_by and handle.session_id != session and handle.is_frozen():
                handle.session_id = session
                adopted += 1
        if adopted:
            log.info("%d workers kept frozen through the lost session wait for a renewal "
                     "of session %s", adopted, hex_session(session))
            self._lease.wake()

    def end_frozen(self) -> None:
        """Kill every worker frozen (its lease ran out, nimbus/worker/lease.py) for longer
        than ``supervisor.worker.timeout.secs``: the connection is not coming back soon,
        and the leader may give up on its work. Not a crash: the lease rule at work."""
        now = time.monotonic()
        for handle in self._table.running():
            if handle.ended_by or handle.lease_deadline is None:
                continue
            frozen_s = now - handle.lease_deadline
            if frozen_s > self._timeout_s and handle.is_frozen():
                log.warning("worker %s: frozen %.0fs since its lease ran out "
                            "(supervisor.worker.timeout.secs %.0f); killed", handle.name,
                            frozen_s, self._timeout_s)
                handle.kill("lease")

    def sweep_frozen(self) -> None:
        """End the frozen workers of this host past their end (any supervisor's: the
        deadline is each worker's own), every FROZEN_SWEEP_S; see nimbus/supervisor/
        orphans.py. Monitor thread (and start)."""
        root = unified_root() if self._cgroups() is not None else None
        if root is None or time.monotonic() < self._next_frozen_sweep:
            return
        self._next_frozen_sweep = time.monotonic() + FROZEN_SWEEP_S
        end_overdue(root)

    def frozen_orphans(self) -> int:
        """Frozen workers of this host whose supervisor process is gone (metrics)."""
        cgroups = self._cgroups()
        root = unified_root() if cgroups is not None else None
        if root is None or cgroups is None:
            return 0
        return count_orphans(root, cgroups.base)
