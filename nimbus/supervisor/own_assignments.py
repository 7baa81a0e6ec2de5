"""A supervisor's own assignments, watched one by one instead of the whole directory.

The leader keeps ``/supervisor-assignments/<supervisor-id>``, the topologies with work on
this supervisor (:mod:`nimbus.master.assignment_index`). :class:`OwnAssignments` watches
that node, and a data watch on each assignment it names: an assignment change costs this
supervisor a read only if the topology has work here (or had, or is given some), never
for the rest of the cluster, and no listing of ``/assignments`` at all.

The index is a hint of what to watch; what the supervisor acts on is the Assignment node
itself, read by its watch: an index that lists a topology whose assignment no longer
places work here costs one watch and starts nothing, and the leader corrects the index
at its next duty cycle. kazoo's data watches read their node again after a reconnection,
lost session included, so the supervisor converges from ZooKeeper whatever it missed.

:func:`assignment_reader` picks this reader when the cluster has the index directory, and
otherwise (a cluster set up by a release before the index) the whole-directory
:class:`~nimbus.state.cluster_view.ClusterView`, saying so once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kazoo.protocol.states import ZnodeStat
from kazoo.recipe.watchers import DataWatch

from nimbus.state.cluster_state import LayoutMissingError, StormClusterState
from nimbus.state.cluster_view import ClusterView
from nimbus.state.records import Assignment, RecordError, SupervisorAssignments

log = logging.getLogger(__name__)

Listener = Callable[[str, str], None]


class OwnAssignments:
    """The assignments this supervisor's index names; same reading API as the
    supervisor's use of ClusterView (``start``, ``assignment_ids``, ``assignment``,
    ``listen``, ``close``)."""

    def __init__(self, state: StormClusterState, supervisor_id: str):
        self.state = state
        self._index_path = state.supervisor_index_path(supervisor_id)
        self._lock = threading.Lock()
        self._listed: frozenset[str] = frozenset()     # what the index names now
        self._watches: dict[str, DataWatch] = {}        # one per named topology
        self._held: dict[str, tuple[bytes, ZnodeStat]] = {}
        self._memo: dict[str, tuple[int, Any]] = {}     # id -> (mzxid, record or error)
        self._listeners: list[Listener] = []
        self._closed = False
        self._index_problem = ""

    def listen(self, listener: Listener) -> None:
        """``listener("assignments", topology_id)`` on each change (kazoo's thread)."""
        self._listeners.append(listener)

    def start(self, timeout_s: float = 60.0) -> None:
        """Set the watches (reads the index and the assignments it names, once)."""
        zk = self.state.zk
        if zk.retry(zk.exists, self.state.path("supervisor-assignments")) is None:
            raise LayoutMissingError(
                f"cannot watch this supervisor's assignments: "
                f"{self.state.path('supervisor-assignments')} does not exist")
        self._index_watch = DataWatch(zk, self._index_path, self._on_index)

    def close(self) -> None:
        """Stop following changes (each watch ends at its next event)."""
        with self._lock:
            self._closed = True

    # -- reads ---------------------------------------------------------------------------
    def assignment_ids(self) -> list[str]:
        with self._lock:
            return sorted(t for t in self._held if t in self._listed)

    def assignment(self, topology_id: str) -> tuple[Assignment, int] | None:
        """The topology's Assignment and its node's version; None if it has none (or the
        index does not name it). RecordError if it cannot be read."""
        with self._lock:
            got = self._held.get(topology_id) if topology_id in self._listed else None
            if got is None:
                return None
            data, stat = got
            memo = self._memo.get(topology_id)
            if memo is None or memo[0] != stat.mzxid:
                path = self.state.path("assignments", topology_id)
                try:  # the state logs an unreadable node (once per problem)
                    value: Any = self.state.decode_record(Assignment, path, (data, stat))
                except RecordError as exc:
                    value = exc
                memo = self._memo[topology_id] = (stat.mzxid, value)
        if isinstance(memo[1], RecordError):
            raise memo[1]
        return memo[1], stat.version

    # -- watches (kazoo's event thread) ----------------------------------------------------
    def _on_index(self, data: bytes | None, _stat: ZnodeStat | None,
                  _event: object = None) -> bool | None:
        if self._closed:
            return False
        listed: frozenset[str] | None = frozenset()
        if data:
            try:
                listed = frozenset(SupervisorAssignments.decode(data, self._index_path)
                                   .topologies)
                self._index_problem = ""
            except RecordError as exc:
                # Keep watching what was named: the leader rewrites the index.
                if str(exc) != self._index_problem:
                    log.error("%s: keeping the assignments watched so far", exc)
                    self._index_problem = str(exc)
                listed = None
        with self._lock:
            if listed is None:
                listed = self._listed
            added = listed - set(self._watches)
            gone = set(self._watches) - listed
            self._listed = listed
            stopped = [self._watches.pop(t) for t in gone]
            for topology_id in gone:
                self._held.pop(topology_id, None)
                self._memo.pop(topology_id, None)
        for watch in stopped:
            # kazoo's DataWatch ends only by its callback returning False, at the node's
            # next event, which a removed topology's node may never have: end it now.
            watch._stopped = True
            self.state.zk.remove_listener(watch._session_watcher)
        for topology_id in sorted(added):
            watch = DataWatch(self.state.zk, self.state.path("assignments", topology_id))
            with self._lock:
                self._watches[topology_id] = watch
            watch(lambda d, s, _e=None, t=topology_id, w=watch: self._on_assignment(t, w, d, s))
        self._tell("")
        return None

    def _on_assignment(self, topology_id: str, watch: DataWatch, data: bytes | None,
                       stat: ZnodeStat | None) -> bool | None:
        with self._lock:
            if self._closed or self._watches.get(topology_id) is not watch:
                return False   # closed, or no longer named (a later listing sets a new one)
            if data is None or stat is None:
                self._held.pop(topology_id, None)
            else:
                self._held[topology_id] = (data, stat)
        self._tell(topology_id)
        return None

    def _tell(self, topology_id: str) -> None:
        for listener in list(self._listeners):
            try:
                listener("assignments", topology_id)
            except Exception:
                log.exception("assignment listener failed")


def assignment_reader(state: StormClusterState, supervisor_id: str,
                      audit_nodes_per_s: float) -> OwnAssignments | ClusterView:
    """This supervisor's reader of its assignments: :class:`OwnAssignments` when the
    cluster keeps the index, else every assignment (a cluster set up before the index)."""
    zk = state.zk
    if zk.retry(zk.exists, state.path("supervisor-assignments")) is not None:
        return OwnAssignments(state, supervisor_id)
    if zk.retry(zk.exists, state.path("assignments")) is None:
        raise LayoutMissingError(
            f"no nimbus has set the cluster up under {state.root} yet (there is no "
            f"{state.path('assignments')})")
    log.warning("this cluster keeps no index of each supervisor's work (its nimbuses "
                "predate it): watching every assignment")
    return ClusterView(state, ("assignments",), name="supervisor",
                       audit_nodes_per_s=audit_nodes_per_s)
