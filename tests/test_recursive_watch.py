"""ZooKeeper's persistent recursive watch from kazoo (nimbus.state.recursive_watch), and
the tree cache that learns of new nodes through it instead of listing directories again,
against a real ZooKeeper (3.8 here, which has ``addWatch``)."""

from __future__ import annotations

import collections
import posixpath
import threading
from typing import Any

import pytest
from faults import lose_connection
from kazoo.client import KazooClient
from kazoo.exceptions import UnimplementedError
from kazoo.protocol.states import Callback, WatchedEvent

from nimbus.state.recursive_watch import RecursiveWatchClient
from nimbus.state.watched_tree import WatchedTree

TIMEOUT_S = 10.0


def drained(zk: KazooClient) -> None:
    """Every event ZooKeeper sent this session before now has been handed to its
    listeners: a round trip (events come before later answers), then the watch queue."""
    zk.sync("/")
    done = threading.Event()
    zk.handler.dispatch_callback(Callback("watch", done.set, ()))
    assert done.wait(TIMEOUT_S)


@pytest.fixture
def root(make_zk, zk_root) -> str:
    make_zk().ensure_path(zk_root)
    return zk_root


class Requests:
    """The requests a client sends, counted by type (GetChildren, GetData, ...)."""

    def __init__(self, zk: KazooClient, monkeypatch: pytest.MonkeyPatch):
        self.sent: collections.Counter[str] = collections.Counter()
        real = zk._call

        def counted(request: Any, async_object: Any) -> Any:
            self.sent[type(request).__name__] += 1
            return real(request, async_object)

        monkeypatch.setattr(zk, "_call", counted)


# -- the protocol ----------------------------------------------------------------------------
def test_a_recursive_watch_reports_every_node_below_in_order(make_zk, root):
    zk, writer = make_zk(), make_zk()
    assert isinstance(zk, RecursiveWatchClient)
    events: list[tuple[str, str]] = []
    zk.add_recursive_watch(root, lambda e: events.append((e.type, e.path))).get(TIMEOUT_S)
    child, grandchild = posixpath.join(root, "a"), posixpath.join(root, "a", "b")
    writer.create(child, b"1")
    writer.create(grandchild, b"2")
    writer.set(child, b"3")
    writer.delete(grandchild)
    writer.set(root, b"4")
    writer.create(root + "-sibling")  # not below the path: not reported
    drained(zk)
    assert events == [("CREATED", child), ("CREATED", grandchild), ("CHANGED", child),
                      ("DELETED", grandchild), ("CHANGED", root)]


def test_a_removed_recursive_watch_reports_nothing_more(make_zk, root, monkeypatch):
    zk, writer = make_zk(), make_zk()
    events: list[WatchedEvent] = []
    zk.add_recursive_watch(root, events.append).get(TIMEOUT_S)
    writer.create(posixpath.join(root, "a"))
    drained(zk)
    assert len(events) == 1
    received: list[Any] = []  # what ZooKeeper sends this connection, listener or none
    real = zk._connection._read_watch_event
    monkeypatch.setattr(zk._connection, "_read_watch_event",
                        lambda buffer, offset: (received.append(offset),
                                                real(buffer, offset)))
    answer = zk.remove_recursive_watch(root, events.append)
    assert answer is not None and answer.get(TIMEOUT_S) is True
    writer.create(posixpath.join(root, "b"))
    writer.set(posixpath.join(root, "a"), b"x")
    drained(zk)
    assert len(events) == 1
    assert received == []  # the server dropped the watch, not only the client's listener
    assert zk._recursive == {}


def test_a_second_add_on_a_new_connection_does_not_double_the_events(make_zk, root):
    zk, writer = make_zk(), make_zk()
    events: list[WatchedEvent] = []
    zk.add_recursive_watch(root, events.append).get(TIMEOUT_S)
    lose_connection(zk)
    writer.create(posixpath.join(root, "lost"))  # the watch went with the connection
    drained(zk)
    assert events == []
    zk.add_recursive_watch(root, events.append).get(TIMEOUT_S)
    writer.create(posixpath.join(root, "seen"))
    drained(zk)
    assert [e.path for e in events] == [posixpath.join(root, "seen")]


