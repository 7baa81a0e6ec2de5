"""kazoo's ``TreeCache`` with its update-ordering race closed (python-zk/kazoo#645).

Why: ``TreeCache`` sends a node's requests from two threads. Its own thread sends the
first ``get`` of a new node; kazoo's watch thread sends the ``get`` that follows a
change. Each request's answer reaches the cache through a callback that is attached only
*after* the request is sent. So when the thread that sent the first ``get`` is preempted
between sending and attaching (a busy nimbus with thousands of nodes), the answer to the
later ``get`` can be applied first and the older answer last. The cache then holds the
old data for good: no further change, no further watch event. Seen at 5,000 topologies:
a follower kept ``/code-distributor/<id>`` without the metafile set 21 ms after the node
was created, and never fetched that topology's code.

The fix, in two parts:

* every watch event is handled on the cache's own thread, so a single thread sends and
  links every request in turn, and answers are applied in the order ZooKeeper gave them
  (this also stops the watch thread from changing the tree while the cache thread walks
  it, and makes the cache's count of requests in flight exact);
* a data answer older than the data held (smaller ``mzxid``) is dropped, whatever the
  cause: a node's ``mzxid`` only grows.

Only private parts of kazoo's recipe are overridden (``TreeNode._process_watch``,
``_process_result`` and ``_call_client``); ``tests/test_watched_tree.py`` fails if a kazoo
release changes them in a way that reopens the race.

New nodes by name (:mod:`nimbus.state.recursive_watch`): on a client that can hold
ZooKeeper's persistent recursive watches, the cache adds one on its directory, on every
new connection before anything is read, and lists a directory only once (when it is
first read, and when a reconnection is checked), with no child watch. A node's creation
then arrives as an event with its path, handled on the cache's thread in order with every
other event and answer: the parent, held since its own creation event, adopts the child
unless its listing already did. Deletions and data changes still arrive through each
node's data watch (ZooKeeper sends one event per change to a connection that has both).
Why: with child watches, every new topology made every daemon list directories of
thousands of children again to find the one new name. A server older than 3.6 answers
``addWatch`` with UnimplementedError; the cache then uses child watches, as kazoo's does.
"""

from __future__ import annotations

import functools
import logging
import posixpath
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, UnimplementedError
from kazoo.protocol.states import EventType, KazooState, WatchedEvent
from kazoo.recipe.cache import TreeCache, TreeNode

from nimbus.state.recursive_watch import recursive_watches

log = logging.getLogger(__name__)


class _Superseded:
    """An answer the base class must treat as neither data nor "no node": only its
    bookkeeping (requests in flight, the initialized event) runs."""

    exception = None

    @staticmethod
    def successful() -> bool:
        return False


SUPERSEDED = _Superseded()


class _NoNewChildren:
    """A listing whose new children were already adopted: the base class then only does
    its bookkeeping, instead of a pass over every child (a path join each) that costs
    O(children) in Python on every child added to a directory of thousands."""

    exception = None

    @staticmethod
    def successful() -> bool:
        return True

    @staticmethod
    def get() -> list[str]:
        return []


NO_NEW_CHILDREN = _NoNewChildren()


class OrderedTreeNode(TreeNode):
    """A cached node whose requests are all sent, and answers applied, on the cache's
    thread, and whose data never goes back to an older version."""

    __slots__ = ()

    def _call_client(self, method_name: str, path: str) -> None:
        # As TreeNode's, but a listing sets no child watch while the tree's recursive
        # watch reports new children (see the module doc).
        self._tree._outstanding_ops += 1
        callback = functools.partial(self._tree._in_background, self._process_result,
                                     method_name, path)
        method = getattr(self._tree._client, method_name + "_async")
        method(path, watch=self._watch_for(method_name)).rawlink(callback)

    def _watch_for(self, method_name: str) -> Any:
        """The watch a ``method_name`` request of this node sets: while the tree's
        recursive watch is on, none for a listing, and none at all on the directory
        itself (ZooKeeper before 3.9 keeps one watch mode per path and connection,
        ZOOKEEPER-4466: a data watch set there would replace the recursive watch; its
        events come through the recursive watch instead)."""
        if self._tree.children_by_recursive_watch and (
                method_name == "get_children" or self._parent is None):
            return None
        return self._process_watch

    def _process_watch(self, watched_event: WatchedEvent) -> None:
        # Called on kazoo's watch thread: hand it to the cache's thread, which sends the
        # follow-up request after linking every earlier one.
        self._tree._in_background(super()._process_watch, watched_event)

    def _process_result(self, method_name: str, path: str, result: Any) -> None:
        if method_name == "get_children" and result.successful():
            # Add new children as this node's class (the base class would make plain
            # TreeNodes), found by a set difference in C rather than a pass in Python.
            for child in sorted(set(result.get()).difference(self._children)):
                self._adopt(child)
            result = NO_NEW_CHILDREN
        elif method_name == "get" and result.successful() and self._data is not None:
            held = self._data.stat.mzxid
            got = result.get()[1].mzxid
            if got < held:
                log.debug("%s: dropped an answer of version %d, %d is held", path, got, held)
                result = SUPERSEDED
        super()._process_result(method_name, path, result)

    def _adopt(self, name: str) -> None:
        """Hold a new child ``name`` (a node of this class) and read it."""
        node = type(self)(self._tree, posixpath.join(self._path, name), self)
        self._children[name] = node
        node.on_created()

    def _adopt_created(self, name: str) -> None:
        """Hold a child whose creation the recursive watch reported, and read its data.
        Not its children: each one created since comes as an event of its own, after
        this one."""
        node = type(self)(self._tree, posixpath.join(self._path, name), self)
        self._children[name] = node
        node._refresh_data()


