"""The cluster state a nimbus reads most, held in memory and kept current by watches.

The summary cache, the scheduler, the code sync and submit used to list a directory and
read every topology's node whenever anything changed: a change cost O(topologies) round
trips on every nimbus, and at 5,000 topologies a scheduling pass or a getClusterInfo took
most of a second. They read this view instead. After the first load, a change costs each
nimbus only the round trips for the nodes that changed (:mod:`nimbus.state.watched_tree`).

The view trails ZooKeeper by the time a watch event takes to arrive. A reader that must
see every change made before a moment (submit checking that a name is free, a new leader
looking at its predecessor's last assignments, a summary asked for read-your-writes)
calls :meth:`ClusterView.barrier` first. Writes still go to :class:`StormClusterState`,
fenced as before; the view never writes.

A ZooKeeper connection blip (a server restarting, a network hiccup shorter than the
session timeout) keeps the view loaded and readable throughout; once the connection is
back, every held node is re-validated and only what changed meanwhile is read again
(:mod:`nimbus.state.revalidating_tree_cache`). Only a lost session reloads the view from
scratch (and it is "not loaded" until then). Each reconnection is logged in one line.

Records are decoded once per node version. A node this release cannot read raises the
same :class:`RecordError` as a direct read (and is logged once, by the state).

The whole-directory reads (:meth:`ClusterView.storms`, :meth:`~ClusterView.assignments`,
:meth:`~ClusterView.supervisors`, the name index) are kept up to date by the names that
changed (:class:`_RecordIndex`): after a submit, a heartbeat or a move, the next read
decodes the nodes that changed and copies a dict, so at 10,000 topologies it costs what
it costs at 100 plus one C-level dict copy, not a pass over every node in Python.
"""

from __future__ import annotations

import bisect
import logging
import math
import posixpath
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from nimbus.state.cluster_state import LayoutMissingError, StormClusterState, is_topology_id
from nimbus.state.code_versions import CodeVersions, version_key
from nimbus.state.records import (
    Assignment,
    CodeMeta,
    Record,
    RecordError,
    StormBase,
    SupervisorInfo,
)
from nimbus.state.revalidating_tree_cache import Revalidation
from nimbus.state.watched_tree import WatchedTree, WatchedTreeError
from nimbus.state.watched_tree import barrier as barrier_of_trees

R = TypeVar("R", bound=Record)

# Every directory a nimbus reads through the view; a supervisor needs assignments only.
NIMBUS_DIRECTORIES = ("storms", "assignments", "supervisors", "code-distributor",
                      "workerbeats", "code-versions")
Listener = Callable[[str, str], None]
StaleListener = Callable[[str, str], None]
# Seconds between two steps of the background audit (ClusterView(audit_nodes_per_s=...)).
AUDIT_TICK_S = 5.0

log = logging.getLogger(__name__)


class _RecordIndex:
    """One directory's readable records by child name, brought up to date on read from
    the names that changed since (every name after a (re)load of the directory).

    Only the view's index lock guards it."""

    def __init__(self, cls: type[Record], accept: Callable[[str], bool],
                 by_name: Callable[[Any], str] | None = None, empty_absent: bool = False,
                 group: Callable[[Any], str] | None = None):
        self.cls = cls
        self.accept = accept   # which child names hold such a record
        self.empty_absent = empty_absent  # a node without data holds no record (yet)
        self.records: dict[str, Any] = {}
        self.changed: set[str] | None = None   # None: every name
        self.served: dict[str, Any] | None = None  # the copy readers share
        # Optional secondary key (a topology's name) -> the names holding it.
        self._key = by_name
        self.keyed: dict[str, set[str]] = {}
        # Optional grouping (a topology's status) -> {name: record} of each group.
        self._group = group
        self.grouped: dict[str, dict[str, Any]] = {}
        self.unreadable: frozenset[str] = frozenset()  # names whose node cannot be read

    def touch(self, name: str) -> None:
        """``name`` changed ("" : the directory itself, so possibly every child)."""
        if not name:
            self.changed = None
        elif self.changed is not None:
            self.changed.add(name)

    def current(self) -> bool:
        return self.served is not None and self.changed is not None and not self.changed

    def put(self, name: str, record: Any) -> None:
        self.drop(name)
        self.records[name] = record
        if self._key is not None:
            self.keyed.setdefault(self._key(record), set()).add(name)
        if self._group is not None:
            self.grouped.setdefault(self._group(record), {})[name] = record

    def drop(self, name: str) -> None:
        old = self.records.pop(name, None)
        if old is None:
            return
        if self._key is not None:
            holders = self.keyed.get(self._key(old))
            if holders is not None:
                holders.discard(name)
                if not holders:
                    del self.keyed[self._key(old)]
        if self._group is not None:
            members = self.grouped.get(self._group(old))
            if members is not None:
                members.pop(name, None)
                if not members:
                    del self.grouped[self._group(old)]

    def clear(self) -> None:
        self.records.clear()
        self.keyed.clear()
        self.grouped.clear()
        self.unreadable = frozenset()


