"""The leader's index of each supervisor's work: ``/supervisor-assignments/<id>``.

A supervisor used to watch every assignment of the cluster, so that each submit, kill or
move made every supervisor list ``/assignments`` again (thousands of children) and read
the changed node: work that grows with the cluster on every daemon. Here the leader
keeps, for each supervisor, the list of topologies whose Assignment places work on it
(a :class:`~nimbus.state.records.SupervisorAssignments`), and a supervisor watches that
one node and the assignments it names (:mod:`nimbus.supervisor.own_assignments`): an
assignment change costs only the supervisors it concerns a read.

The index is derived, never authoritative: a supervisor acts on the Assignment nodes
themselves (the index only says which ones to watch), and the leader rewrites whatever
differs from what the assignments say at every duty cycle, right after the schedule, so
a lost write or a new leader converges at the next cycle. Writes are fenced.
"""

from __future__ import annotations

import logging

from kazoo.exceptions import NoNodeError

from nimbus.state.cluster_state import ConcurrentChangeError, Fence, StormClusterState
from nimbus.state.cluster_view import ClusterView
from nimbus.state.records import RecordError, SupervisorAssignments

log = logging.getLogger(__name__)

#: Index nodes written per fenced transaction.
BATCH = 50


class AssignmentIndex:
    """The index above, as this leader wrote it; :meth:`sync` once per duty cycle."""

    def __init__(self, state: StormClusterState, view: ClusterView):
        self._state = state
        self._view = view
        self._written: dict[str, frozenset[str]] | None = None  # None: read it first
        # The view's assignments dict last seen and what it placed where: the duty cycle
        # runs after every submit, and a pass over 10,000 assignments each time adds up.
        self._desired: tuple[object, dict[str, frozenset[str]]] = (None, {})
        self.writes = 0   # index nodes created, changed or deleted (tests, benchmarks)

    def reset(self) -> None:
        """A new leadership: read what is there before the next write."""
        self._written = None

    def desired(self) -> dict[str, frozenset[str]]:
        """Supervisor id -> the topologies whose Assignment (in the view) places work on
        it."""
        assignments = self._view.assignments()
        if self._desired[0] is assignments:  # the view's shared dict: nothing changed
            return self._desired[1]
        out: dict[str, set[str]] = {}
        for topology_id, assignment in assignments.items():
            for node, _port in assignment.executor_node_port.values():
                out.setdefault(node, set()).add(topology_id)
        desired = {node: frozenset(ids) for node, ids in out.items()}
        self._desired = (assignments, desired)
        return desired

    def sync(self, fence: Fence, fresh: bool = False) -> int:
        """Write every index node that differs from the assignments; returns how many.
        ``fresh``: assignments were just written; the view is brought up to them first."""
        if fresh:
            self._view.barrier(directories=("assignments",))
        if self._written is None:
            self._written = self._read_all()
        desired = self.desired()
        changes: dict[str, list[str] | None] = {}
        for supervisor_id in sorted(set(desired) | set(self._written)):
            wanted = desired.get(supervisor_id, frozenset())
            if wanted == self._written.get(supervisor_id, frozenset()) and (
                    wanted or supervisor_id not in self._written):
                continue
            changes[supervisor_id] = sorted(wanted) if wanted else None
        names = sorted(changes)
        for start in range(0, len(names), BATCH):
            batch = {n: changes[n] for n in names[start:start + BATCH]}
            try:
                self._state.write_supervisor_index(fence, batch, set(self._written))
            except ConcurrentChangeError:
                self._written = None   # not as this leader thought: read it again
                raise
            for supervisor_id, topologies in batch.items():
                if topologies is None:
                    self._written.pop(supervisor_id, None)
                else:
                    self._written[supervisor_id] = frozenset(topologies)
            self.writes += len(batch)
        return len(changes)

    def _read_all(self) -> dict[str, frozenset[str]]:
        zk = self._state.zk
        written: dict[str, frozenset[str]] = {}
        directory = self._state.path("supervisor-assignments")
        for supervisor_id in zk.retry(zk.get_children, directory):
            path = self._state.supervisor_index_path(supervisor_id)
            try:
                data, _ = zk.retry(zk.get, path)
            except NoNodeError:
                continue
            try:
                written[supervisor_id] = frozenset(
                    SupervisorAssignments.decode(data, path).topologies)
            except RecordError as exc:
                log.warning("rewriting an unreadable supervisor index: %s", exc)
                written[supervisor_id] = frozenset({"<unreadable>"})
        return written
