"""What the leader assigned to this supervisor, read for one reconcile pass.

:class:`AssignedWork` makes the supervisor's reader of its assignments at the first pass
(:func:`~nimbus.supervisor.own_assignments.assignment_reader`: the layout may not exist
before), and then gives each pass the readable assignments and each topology's worker
count. Topologies whose assignment or StormBase this release cannot read (a newer
release's, or damaged; the state logs the node) are added to the pass's ``frozen`` set:
their workers here are neither started nor stopped and their code is kept, until the
node is readable again.
"""

from __future__ import annotations

from collections.abc import Callable

from nimbus.state.cluster_state import StormClusterState
from nimbus.state.cluster_view import ClusterView
from nimbus.state.records import Assignment, RecordError
from nimbus.supervisor.own_assignments import OwnAssignments, assignment_reader


class AssignedWork:
    """See the module doc. ``wake()`` is rung when an assignment of this supervisor's
    changes (the reconcile loop's wake)."""

    def __init__(self, state: StormClusterState, supervisor_id: str,
                 audit_nodes_per_s: float, wake: Callable[[], None]):
        self._state = state
        self._id = supervisor_id
        self._audit_nodes_per_s = audit_nodes_per_s
        self._wake = wake
        self.view: OwnAssignments | ClusterView | None = None

    def assignments(self, frozen: set[str]) -> dict[str, Assignment]:
        """Every readable assignment (from the reader); adds the ids of unreadable ones
        to ``frozen``. LayoutMissingError until a nimbus has made the layout."""
        view = self._reader()
        out = {}
        for topology_id in view.assignment_ids():
            try:
                found = view.assignment(topology_id)
            except RecordError:
                frozen.add(topology_id)
                continue
            if found is not None:
                out[topology_id] = found[0]
        return out

    def num_workers(self, topology_ids: set[str], frozen: set[str]) -> dict[str, int]:
        """``topology.workers`` of each topology (its StormBase's; 1 if it has none);
        adds the ids of unreadable ones to ``frozen``."""
        out = {}
        for topology_id in topology_ids:
            try:
                base = self._state.storm_base(topology_id)
            except RecordError:
                frozen.add(topology_id)
                continue
            out[topology_id] = max(1, base.num_workers) if base is not None else 1
        return out

    def close(self) -> None:
        if self.view is not None:
            self.view.close()

    def _reader(self) -> OwnAssignments | ClusterView:
        if self.view is None:
            # LayoutMissingError if a nimbus has not made the layout yet.
            view = assignment_reader(self._state, self._id, self._audit_nodes_per_s)
            view.listen(lambda _directory, _topology: self._wake())
            try:
                view.start()
            except BaseException:
                view.close()
                raise
            self.view = view
        return self.view