class OrderedTreeCache(TreeCache):
    """``TreeCache`` made of :class:`OrderedTreeNode`; same API. New children come from a
    recursive watch when the client can hold one (see the module doc)."""

    #: How long the cache's thread waits for ``addWatch`` to be answered.
    ARM_TIMEOUT_S = 30.0

    def __init__(self, client: KazooClient, path: str):
        super().__init__(client, path)
        self._root = OrderedTreeNode.make_root(self, path)
        self._recursive = recursive_watches(client)
        #: Whether listings set no child watch (read by the nodes, on the cache's thread).
        self.children_by_recursive_watch = self._recursive is not None

    def start(self) -> None:
        if self._recursive is not None and self._state == self.STATE_LATENT:
            self._in_background(self._arm_recursive)  # queued before the first load
        super().start()

    def close(self) -> None:
        started = self._state == self.STATE_STARTED
        super().close()
        if started and self._recursive is not None and self.children_by_recursive_watch:
            self._recursive.remove_recursive_watch(self._root._path, self._on_recursive_event)

    def _session_watcher(self, state: str) -> None:
        if state == KazooState.CONNECTED:
            self._in_background(self._arm_recursive)  # before the reload kazoo queues
        super()._session_watcher(state)

    def _arm_recursive(self) -> None:
        """Add the recursive watch on this connection (the cache's thread, before any
        read of the connection is sent). A server older than 3.6 makes the cache use child
        watches from then on. Other failures are left to the reconnection that follows
        them (a lost connection), which arms it again before reading again."""
        if self._recursive is None or not self.children_by_recursive_watch or \
                self._state != self.STATE_STARTED:
            return
        answer = self._recursive.add_recursive_watch(self._root._path,
                                                     self._on_recursive_event)
        try:
            answer.get(timeout=self.ARM_TIMEOUT_S)
        except UnimplementedError:
            log.warning("%s: ZooKeeper is older than 3.6 (no addWatch): new nodes are "
                        "found by listing their directory again, on every change",
                        self._root._path)
            self.children_by_recursive_watch = False
            self._recursive.remove_recursive_watch(self._root._path, self._on_recursive_event)
        except (KazooException, self._client.handler.timeout_exception) as exc:
            log.debug("%s: addWatch not answered (%r): armed again on reconnection",
                      self._root._path, exc)

    def _on_recursive_event(self, event: WatchedEvent) -> None:
        # kazoo's watch thread. News: a creation, and anything about the directory itself
        # (which has no data watch); every other node's data watch reports its changes
        # and its deletion. Handled on the cache's thread, in order.
        if event.type == EventType.CREATED or event.path == self._root._path:
            self._in_background(self._on_recursive, event)

    def _on_recursive(self, event: WatchedEvent) -> None:
        if self._state != self.STATE_STARTED or not self.children_by_recursive_watch:
            return
        root, path = self._root, event.path
        if path == root._path:  # what its data watch would have reported
            if event.type == EventType.CREATED:
                if root._state == root.STATE_DEAD:
                    root._state = root.STATE_PENDING
                    root.on_created()
            elif event.type == EventType.DELETED:
                root.on_deleted()
            elif event.type == EventType.CHANGED and root._state != root.STATE_DEAD:
                root._refresh_data()
            return
        if not path.startswith(root._path.rstrip("/") + "/"):
            return
        parent_path, name = posixpath.split(path)
        parent = self._find_node(parent_path)
        # A parent not held (deleted since, or not yet re-created): its own creation event,
        # or the listing that follows it, brings the child.
        if parent is None or parent._state == parent.STATE_DEAD or name in parent._children:
            return
        parent._adopt_created(name)
