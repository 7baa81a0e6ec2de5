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

Only private parts of kazoo's recipe are overridden (``TreeNode._process_watch`` and
``_process_result``); ``tests/test_watched_tree.py`` fails if a kazoo release changes
them in a way that reopens the race.
"""

from __future__ import annotations

import logging
import posixpath
from typing import Any

from kazoo.client import KazooClient
from kazoo.protocol.states import WatchedEvent
from kazoo.recipe.cache import TreeCache, TreeNode

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


class OrderedTreeCache(TreeCache):
    """``TreeCache`` made of :class:`OrderedTreeNode`; same API."""

    def __init__(self, client: KazooClient, path: str):
        super().__init__(client, path)
        self._root = OrderedTreeNode.make_root(self, path)