class ViewNotLoadedError(RuntimeError):
    """The view is not (or no longer) loaded: its session was lost, and what it holds may
    be stale. Callers skip the decision and retry."""


class _IdList:
    """A directory's topology ids in order, brought up to date by the names that changed
    (:meth:`ClusterView._ids`). Only the view's index lock guards it."""

    #: More changed names than this since the last read: list the children again.
    FEW = 64

    def __init__(self) -> None:
        self.touched: set[str] | None = None   # names changed since; None: every name
        self.ids: list[str] = []                # shared with readers: replaced, not changed
        self._members: set[str] = set()

    def touch(self, name: str) -> None:
        """``name`` changed ("": the directory itself, so possibly every child)."""
        if not name:
            self.touched = None
        elif self.touched is not None:
            self.touched.add(name)

    def replace(self, ids: list[str]) -> list[str]:
        """Every id, listed afresh (sorted), kept from now on."""
        self.ids, self._members = ids, set(ids)
        return ids

    def update(self, tree: WatchedTree, names: set[str],
               not_an_id: Callable[[str], None]) -> list[str]:
        """Apply ``names``' changes: each is in the list if and only if it is a held
        child of ``tree`` and a topology id."""
        ids: list[str] | None = None
        for name in sorted(names):
            held = tree.holds(tree.join(name))
            if held and not is_topology_id(name):
                not_an_id(name)  # logged once, as a listing logs it
                held = False
            if held == (name in self._members):
                continue
            if ids is None:
                ids = list(self.ids)  # a C-level copy: readers keep the old list
            if held:
                bisect.insort(ids, name)
                self._members.add(name)
            else:
                del ids[bisect.bisect_left(ids, name)]
                self._members.discard(name)
        if ids is not None:
            self.ids = ids
        return self.ids


