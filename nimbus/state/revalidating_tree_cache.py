"""A tree cache that lives through a ZooKeeper connection blip without reading its data
again: only what changed while it was disconnected is read.

Why: ZooKeeper keeps a session's watches on its *connection*, and kazoo neither keeps
them across a new connection nor sends ZooKeeper's SetWatches when it reconnects to the
same session (it did for a while, python-zk/kazoo#305, reverted in #450; kazoo 2.11 and
its main branch have none). On SUSPENDED kazoo forgets every watcher
(``KazooClient._session_callback``), so kazoo's ``TreeCache`` re-reads every node when the
connection comes back (``TreeNode.on_reconnected``: a ``get`` and a ``get_children`` a
node, data included). 200 nodes cost 201 data reads a blip; a ZooKeeper server restart
made every nimbus and supervisor connected to it read its whole view at once.

What :class:`RevalidatingTreeCache` does instead, on a reconnection *within the session*
(it was loaded and no LOST came since): it keeps what it holds, and re-arms each held
node's watches with the two requests that set them without reading data, ``exists``
(data watch; the node's stat) and ``get_children`` (child watch; the listing; no watch
while the directory's recursive watch reports new nodes, which is added again first:
nimbus.state.ordered_tree_cache), all sent at once from the cache's thread (pipelined:
about one round trip, plus the server's time for two small requests a node). Each
answer is compared with what is held:

* a node whose (czxid, mzxid) differs is read again (``get``): changed, or re-created;
* a node that is gone is removed, with whatever is held below it;
* a child listed but not held is added and read as on a first load; a held child not
  listed is removed (the listing itself is compared: a stat's cversion/pzxid would only
  say *that* the children changed);
* a node held but never read (its first ``get`` failed with the connection) is read.

Nothing else is read or published. A round ends when every answer is in, those of the
reads it caused included (a new subtree is loaded by then), so the view has caught up;
listeners (:meth:`RevalidatingTreeCache.listen_reconnect`) then get a
:class:`Revalidation`. The view stays loaded, and readable, throughout.

Why that is exact: ZooKeeper sets a watch and answers the request in one step, so a change
made before a node's answer shows in it and one made after fires the new watch as usual;
answers and watch events are applied in the order ZooKeeper sent them, on the cache's
one thread (:mod:`nimbus.state.ordered_tree_cache`). After a LOST session nothing held
can be trusted (ephemeral nodes died with it, watches and answers in flight are gone),
so the cache reloads every node, as kazoo's does, and says so (``Revalidation.reloaded``).

Why not SetWatches, though it is one request (in batches) instead of two a node: kazoo's
connection loop (``ConnectionHandler._connect_attempt``) has no hook to send a request
between the handshake and the queued ones, and it treats an answer whose xid is not the
next pending request's (SetWatches answers with xid -8) as a protocol error; it would
mean driving kazoo's private socket methods from a state listener on its connection
thread, where a mistake hangs or kills the whole session (and whatever else uses it),
and knowing which of kazoo's data watchers are exists-watches, which kazoo does not record.
#305 was reverted for the RuntimeErrors it raised. The requests here are kazoo's public
async calls, answered like any other; the cost is two small answers a node a blip
instead of a full reload.

Only private parts of kazoo's recipe are relied on (``TreeCache._session_watcher``,
``_in_background``, ``_is_initialized``; ``TreeNode._children``, ``_data``, ``_state``,
``_refresh*``, ``on_deleted``); ``tests/test_view_reconnect.py`` fails if a kazoo release
changes how its own cache reconnects.
"""

from __future__ import annotations

import functools
import logging
import posixpath
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import EventType, KazooState, WatchedEvent
from kazoo.recipe.cache import TreeEvent, TreeNode

from nimbus.state.ordered_tree_cache import OrderedTreeCache, OrderedTreeNode

log = logging.getLogger(__name__)


