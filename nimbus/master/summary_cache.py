"""The cluster summary every nimbus serves from memory, kept current by ZooKeeper watches.

A named thread rebuilds the snapshot whenever something it shows changes: storms,
assignments and supervisors come from the in-memory :class:`ClusterView` (no round trip),
nimbuses and the leader queue (a handful of nodes) are read with watches. Replication
counts are asked of the distributor only for topologies whose replica registrations
changed, and for a few more on each safety-net pass (for stores without watches, like
S3), so a submission costs the same round trips at 100 topologies as at 5,000.
getClusterInfo then never touches ZooKeeper. A topology whose StormBase this release
cannot read is left out (the state logs the node once); the others are still listed.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace

from kazoo.exceptions import KazooException

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

    def __init__(self, state: StormClusterState, distributor: CodeDistributor,
                 view: ClusterView):
        self._state = state
        self._distributor = distributor
        self._view = view
        self._snapshot = ClusterSnapshot()
        self._replication: dict[str, int] = {}
        self._stale_replication: set[str] = set()  # replica registrations changed
        self._stale_lock = threading.Lock()
        self._sweep_from = ""  # the safety net's place in the id order
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._fresh = threading.Condition()
        self._requested = 0  # reload requests made by refresh_now
        self._loaded = 0     # the newest request a finished reload has covered
        self._thread = threading.Thread(target=self._run, name="cluster-summary", daemon=True)

    def start(self) -> None:
        self._view.listen(self._on_view_change)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def wake(self, _event: object = None) -> None:
        self._wake.set()

    def _on_view_change(self, directory: str, topology_id: str) -> None:
        if directory == "workerbeats":
            return  # heartbeats: nothing the summary shows
        if directory == "code-distributor":
            with self._stale_lock:
                self._stale_replication.add(topology_id)
        self._wake.set()

    @property
    def snapshot(self) -> ClusterSnapshot:
        return self._snapshot

    def refresh_now(self, timeout_s: float = 5.0) -> ClusterSnapshot:
        """Wait (bounded) for a reload that *started* after this call, so that a nimbus
        answers with its own writes included (read-your-writes)."""
        with self._fresh:
            self._requested += 1
            wanted = self._requested
        self._wake.set()
        deadline = time.monotonic() + timeout_s
        with self._fresh:
            while self._loaded < wanted and time.monotonic() < deadline:
                self._fresh.wait(deadline - time.monotonic())
        return self._snapshot

    def _run(self) -> None:
        timed_out = True  # the first load counts every topology's replicas anyway
        while not self._stop.is_set():
            with self._fresh:
                generation = self._requested
                asked = generation > self._loaded
            try:
                snapshot = self._load(barrier=asked, sweep=timed_out)
                with self._fresh:
                    self._snapshot = snapshot
                    self._loaded = generation
                    self._fresh.notify_all()
            except LayoutMissingError as exc:
                # Serve no leader rather than a stale one; the code sync logs the cause.
                log.debug("cluster summary unavailable: %s", exc)
                with self._fresh:
                    self._snapshot = replace(self._snapshot, leader=None)
                self._stop.wait(0.5)
                self._wake.set()
            except (KazooException, ViewNotLoadedError) as exc:
                log.debug("cluster summary reload failed: %s", exc)
                self._stop.wait(0.5)
                self._wake.set()
            except Exception:
                log.exception("cluster summary reload failed")
            timed_out = not self._wake.wait(self.SAFETY_INTERVAL_S)
            self._wake.clear()

    def _load(self, barrier: bool, sweep: bool) -> ClusterSnapshot:
        """A new snapshot; ``barrier``: include every change made before the call
        (read-your-writes); ``sweep``: also recount some replicas (the safety net)."""
        state, view = self._state, self._view
        if barrier:
            view.barrier()
        nimbuses = state.nimbuses(watch=self.wake)
        queue = state.leader_queue(watch=self.wake)
        storms = view.storms()  # unreadable ones are left out (logged by the state)
        assignments = {t: a for t, a in view.assignments().items() if t in storms}
        supervisors = view.supervisors()
        return ClusterSnapshot(nimbuses=nimbuses, leader=queue[0][1] if queue else None,
                               storms=storms, replication=self._count_replicas(storms, sweep),
                               supervisors=supervisors, assignments=assignments,
                               taken_at=time.monotonic())

    def _count_replicas(self, storms: dict[str, StormBase], sweep: bool) -> dict[str, int]:
        with self._stale_lock:
            stale, self._stale_replication = self._stale_replication, set()
        for topology_id in [t for t in self._replication if t not in storms]:
            del self._replication[topology_id]
        recount = {t for t in storms if t not in self._replication or t in stale}
        if sweep and storms:
            ordered = sorted(storms)
            later = [t for t in ordered if t > self._sweep_from]
            batch = (later + ordered)[:self.SWEEP_PER_PASS]
            self._sweep_from = batch[-1]
            recount.update(batch)
        for topology_id in recount:
            try:
                self._replication[topology_id] = self._distributor.get_replication_count(
                    topology_id)
            except Exception as exc:
                log.debug("replication count of %s unavailable: %s", topology_id, exc)
                self._replication[topology_id] = 0
        return dict(self._replication)
