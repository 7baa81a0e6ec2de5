"""A supervisor's own assignments, watched one by one instead of the whole directory.

The leader keeps ``/supervisor-assignments/<supervisor-id>``, the topologies with work on
this supervisor (:mod:`nimbus.master.assignment_index`). :class:`OwnAssignments` watches
that node, and a data watch on each assignment it names: an assignment change costs this
supervisor a read only if the topology has work here (or had, or is given some), never
for the rest of the cluster, and no listing of ``/assignments`` at all.

After a lost session nothing is served (:class:`ViewNotLoadedError`, as the
whole-directory view does) until the index and every assignment it names have been read
again on the new session: a supervisor never acts on what it held before.

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

from kazoo.exceptions import KazooException, NoNodeError
from kazoo.protocol.states import KazooState, ZnodeStat
from kazoo.recipe.watchers import DataWatch

from nimbus.state.cluster_state import LayoutMissingError, StormClusterState
from nimbus.state.cluster_view import ClusterView, ViewNotLoadedError
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
        self._lost = False   # a session was lost and not all is read again yet

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
        zk.add_listener(self._on_state)
        self._index_watch = DataWatch(zk, self._index_path, self._on_index)

    def close(self) -> None:
        """Stop following changes (each watch ends at its next event)."""
        with self._lock:
            self._closed = True
        self.state.zk.remove_listener(self._on_state)

    # -- a lost session --------------------------------------------------------------------
    def _on_state(self, state: str) -> None:
        # kazoo's connection thread: only flag, and read again on a thread of kazoo's.
        if state == KazooState.LOST:
            with self._lock:
                self._lost = True
        elif state == KazooState.CONNECTED and self._lost and not self._closed:
            self.state.zk.handler.spawn(self._read_again)

    def _read_again(self) -> None:
        """Read the index and each assignment it names on the new session, then serve."""
        zk = self.state.zk
        try:
            try:
                data, _ = zk.retry(zk.get, self._index_path)
            except NoNodeError:
                data = None
            listed = frozenset(SupervisorAssignments.decode(
                data, self._index_path).topologies) if data else frozenset()
            fresh: dict[str, tuple[bytes, ZnodeStat]] = {}
            for topology_id in sorted(listed):
                try:
                    fresh[topology_id] = zk.retry(
                        zk.get, self.state.path("assignments", topology_id))
                except NoNodeError:
                    continue
        except (KazooException, RecordError) as exc:
            log.warning("could not read this supervisor's assignments again after a lost "
                        "session (%s): the next reconnection tries again", exc)
            return
        with self._lock:
            for topology_id, got in fresh.items():
                if topology_id in self._listed:
                    self._held[topology_id] = got
            for topology_id in set(self._held) - set(fresh):
                self._held.pop(topology_id, None)
            self._lost = False
        self._tell("")

    # -- reads ---------------------------------------------------------------------------
    def assignment_ids(self) -> list[str]:
        """ViewNotLoadedError after a lost session, until all is read again."""
        with self._lock:
            if self._lost:
                raise ViewNotLoadedError(
                    f"{self._index_path}: not read again since the session was lost")
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