@dataclass
class Revalidation:
    """What one reconnection cost a tree (or a view: see :meth:`total`)."""

    validated: int = 0  # held nodes whose watches were set again
    changed: int = 0    # read again: their data changed (or they were re-created)
    added: int = 0      # children found that were not held: read as on a first load
    unread: int = 0     # held but never read (a first read lost with the connection)
    removed: int = 0    # held nodes found gone (with what was held below them)
    failed: int = 0     # answers lost to another drop: the next reconnection re-validates
    reloaded: int = 0   # after a LOST session: every node read again (then nothing else)

    @property
    def reread(self) -> int:
        """Nodes whose data the reconnection read."""
        return self.changed + self.added + self.unread

    @classmethod
    def total(cls, reports: list[Revalidation]) -> Revalidation:
        return cls(**{f.name: sum(getattr(r, f.name) for r in reports) for f in fields(cls)})


ReconnectListener = Callable[[Revalidation], None]


class _Round:
    """One reconnection's re-validation: its report and the answers still to come."""

    def __init__(self) -> None:
        self.report = Revalidation()
        self.pending = 0


class RevalidatingTreeNode(OrderedTreeNode):
    """A cached node that can re-validate itself after a reconnection. Every request a
    re-validation causes (its own, the reads of what changed, the loads of new subtrees)
    is counted in its round, so a round ends when the view has caught up."""

    __slots__ = ()

    def _process_watch(self, watched_event: WatchedEvent) -> None:
        self._tree._in_background(self._on_watch, watched_event)

    def _on_watch(self, event: WatchedEvent) -> None:
        if self._removed():
            # A re-validation answered after this node's removal set this watch again.
            # Its path may be re-created: the new node has a watch of its own.
            return
        if event.type == EventType.CREATED and self._parent is not None:
            # The exists-watch a re-validation sets on a node it finds gone, fired by the
            # path's creation after a removal this node did not see: read it as a change.
            self._refresh_data()
            return
        TreeNode._process_watch(self, event)

    def _removed(self) -> bool:
        """No longer held (the directory itself is revived by its exists-watch instead)."""
        return self._parent is not None and self._state == self.STATE_DEAD

    def _subtree_size(self) -> int:
        return 1 + sum(child._subtree_size() for child in self._children.values())

    # -- requests of a round ------------------------------------------------------------------
    def _revalidate(self, round_: _Round) -> None:
        """Set this node's watches again and compare what comes back (the cache's thread)."""
        if self._state == self.STATE_DEAD:
            # Only the directory itself is walked dead: watch for its creation again.
            self._call_client("exists", self._path)
            return
        round_.report.validated += 1
        if self._data is None:
            round_.report.unread += 1
            self._read("get", round_)  # sets both watches, as on a first load
            self._read("get_children", round_)
            return
        client: KazooClient = self._tree._client
        for kind, send in (("exists", client.exists_async),
                           ("get_children", client.get_children_async)):
            round_.pending += 1
            send(self._path, watch=self._watch_for(kind)).rawlink(
                functools.partial(self._tree._in_background, self._revalidated, kind, round_))

    def _read(self, method: str, round_: _Round) -> None:
        """A ``get`` or ``get_children`` whose answer is applied as any other (it sets the
        watch too), and counted in ``round_``."""
        self._tree._outstanding_ops += 1  # as TreeNode._call_client counts it
        round_.pending += 1
        getattr(self._tree._client, f"{method}_async")(
            self._path, watch=self._watch_for(method)).rawlink(
            functools.partial(self._tree._in_background, self._read_answered, method, round_))

    def _adopt(self, name: str) -> None:
        round_ = self._tree._loading_for
        if round_ is None:  # not during a round: as always
            super()._adopt(name)
            return
        node = type(self)(self._tree, posixpath.join(self._path, name), self)
        self._children[name] = node
        round_.report.added += 1
        node._read("get", round_)
        node._read("get_children", round_)

    # -- answers of a round -------------------------------------------------------------------
    def _read_answered(self, method: str, round_: _Round, result: Any) -> None:
        round_.pending -= 1
        try:
            if self._removed():  # its answer must not bring a node no longer held back
                self._tree._outstanding_ops -= 1
                self._reset_watchers()
                return
            if not result.successful() and not isinstance(result.exception, NoNodeError):
                round_.report.failed += 1
            self._tree._loading_for = round_  # children it adds are this round's too
            try:
                self._process_result(method, self._path, result)
            finally:
                self._tree._loading_for = None
        finally:
            self._tree._answered(round_)

    def _revalidated(self, kind: str, round_: _Round, result: Any) -> None:
        round_.pending -= 1
        try:
            if self._state == self.STATE_DEAD:
                if self._removed():  # removed since it was asked about: drop the new watch
                    self._reset_watchers()
            elif not result.successful() and not isinstance(result.exception, NoNodeError):
                round_.report.failed += 1
            elif kind == "exists":
                self._compare_stat(round_, result.get())
            elif not result.successful():  # get_children: gone since its exists answer
                self._remove(round_)
            else:
                self._compare_children(round_, set(result.get()))
        finally:
            self._tree._answered(round_)

    def _compare_stat(self, round_: _Round, stat: Any) -> None:
        if stat is None:
            self._remove(round_)
            return
        held = self._data.stat if self._data is not None else None
        if held is None or (held.czxid, held.mzxid) != (stat.czxid, stat.mzxid):
            round_.report.changed += 1
            self._read("get", round_)

    def _compare_children(self, round_: _Round, listed: set[str]) -> None:
        for name, child in list(self._children.items()):
            if name not in listed:
                child._remove(round_)
        self._tree._loading_for = round_
        try:
            for name in sorted(listed - set(self._children)):
                self._adopt(name)
        finally:
            self._tree._loading_for = None

    def _remove(self, round_: _Round) -> None:
        round_.report.removed += self._subtree_size()
        self.on_deleted()


