"""The cluster summary every nimbus serves from memory, kept current by ZooKeeper watches.

A named loop (``cluster-summary``) rebuilds the snapshot whenever something it shows
changes: storms, assignments and supervisors come from the in-memory
:class:`ClusterView` (no round trip), nimbuses and the leader queue (a handful of nodes)
are read with watches. Replication counts are asked of the distributor only for
topologies whose replica registrations changed, and for a few more on each safety-net
pass (for stores without watches, like S3), so a submission costs the same round trips
at 100 topologies as at 5,000. getClusterInfo then never touches ZooKeeper. A topology
whose StormBase this release cannot read is left out (the state logs the node once); the
others are still listed.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace

from kazoo.exceptions import KazooException

from nimbus.background_loop import BackgroundLoop
from nimbus.distribution.distributors import CodeDistributor
from nimbus.state.cluster_state import LayoutMissingError, StormClusterState
from nimbus.state.cluster_view import ClusterView, ViewNotLoadedError
from nimbus.state.records import Assignment, NimbusInfo, StormBase, SupervisorInfo

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClusterSnapshot:
    """What getClusterInfo reports, as of ``taken_at``."""

    nimbuses: list[NimbusInfo] = field(default_factory=list)
    leader: str | None = None
    storms: dict[str, StormBase] = field(default_factory=dict)
    replication: dict[str, int] = field(default_factory=dict)
    supervisors: dict[str, SupervisorInfo] = field(default_factory=dict)
    assignments: dict[str, Assignment] = field(default_factory=dict)
    taken_at: float = 0.0


class ClusterSummaryCache:
    """Holds the latest :class:`ClusterSnapshot`; see the module docstring."""

    SAFETY_INTERVAL_S = 5.0
    # Replication counts refreshed per safety-net pass beyond those known to have changed.
    SWEEP_PER_PASS = 50
    PARTS = ("nimbuses", "storms", "assignments", "supervisors")

    def __init__(self, state: StormClusterState, distributor: CodeDistributor,
                 view: ClusterView):
        self._state = state
        self._distributor = distributor
        self._view = view
        self._snapshot = ClusterSnapshot()
        self._replication: dict[str, int] = {}
        self._served_replication: dict[str, int] = {}  # the copy the snapshot holds
        self._stale_replication: set[str] = set()  # replica registrations changed
        # What changed since the last load: only those parts are rebuilt, so a
        # supervisor's heartbeat does not cost a pass over every topology.
        self._dirty: set[str] = set(self.PARTS)
        self._stale_lock = threading.Lock()
        self._sweep_from = ""  # the safety net's place in the id order
        self._fresh = threading.Condition()
        self._requested = 0  # reload requests made by refresh_now
        self._loaded = 0     # the newest request a finished reload has covered
        # Read at every wait, so that a test may lengthen the safety net.
        self._loop = BackgroundLoop("cluster-summary", self._reload,
                                    period=lambda: self.SAFETY_INTERVAL_S)

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
        with self._stale_lock:
            if directory == "code-distributor":
                self._stale_replication.add(topology_id)
            else:
                self._dirty.add(directory)
        self._loop.wake()

    def _on_nimbus_change(self, _event: object = None) -> None:
        with self._stale_lock:
            self._dirty.add("nimbuses")
        self._loop.wake()

    @property
    def snapshot(self) -> ClusterSnapshot:
        return self._snapshot

    def refresh_now(self, timeout_s: float = 5.0) -> ClusterSnapshot:
        """Wait (bounded) for a reload that *started* after this call, so that a nimbus
        answers with its own writes included (read-your-writes)."""
        with self._fresh:
            self._requested += 1
            wanted = self._requested
        self._loop.wake()
        deadline = time.monotonic() + timeout_s
        with self._fresh:
            while self._loaded < wanted and time.monotonic() < deadline:
                self._fresh.wait(deadline - time.monotonic())
        return self._snapshot

    def _reload(self) -> None:
        """One pass of the ``cluster-summary`` loop: a new snapshot, served at once."""
        # The first load, and every safety-net pass (no wake-up for a whole interval),
        # recounts some replicas: the first load counts every topology's anyway.
        sweep = not self._loop.woken
        with self._fresh:
            generation = self._requested
            asked = generation > self._loaded
        try:
            snapshot = self._load(barrier=asked, sweep=sweep)
            with self._fresh:
                self._snapshot = snapshot
                self._loaded = generation
                self._fresh.notify_all()
        except LayoutMissingError as exc:
            # Serve no leader rather than a stale one; the code sync logs the cause.
            log.debug("cluster summary unavailable: %s", exc)
            with self._fresh:
                self._snapshot = replace(self._snapshot, leader=None)
            with self._stale_lock:  # everything is read again once the layout is back
                self._dirty |= set(self.PARTS)
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
        with self._stale_lock:
            dirty, self._dirty = self._dirty, set()
        try:
            if "nimbuses" in dirty:
                nimbuses = state.nimbuses(watch=self._on_nimbus_change)
                queue = state.leader_queue(watch=self._on_nimbus_change)
                leader = queue[0][1] if queue else None
            else:
                nimbuses, leader = previous.nimbuses, previous.leader
            # Unreadable StormBases are left out (logged by the state).
            storms = view.storms() if "storms" in dirty else previous.storms
            assignments = ({t: a for t, a in view.assignments().items() if t in storms}
                           if dirty & {"storms", "assignments"} else previous.assignments)
            supervisors = view.supervisors() if "supervisors" in dirty \
                else previous.supervisors
            replication = self._count_replicas(storms, sweep)
        except BaseException:
            with self._stale_lock:  # not loaded: try those parts again next time
                self._dirty |= dirty
            raise
        return ClusterSnapshot(nimbuses=nimbuses, leader=leader, storms=storms,
                               replication=replication, supervisors=supervisors,
                               assignments=assignments, taken_at=time.monotonic())

    def _count_replicas(self, storms: dict[str, StormBase], sweep: bool) -> dict[str, int]:
        """Replication counts of ``storms``: the previous dict itself when none changed."""
        with self._stale_lock:
            stale, self._stale_replication = self._stale_replication, set()
        changed = False
        for topology_id in [t for t in self._replication if t not in storms]:
            del self._replication[topology_id]
            changed = True
        recount = {t for t in storms if t not in self._replication or t in stale}
        if sweep and storms:
            ordered = sorted(storms)
            later = [t for t in ordered if t > self._sweep_from]
            batch = (later + ordered)[:self.SWEEP_PER_PASS]
            self._sweep_from = batch[-1]
            recount.update(batch)
        for topology_id in recount:
            try:
                count = self._distributor.get_replication_count(topology_id)
            except Exception as exc:
                log.debug("replication count of %s unavailable: %s", topology_id, exc)
                count = 0
            if self._replication.get(topology_id) != count:
                self._replication[topology_id] = count
                changed = True
        if changed:
            self._served_replication = dict(self._replication)
        return self._served_replication
