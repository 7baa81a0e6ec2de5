"""Events the UI process saw while it ran: leader changes, reassignments, replication.

Nothing in ZooKeeper keeps this history, so the timeline starts when the UI starts and
keeps the newest :data:`MAX_EVENTS` in memory.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

MAX_EVENTS = 200

LEADER, ASSIGNMENT, REPLICATION, STATUS = "leader", "assignment", "replication", "status"


class Timeline:
    """A bounded, thread-safe list of events, newest last."""

    def __init__(self, max_events: int = MAX_EVENTS):
        self._events: deque[dict[str, Any]] = deque(maxlen=max_events)
        self._lock = threading.Lock()
        self._seq = 0

    def add(self, kind: str, message: str, topology_id: str = "",
            at: float | None = None) -> None:
        with self._lock:
            self._seq += 1
            self._events.append({"seq": self._seq, "time": at or time.time(), "kind": kind,
                                 "topologyId": topology_id, "message": message})

    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._events)


def placement(assignment: Any) -> dict[str, tuple[str, int]]:
    """worker -> (supervisor id, port) of an Assignment (empty for None)."""
    if assignment is None:
        return {}
    return {w: (str(sp[0]), int(sp[1])) for w, sp in assignment.executor_node_port.items()}


def diff(timeline: Timeline, old: Any, new: Any) -> None:
    """Record what changed from snapshot ``old`` to ``new`` (both
    :class:`~nimbus.state.cluster_snapshot.ClusterSnapshot`).

    The first snapshot (``old`` None) records only who leads, so the timeline does not
    open with one "assigned" event per topology.
    """
    if old is None:
        timeline.add(LEADER, f"leader is {new.leader}" if new.leader
                     else "no leader")
        return
    if old.leader != new.leader:
        timeline.add(LEADER, f"leader changed: {old.leader or 'none'} -> "
                             f"{new.leader or 'none'}")
    for topology_id in sorted(set(old.storms) | set(new.storms)):
        before, after = old.storms.get(topology_id), new.storms.get(topology_id)
        name = (after or before).storm_name
        if before is None:
            timeline.add(STATUS, f"{name} submitted ({after.status})", topology_id)
        elif after is None:
            timeline.add(STATUS, f"{name} removed", topology_id)
        elif before.status != after.status:
            timeline.add(STATUS, f"{name}: {before.status} -> {after.status}", topology_id)
        _diff_assignment(timeline, topology_id, name, old.assignments.get(topology_id),
                         new.assignments.get(topology_id))
        _diff_replicas(timeline, topology_id, name, old.replica_hosts,
                       new.replica_hosts)


def _diff_assignment(timeline: Timeline, topology_id: str, name: str,
                     before: Any, after: Any) -> None:
    was, now = placement(before), placement(after)
    if was == now:
        return
    moved = [f"{w} -> {now[w][0]}:{now[w][1]}" for w in sorted(now)
             if w in was and was[w] != now[w]]
    added = [f"{w} on {now[w][0]}:{now[w][1]}" for w in sorted(set(now) - set(was))]
    removed = sorted(set(was) - set(now))
    parts = ([f"moved {', '.join(moved)}"] if moved else []) + \
        ([f"placed {', '.join(added)}"] if added else []) + \
        ([f"stopped {', '.join(removed)}"] if removed else [])
    timeline.add(ASSIGNMENT, f"{name}: reassigned: " + "; ".join(parts), topology_id)


def _diff_replicas(timeline: Timeline, topology_id: str, name: str,
                   old: Mapping[str, list[str]], new: Mapping[str, list[str]]) -> None:
    was, now = set(old.get(topology_id, [])), set(new.get(topology_id, []))
    for host in sorted(now - was):
        timeline.add(REPLICATION, f"{name}: code replicated on {host} "
                                  f"({len(now)} replicas)", topology_id)
    for host in sorted(was - now):
        timeline.add(REPLICATION, f"{name}: replica on {host} gone "
                                  f"({len(now)} replicas)", topology_id)