class ClusterView:
    """Watched copies of ``directories`` under the state's root; see the module docstring."""

    def __init__(self, state: StormClusterState,
                 directories: tuple[str, ...] = NIMBUS_DIRECTORIES, name: str = "view",
                 audit_nodes_per_s: float = 0.0, audit_tick_s: float = AUDIT_TICK_S,
                 on_stale: StaleListener | None = None):
        """``audit_nodes_per_s`` > 0 compares that many held nodes a second with
        ZooKeeper, in the background, and re-reads any the view holds stale
        (:meth:`WatchedTree.audit`); ``on_stale(directory, path)`` is told of each."""
        self.state = state
        self.name = name
        self._audit_budget = math.ceil(audit_nodes_per_s * audit_tick_s)
        self._audit_tick_s = audit_tick_s
        self._on_stale = on_stale
        self._audit_stop = threading.Event()
        self._auditor: threading.Thread | None = None
        self._trees = {d: WatchedTree(state.zk, state.path(d), f"{name}-{d}")
                       for d in directories}
        self._memo: dict[str, tuple[int, Any]] = {}  # path -> (mzxid, record or RecordError)
        self._memo_lock = threading.Lock()
        self._listeners: list[Listener] = []
        # The whole-directory reads (storms(), assignments(), supervisors(), the name
        # index), kept up to date by name (see _RecordIndex): readers share them and
        # must not change them.
        indexes = {
            "storms": _RecordIndex(StormBase, is_topology_id, by_name=lambda b: b.storm_name,
                                   group=lambda b: b.status),
            "assignments": _RecordIndex(Assignment, is_topology_id),
            "supervisors": _RecordIndex(SupervisorInfo, lambda name: True),
            # Code keys: a node's metafile is set once its upload is done.
            "code-distributor": _RecordIndex(CodeMeta, is_topology_id, empty_absent=True),
        }
        self._indexes = {d: i for d, i in indexes.items() if d in self._trees}
        self._index_lock = threading.Lock()
        # Each directory's sorted topology ids, patched by the names that change (_ids).
        self._id_lists = {d: _IdList() for d in self._trees}
        # Each directory's report of a reconnection, until every directory has one.
        self._reconnects: dict[str, deque[Revalidation]] = {d: deque() for d in self._trees}
        self._reconnects_lock = threading.Lock()
        self.last_reconnect: Revalidation | None = None  # totals of the last one logged
        self.reconnect_count = 0
        for directory, tree in self._trees.items():
            tree.listen(lambda path, d=directory: self._changed(d, path))
            tree.listen_reconnect(lambda report, d=directory: self._reconnected(d, report))

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self, timeout_s: float = 60.0) -> None:
        """Load every directory; LayoutMissingError if one does not exist."""
        try:
            for tree in self._trees.values():
                tree.start(timeout_s)
        except WatchedTreeError as exc:
            self.close()
            raise LayoutMissingError(f"cannot watch the cluster state: {exc}") from None
        if self._audit_budget > 0 and self._auditor is None:
            self._audit_stop.clear()
            self._auditor = threading.Thread(target=self._audit_loop, daemon=True,
                                             name=f"view-audit-{self.name}")
            self._auditor.start()

    def close(self) -> None:
        self._audit_stop.set()
        if self._auditor is not None and self._auditor is not threading.current_thread():
            self._auditor.join(30)
        self._auditor = None
        for tree in self._trees.values():
            tree.close()
        with self._reconnects_lock:  # a reconnection half reported is never completed
            for reports in self._reconnects.values():
                reports.clear()

    def listen(self, listener: Listener) -> None:
        """Call ``listener(directory, topology_id)`` on a change under ``directory``;
        ``topology_id`` is the first path component below it ("" for the directory)."""
        self._listeners.append(listener)

    @property
    def loaded(self) -> bool:
        return all(tree.loaded for tree in self._trees.values())

    def barrier(self, timeout_s: float = 10.0, directories: tuple[str, ...] = ()) -> None:
        """Return once every change committed before the call is in the view (of
        ``directories``, or all). ViewNotLoadedError if that cannot be had in time (or
        the view is not started)."""
        try:
            barrier_of_trees([self._trees[d] for d in directories or self._trees], timeout_s)
        except WatchedTreeError as exc:
            raise ViewNotLoadedError(str(exc)) from None

    # -- topologies ---------------------------------------------------------------------------
    def active_storms(self) -> list[str]:
        """Ids of every topology under /storms (as :meth:`StormClusterState.active_storms`).
        Shared: do not change it."""
        return self._ids("storms")

    def has_storm(self, topology_id: str) -> bool:
        """Whether ``topology_id`` is under /storms (one of :meth:`active_storms`, its
        node read or not), in constant time."""
        tree = self._tree("storms")
        return is_topology_id(topology_id) and tree.holds(tree.join(topology_id))

    def storm_base(self, topology_id: str) -> StormBase | None:
        """RecordError if unreadable."""
        return self._record(StormBase, "storms", topology_id)

    def storms(self) -> dict[str, StormBase]:
        """Every readable StormBase (an unreadable one is logged once by the state).
        Shared: do not change it."""
        return self._indexed("storms")

    def storms_in(self, status: str) -> dict[str, StormBase]:
        """Every readable StormBase in ``status`` (KILLED, REBALANCING, ...), a copy of its
        own: kept by status as records change, so asking costs the topologies in that
        status, not a pass over every topology."""
        with self._index_lock:
            return dict(self._sync_index("storms").grouped.get(status, {}))

    def find_storm_by_name(self, name: str) -> tuple[str, StormBase] | None:
        """(id, StormBase) of the topology named ``name`` (the greatest id if several
        are), from memory in constant time."""
        with self._index_lock:
            index = self._sync_index("storms")
            holders = index.keyed.get(name)
            if not holders:
                return None
            topology_id = max(holders)
            return topology_id, index.records[topology_id]

    # -- assignments --------------------------------------------------------------------------
    def assignment(self, topology_id: str) -> tuple[Assignment, int] | None:
        """(Assignment, data version); RecordError if unreadable."""
        tree = self._tree("assignments")
        path = tree.join(topology_id)
        got = tree.get(path)
        if got is None:
            return None
        return self._decode(Assignment, path, got), got[1].version

    def assignment_ids(self) -> list[str]:
        return self._ids("assignments")

    def assignments(self) -> dict[str, Assignment]:
        """Every readable Assignment. Shared: do not change it."""
        return self._indexed("assignments")

    # -- supervisors --------------------------------------------------------------------------
    def supervisors(self) -> dict[str, SupervisorInfo]:
        """Every live supervisor whose heartbeat this release can read. Shared: do not
        change it."""
        return self._indexed("supervisors")

    def unreadable(self, directory: str) -> frozenset[str]:
        """Names under ``directory`` (storms, assignments, supervisors, code-distributor)
        whose node this
        release cannot read: left out of the whole-directory reads."""
        with self._index_lock:
            return self._sync_index(directory).unreadable

    def has_supervisor(self, supervisor_id: str) -> bool:
        """Whether the view holds ``supervisor_id``'s node (readable or not)."""
        tree = self._tree("supervisors")
        return tree.get(tree.join(supervisor_id)) is not None

    def worker_beat_versions(self, topology_id: str) -> dict[str, int]:
        """``<node>-<port>`` -> data version of each worker heartbeat of a topology."""
        tree = self._tree("workerbeats")
        base = tree.join(topology_id)
        out = {}
        for child in tree.children(base):
            got = tree.get(posixpath.join(base, child))
            if got is not None:
                out[child] = got[1].version
        return out

    # -- code ---------------------------------------------------------------------------------
    def code_topologies(self) -> list[str]:
        return self._ids("code-distributor")

    def code_meta(self, topology_id: str) -> CodeMeta | None:
        """The published metafile, or None while the upload is in progress; RecordError
        if the node holds something else."""
        tree = self._tree("code-distributor")
        path = tree.join(topology_id)
        got = tree.get(path)
        if got is None or not got[0]:
            return None
        return self._decode(CodeMeta, path, got)

    def code_metas(self) -> dict[str, CodeMeta]:
        """code key -> its published metafile, for every code node that has one and
        that this release can read (those it cannot: :meth:`unreadable`). Shared: do not
        change it."""
        return self._indexed("code-distributor")

    def replica_hosts(self, topology_id: str) -> list[str]:
        tree = self._tree("code-distributor")
        return tree.children(tree.join(topology_id))

    # -- code versions ------------------------------------------------------------------------
    def code_versions(self, topology_id: str) -> tuple[CodeVersions, int] | None:
        """(CodeVersions, data version) of an upgraded topology, None for one never
        upgraded; RecordError if unreadable."""
        tree = self._tree("code-versions")
        path = tree.join(topology_id)
        got = tree.get(path)
        if got is None:
            return None
        return self._decode(CodeVersions, path, got), got[1].version

    def running_code_key(self, topology_id: str) -> str:
        """The code key of the version ``topology_id``'s workers run: its id when it was
        never upgraded, or when its /code-versions node cannot be read here."""
        try:
            got = self.code_versions(topology_id)
        except (RecordError, ViewNotLoadedError):
            return topology_id
        if got is None or got[0].entry(got[0].running) is None:
            return topology_id
        return version_key(topology_id, got[0].running)

    def upgraded_topologies(self) -> list[str]:
        """Ids of the topologies that have a /code-versions node."""
        return self._ids("code-versions")

    # -- audit --------------------------------------------------------------------------------
    def audit(self, budget: int, current: int = 0) -> tuple[list[tuple[str, str]], int]:
        """One audit step: ``budget`` nodes of the directory at index ``current`` in
        turn, plus every directory's earlier differences. Returns the stale
        (directory, path) pairs re-read, and the index of the directory to go on with."""
        stale = []
        directories = list(self._trees)
        for index, directory in enumerate(directories):
            tree = self._trees[directory]
            paths, ended = tree.audit(budget if index == current else 0)
            stale.extend((directory, path) for path in paths)
            if index == current and ended:
                current = (current + 1) % len(directories)
        for directory, path in stale:
            if self._on_stale is not None:
                self._on_stale(directory, path)
        return stale, current

    def _audit_loop(self) -> None:
        current = 0
        while not self._audit_stop.wait(self._audit_tick_s):
            try:
                _stale, current = self.audit(self._audit_budget, current)
            except (WatchedTreeError, KazooException, KazooTimeoutError) as exc:
                # The session is down or slow: the next tick tries again.
                log.info("%s: view audit skipped: %s", self.name, exc)
            except Exception:
                log.exception("%s: view audit failed", self.name)

    # -- internals ----------------------------------------------------------------------------
    def _tree(self, directory: str) -> WatchedTree:
        tree = self._trees[directory]
        if not tree.started:
            raise ViewNotLoadedError(f"{tree.path}: not watched by this view (yet)")
        if not tree.loaded:
            raise ViewNotLoadedError(f"{tree.path}: not loaded (ZooKeeper session lost?)")
        if not tree.present():
            raise LayoutMissingError(
                f"{tree.path} does not exist: ZooKeeper was wiped, or the root belongs "
                "to another cluster; refusing to act on it")
        return tree

    def _indexed(self, directory: str) -> dict[str, Any]:
        """The shared copy of ``directory``'s readable records, brought up to date."""
        with self._index_lock:
            index = self._sync_index(directory)
            if index.served is None:
                index.served = dict(index.records)  # a C-level copy
            return index.served

    def _sync_index(self, directory: str) -> _RecordIndex:
        """Decode what changed under ``directory`` since the last read (the caller holds
        the index lock); the tree is checked loaded and present first."""
        tree = self._tree(directory)
        index = self._indexes[directory]
        if index.current():
            return index
        if index.changed is None:
            index.clear()
            names: Any = tree.children()
        else:
            names = sorted(index.changed)
        index.changed = set()
        index.served = None
        for name in names:
            if not index.accept(name):
                continue
            path = tree.join(name)
            got = tree.get(path)
            if got is None or (index.empty_absent and not got[0]):
                index.drop(name)
                index.unreadable -= {name}
                continue
            try:
                index.put(name, self._decode(index.cls, path, got))
                index.unreadable -= {name}
            except RecordError:
                index.drop(name)  # logged once by the state
                index.unreadable |= {name}
        return index

    def _ids(self, directory: str) -> list[str]:
        """The topology ids among ``directory``'s children, sorted; shared, do not change
        it. Kept across changes: a change costs its own names (a presence check each, an
        insertion or removal in order), not a sort and a pattern match per child, which
        every submit made every reader pay at 10,000 topologies."""
        tree = self._tree(directory)
        kept = self._id_lists[directory]
        with self._index_lock:
            touched, kept.touched = kept.touched, set()
            if touched is not None and len(touched) <= _IdList.FEW:
                return kept.update(
                    tree, touched, lambda child: self.state.note_not_topology_id(directory, child))
            # Listed afresh under the lock (the first read, a reconnection, a burst): a
            # reader arriving meanwhile waits for this list rather than take the old one.
            ids = []
            for child in tree.children():
                if is_topology_id(child):
                    ids.append(child)
                else:  # logged once, as a listing logs it
                    self.state.note_not_topology_id(directory, child)
            return kept.replace(ids)

    def _record(self, cls: type[R], directory: str, topology_id: str) -> R | None:
        tree = self._tree(directory)
        path = tree.join(topology_id)
        got = tree.get(path)
        return self._decode(cls, path, got) if got is not None else None

    def _decode(self, cls: type[R], path: str, got: tuple[bytes, Any]) -> R:
        version = got[1].mzxid
        with self._memo_lock:
            memo = self._memo.get(path)
        if memo is not None and memo[0] == version:
            if isinstance(memo[1], RecordError):
                raise memo[1]
            return memo[1]
        try:
            record: Any = self.state.decode_record(cls, path, got)
        except RecordError as exc:
            record = exc
        with self._memo_lock:
            self._memo[path] = (version, record)
        if isinstance(record, RecordError):
            raise record
        return record

    def _reconnected(self, directory: str, report: Revalidation) -> None:
        """One line per reconnection, once every directory is done with it (each on its
        own cache's thread)."""
        with self._reconnects_lock:
            self._reconnects[directory].append(report)
            if not all(self._reconnects.values()):
                return
            total = Revalidation.total([q.popleft() for q in self._reconnects.values()])
            with self._index_lock:  # whatever the report says, read every name again
                for index in self._indexes.values():
                    index.touch("")
            if total.reloaded:
                log.info("%s: the ZooKeeper session was lost: the view was reloaded from "
                         "scratch (%d nodes read)", self.name, total.reloaded)
            else:
                log.info("%s: ZooKeeper connection back within the session: %d nodes "
                         "re-validated, %d re-read (%d changed, %d new, %d unread), %d "
                         "removed%s", self.name, total.validated, total.reread,
                         total.changed, total.added, total.unread, total.removed,
                         f"; {total.failed} answers lost to another drop (the next "
                         "reconnection re-validates them)" if total.failed else "")
            self.last_reconnect = total  # after the line: whoever sees it can find that
            self.reconnect_count += 1

    def _changed(self, directory: str, path: str) -> None:
        tree = self._trees[directory]
        relative = path[len(tree.path):].strip("/")
        topology_id = relative.split("/", 1)[0] if relative else ""
        index = self._indexes.get(directory)
        with self._index_lock:
            if index is not None:
                index.touch(topology_id)
            self._id_lists[directory].touch(topology_id)
        if relative and tree.get(path) is None:  # removed: forget its decoded record
            with self._memo_lock:
                self._memo.pop(path, None)
        for listener in self._listeners:
            listener(directory, topology_id)