class RevalidatingTreeCache(OrderedTreeCache):
    """:class:`OrderedTreeCache` that re-validates instead of reloading after a
    reconnection within its session; see the module docstring. Same API, plus
    :meth:`listen_reconnect`."""

    def __init__(self, client: KazooClient, path: str):
        super().__init__(client, path)
        self._root = RevalidatingTreeNode.make_root(self, path)
        self._reconnect_listeners: list[ReconnectListener] = []
        self._loading_for: _Round | None = None  # the round whose answer is being applied
        self._ever_initialized = False
        self._reloading = False
        self.listen(self._on_own_event)

    def listen_reconnect(self, listener: ReconnectListener) -> None:
        """Call ``listener(report)`` on the cache's thread once the work of a reconnection
        is done: every re-validation answer in, or, after a LOST session, every node
        loaded again (``report.reloaded``)."""
        self._reconnect_listeners.append(listener)

    def _session_watcher(self, state: str) -> None:
        if state == KazooState.CONNECTED:
            # kazoo's connection thread, before any request is sent on the new connection:
            # decide on the cache's thread, in order with the answers already queued there,
            # once the recursive watch is back on this connection (before any read).
            self._in_background(self._arm_recursive)
            self._in_background(self._on_connected)
        else:
            super()._session_watcher(state)

    def _on_connected(self) -> None:
        if self._state != self.STATE_STARTED:
            return
        if not self._is_initialized:  # not loaded yet, or the session was lost: load all
            self._root.on_reconnected()
            self._publish_event(TreeEvent.CONNECTION_RECONNECTED)
            return
        round_ = _Round()
        nodes = [self._root]
        while nodes:  # parents are asked before their children
            node = nodes.pop()
            node._revalidate(round_)
            nodes.extend(node._children.values())
        if round_.pending == 0:
            self._finish(round_.report)

    def _answered(self, round_: _Round) -> None:
        if round_.pending == 0:
            self._finish(round_.report)

    def _finish(self, report: Revalidation) -> None:
        # Published only now: "anything may have changed" is then true of a view that
        # has caught up (each change found was published on its own as well).
        self._publish_event(TreeEvent.CONNECTION_RECONNECTED)
        self._report(report)

    def _report(self, report: Revalidation) -> None:
        for listener in self._reconnect_listeners:
            try:
                listener(report)
            except Exception:
                log.exception("%s: reconnect listener failed", self._root._path)

    def _on_own_event(self, event: TreeEvent) -> None:
        kind = event.event_type
        if kind == TreeEvent.CONNECTION_LOST and self._ever_initialized:
            self._reloading = True
        elif kind == TreeEvent.INITIALIZED:
            self._ever_initialized = True
            if self._reloading:
                self._reloading = False
                self._report(Revalidation(reloaded=self._root._subtree_size()))
