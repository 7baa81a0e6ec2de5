"""ZooKeeper's persistent recursive watch (ZooKeeper 3.6+), which kazoo 2.11 lacks.

Why: a tree cache learns of a new node from its parent's child watch, which only says
*that* the children changed. It must then list the parent again, and ask ZooKeeper for
every name under it, to find the one that is new. A directory of 10,000 topologies is
listed again, 10,000 names each time, on every submit, by every daemon (several such
directories each). One ``addWatch`` on the directory in ``PERSISTENT_RECURSIVE`` mode
instead makes ZooKeeper send, for every node below it, created, deleted and data-changed
events with the node's path, until the connection ends: a new node is known by name, and
nothing is listed again.

kazoo 2.11, its newest release, has no client side for it (python-zk/kazoo#714 was
closed unmerged). What this module adds to kazoo, in :class:`RecursiveWatchClient`:

* :meth:`RecursiveWatchClient.add_recursive_watch` sends ``addWatch`` (opcode 106, mode
  1) and calls the listener with each event below (or at) the path, on kazoo's watch
  thread, in order with every other watch callback;
* :meth:`RecursiveWatchClient.remove_recursive_watch` forgets a listener and, with the
  path's last one, sends ``removeWatches`` (opcode 18, any watcher type).

A persistent watch lives on the *connection*, like every ZooKeeper watch, and kazoo does
not send SetWatches on a reconnection (nimbus.state.revalidating_tree_cache): its owner
adds it again on every new connection, before it reads what changed meanwhile. A server
older than 3.6 answers ``addWatch`` with UnimplementedError; the tree cache then falls
back to child watches.
"""

from __future__ import annotations

import logging
import threading
from collections import namedtuple
from collections.abc import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.interfaces import IAsyncResult
from kazoo.protocol.connection import ConnectionHandler
from kazoo.protocol.serialization import Watch, int_struct, write_string
from kazoo.protocol.states import EVENT_TYPE_MAP, Callback, WatchedEvent

log = logging.getLogger(__name__)

#: ``AddWatchMode.PERSISTENT_RECURSIVE`` in ZooKeeper's protocol.
PERSISTENT_RECURSIVE = 1
#: ``WatcherType.Any`` (removeWatches): ZooKeeper 3.8 answers the persistent types (4, 5;
#: ZOOKEEPER-4472) with a marshalling error. It also drops one-time watches on that very
#: path: the tree cache sets none on its directory while it holds a recursive watch there.
ANY_WATCHER = 3
# The event types a recursive watch sends: created, deleted, data changed (never
# "children changed").
_NODE_EVENTS = (1, 2, 3)

RecursiveListener = Callable[[WatchedEvent], None]


def _path_and_int(path: str, value: int) -> bytearray:
    """The body of both requests below: a path, then an int."""
    body = bytearray(write_string(path))
    body.extend(int_struct.pack(value))
    return body


def _header_only(buffer: bytes, offset: int) -> bool:
    """Both requests below are answered with a header and nothing to read."""
    return True


class AddWatch(namedtuple("AddWatch", "path mode")):
    """ZooKeeper's ``AddWatchRequest``."""

    type = 106
    deserialize = staticmethod(_header_only)

    def serialize(self) -> bytearray:
        return _path_and_int(self.path, self.mode)


class RemoveWatches(namedtuple("RemoveWatches", "path watcher_type")):
    """ZooKeeper's ``RemoveWatchesRequest``."""

    type = 18
    deserialize = staticmethod(_header_only)

    def serialize(self) -> bytearray:
        return _path_and_int(self.path, self.watcher_type)


class _RecursiveWatchConnection(ConnectionHandler):
    """kazoo's connection, which also hands each event to the recursive watches of the
    path and its ancestors (after the one-time watchers kazoo pops, in one go, so that
    every callback keeps the order ZooKeeper sent the events in)."""

    def _read_watch_event(self, buffer: bytes, offset: int) -> None:
        super()._read_watch_event(buffer, offset)
        client: RecursiveWatchClient = self.client  # type: ignore[assignment]
        watches = client._recursive  # copied on write: read without a lock
        if not watches or client._stopped.is_set():
            return
        watch, _ = Watch.deserialize(buffer, offset)
        if watch.type not in _NODE_EVENTS:
            return
        listeners: list[RecursiveListener] = []
        path = watch.path
        while True:
            listeners.extend(watches.get(path, ()))
            if path == "/" or not path:
                break
            path = path.rsplit("/", 1)[0] or "/"
        if not listeners:
            return
        event = WatchedEvent(EVENT_TYPE_MAP[watch.type], client._state,
                             client.unchroot(watch.path))
        for listener in listeners:
            client.handler.dispatch_callback(Callback("watch", listener, (event,)))


class RecursiveWatchClient(KazooClient):
    """A kazoo client that can hold ZooKeeper's persistent recursive watches; see the
    module doc."""

    def __init__(self, *args: object, **kwargs: object):
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        old = self._connection  # not started yet: swapped for one that knows the watches
        self._connection = _RecursiveWatchConnection(
            self, old.retry_sleeper, logger=old.logger, sasl_options=old.sasl_options)
        self._recursive_lock = threading.Lock()
        # chrooted path -> listeners; replaced, never changed in place (read unlocked)
        self._recursive: dict[str, tuple[RecursiveListener, ...]] = {}

    def add_recursive_watch(self, path: str, listener: RecursiveListener) -> IAsyncResult:
        """Watch every node at and below ``path`` until the connection ends; returns the
        answer to ``addWatch`` (UnimplementedError from a server older than 3.6).
        ``listener`` gets every event from the moment the server adds the watch. Adding
        it again on a new connection does not call ``listener`` twice per event."""
        full = self.chroot + path if self.chroot else path
        with self._recursive_lock:
            have = self._recursive.get(full, ())
            if listener not in have:
                self._recursive = {**self._recursive, full: (*have, listener)}
        result = self.handler.async_result()
        self._call(AddWatch(full, PERSISTENT_RECURSIVE), result)
        return result

    def remove_recursive_watch(self, path: str,
                               listener: RecursiveListener) -> IAsyncResult | None:
        """Stop calling ``listener``; with the path's last listener, ask the server to
        drop the watch and return its answer (None: nothing asked). Callers need not wait
        for it, and a failure is only logged: the watch ends with the connection anyway."""
        full = self.chroot + path if self.chroot else path
        with self._recursive_lock:
            have = tuple(x for x in self._recursive.get(full, ()) if x != listener)
            rest = {k: v for k, v in self._recursive.items() if k != full}
            if have:
                rest[full] = have
            self._recursive = rest
        if have or not self.connected:
            return None
        result = self.handler.async_result()
        self._call(RemoveWatches(full, ANY_WATCHER), result)

        def done(answer: IAsyncResult) -> None:
            if not answer.successful() and isinstance(answer.exception, KazooException):
                log.debug("removing the recursive watch on %s: %r", path, answer.exception)

        result.rawlink(done)
        return result


def recursive_watches(zk: KazooClient) -> RecursiveWatchClient | None:
    """``zk`` if it can hold recursive watches, else None."""
    return zk if isinstance(zk, RecursiveWatchClient) else None