# -- the tree cache on it --------------------------------------------------------------------
def test_a_new_node_is_read_without_listing_its_directory(make_zk, root, monkeypatch):
    """The point of it: with 50 nodes held, five more cost five reads of their data and
    no listing, where child watches cost a listing of the whole directory each."""
    zk, writer = make_zk(), make_zk()
    for i in range(50):
        writer.create(posixpath.join(root, f"n{i:03d}"), b"old")
    tree = WatchedTree(zk, root, "recursive")
    tree.start()
    try:
        assert tree._cache.children_by_recursive_watch
        requests = Requests(zk, monkeypatch)
        for i in range(50, 55):
            writer.create(posixpath.join(root, f"n{i:03d}"), b"new")
        tree.barrier()
        assert len(tree.children()) == 55
        assert tree.get(posixpath.join(root, "n054"))[0] == b"new"
        assert requests.sent["GetChildren"] == 0
        assert requests.sent["GetData"] == 5
    finally:
        tree.close()


def test_nodes_created_under_a_new_node_are_held(make_zk, root):
    """A child's creation comes after its parent's, so a node adopted from its creation
    event needs no listing: every child it gets comes as an event of its own."""
    zk, writer = make_zk(), make_zk()
    tree = WatchedTree(zk, root, "recursive")
    tree.start()
    try:
        parent = posixpath.join(root, "topology")
        transaction = writer.transaction()
        transaction.create(parent, b"p")
        transaction.create(posixpath.join(parent, "host-a"), b"a")
        transaction.create(posixpath.join(parent, "host-b"), b"b")
        transaction.commit()
        writer.create(posixpath.join(parent, "host-c"), b"c")
        tree.barrier()
        assert tree.children(parent) == ["host-a", "host-b", "host-c"]
        assert tree.get(posixpath.join(parent, "host-b"))[0] == b"b"
    finally:
        tree.close()


def test_the_directory_itself_is_followed_through_the_recursive_watch(make_zk, root):
    """ZooKeeper before 3.9 keeps one watch mode per path and connection: a data watch on
    the directory would replace its recursive watch, and no new child would ever be seen.
    The directory's own changes, deletion and re-creation come through the recursive
    watch instead."""
    zk, writer = make_zk(), make_zk()
    tree = WatchedTree(zk, root, "recursive")
    tree.start()
    try:
        writer.set(root, b"changed")
        writer.create(posixpath.join(root, "after-a-change"))
        tree.barrier()
        assert tree.get(root)[0] == b"changed"
        assert tree.children() == ["after-a-change"]
        writer.delete(root, recursive=True)
        tree.barrier()
        assert not tree.present()
        writer.create(root, b"again")
        writer.create(posixpath.join(root, "after-re-creation"))
        tree.barrier()
        assert tree.get(root)[0] == b"again"
        assert tree.children() == ["after-re-creation"]
    finally:
        tree.close()


def test_after_a_blip_the_watch_is_back_and_what_was_missed_is_read(make_zk, root):
    zk, writer = make_zk(), make_zk()
    writer.create(posixpath.join(root, "before"))
    tree = WatchedTree(zk, root, "recursive")
    reconnected = threading.Event()
    tree.listen_reconnect(lambda report: reconnected.set())
    tree.start()
    try:
        writer.create(posixpath.join(root, "between"))
        lose_connection(zk)
        assert reconnected.wait(TIMEOUT_S)
        writer.create(posixpath.join(root, "after"))
        tree.barrier()
        assert tree.children() == ["after", "before", "between"]
    finally:
        tree.close()


def test_a_server_without_addwatch_makes_the_tree_list_directories(make_zk, root, caplog):
    """ZooKeeper before 3.6 answers addWatch with UnimplementedError (faked here: the
    server is 3.8): the tree uses child watches, says so once, and still sees new nodes."""
    zk, writer = make_zk(), make_zk()

    def unimplemented(path: str, listener: Any) -> Any:
        answer = zk.handler.async_result()
        answer.set_exception(UnimplementedError())
        return answer

    zk.add_recursive_watch = unimplemented  # type: ignore[method-assign]
    tree = WatchedTree(zk, root, "old-server")
    tree.start()
    try:
        assert not tree._cache.children_by_recursive_watch
        writer.create(posixpath.join(root, "new"))
        tree.barrier()
        assert tree.children() == ["new"]
        lose_connection(zk)
        writer.create(posixpath.join(root, "newer"))
        tree.barrier()
        assert tree.children() == ["new", "newer"]
        assert sum("older than 3.6" in r.getMessage() for r in caplog.records) == 1
    finally:
        tree.close()
