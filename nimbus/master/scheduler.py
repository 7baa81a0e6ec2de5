"""The leader's scheduler: give every live topology its workers on supervisor slots.

A duty of the leader only; every assignment it writes is fenced by the leader lock. One
pass (:meth:`Scheduler.schedule`) reads the supervisors and the topologies (from the
in-memory :class:`ClusterView`, after a barrier so that it sees every change made before
the pass, its own last writes and a predecessor's included), keeps every
worker that is alive where it is, moves the others to free slots, and writes each
Assignment that changed. A worker is one slot (``supervisor id``, port); its executor
key in the Assignment is ``worker-<i>``.

Liveness never compares clocks of different hosts:

* a supervisor is alive while its ephemeral ``/supervisors/<id>`` node exists, that is
  while its ZooKeeper session lives; its workers move only once that session has
  ended (a supervisor that loses its connection stops its workers before then);
* a worker is alive while the *version* of its heartbeat node keeps changing, as seen on
  this leader's own monotonic clock. A worker gets ``nimbus.task.launch.secs`` to send
  its first heartbeat and ``nimbus.task.timeout.secs`` between two heartbeats after that.
  A leader that has just taken over starts every clock from the moment it first looks,
  so a failover never reassigns healthy work (Storm's STORM-3984 did).

Work never runs twice (docs/runtime.md, "A worker runs only while it is assigned"): a
supervisor renews a worker's lease only while the assignment it reads from ZooKeeper still
places the worker there, and a lease is at most ``2/3 T`` long (``T`` the session
timeout; nimbus.timing.WORKER_LEASE_FRACTION). So when a pass takes a worker off a slot
whose supervisor still lives (a deactivate, a rebalance, a silent worker), the old worker
may run for up to ``2/3 T`` after the write; the executor is placed anywhere else only
after that (its *release quarantine*; the same slot may have it back at once).
A worker that went silent is taken off its slot the same way: it may be hung, not
gone, and its supervisor renews its lease until it reads the change.

Quarantines live in the leader's memory only. That is enough when a successor leads
only once the leader's session has expired, ``T`` after its last write, or after a
handover (a nimbus that stops on purpose waits out its quarantines before it leaves the
election, :meth:`Scheduler.last_release_s`). A nimbus started again after a kill -9 may
remove its dead predecessor's lock node before that session expires
(:mod:`nimbus.state.incarnation`), and marks the removal in ZooKeeper. A leader that
takes over on a new lock node (:meth:`Scheduler.reset` with ``successor``) and finds
that mark places no executor the assignment leaves unplaced for ``2/3 T`` after the
takeover, whatever the counts were then: the dead leader may have released it moments
ago, from a slot nobody recorded, but its last write came before the takeover (every
leader write is fenced on its lock node), so those releases have run out by the end of
this *takeover hold*. It supersedes this nimbus's own releases of earlier terms. Work
still placed on a slot is kept or moved as usual. Work whose supervisor's session has
ended moves at once: its lease ended before the session did.

A pass costs the topologies that are not at rest (something placed or wanted) and those
whose StormBase or Assignment changed since the last pass, not every topology: one at
rest stays so until one of those two records changes, which the view's change events
tell (:meth:`Scheduler._topologies`). A new leadership's first pass, and a pass after the
view was loaded again or reconnected, looks at every topology.

Workers are spread: a new worker goes to the supervisor with the fewest workers of that
topology, then the fewest used slots overall, so that one supervisor's death takes as
little of one topology with it as possible.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NamedTuple

from nimbus.config import Config
from nimbus.master.placement_history import write_assignment
from nimbus.state.cluster_state import Fence, StormClusterState
from nimbus.state.cluster_view import ClusterView
from nimbus.state.records import (
    ACTIVE,
    WORKER_PREFIX,
    Assignment,
    StormBase,
    SupervisorInfo,
)
from nimbus.state.view_changes import ViewChanges

log = logging.getLogger(__name__)


class Slot(NamedTuple):
    """A supervisor's port that runs at most one worker (a tuple: a pass sorts
    thousands of them, and tuples compare in C)."""

    supervisor_id: str
    port: int

    @property
    def beat_name(self) -> str:
        """The worker's heartbeat node under ``/workerbeats/<topology-id>/``."""
        return f"{self.supervisor_id}-{self.port}"


