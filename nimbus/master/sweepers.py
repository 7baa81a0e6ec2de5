"""The leader's sweeps: what a moved worker or a half-finished removal leaves behind.

Run from the leader's duty cycle at most every ``nimbus.sweep.freq.secs``, after the
schedule, and fenced like every leader write (a deposed leader deletes nothing):

* **Worker heartbeats** (Storm's ``remove-worker-heartbeat!``): a
  ``/workerbeats/<id>/<node>-<port>`` node whose slot the topology's Assignment no longer
  names (the worker moved, or the topology shrank) is deleted. Read from the leader's
  view, which holds the assignments and the beats in memory: no round trip to find them.
* **Shared-store objects** of topologies that have no code node (their ``delete_shared``
  failed, or their leader died between removing the node and deleting the objects): a
  distributor that implements the optional ``list_shared`` hook is asked what it holds;
  a topology id found there with no code node, no live topology and no submission in
  flight, and still so after ``nimbus.code.orphan.grace.secs`` (measured by this leader
  from the sweep that first saw it), is deleted with ``delete_shared``, and logged.

Neither ever deletes anything of a live or pending topology: a submission creates its
code node before it uploads, and its id is pending until it is a topology.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from nimbus.distribution.distributors import CodeDistributor
from nimbus.state.cluster_state import Fence, StormClusterState
from nimbus.state.cluster_view import ClusterView

log = logging.getLogger(__name__)

#: Deletions per fenced transaction (ZooKeeper's request size stays small).
BATCH = 100


class LeaderSweeper:
    """The sweeps above; :meth:`sweep` is called from the duty cycle."""

    def __init__(self, state: StormClusterState, view: ClusterView,
                 distributor: CodeDistributor, pending: Callable[[], set[str]],
                 period_s: float, orphan_grace_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self._state = state
        self._view = view
        self._distributor = distributor
        self._pending = pending
        self._period_s = period_s
        self._grace_s = orphan_grace_s
        self._clock = clock
        self._next = 0.0
        self._orphans_since: dict[str, float] = {}
        self.beats_deleted = 0
        self.shared_deleted = 0

    def reset(self) -> None:
        """A new leadership: sweep at its first cycle, and measure grace periods afresh."""
        self._next = 0.0
        self._orphans_since.clear()

    def sweep(self, fence: Fence) -> None:
        """Sweep if the period has passed since the last sweep."""
        now = self._clock()
        if now < self._next:
            return
        self._next = now + self._period_s
        self.sweep_worker_beats(fence)
        self.sweep_shared_code(fence)

    # -- worker heartbeats ----------------------------------------------------------------
    def stale_beats(self) -> list[str]:
        """Paths of heartbeat nodes whose slot their topology's Assignment does not name."""
        stale = []
        assignments = self._view.assignments()
        for topology_id, assignment in sorted(assignments.items()):
            slots = {f"{node}-{port}" for node, port in
                     assignment.executor_node_port.values()}
            for child in sorted(self._view.worker_beat_versions(topology_id)):
                if child not in slots:
                    stale.append(self._state.path("workerbeats", topology_id, child))
        return stale

    def sweep_worker_beats(self, fence: Fence) -> int:
        """Delete the stale heartbeat nodes (fenced); returns how many were deleted."""
        stale = self.stale_beats()
        deleted = 0
        for start in range(0, len(stale), BATCH):
            deleted += self._state.delete_nodes(fence, stale[start:start + BATCH])
        if deleted:
            log.info("removed %d heartbeats of workers whose slots are no longer assigned",
                     deleted)
        self.beats_deleted += deleted
        return deleted

    # -- shared-store objects -------------------------------------------------------------
    def sweep_shared_code(self, fence: Fence) -> list[str]:
        """Delete shared code of topologies that no longer exist; returns the ids."""
        # Read in this order: a submission that creates its code node meanwhile is seen
        # as pending, or by its code node, never as neither.
        held = self._distributor.list_shared()
        if held is None:
            return []
        pending = self._pending()
        codes = set(self._state.code_topologies())
        storms = set(self._state.active_storms())
        orphans = set(held) - codes - storms - pending
        now = self._clock()
        for topology_id in list(self._orphans_since):
            if topology_id not in orphans:
                del self._orphans_since[topology_id]
        deleted = []
        for topology_id in sorted(orphans):
            since = self._orphans_since.setdefault(topology_id, now)
            if now - since < self._grace_s:
                continue
            self._state.check_leader(fence)   # a deposed leader deletes nothing
            log.warning("deleting the shared code of %s: it has had no code node and no "
                        "topology for %.0f s (a removal that did not finish)", topology_id,
                        now - since)
            self._distributor.delete_shared(topology_id)
            del self._orphans_since[topology_id]
            deleted.append(topology_id)
        self.shared_deleted += len(deleted)
        return deleted
