"""One ZooKeeper directory kept in memory by watches (kazoo's ``TreeCache``).

Readers that used to list a directory and read every child on each wake-up (O(N) round
trips per change) read this instead: after the first load, a change costs ZooKeeper only
the round trips for the nodes that changed, however many there are in all.

What this adds to ``TreeCache`` (in its race-free form,
:class:`~nimbus.state.ordered_tree_cache.OrderedTreeCache`):

* it refuses to start on a directory that does not exist: ``TreeCache`` would create it,
  and an absent directory means a wiped or foreign ZooKeeper (``LayoutMissingError``),
  never an empty one;
* its background thread is named and joined on :meth:`WatchedTree.close`;
* a reconnection within the session keeps what is held and reads again only what
  changed meanwhile (:mod:`nimbus.state.revalidating_tree_cache`); reconnect listeners
  are told what it cost;
* :meth:`WatchedTree.barrier`: wait until every change made before the call (by anyone) is
  in memory, for read-your-writes and for decisions that must not miss a recent change;
* listeners get the changed path only, on the cache's own thread.
"""

from __future__ import annotations

import logging
import posixpath
import threading
import time
from collections.abc import Callable

from kazoo.client import KazooClient
from kazoo.protocol.states import Callback, ZnodeStat
from kazoo.recipe.cache import TreeCache, TreeEvent

from nimbus.state.revalidating_tree_cache import (
    ReconnectListener,
    RevalidatingTreeCache,
    Revalidation,
)

log = logging.getLogger(__name__)

Listener = Callable[[str], None]
# What is known of a node: None (no node) or (czxid, mzxid, number of children).
Fact = tuple[int, int, int] | None


def _lagging(first: tuple[Fact, Fact], zk_now: Fact, held: Fact, since: int) -> bool:
    """Whether a view holding ``held`` after a barrier missed a change. ``first`` is
    (ZooKeeper, view) at the previous look, whose answers are later than zxid ``since``;
    ``zk_now`` is what ZooKeeper had at the latest look: just before the barrier, or
    after it for a node not held."""
    zk_then, held_then = first
    if zk_then is None:  # no node then: holding one created before is holding a deleted one
        return held is not None and held[0] <= since
    if held is None:  # it existed then and after the barrier (same creation): not held
        return zk_now is not None and zk_now[0] == zk_then[0]
    if held[0] != zk_then[0] or held[1] != zk_then[1]:
        return (held[0], held[1]) < (zk_then[0], zk_then[1])  # an older version
    return held[2] != zk_then[2] and zk_now == zk_then and held == held_then


class WatchedTreeError(RuntimeError):
    """The directory cannot be watched (absent, or not loaded in time)."""


def barrier(trees: list[WatchedTree], timeout_s: float = 10.0) -> None:
    """Return once every change committed before this call is in memory in each of
    ``trees``, which share one ZooKeeper session. Raises WatchedTreeError on timeout, or
    if one is not watched.

    Built only on ordering ZooKeeper and kazoo guarantee: a session gets a watch event
    before the answer to any later request, answers come in request order, and kazoo runs
    watch callbacks and completion callbacks each on one thread, in order. So: a ``sync``
    round trip (every earlier event is then queued), drain the watch callbacks and then
    each cache's thread, which handles them (the caches have asked for every changed
    node), then a round trip and a drain of the completion callbacks and of each cache's
    thread (the answers are in memory). Answers about new nodes make a cache ask for
    their children, so the last step repeats once per level (the deepest ``depth`` + 1
    times). The trees go through each step together: the cost is that of one tree, a
    constant number of round trips and hand-offs between threads (each may wait for the
    GIL on a busy process, so they are kept few)."""
    if not trees:
        return
    zk = trees[0].zk
    for tree in trees:
        if not tree.started:
            raise WatchedTreeError(f"{tree.path} is not watched")
        if tree.zk is not zk:
            raise ValueError("a barrier covers trees of one ZooKeeper session")
    deadline = time.monotonic() + timeout_s
    handler = zk.handler

    def drained(*queues: Callable[[Callable[[], None]], None]) -> None:
        marks = []
        for put in queues:
            marks.append(threading.Event())
            put(marks[-1].set)
        for mark in marks:
            if not mark.wait(max(0.0, deadline - time.monotonic())):
                raise WatchedTreeError(
                    f"{', '.join(t.path for t in trees)}: changes not in memory within "
                    f"{timeout_s:.0f}s")

    caches = [tree._cache._in_background for tree in trees]
    zk.retry(zk.sync, trees[0].path)
    drained(lambda f: handler.dispatch_callback(Callback("watch", f, ())))
    drained(*caches)  # watch events are handled there
    # One round per level: an answer about a new node at one level makes the cache ask
    # about that node's children. Always every round: a constant cost, and it does not
    # depend on the caches' private counts of requests in flight.
    for _level in range(max(tree.depth for tree in trees) + 1):
        zk.exists_async(trees[0].path).get(timeout=max(0.0, deadline - time.monotonic()))
        drained(handler.completion_queue.put)
        drained(*caches)


