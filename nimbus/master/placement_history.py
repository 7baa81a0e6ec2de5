"""Where each worker of a topology has run: the leader's placement history.

Nothing else remembers it: an Assignment says only where each worker runs now. So every
time the scheduler writes an Assignment whose placements changed, the leader also
rewrites ``/placements/<topology-id>`` (:class:`~nimbus.state.records.PlacementHistory`)
in the same fenced transaction (:meth:`StormClusterState.set_assignment`): a deposed
leader writes neither, and the history never disagrees with the assignment it describes.
The node goes with the topology (:meth:`StormClusterState.remove_storm`).

Bounds: the newest :data:`MAX_PER_WORKER` placements of each worker, and
:data:`MAX_ENTRIES` in all (a topology of many workers keeps fewer per worker, at least
the current one), so the node stays small (about 100 bytes a placement) whatever
happens.

The history is for people (:func:`nimbus.state.runtime_view.placements_of` reads it
for them); scheduling never reads it. A history this release cannot read is left as it
is (logged once by the state), and the assignment is written alone.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from nimbus.state.cluster_state import ConcurrentChangeError, Fence, StormClusterState
from nimbus.state.records import WORKER_PREFIX, Assignment, PlacementHistory, RecordError

log = logging.getLogger(__name__)

MAX_PER_WORKER = 20
MAX_ENTRIES = 2000


def _index(worker: str) -> int:
    try:
        return int(worker[len(WORKER_PREFIX):])
    except ValueError:
        return -1


def _trimmed(workers: dict[str, list[dict[str, Any]]],
             placed: set[str]) -> dict[str, list[dict[str, Any]]]:
    """``workers`` within the bounds: workers no longer placed go first (highest index
    first) if there are more than MAX_ENTRIES workers; then each keeps its newest
    ``MAX_ENTRIES // workers`` placements, at most MAX_PER_WORKER, at least one."""
    names = sorted(workers, key=lambda w: (w not in placed, _index(w)))[:MAX_ENTRIES]
    limit = max(1, min(MAX_PER_WORKER, MAX_ENTRIES // max(1, len(names))))
    return {name: workers[name][-limit:] for name in sorted(names, key=_index)}


def advance(history: PlacementHistory | None, old: Assignment, new: Assignment,
            now_secs: int) -> PlacementHistory | None:
    """The history after ``old`` became ``new`` at ``now_secs`` (the leader's clock), or
    None when no placement changed. A worker placed on another slot (or placed again)
    gets a new entry since its start time in ``new``; its previous entry, and that of a
    worker no longer placed, ends at ``now_secs``."""
    workers = {name: [dict(entry) for entry in entries]
               for name, entries in (history.workers if history else {}).items()}
    changed = False
    for worker in sorted(set(old.executor_node_port) | set(new.executor_node_port),
                         key=_index):
        slot = new.executor_node_port.get(worker)
        entries = workers.get(worker, [])
        current = entries[-1] if entries and entries[-1]["until_secs"] == 0 else None
        if not slot:
            if current is not None:   # taken off (deactivate, rebalance down, kill)
                current["until_secs"] = now_secs
                changed = True
            continue
        supervisor_id, port = str(slot[0]), int(slot[1])
        if current is not None and current["supervisor_id"] == supervisor_id \
                and current["port"] == port:
            continue
        if current is not None:
            current["until_secs"] = now_secs
        since = new.executor_start_time_secs.get(worker, now_secs)
        workers[worker] = [*entries, {
            "supervisor_id": supervisor_id, "host": new.node_host.get(supervisor_id,
                                                                     supervisor_id),
            "port": port, "since_secs": int(since), "until_secs": 0}]
        changed = True
    if not changed:
        return None
    return PlacementHistory(workers=_trimmed(workers, set(new.executor_node_port)))


def write_assignment(state: StormClusterState, fence: Fence, topology_id: str,
                     old: Assignment, new: Assignment, now_secs: int | None = None) -> None:
    """Write ``new`` (the scheduler's) and, in the same fenced transaction, the placement
    history it makes; NotLeaderError as every fenced write. The assignment is written
    even when the history cannot be (unreadable, or changed under this leader)."""
    now_secs = int(time.time()) if now_secs is None else now_secs
    try:
        history, version = state.placement_history(topology_id)
    except RecordError:
        state.set_assignment(fence, topology_id, new)
        return
    updated = advance(history, old, new, now_secs)
    if updated is None:
        state.set_assignment(fence, topology_id, new)
        return
    try:
        state.set_assignment(fence, topology_id, new, updated, version)
    except ConcurrentChangeError as exc:
        # Only the leader writes the node, so this is a surprise; scheduling must not
        # depend on it. (A topology removed meanwhile fails again below, as before.)
        log.warning("placement history of %s not recorded (%s); the assignment is "
                    "written alone", topology_id, exc)
        state.set_assignment(fence, topology_id, new)

