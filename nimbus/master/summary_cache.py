"""The cluster summary every nimbus serves from memory, kept current by ZooKeeper watches.

The summary is the cluster's one read model, a
:class:`~nimbus.state.cluster_snapshot.ClusterSnapshot`: getClusterInfo, getClusterRecords,
``top``'s rows, the metrics and a UI inside this nimbus read it (:meth:`listen` tells them
of each new one). A named loop (``cluster-summary``) rebuilds the snapshot whenever
something it shows changes: storms, assignments, supervisors and replica registrations
come from the in-memory :class:`ClusterView` (no round trip), nimbuses and the leader
queue (a handful of nodes) are read with watches. Replication counts are asked of the
distributor only for topologies whose replica registrations changed, and for a few more
on each safety-net pass (for stores without watches, like S3), so a submission costs the
same round trips at 100 topologies as at 5,000. getClusterInfo then never touches
ZooKeeper. A topology whose StormBase this release cannot read is left out (the state
logs the node once); the others are still listed.

A load asks the distributor for at most COUNTS_PER_LOAD counts. The first load of a
nimbus at 10,000 topologies would otherwise ask for every one (for localfs a listing in
ZooKeeper each, for s3 a request to the store each), and show nothing until all were
answered. Topologies not counted yet are shown at once with the count of replicas
registered in the view, and are counted by the next loads, which follow at once.
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from kazoo.exceptions import KazooException

from nimbus.background_loop import BackgroundLoop
from nimbus.distribution.distributors import CodeDistributor
from nimbus.read_your_writes import Reloads
from nimbus.state.cluster_snapshot import ClusterSnapshot
from nimbus.state.cluster_state import LayoutMissingError, StormClusterState
from nimbus.state.cluster_view import ClusterView, ViewNotLoadedError
from nimbus.state.code_versions import topology_of
from nimbus.state.records import Assignment, RecordError, StormBase
from nimbus.state.view_changes import ViewChanges

log = logging.getLogger(__name__)


class ClusterSummaryCache:
    """Holds the latest :class:`ClusterSnapshot`; see the module docstring."""

    SAFETY_INTERVAL_S = 5.0
    # A supervisor's heartbeat (its node rewritten, not added or removed) is shown
    # within this long rather than at once: 1,000 supervisors beat 200 times a second,
    # and a new snapshot for each would keep a core busy.
    HEARTBEAT_DELAY_S = 1.0
    # Replication counts refreshed per safety-net pass beyond those known to have changed.
    SWEEP_PER_PASS = 50
    # Replication counts asked of the distributor per load at most; the others wait for
    # the next loads, shown meanwhile with their registered replicas (module doc).
    COUNTS_PER_LOAD = 500
    PARTS = ("nimbuses", "storms", "assignments", "supervisors", "code-versions")

    def __init__(self, state: StormClusterState, distributor: CodeDistributor,
                 view: ClusterView):
        self._state = state
        self._distributor = distributor
        self._view = view
        self._snapshot = ClusterSnapshot()
        self._replication: dict[str, int] = {}
        self._served_replication: dict[str, int] = {}  # the copy the snapshot holds
        self._stale_replication: set[str] = set()  # replica registrations changed
        # Topologies shown with their registered replicas, not yet counted by the
        # distributor (more than COUNTS_PER_LOAD were due): the cluster-summary thread's.
        self._uncounted: set[str] = set()
        self._load_failed = False  # the last load raised: no load at once (_next_wait)
        self._hosts: dict[str, list[str]] = {}
        self._served_hosts: dict[str, list[str]] = {}  # the copy the snapshot holds
        # Topologies whose StormBase or Assignment changed since the last load: the
        # per-topology parts (replica hosts and counts, assignments of live topologies)
        # are reconciled by them, not by set operations over every topology after each
        # change (most of a follower's work per submit at 10,000 topologies).
        self._changes = ViewChanges(view, ("storms", "assignments"))
        # Assignments without a StormBase (a submission or a removal half seen).
        self._orphan_assignments: set[str] = set()
        # Why the snapshot is not current: the cluster's layout is missing ("" if it is).
        self._layout_error = ""
        self._listeners: tuple[Callable[[], None], ...] = ()
        self._listeners_lock = threading.Lock()
        # What changed since the last load: only those parts are rebuilt, so a
        # supervisor's heartbeat does not cost a pass over every topology.
        self._dirty: set[str] = set(self.PARTS)
        self._stale_lock = threading.Lock()
        self._sweep_from = ""  # the safety net's place in the id order
        self._next_sweep = 0.0  # monotonic time of the next safety-net recount
        # When a heartbeat not yet shown first arrived (None: none waiting).
        self._beat_since: float | None = None
        self._reloads = Reloads()   # read-your-writes (refresh_now)
        # Read at every wait, so that a test may lengthen the safety net.
        self._loop = BackgroundLoop("cluster-summary", self._reload, period=self._next_wait)

    def start(self) -> None:
        self._view.listen(self._on_view_change)
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop(join_timeout=10)

    def wake(self, _event: object = None) -> None:
        """Reload soon (also the callback of every watch the cache leaves)."""
        self._loop.wake()

    def _on_view_change(self, directory: str, topology_id: str) -> None:
        if directory == "workerbeats":
            return  # heartbeats: nothing the summary shows
        if directory == "supervisors" and self._is_heartbeat(topology_id):
            with self._stale_lock:
                self._dirty.add(directory)
                if self._beat_since is None:
                    self._beat_since = time.monotonic()
            return  # shown at the next reload, HEARTBEAT_DELAY_S at the latest
        with self._stale_lock:
            if directory == "code-distributor":  # a code key: count its topology again
                self._stale_replication.add(topology_of(topology_id))
            elif directory == "code-versions":  # the running version may have changed
                self._stale_replication.add(topology_id)
                self._dirty.add(directory)
            else:
                self._dirty.add(directory)
        self._loop.wake()

    def _is_heartbeat(self, supervisor_id: str) -> bool:
        """Whether a change to ``supervisor_id``'s node is a heartbeat of a supervisor
        already shown (not one that joined or left)."""
        if not supervisor_id or supervisor_id not in self._snapshot.supervisors:
            return False
        try:
            return self._view.has_supervisor(supervisor_id)
        except Exception:  # not loaded, say: reload at once and let it tell
            return False

    def _next_wait(self) -> float:
        """The loop's wait when nothing wakes it: until a waiting heartbeat or the safety
        net is due, and never longer than HEARTBEAT_DELAY_S (a heartbeat does not wake
        the loop, so a wait that began before it must end in time to show it)."""
        if self._uncounted and not self._load_failed:
            return 0.0  # the next counts are due at once; a failed load waits as before
        due = min(self._next_sweep, self._beat_due())
        return max(0.0, min(due - time.monotonic(), self.HEARTBEAT_DELAY_S))

    def _pending(self) -> bool:
        """Whether a change other than a waiting heartbeat is not shown yet. Judged from
        the parts themselves, not from the wake-up alone: a wake-up that lands as a
        tick's wait times out is cleared with it, and must not wait for the safety net."""
        with self._stale_lock:
            others = self._dirty - {"supervisors"}
            joined = "supervisors" in self._dirty and self._beat_since is None
            return bool(others or self._stale_replication or joined or self._uncounted)

    def _beat_due(self) -> float:
        with self._stale_lock:
            since = self._beat_since
        return math.inf if since is None else since + self.HEARTBEAT_DELAY_S

    def _on_nimbus_change(self, _event: object = None) -> None:
        with self._stale_lock:
            self._dirty.add("nimbuses")
        self._loop.wake()

    @property
    def snapshot(self) -> ClusterSnapshot:
        """The newest snapshot (memory only; ``version`` 0 until the first load)."""
        return self._snapshot

    @property
    def layout_error(self) -> str:
        """Why the snapshot is not current: the cluster's layout is missing in ZooKeeper
        (wiped, or a wrong root); "" once it is read."""
        return self._layout_error

    def listen(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` (on the ``cluster-summary`` thread: it must not block)
        after each new snapshot, and when :attr:`layout_error` changes."""
        with self._listeners_lock:
            self._listeners = (*self._listeners, listener)

    def unlisten(self, listener: Callable[[], None]) -> None:
        """Stop calling ``listener`` (one equal to it: a bound method is a new object at
        each access)."""
        with self._listeners_lock:
            self._listeners = tuple(f for f in self._listeners if f != listener)

    def _tell(self) -> None:
        for listener in self._listeners:
            try:
                listener()
            except Exception:  # a reader's bug must not stop the summary
                log.exception("cluster summary listener failed")

    def refresh_now(self, timeout_s: float = 5.0) -> ClusterSnapshot:
        """Wait (bounded) for a reload that *started* after this call, so that a nimbus
        answers with its own writes included (read-your-writes)."""
        self._reloads.wait_for_next(self._loop.wake, timeout_s)
        return self._snapshot

    def _reload(self) -> None:
        """One pass of the ``cluster-summary`` loop: a new snapshot, served at once."""
        # The first load, and every safety-net pass (no wake-up for a whole interval),
        # recounts some replicas (the first load also counts a first batch of all).
        now = time.monotonic()
        sweep = not self._loop.woken and now >= self._next_sweep
        if not (self._loop.woken or sweep or now >= self._beat_due() or self._pending()):
            return  # a tick with nothing due (see _next_wait)
        if sweep:
            self._next_sweep = now + self.SAFETY_INTERVAL_S
        generation, asked = self._reloads.begin()
        self._load_failed = True  # until this load is served (see _next_wait)
        try:
            snapshot = self._load(barrier=asked, sweep=sweep)
            self._load_failed = False
            with self._reloads.finish(generation):
                self._snapshot = snapshot
                self._layout_error = ""
            self._tell()
        except LayoutMissingError as exc:
            # Serve no leader rather than a stale one; the code sync logs the cause.
            log.debug("cluster summary unavailable: %s", exc)
            told = self._layout_error != str(exc) or self._snapshot.leader is not None
            with self._reloads.lock:
                if self._snapshot.leader is not None:
                    self._snapshot = replace(self._snapshot, leader=None,
                                             version=self._snapshot.version + 1)
                self._layout_error = str(exc)
            with self._stale_lock:  # everything is read again once the layout is back
                self._dirty |= set(self.PARTS)
            if told:
                self._tell()
            self._retry_soon()
        except (KazooException, ViewNotLoadedError) as exc:
            log.debug("cluster summary reload failed: %s", exc)
            self._retry_soon()

    def _retry_soon(self) -> None:
        if not self._loop.sleep(0.5):
            self._loop.wake()

    def _load(self, barrier: bool, sweep: bool) -> ClusterSnapshot:
        """A new snapshot; ``barrier``: include every change made before the call
        (read-your-writes); ``sweep``: also recount some replicas (the safety net).
        Only the parts that changed are rebuilt; the others are the previous ones."""
        state, view, previous = self._state, self._view, self._snapshot
        if barrier:
            view.barrier()
        # Taken before the view's records are read: a change told after this is taken
        # next time (and has woken the loop), one told before is in what is read.
        changed = self._changes.take()
        with self._stale_lock:
            dirty, self._dirty = self._dirty, set()
            stale, self._stale_replication = self._stale_replication, set()
            self._beat_since = None
        try:
            if "nimbuses" in dirty:
                nimbuses = state.nimbuses(watch=self._on_nimbus_change)
                queue = state.leader_queue(watch=self._on_nimbus_change)
                leader = queue[0][1] if queue else None
            else:
                nimbuses, leader = previous.nimbuses, previous.leader
            # Unreadable StormBases are left out (logged by the state). Read every
            # time (the same shared dict while nothing changed): the per-topology parts
            # below are reconciled against the topologies as they are now.
            storms = view.storms()
            every = view.assignments()
            orphans = self._note_orphan_assignments(storms, every, changed)
            assignments = self._assignments(every, orphans) \
                if dirty & {"storms", "assignments"} or storms is not previous.storms \
                else previous.assignments
            supervisors = view.supervisors() if "supervisors" in dirty \
                else previous.supervisors
            running_versions = self._running_versions(storms) \
                if dirty & {"storms", "code-versions"} else previous.running_versions
            replica_hosts = self._replica_hosts(storms, stale, changed)
            replication = self._count_replicas(storms, stale, changed, sweep)
        except BaseException:
            with self._stale_lock:  # not loaded: try those parts again next time
                self._dirty |= dirty
                self._stale_replication |= stale
            self._changes.everything()
            raise
        return ClusterSnapshot(nimbuses=nimbuses, leader=leader, storms=storms,
                               assignments=assignments, supervisors=supervisors,
                               replication=replication, replica_hosts=replica_hosts,
                               running_versions=running_versions,
                               taken_at=time.monotonic(), version=previous.version + 1)

    def _note_orphan_assignments(self, storms: dict[str, StormBase],
                                 every: dict[str, Assignment],
                                 changed: set[str] | None) -> set[str]:
        """The assignments the view holds without a StormBase in ``storms`` (a submission
        or a removal half seen), brought up to date from the topologies that ``changed``
        (None: all of them); ``every`` is the view's assignments."""
        if changed is None:
            self._orphan_assignments = set(every.keys() - storms.keys())
        else:
            for topology_id in changed:
                if topology_id in every and topology_id not in storms:
                    self._orphan_assignments.add(topology_id)
                else:
                    self._orphan_assignments.discard(topology_id)
        return self._orphan_assignments

    @staticmethod
    def _assignments(every: dict[str, Assignment], orphans: set[str]
                     ) -> dict[str, Assignment]:
        """The view's assignments of live topologies: its own shared dict when it holds
        no other, a copy without the ``orphans`` otherwise."""
        if not orphans:
            return every
        kept = dict(every)
        for topology_id in orphans:
            kept.pop(topology_id, None)
        return kept

    def _running_versions(self, storms: dict[str, StormBase]) -> dict[str, int]:
        """The version each upgraded topology of ``storms`` runs (from the view's
        memory); one whose /code-versions node cannot be read is left out."""
        running: dict[str, int] = {}
        for topology_id in self._view.upgraded_topologies():
            if topology_id not in storms:
                continue
            try:
                got = self._view.code_versions(topology_id)
            except RecordError:  # logged by the state
                continue
            if got is not None:
                running[topology_id] = got[0].running
        return running

    @staticmethod
    def _reconcile(held: dict[str, object], storms: dict[str, StormBase],
                   changed: set[str] | None) -> tuple[set[str], bool]:
        """Drop from ``held`` the topologies ``storms`` no longer has; return the ones it
        lacks (to read) and whether anything was dropped. Judged over the topologies that
        ``changed`` since the last load, or over all of them (None)."""
        if changed is None:
            gone = held.keys() - storms.keys()
            new = set(storms.keys() - held.keys())
        else:
            gone = {t for t in changed if t in held and t not in storms}
            new = {t for t in changed if t in storms and t not in held}
        for topology_id in gone:
            del held[topology_id]
        return new, bool(gone)

    def _replica_hosts(self, storms: dict[str, StormBase], stale: set[str],
                       changed: set[str] | None) -> dict[str, list[str]]:
        """The registered replicas of ``storms`` (from the view's memory), read again for
        new topologies and those whose registrations changed: the previous dict itself
        when none changed."""
        reread, dropped = self._reconcile(self._hosts, storms, changed)  # type: ignore[arg-type]
        reread |= {t for t in stale if t in storms}
        updated = dropped
        for topology_id in reread:
            hosts = self._view.replica_hosts(self._view.running_code_key(topology_id))
            if self._hosts.get(topology_id) != hosts:
                self._hosts[topology_id] = hosts
                updated = True
        if updated:
            self._served_hosts = dict(self._hosts)
        return self._served_hosts

    def _count_replicas(self, storms: dict[str, StormBase], stale: set[str],
                        changed: set[str] | None, sweep: bool) -> dict[str, int]:
        """Replication counts of ``storms``: the previous dict itself when none changed.
        At most COUNTS_PER_LOAD are asked of the distributor; see the module doc."""
        recount, updated = self._reconcile(self._replication, storms, changed)  # type: ignore[arg-type]
        recount |= {t for t in stale if t in storms}
        if sweep and storms and not self._uncounted:  # catching up visits every one
            ordered = sorted(storms)
            later = ordered[bisect.bisect_right(ordered, self._sweep_from):]
            batch = (later + ordered)[:self.SWEEP_PER_PASS]
            self._sweep_from = batch[-1]
            recount.update(batch)
        self._uncounted = {t for t in self._uncounted | recount if t in storms}
        if len(self._uncounted) > self.COUNTS_PER_LOAD:
            # What changed since the last load first, then the others waiting, by id.
            later = sorted(self._uncounted - recount)
            recount = set(sorted(recount)[:self.COUNTS_PER_LOAD])
            recount.update(later[:self.COUNTS_PER_LOAD - len(recount)])
            for topology_id in self._uncounted - recount:
                if topology_id not in self._replication or topology_id in stale:
                    # Shown meanwhile with the replicas registered in the view, as
                    # _replica_hosts has just read them for new and changed topologies.
                    registered = len(self._hosts.get(topology_id, ()))
                    if self._replication.get(topology_id) != registered:
                        self._replication[topology_id] = registered
                        updated = True
        else:
            recount = set(self._uncounted)
        for topology_id in sorted(recount):  # by id, as the batches are
            try:
                count = self._distributor.get_replication_count(
                    self._view.running_code_key(topology_id))
            except Exception as exc:
                log.debug("replication count of %s unavailable: %s", topology_id, exc)
                count = 0
            if self._replication.get(topology_id) != count:
                self._replication[topology_id] = count
                updated = True
            self._uncounted.discard(topology_id)  # one by one: a load may stop part-way
        if updated:
            self._served_replication = dict(self._replication)
        return self._served_replication