@dataclass
class _Beat:
    version: int | None   # None: no heartbeat node yet
    changed_at: float     # this leader's monotonic clock
    launched: bool        # a first heartbeat has been seen


class HeartbeatObserver:
    """When each worker's heartbeat last changed, on this leader's monotonic clock."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._beats: dict[tuple[str, str], _Beat] = {}

    def reset(self) -> None:
        """Forget everything: a new leader trusts no age it did not measure itself."""
        self._beats.clear()

    def placed(self, topology_id: str, beat_name: str, version: int | None) -> None:
        """A worker was just (re)assigned to this slot: it gets the launch time, and a
        heartbeat node left there by an earlier worker does not count as its own."""
        self._beats[(topology_id, beat_name)] = _Beat(version, self._clock(), launched=False)

    def silent_for(self, topology_id: str, beat_name: str, version: int | None) -> tuple[
            float, bool]:
        """(seconds since the heartbeat last changed, whether this worker has beaten)."""
        now = self._clock()
        key = (topology_id, beat_name)
        beat = self._beats.get(key)
        if beat is None:
            # First look (a new leader): the clock starts now, whatever the node says
            # about the past; a worker whose node exists has started.
            beat = self._beats[key] = _Beat(version, now, launched=version is not None)
        elif version != beat.version:
            beat.version, beat.changed_at = version, now
            beat.launched = beat.launched or version is not None
        return now - beat.changed_at, beat.launched

    def forget(self, topology_id: str, beat_name: str) -> None:
        self._beats.pop((topology_id, beat_name), None)

    def keep_only(self, live: set[tuple[str, str]]) -> None:
        for key in set(self._beats) - live:
            del self._beats[key]


class Scheduler:
    """Assign workers of every topology to supervisor slots; see the module docstring."""

    # A pass slower than this is logged at INFO (issue 9's target for one pass).
    SLOW_PASS_S = 0.2

    # The directories a pass reads.
    READS = ("storms", "assignments", "supervisors", "workerbeats")

    def __init__(self, conf: Config, state: StormClusterState, view: ClusterView,
                 quarantine_s: Callable[[], float],
                 clock: Callable[[], float] = time.monotonic):
        """``quarantine_s()``: how long a worker taken off a live supervisor's slot may
        still run, the longest lease a supervisor grants (2/3 of the session timeout)."""
        self._state = state
        self._quarantine_s = quarantine_s
        self._clock = clock
        # (topology id, executor) -> (the slot it was taken off, when): see module doc.
        self._released: dict[tuple[str, str], tuple[Slot, float]] = {}
        self._held_back: set[tuple[str, str, float]] = set()   # logged once each
        # (topology id, executor) -> the slot it went silent on: placed elsewhere if any
        # other slot is free, once its release quarantine allows.
        self._went_silent: dict[tuple[str, str], Slot] = {}
        self._view = view
        self._timeout_s = conf["nimbus.task.timeout.secs"]
        self._launch_s = conf["nimbus.task.launch.secs"]
        self._observer = HeartbeatObserver(clock)
        self._fresh = False
        # When this nimbus last took over from another leader, while a takeover hold
        # may apply (see the module doc); whether the mark is still to be read.
        self._taken_over_at: float | None = None
        self._takeover_unread = False
        # Topologies at rest at the last pass (nothing placed, nothing wanted), skipped
        # until their StormBase or Assignment changes; see _topologies.
        self._settled: set[str] = set()
        self._changes = ViewChanges(view, ("storms", "assignments"))
        # The view's supervisors dict last seen and its slots, sorted.
        self._slots: tuple[dict[str, SupervisorInfo], list[Slot]] = ({}, [])

    def reset(self, successor: bool = True) -> None:
        """Call on gaining leadership: heartbeat ages are measured afresh. ``successor``
        (a lock node this scheduler has not led on before, so another nimbus may have
        led since): the next pass reads whether a takeover hold applies, from now.

        Safe from any thread: the takeover time is stamped here, and the hold is in
        force until that pass has read otherwise, so a pass that fails loses nothing.
        """
        if successor:
            self._taken_over_at = self._clock()
            self._takeover_unread = True
        self._fresh = True
        self._changes.everything()  # a new leadership's first pass looks at every topology

    def schedule(self, fence: Fence) -> dict[str, Assignment]:
        """One pass; returns the assignments it wrote (topology id -> Assignment).

        Each pass logs its duration (DEBUG; INFO when slower than ``SLOW_PASS_S``)."""
        started = time.monotonic()
        counts: dict[str, int] = {}
        written = self._schedule(fence, counts)
        elapsed = time.monotonic() - started
        log.log(logging.INFO if elapsed >= self.SLOW_PASS_S else logging.DEBUG,
                "scheduler pass: %d topologies, %d supervisors, %d assignments written in "
                "%.1f ms (%d looked at)", counts.get("topologies", 0),
                counts.get("supervisors", 0), len(written), elapsed * 1000,
                counts.get("looked_at", 0))
        return written

    def _schedule(self, fence: Fence, counts: dict[str, int]) -> dict[str, Assignment]:
        now = self._clock()
        if self._fresh:
            # Releases are kept: they were this process's own (a takeover hold, which
            # lasts longer, supersedes those of earlier terms).
            self._fresh = False
            self._observer.reset()
        quarantine = self._quarantine_s()
        self._released = {k: v for k, v in self._released.items()
                          if now < v[1] + quarantine}
        if self._takeover_unread:
            self._read_takeover_mark(fence, quarantine)
        # A constant number of round trips, whatever the cluster's size; then memory only.
        self._view.barrier(directories=self.READS)
        shared = self._view.supervisors()
        # A copy: the view's dict is shared, and _confirm_missing may add to this one.
        supervisors = dict(shared)
        storms, topologies = self._topologies()
        counts.update(topologies=len(storms), supervisors=len(supervisors),
                      looked_at=len(topologies))
        current = self._assignments_of(storms, topologies)
        self._confirm_missing(supervisors, current)
        self._went_silent = {k: v for k, v in self._went_silent.items() if k[0] in storms}
        silent: set[Slot] = set()
        kept = {t: self._keep_alive_workers(t, current[t], supervisors, silent)
                for t in topologies if current[t] is not None}
        used = {slot for workers in kept.values() for slot in workers.values()}
        # A slot whose worker went silent is not offered again in the same pass: its
        # worker must move, not be handed the very slot it failed on.
        if len(supervisors) == len(shared):
            taken = used | silent
            free = [s for s in self._slots_of(shared) if s not in taken] if taken \
                else list(self._slots_of(shared))
        else:
            free = sorted(self._all_slots(supervisors) - used - silent)
        written: dict[str, Assignment] = {}
        observed: set[tuple[str, str]] = set()
        wanted = {t: (max(0, base.num_workers) if base.status == ACTIVE else 0)
                  for t, base in topologies.items()}
        before = {t: dict(workers) for t, workers in kept.items() if workers}
        # Every topology gives back what it no longer needs before any grows, so that a
        # slot freed by a deactivate or a rebalance is used in the same pass.
        # Only active topologies run: deactivate frees the slots, checkpoints stay.
        # A REBALANCING topology is deactivated the same way for its wait.
        for topology_id, workers in kept.items():
            self._trim(workers, wanted[topology_id], free, used)
        for topology_id, base in topologies.items():
            old = current[topology_id]
            if old is None:
                continue  # being created or removed; the next pass sees it settled
            if not wanted[topology_id] and not kept[topology_id] and not (
                    old.executor_node_port or old.node_host or old.executor_start_time_secs):
                # Nothing placed, nothing wanted: an inactive topology at rest, skipped
                # by the next passes until its StormBase or Assignment changes.
                self._settled.add(topology_id)
                continue
            workers = self._grow(topology_id, kept[topology_id], wanted[topology_id],
                                 free, used, now, quarantine, old, supervisors)
            had = before.get(topology_id, {})
            placed = [s for e, s in workers.items() if had.get(e) != s]
            if placed:
                beats = self._view.worker_beat_versions(topology_id)
                for slot in placed:
                    self._observer.placed(topology_id, slot.beat_name, beats.get(slot.beat_name))
            observed |= {(topology_id, s.beat_name) for s in workers.values()}
            if self._unchanged(old, workers, supervisors):
                continue  # most topologies, most passes: no new Assignment to build
            new = self._assignment(old, workers, supervisors)
            if new != old:
                # With the placement history in the same fenced transaction.
                write_assignment(self._state, fence, topology_id, old, new)
                written[topology_id] = new
                self._log_change(topology_id, base, old, new, wanted[topology_id])
                self._note_releases(topology_id, old, new, supervisors)
        self._observer.keep_only(observed)
        return written

    def next_release_s(self) -> float | None:
        """Seconds until the earliest release quarantine (or takeover hold) ends (None:
        none pending), so that the duty loop runs a pass then rather than at its next
        period."""
        ends = self._quarantine_ends()
        if self._taken_over_at is not None:
            hold = self._taken_over_at + self._quarantine_s() - self._clock()
            if hold > 0:
                ends.append(hold)
        return min(ends) if ends else None

    def last_release_s(self) -> float | None:
        """Seconds until the last release quarantine ends (None: none pending): how long
        a leader that stops on purpose waits before it leaves the election."""
        ends = self._quarantine_ends()
        return max(ends) if ends else None

    def _quarantine_ends(self) -> list[float]:
        quarantine = self._quarantine_s()
        now = self._clock()
        ends = [when + quarantine - now for _, when in list(self._released.values())]
        return [end for end in ends if end > 0]

    def _note_releases(self, topology_id: str, old: Assignment, new: Assignment,
                       supervisors: dict[str, SupervisorInfo]) -> None:
        """Remember the workers this write took off slots of supervisors that still live:
        their leases may run a while yet (measured from after the write)."""
        written_at = self._clock()
        for executor, (supervisor_id, port) in old.executor_node_port.items():
            if supervisor_id in supervisors and \
                    new.executor_node_port.get(executor) != [supervisor_id, port]:
                self._released[(topology_id, executor)] = (Slot(supervisor_id, int(port)),
                                                           written_at)

    def _read_takeover_mark(self, fence: Fence, quarantine: float) -> None:
        """The first pass after a takeover: a hold if the predecessor's lock node was
        removed before its session expired, then the mark cleared (fenced)."""
        if self._state.lock_nodes_removed_early():
            log.info("took over from a leader whose lock node was removed before its "
                     "session expired: unplaced work waits %.1fs for any release it may "
                     "have made", quarantine)
            self._state.clear_removed_early(fence)
        else:
            self._taken_over_at = None
        self._takeover_unread = False

    def _held_back_from(self, topology_id: str, executor: str, now: float,
                        quarantine: float, placed_on: Slot | None,
                        supervisors: dict[str, SupervisorInfo],
                        ) -> tuple[Slot | None, float] | None:
        """(the only slot it may take now, None for none; seconds left) while the
        executor may not go just anywhere; None when it may. ``placed_on`` is its slot in
        the assignment read by this pass (None: unplaced)."""
        if placed_on is not None:
            if placed_on.supervisor_id in supervisors and quarantine > 0:
                # Taken off a live supervisor's slot in this very pass (it went silent):
                # nowhere else until its release, noted once written, has run out.
                return placed_on, quarantine
            return None  # its supervisor's session ended, and with it the lease
        takeover = self._taken_over_at
        released = self._released.get((topology_id, executor))
        if released is not None and (takeover is None or released[1] >= takeover) \
                and now < released[1] + quarantine:
            return released[0], released[1] + quarantine - now
        if takeover is not None and now < takeover + quarantine:
            return None, takeover + quarantine - now
        return None

    def _confirm_missing(self, supervisors: dict[str, SupervisorInfo],
                         current: dict[str, Assignment | None]) -> None:
        """Add to ``supervisors`` each one that an assignment places work on and the view
        lacks but ZooKeeper has. Work moves at once off a supervisor that is gone, so
        gone must mean gone: a restarted supervisor replaces its node in one
        transaction, but the view applies it as a delete and, a read later, a create."""
        placed = {slot[0] for assignment in current.values() if assignment is not None
                  for slot in assignment.executor_node_port.values() if slot}
        for supervisor_id in sorted(placed - supervisors.keys()):
            info = self._state.supervisor_info(supervisor_id)
            if info is not None:
                log.info("supervisor %s is in ZooKeeper though not yet in the view: its "
                         "work stays", supervisor_id)
                supervisors[supervisor_id] = info

    # -- reading ----------------------------------------------------------------------------
    def _assignments_of(self, storms: dict[str, StormBase], topologies: dict[str, StormBase]
                        ) -> dict[str, Assignment | None]:
        """Each looked-at topology's Assignment (None: none yet); RecordError if any
        topology's is unreadable (the pass then stops: placing work without knowing
        where that topology runs could double-book)."""
        for topology_id in sorted(self._view.unreadable("assignments") & storms.keys()):
            self._view.assignment(topology_id)  # raises its RecordError
        every = self._view.assignments()
        return {t: every.get(t) for t in topologies}

    def _topologies(self) -> tuple[dict[str, StormBase], dict[str, StormBase]]:
        """(every topology, the ones this pass looks at, oldest first); RecordError if a
        StormBase is unreadable, as a direct read.

        A pass looks at every topology not at rest at the last one, and at those whose
        StormBase or Assignment changed since (the view's change events, taken before
        the records are read: a change landing meanwhile is looked at again next time).
        At rest means an Assignment with nothing placed and a topology that wants no
        worker, which depends on those two records alone: at 10,000 mostly inactive
        topologies a pass after a submit looks at a few, not at all of them.
        """
        changed = self._changes.take()
        if changed is None:
            self._settled.clear()
        else:
            self._settled -= changed
        for topology_id in sorted(self._view.unreadable("storms")):
            self._view.storm_base(topology_id)  # raises its RecordError
        storms = self._view.storms()
        looked_at = storms.keys() - self._settled if self._settled else storms.keys()
        # Oldest first: when slots run short, the longest-running topologies keep theirs.
        order = sorted(looked_at, key=lambda t: (storms[t].launch_time_secs, t))
        return storms, {t: storms[t] for t in order}

    def _slots_of(self, supervisors: dict[str, SupervisorInfo]) -> list[Slot]:
        """:meth:`_all_slots` of the view's shared supervisors, sorted, kept until they
        change (shared: do not change it)."""
        seen, slots = self._slots
        if seen is not supervisors:
            slots = sorted(self._all_slots(supervisors))
            self._slots = (supervisors, slots)
        return slots

    @staticmethod
    def _all_slots(supervisors: dict[str, SupervisorInfo]) -> set[Slot]:
        return {Slot(sid, port) for sid, info in supervisors.items() for port in info.meta}

    # -- deciding ---------------------------------------------------------------------------
    def _keep_alive_workers(self, topology_id: str, assignment: Assignment,
                            supervisors: dict[str, SupervisorInfo],
                            silent: set[Slot]) -> dict[str, Slot]:
        """The workers of ``assignment`` that stay where they are; adds the slots of
        workers that went silent to ``silent``."""
        if not assignment.executor_node_port:
            return {}  # nothing placed (an inactive topology): no beats to read
        beats = self._view.worker_beat_versions(topology_id)
        kept: dict[str, Slot] = {}
        for executor, (supervisor_id, port) in sorted(assignment.executor_node_port.items()):
            slot = Slot(supervisor_id, int(port))
            if supervisor_id not in supervisors or slot.port not in supervisors[supervisor_id].meta:
                log.info("%s: %s on %s:%d moves: its supervisor is gone", topology_id,
                         executor, supervisor_id, slot.port)
                self._observer.forget(topology_id, slot.beat_name)
                continue
            quiet, launched = self._observer.silent_for(
                topology_id, slot.beat_name, beats.get(slot.beat_name))
            limit = self._timeout_s if launched else self._launch_s
            if quiet > limit:
                log.warning("%s: %s on %s:%d moves: no heartbeat for %.0fs (limit %ss)",
                            topology_id, executor, supervisor_id, slot.port, quiet, limit)
                self._observer.forget(topology_id, slot.beat_name)
                silent.add(slot)
                self._went_silent[(topology_id, executor)] = slot
                continue
            kept[executor] = slot
        return kept

    @staticmethod
    def _trim(workers: dict[str, Slot], wanted: int, free: list[Slot],
              used: set[Slot]) -> None:
        """Give back the workers beyond ``wanted``: the highest indices go."""
        if len(workers) <= wanted:
            return  # nothing to give back (most topologies, most passes): no sort
        indices = sorted(int(e[len(WORKER_PREFIX):]) for e in workers)
        for index in indices[wanted:]:
            slot = workers.pop(f"{WORKER_PREFIX}{index}")
            used.discard(slot)
            free.append(slot)
        free.sort()

    def _grow(self, topology_id: str, workers: dict[str, Slot], wanted: int,
              free: list[Slot], used: set[Slot], now: float, quarantine: float,
              old: Assignment, supervisors: dict[str, SupervisorInfo]) -> dict[str, Slot]:
        """``workers`` grown to ``wanted`` as far as free slots and release quarantines
        allow."""
        for index in range(wanted):
            executor = f"{WORKER_PREFIX}{index}"
            if executor in workers:
                continue
            was = old.executor_node_port.get(executor)
            held = self._held_back_from(topology_id, executor, now, quarantine,
                                        Slot(was[0], int(was[1])) if was else None,
                                        supervisors)
            if held is not None and held[0] not in free:
                key = (topology_id, executor, round(now + held[1], 1))
                if key not in self._held_back:
                    self._held_back = {k for k in self._held_back if k[2] > now} | {key}
                    log.info("%s: %s waits %.1fs before it is placed elsewhere: its "
                             "previous worker's lease may run until then", topology_id,
                             executor, held[1])
                continue
            if held is not None:
                slot = held[0]
            else:
                failed_on = self._went_silent.get((topology_id, executor))
                slot = self._pick(workers, [f for f in free if f != failed_on] or free,
                                  used)
            if slot is None:
                log.warning("%s: no free slot for %s (%d of %d workers placed)",
                            topology_id, executor, len(workers), wanted)
                break
            free.remove(slot)
            used.add(slot)
            workers[executor] = slot
            self._went_silent.pop((topology_id, executor), None)
        return workers

    @staticmethod
    def _pick(workers: dict[str, Slot], free: list[Slot], used: set[Slot]) -> Slot | None:
        if not free:
            return None
        mine: dict[str, int] = {}
        for slot in workers.values():
            mine[slot.supervisor_id] = mine.get(slot.supervisor_id, 0) + 1
        load: dict[str, int] = {}
        for slot in used:
            load[slot.supervisor_id] = load.get(slot.supervisor_id, 0) + 1
        return min(free, key=lambda s: (mine.get(s.supervisor_id, 0),
                                        load.get(s.supervisor_id, 0), s))

    @staticmethod
    def _unchanged(old: Assignment, workers: dict[str, Slot],
                   supervisors: dict[str, SupervisorInfo]) -> bool:
        """Whether :meth:`_assignment` would return ``old`` unchanged: the same slots,
        each with its start time, on supervisors under the host names it holds."""
        placed = old.executor_node_port
        if len(placed) != len(workers) or len(old.executor_start_time_secs) != len(workers):
            return False
        hosts = old.node_host
        named = set()
        for executor, slot in workers.items():
            if placed.get(executor) != [slot.supervisor_id, slot.port] or \
                    executor not in old.executor_start_time_secs or \
                    hosts.get(slot.supervisor_id) != supervisors[slot.supervisor_id].hostname:
                return False
            named.add(slot.supervisor_id)
        return len(hosts) == len(named)

    @staticmethod
    def _assignment(old: Assignment, workers: dict[str, Slot],
                    supervisors: dict[str, SupervisorInfo]) -> Assignment:
        now = int(time.time())  # start times are informational (uptime), never compared
        executor_node_port = {e: [s.supervisor_id, s.port] for e, s in sorted(workers.items())}
        start = {e: (old.executor_start_time_secs.get(e, now)
                     if old.executor_node_port.get(e) == executor_node_port[e] else now)
                 for e in executor_node_port}
        node_host = {s.supervisor_id: supervisors[s.supervisor_id].hostname
                     for s in workers.values()}
        return replace(old, node_host=node_host, executor_node_port=executor_node_port,
                       executor_start_time_secs=start)

    @staticmethod
    def _log_change(topology_id: str, base: StormBase, old: Assignment, new: Assignment,
                    wanted: int) -> None:
        def slots(a: Assignment) -> str:
            return ", ".join(f"{e}={n}:{p}" for e, (n, p) in sorted(a.executor_node_port.items()))

        log.info("assigned %s (%s, %d of %d workers): [%s] (was [%s])", topology_id,
                 base.storm_name, len(new.executor_node_port), wanted, slots(new), slots(old))
