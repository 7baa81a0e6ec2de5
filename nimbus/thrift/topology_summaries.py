"""The TopologySummary list of getClusterInfo, rebuilt by what changed.

Uptimes are whole seconds, so the list changes every second even when no topology did.
Building 10,000 structs afresh, and sorting the ids, cost about as much as encoding them,
and the first getClusterInfo of each second paid both. Here a topology whose records did
not change keeps its struct and gets its new uptime, and the order is sorted again only
when the set of topologies changed.
"""

from __future__ import annotations

from typing import Any

from nimbus.thrift import storm
from nimbus.thrift.numbers import i32


class TopologySummaries:
    """One nimbus's TopologySummary structs. Not thread-safe: the caller serialises
    :meth:`at` and the use of the list it returns (the structs are updated in place)."""

    def __init__(self) -> None:
        self._storms: Any = None       # the storms dict the order was sorted from
        self._order: list[str] = []
        # topology id -> (StormBase, Assignment or None, replicas, its struct)
        self._rows: dict[str, tuple[Any, Any, int, Any]] = {}
        self._key: tuple[Any, ...] | None = None
        self._second: int | None = None
        self._list: list[Any] = []
        self._launched: list[int] = []  # each struct's topology's launch time

    @property
    def second(self) -> int | None:
        """The second the last list returned is at."""
        return self._second

    def at(self, snap: Any, now: float) -> list[Any]:
        """The TopologySummary list of ``snap`` (a cluster snapshot) at ``now``, sorted
        by id. While the snapshot's parts are unchanged it is the same list, its uptimes
        brought to ``now``'s second."""
        second = int(now)
        # The summary cache keeps the parts that did not change (a supervisor's heartbeat
        # makes a new snapshot with the same storms), so the parts are the key.
        key = (snap.storms, snap.assignments, snap.replication)
        if self._key is not None and all(a is b for a, b in zip(self._key, key, strict=True)):
            if self._second != second:
                for summary, launched in zip(self._list, self._launched, strict=True):
                    summary.uptime_secs = i32(second - launched)
                self._second = second
            return self._list
        storms, found, replication = key
        if storms is not self._storms:
            self._storms, self._order = storms, sorted(storms)
            for gone in self._rows.keys() - storms.keys():
                del self._rows[gone]
        rows = self._rows
        topologies = []
        for topology_id in self._order:
            base = storms[topology_id]
            assignment = found.get(topology_id)
            replicas = replication.get(topology_id, 0)
            uptime = i32(second - base.launch_time_secs)
            row = rows.get(topology_id)
            if row is not None and row[0] is base and row[1] is assignment \
                    and row[2] == replicas:
                summary = row[3]
                summary.uptime_secs = uptime
            else:
                # Workers placed by the scheduler (Storm reports assigned, not requested,
                # workers). Each worker is one executor (worker-<i>) of the Assignment:
                # there are no finer tasks.
                workers = i32(len(assignment.executor_node_port)) \
                    if assignment is not None else 0
                summary = storm.TopologySummary(
                    id=topology_id, name=base.storm_name, num_tasks=workers,
                    num_executors=workers, num_workers=workers, uptime_secs=uptime,
                    status=base.status, owner=base.owner or None,
                    replication_count=i32(replicas))
                rows[topology_id] = (base, assignment, replicas, summary)
            topologies.append(summary)
        self._key, self._second, self._list = key, second, topologies
        self._launched = [storms[topology_id].launch_time_secs for topology_id in self._order]
        return topologies