class WatchedTree:
    """The nodes under ``path`` (any depth), current as of the last watch event.

    Reads never touch ZooKeeper. Paths given to the readers are absolute.
    """


    def __init__(self, zk: KazooClient, path: str, name: str, depth: int = 2):
        """``depth``: how many levels below ``path`` nodes may be (what :meth:`barrier`
        waits for); nimbus-ha's deepest is /code-distributor/<topology>/<host>."""
        self.zk = zk
        self.depth = depth
        self.path = path.rstrip("/") or "/"
        self.name = name
        self._cache = self._new_cache()
        self._listeners: list[Listener] = []
        self._reconnect_listeners: list[ReconnectListener] = []
        self._initialized = threading.Event()
        self._started = False
        self._audit_queue: list[str] = []  # nodes still to compare in this round
        self._suspects: dict[str, tuple[Fact, Fact]] = {}  # differed at the last audit
        self._suspects_since = 0  # a zxid no later than the suspects' looks

    def _new_cache(self) -> RevalidatingTreeCache:
        cache = RevalidatingTreeCache(self.zk, self.path)
        cache.listen(self._on_event)
        cache.listen_fault(self._on_fault)
        cache.listen_reconnect(self._on_reconnect)
        return cache

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self, timeout_s: float = 30.0) -> None:
        """Load the directory and keep it current; returns once it is loaded.

        Raises WatchedTreeError if the directory does not exist or does not load within
        ``timeout_s``."""
        if self._started:
            return
        if self.zk.retry(self.zk.exists, self.path) is None:
            raise WatchedTreeError(f"{self.path} does not exist: nothing to watch")
        if self._cache._state != TreeCache.STATE_LATENT:  # closed: a TreeCache starts once
            self._cache = self._new_cache()
        self._initialized.clear()
        self._cache.start()
        self._started = True
        thread = self._cache._task_thread  # spawned by TreeCache.start; named here
        if isinstance(thread, threading.Thread):
            thread.name = f"zk-tree-{self.name}"
        if not self._initialized.wait(timeout_s):
            self.close()
            raise WatchedTreeError(f"{self.path} not loaded within {timeout_s:.0f}s")

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop watching and join the cache's thread."""
        if not self._started:
            return
        self._started = False
        self._initialized.clear()
        self._audit_queue, self._suspects = [], {}
        self._cache.close()
        thread = self._cache._task_thread
        if isinstance(thread, threading.Thread) and thread is not threading.current_thread():
            thread.join(timeout_s)

    def listen(self, listener: Listener) -> None:
        """Call ``listener(path)`` (on the cache's thread) after a node under this
        directory was added, changed or removed; ``path`` is the directory itself after a
        reconnection, once the view has caught up (anything may have changed)."""
        self._listeners.append(listener)

    def listen_reconnect(self, listener: ReconnectListener) -> None:
        """Call ``listener(report)`` (on the cache's thread) once the work of each
        reconnection is done: within the session, every held node re-validated; after a
        lost session, every node loaded again (``report.reloaded``)."""
        self._reconnect_listeners.append(listener)

    @property
    def started(self) -> bool:
        """Started and not closed since (loaded or not)."""
        return self._started

    @property
    def loaded(self) -> bool:
        """Loaded, and not since lost with the session."""
        return self._initialized.is_set()

    # -- reading ------------------------------------------------------------------------------
    def present(self) -> bool:
        """Whether the directory itself exists (False once it is deleted)."""
        return self._cache.get_data(self.path) is not None

    def children(self, path: str | None = None) -> list[str]:
        """Sorted names of the children of ``path`` (this directory by default)."""
        return sorted(self._cache.get_children(path or self.path, default=frozenset()))

    def holds(self, path: str) -> bool:
        """Whether ``path`` is held (listed under its parent; its data may not be read
        yet), as :meth:`children` of its parent would list it."""
        return self._cache._find_node(path) is not None

    def get(self, path: str) -> tuple[bytes, ZnodeStat] | None:
        """(data, stat) of a node, or None if it is not (yet) known."""
        node = self._cache.get_data(path)
        if node is None:
            return None
        return node.data, node.stat

    def join(self, *parts: str) -> str:
        return posixpath.join(self.path, *parts)

    def barrier(self, timeout_s: float = 10.0) -> None:
        """Return once every change committed before this call is in memory; see
        :func:`barrier`."""
        barrier([self], timeout_s)

    # -- audit --------------------------------------------------------------------------------
    def audit(self, limit: int, timeout_s: float = 10.0) -> tuple[list[str], bool]:
        """Compare up to ``limit`` held nodes (the next in a round over the whole tree) and
        every node that differed at the last audit with ZooKeeper, and re-read each one
        this view holds stale. Returns (stale paths, whether a round over the tree ended).

        Defence in depth: watches keep the view current, and no way for them to miss a
        change is known since :mod:`nimbus.state.ordered_tree_cache`; but a view that
        missed one would never learn of it, and a scheduler or supervisor would act on
        the old value. A node is compared by creation and modification zxid and number
        of children (one ``exists`` each, sent together). A difference is often a change
        in flight, so a node that differs is judged at the next audit, after a
        :meth:`barrier` (which brings in every change made before it): it is stale if the
        view is still behind what ZooKeeper held at the first look (an older version, a
        node already deleted then, or one that existed then and still does but is not
        held), or if its number of children still differs while neither side changed (a
        count has no order, so only a quiet directory is judged by it). Re-reading a node
        (its data and children) goes through the cache, which then publishes the change
        as usual. Raises WatchedTreeError if a comparison does not finish in time."""
        if not self.loaded:
            return [], False
        if limit > 0 and not self._audit_queue:  # a step with no budget walks nothing
            self._audit_queue = self._held_paths()
        batch = self._audit_queue[-limit:] if limit > 0 else []
        del self._audit_queue[len(self._audit_queue) - len(batch):]
        ended = limit > 0 and not self._audit_queue
        suspects, since = self._suspects, self._suspects_since
        # Every answer below is at least this recent: a lower bound for their zxid.
        self._suspects, self._suspects_since = {}, self.zk.last_zxid
        differ = {path: look for path, look in
                  self._look(list(dict.fromkeys([*suspects, *batch])), timeout_s).items()
                  if look[0] != look[1]}
        again = [path for path in suspects if path in differ]
        stale: list[str] = []
        if again:
            self.barrier(timeout_s)
            # A node not held may have been deleted just before the barrier: ask again.
            latest = {path: look[0] for path, look in self._look(
                [path for path in again if self._held(path) is None], timeout_s).items()}
            stale = [path for path in again
                     if _lagging(suspects[path], latest.get(path, differ[path][0]),
                                 self._held(path), since)]
        for path in stale:
            log.warning("%s: the view held %s stale (czxid, mzxid, children: held %s, "
                        "ZooKeeper had %s); re-reading it", self.name, path,
                        self._held(path), suspects[path][0])
            self._reread(path)
        self._suspects = {path: look for path, look in differ.items() if path not in stale}
        return stale, ended

    def _held_paths(self) -> list[str]:
        """Every node held, the directory first (popped from the end: reversed)."""
        paths, level = [], [self.path]
        while level:
            paths.extend(level)
            level = [posixpath.join(parent, child) for parent in level
                     for child in self.children(parent)]
        paths.reverse()
        return paths

    def _held(self, path: str) -> Fact:
        node = self._cache.get_data(path)
        if node is None:
            return None
        return (node.stat.czxid, node.stat.mzxid,
                len(self._cache.get_children(path, default=frozenset())))

    def _look(self, paths: list[str], timeout_s: float) -> dict[str, tuple[Fact, Fact]]:
        """path -> (what ZooKeeper has, what the view holds)."""
        asked = [(path, self.zk.exists_async(path)) for path in paths]
        looks = {}
        for path, answer in asked:
            stat = answer.get(timeout=timeout_s)
            zk_has = None if stat is None else (stat.czxid, stat.mzxid, stat.numChildren)
            looks[path] = (zk_has, self._held(path))
        return looks

    def _reread(self, path: str) -> None:
        """Have the cache read ``path`` again, or its nearest held ancestor if it is not
        held (that ancestor's children are read again, which adds it)."""
        node = self._cache._find_node(path)
        while node is None and path != self.path:
            path = posixpath.dirname(path)
            node = self._cache._find_node(path)
        if node is not None:
            self._cache._in_background(node._refresh)

    # -- events -------------------------------------------------------------------------------
    def _on_event(self, event: TreeEvent) -> None:
        kind = event.event_type
        if kind == TreeEvent.INITIALIZED:
            self._initialized.set()
            self._notify(self.path)
        elif kind == TreeEvent.CONNECTION_LOST:
            self._initialized.clear()
        elif kind == TreeEvent.CONNECTION_RECONNECTED:
            self._notify(self.path)
        elif kind in (TreeEvent.NODE_ADDED, TreeEvent.NODE_UPDATED, TreeEvent.NODE_REMOVED):
            data = event.event_data
            self._notify(data.path if data is not None else self.path)

    def _on_reconnect(self, report: Revalidation) -> None:
        log.debug("%s: reconnected: %s", self.name, report)
        for listener in self._reconnect_listeners:
            try:
                listener(report)
            except Exception:
                log.exception("%s: reconnect listener failed", self.name)

    def _notify(self, path: str) -> None:
        for listener in self._listeners:
            try:
                listener(path)
            except Exception:
                log.exception("%s: listener failed", self.name)

    def _on_fault(self, exc: Exception) -> None:
        log.warning("%s: watching %s failed: %s", self.name, self.path, exc)
