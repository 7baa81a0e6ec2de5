"""The view across a ZooKeeper connection blip, against a real server (issue 20): a
reconnection within the session keeps what the view holds, re-validates it and reads only
what changed while it was disconnected; a lost session still reloads from scratch.

The view's client reaches ZooKeeper through a loopback proxy, cut to disconnect it (the
session lives on) while another client changes the tree; every ``get`` the view's client
sends is counted.
"""

from __future__ import annotations

import collections
import logging
import posixpath
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from faults import lose_connection
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss
from kazoo.protocol import serialization
from kazoo.protocol.connection import _CONNECTION_DROP
from kazoo.protocol.states import KazooState
from kazoo.recipe.cache import TreeCache, TreeEvent
from kazoo.retry import KazooRetry
from tcp_proxy import DelayProxy

from nimbus.state.cluster_state import StormClusterState
from nimbus.state.cluster_view import ClusterView
from nimbus.state.revalidating_tree_cache import Revalidation
from nimbus.state.watched_tree import WatchedTree

TIMEOUT_S = 15.0
DIRECTORIES = ("storms", "assignments", "supervisors", "code-distributor", "workerbeats",
               "code-versions")
NODES = 200  # below the five directories


def tid(index: int) -> str:
    """A topology id (the view lists only names of that form as topologies)."""
    return f"t{index}-1-1700000000"


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s}s"
        time.sleep(0.01)


class ReadCounter:
    """Counts the requests ``zk`` sends (by kazoo method) and the paths it ``get``s."""

    def __init__(self, zk: KazooClient, monkeypatch: pytest.MonkeyPatch):
        self.calls: collections.Counter[str] = collections.Counter()
        self.gets: list[str] = []
        for name in ("get_async", "get_children_async", "exists_async"):
            real = getattr(zk, name)

            def counted(path: str, *args: Any, _real: Any = real, _name: str = name,
                        **kwargs: Any) -> Any:
                self.calls[_name] += 1
                if _name == "get_async":
                    self.gets.append(path)
                return _real(path, *args, **kwargs)

            monkeypatch.setattr(zk, name, counted)

    def reset(self) -> None:
        self.calls.clear()
        self.gets.clear()


class StateEvents:
    """Events set when ``zk`` reports SUSPENDED or LOST; CONNECTED is counted."""

    def __init__(self, zk: KazooClient):
        self.suspended = threading.Event()
        self.lost = threading.Event()
        self.connections = 0
        zk.add_listener(self._on_state)

    def _on_state(self, state: str) -> None:
        if state == KazooState.SUSPENDED:
            self.suspended.set()
        elif state == KazooState.LOST:
            self.lost.set()
        elif state == KazooState.CONNECTED:
            self.connections += 1


def populate(writer: StormClusterState) -> None:
    """NODES nodes: 60 under storms and assignments each, 5 supervisors, 20 topologies'
    code with two replica hosts each (60 nodes), 5 topologies' worker beats (2 each)."""
    paths = [*(writer.path("storms", tid(i)) for i in range(60)),
             *(writer.path("assignments", tid(i)) for i in range(60)),
             *(writer.path("supervisors", f"s{i}") for i in range(5))]
    for i in range(20):
        paths += [writer.path("code-distributor", tid(i)),
                  *(writer.path("code-distributor", tid(i), f"host-{h}") for h in range(2))]
    for i in range(5):
        paths += [writer.path("workerbeats", tid(i)),
                  *(writer.path("workerbeats", tid(i), f"s{b}-6700") for b in range(2))]
    assert len(paths) == NODES
    transaction = writer.zk.transaction()
    for path in paths:
        transaction.create(path, f"v1 {path}".encode())
    assert not [r for r in transaction.commit() if isinstance(r, Exception)]


Version = tuple[bytes, int, int, int]


def version(got: tuple[bytes, Any] | None) -> Version | None:
    """(data, czxid, mzxid, data version): what a cache holds of a node. The rest of a
    stat (cversion, pzxid, numChildren) changes with the children, whose changes no tree
    cache reads the parent again for: the children themselves are compared instead."""
    if got is None:
        return None
    data, stat = got
    return data, stat.czxid, stat.mzxid, stat.version


def zookeeper_has(zk: KazooClient, path: str) -> dict[str, Version | None]:
    """path -> version of ``path`` and of every node below it, read from ZooKeeper."""
    out, level = {}, [path]
    while level:
        out.update({p: version(zk.get(p)) for p in level})
        level = [posixpath.join(p, c) for p in level for c in zk.get_children(p)]
    return out


def view_holds(tree: WatchedTree) -> dict[str, Version | None]:
    out, level = {}, [tree.path]
    while level:
        out.update({p: version(tree.get(p)) for p in level})
        level = [posixpath.join(p, c) for p in level for c in tree.children(p)]
    return out


def assert_view_is_zookeeper(view: ClusterView, zk: KazooClient) -> None:
    view.barrier()
    for directory in DIRECTORIES:
        tree = view._trees[directory]
        assert view_holds(tree) == zookeeper_has(zk, tree.path), directory


@pytest.fixture
def writer(make_zk, zk_root) -> StormClusterState:
    state = StormClusterState(make_zk(), zk_root)
    state.setup()
    populate(state)
    return state


@pytest.fixture
def proxy(zk_server) -> Iterator[DelayProxy]:
    with DelayProxy(zk_server.port) as made:
        yield made


@pytest.fixture
def view_zk(proxy) -> Iterator[KazooClient]:
    """The view's client, through the proxy; it reconnects within a second of a heal."""
    zk = KazooClient(hosts=proxy.address, timeout=10.0,
                     connection_retry=KazooRetry(max_tries=-1, max_delay=0.5))
    zk.start(timeout=TIMEOUT_S)
    yield zk
    zk.stop()
    zk.close()


@pytest.fixture
def view(view_zk, zk_root, writer) -> Iterator[ClusterView]:
    made = ClusterView(StormClusterState(view_zk, zk_root), name="blip")
    made.start()
    made.barrier()
    yield made
    made.close()


def change_while_disconnected(writer: StormClusterState) -> list[str]:
    """Change the tree as a blip may hide from the view; returns the paths whose data the
    view must read again: 5 changed (one deleted and created again), 4 new (one with a
    child), 4 removed (one with its two children)."""
    zk, path = writer.zk, writer.path
    changed = [path("storms", tid(0)), path("assignments", tid(1)),
               path("code-distributor", tid(2), "host-0"), path("supervisors", "s0")]
    for node in changed:
        zk.set(node, b"v2")
    recreated = path("assignments", tid(7))
    zk.delete(recreated)
    zk.create(recreated, b"v2 recreated")
    zk.delete(path("storms", tid(5)))
    zk.delete(path("code-distributor", tid(3)), recursive=True)
    new = [path("storms", tid(100)), path("code-distributor", tid(101)),
           path("code-distributor", tid(101), "host-0"),
           path("workerbeats", tid(0), "s9-6700")]
    for node in new:
        zk.create(node, b"new")
    return sorted([*changed, recreated, *new])


def test_a_blip_re_reads_only_what_changed_while_disconnected(
        writer, proxy, view_zk, view, monkeypatch, caplog):
    reads = ReadCounter(view_zk, monkeypatch)
    states = StateEvents(view_zk)
    loaded_when_told: list[bool] = []
    view.listen(lambda _directory, _topology: loaded_when_told.append(view.loaded))
    proxy.cut()
    assert states.suspended.wait(TIMEOUT_S)
    # Disconnected: the view still serves what it holds.
    assert view.loaded
    assert len(view.active_storms()) == 60
    expected_reads = change_while_disconnected(writer)
    with caplog.at_level(logging.INFO, logger="nimbus.state.cluster_view"):
        proxy.heal()
        wait_until(lambda: view.reconnect_count == 1, "the reconnection re-validated")
    assert states.connections == 1
    # One get per changed or new node, nothing else read: not one per node held.
    assert sorted(reads.gets) == expected_reads
    assert view.last_reconnect == Revalidation(
        validated=NODES + len(DIRECTORIES), changed=5, added=4, removed=4)
    lines = [r.getMessage() for r in caplog.records if "ZooKeeper" in r.getMessage()]
    assert lines == ["blip: ZooKeeper connection back within the session: 206 nodes "
                     "re-validated, 9 re-read (5 changed, 4 new, 0 unread), 4 removed"]
    # Readable throughout: loaded whenever a change was published during the reconnection.
    assert loaded_when_told and all(loaded_when_told)
    assert_view_is_zookeeper(view, writer.zk)
    assert len(view.active_storms()) == 60  # one removed, one added

    # The watches are set again: later changes arrive as events, and the audit agrees.
    reads.reset()
    zk, path = writer.zk, writer.path
    zk.set(path("storms", tid(9)), b"v3")
    zk.create(path("code-distributor", tid(4), "host-7"), b"late")
    # One transaction: a recursive delete's steps (children first) would let the view
    # see, and read, the directory between two of them.
    gone = zk.transaction()
    for child in zk.get_children(path("workerbeats", tid(1))):
        gone.delete(path("workerbeats", tid(1), child))
    gone.delete(path("workerbeats", tid(1)))
    assert not [r for r in gone.commit() if isinstance(r, Exception)]
    zk.set(path("assignments", tid(7)), b"v3")  # the node created while disconnected
    assert_view_is_zookeeper(view, writer.zk)
    assert sorted(reads.gets) == [path("assignments", tid(7)),
                                  path("code-distributor", tid(4), "host-7"),
                                  path("storms", tid(9))]
    for directory in DIRECTORIES:
        tree = view._trees[directory]
        assert tree.audit(1000) == ([], True), directory
        assert tree._suspects == {}


def test_a_blip_with_no_change_reads_nothing(writer, view_zk, view, monkeypatch):
    reads = ReadCounter(view_zk, monkeypatch)
    lose_connection(view_zk)
    wait_until(lambda: view.reconnect_count == 1, "the reconnection re-validated")
    assert view.last_reconnect == Revalidation(validated=NODES + len(DIRECTORIES))
    # Each node's two watches set again (an exists and a get_children), no data read.
    held = NODES + len(DIRECTORIES)
    assert reads.calls == {"exists_async": held, "get_children_async": held}
    assert_view_is_zookeeper(view, writer.zk)


def test_a_lost_session_still_reloads_from_scratch(
        zk_server, writer, proxy, view_zk, view, monkeypatch, caplog):
    reads = ReadCounter(view_zk, monkeypatch)
    states = StateEvents(view_zk)
    session = view_zk.client_id  # kazoo tells it only while connected
    held = {path for d in DIRECTORIES for path in view_holds(view._trees[d])}
    proxy.cut()
    assert states.suspended.wait(TIMEOUT_S)
    # The session ends while the view is cut off (as expire_session does it), and the
    # tree changes; the view learns of both when it reconnects.
    twin = KazooClient(hosts=zk_server.hosts, client_id=session, timeout=10.0)
    twin.start(timeout=TIMEOUT_S)
    twin.stop()
    twin.close()
    change_while_disconnected(writer)
    with caplog.at_level(logging.INFO, logger="nimbus.state.cluster_view"):
        proxy.heal()
        wait_until(lambda: view.reconnect_count == 1, "the view reloaded")
    assert states.lost.is_set()
    assert view.loaded
    assert view.last_reconnect == Revalidation(reloaded=NODES + len(DIRECTORIES))
    # Every node held is read again (those gone, to find them gone), and every new one.
    now = {path for d in DIRECTORIES for path in zookeeper_has(writer.zk, writer.path(d))}
    assert sorted(reads.gets) == sorted(held | now)
    assert [r.getMessage() for r in caplog.records if "ZooKeeper" in r.getMessage()] == [
        "blip: the ZooKeeper session was lost: the view was reloaded from scratch "
        "(206 nodes read)"]
    assert_view_is_zookeeper(view, writer.zk)


def test_a_path_removed_in_a_blip_and_created_later_is_followed(
        writer, proxy, view_zk, view, caplog):
    """The ``exists`` that finds a node gone leaves an exists-watch in ZooKeeper; its
    event, when the path is created again, must neither fail nor confuse the new node."""
    states = StateEvents(view_zk)
    target = writer.path("storms", tid(3))
    proxy.cut()
    assert states.suspended.wait(TIMEOUT_S)
    writer.zk.delete(target)
    proxy.heal()
    wait_until(lambda: view.reconnect_count == 1, "the reconnection re-validated")
    assert view.last_reconnect == Revalidation(validated=NODES + len(DIRECTORIES), removed=1)
    seen = len(caplog.records)
    with caplog.at_level(logging.WARNING):
        writer.zk.create(target, b"again")
        view.barrier()
        writer.zk.set(target, b"and again")
        assert_view_is_zookeeper(view, writer.zk)
    assert view._trees["storms"].get(target)[0] == b"and again"
    assert [r.getMessage() for r in caplog.records[seen:]] == []


def test_a_drop_during_the_re_validation_is_mended_by_the_next(
        writer, proxy, view_zk, view, monkeypatch):
    """The connection drops again while a round's answers come in: answers are lost,
    and the next reconnection's round brings the view up to ZooKeeper all the same."""
    states = StateEvents(view_zk)
    tree = view._trees["code-distributor"]
    real = tree._cache._on_connected
    dropped: list[bool] = []

    def on_connected() -> None:
        real()  # the round's requests are queued: drop the connection behind them
        if not dropped:
            dropped.append(True)
            view_zk._call(_CONNECTION_DROP, None)

    monkeypatch.setattr(tree._cache, "_on_connected", on_connected)
    proxy.cut()
    assert states.suspended.wait(TIMEOUT_S)
    change_while_disconnected(writer)
    proxy.heal()
    # Which directory's round the drop cuts short depends on the order the caches' threads
    # run in, so the lost answers may be counted in either reconnection's total.
    wait_until(lambda: view.reconnect_count >= 2 and view.last_reconnect.failed == 0,
               "a reconnection after the drop with no answer lost")
    assert dropped == [True] and states.connections >= 2
    assert_view_is_zookeeper(view, writer.zk)


def test_a_node_whose_first_read_was_lost_is_read_at_the_reconnection(
        writer, view_zk, view, monkeypatch):
    """A new node's first ``get`` is answered with ConnectionLoss (as when the connection
    drops under it): the view holds the node without data until the next reconnection,
    whose round reads it (and nothing else)."""
    target = writer.path("storms", tid(200))
    real_get = view_zk.get_async
    lost: list[str] = []

    def get_async(path: str, watch: Any = None) -> Any:
        if path != target or lost:
            return real_get(path, watch=watch)
        lost.append(path)
        answer = view_zk.handler.async_result()
        answer.set_exception(ConnectionLoss())
        return answer

    monkeypatch.setattr(view_zk, "get_async", get_async)
    writer.zk.create(target, b"late")
    view.barrier()
    tree = view._trees["storms"]
    assert lost == [target] and tid(200) in tree.children() and tree.get(target) is None
    reads = ReadCounter(view_zk, monkeypatch)
    lose_connection(view_zk)
    wait_until(lambda: view.reconnect_count == 1, "the reconnection re-validated")
    assert view.last_reconnect == Revalidation(validated=NODES + len(DIRECTORIES) + 1, unread=1)
    assert reads.gets == [target]
    assert_view_is_zookeeper(view, writer.zk)


# -- what kazoo does itself: if this changes, revisit revalidating_tree_cache ---------------
def test_kazoos_tree_cache_reads_every_node_again_after_a_blip(make_zk, writer, monkeypatch):
    """kazoo forgets every watch on a dropped connection and sends no SetWatches, so its
    TreeCache reads every node again. Fails if a kazoo release changes either."""
    assert not hasattr(serialization, "SetWatches")
    zk = make_zk()
    cache = TreeCache(zk, writer.path("storms"))
    loaded = threading.Event()
    cache.listen(lambda e: e.event_type == TreeEvent.INITIALIZED and loaded.set())
    cache.start()
    try:
        assert loaded.wait(TIMEOUT_S)
        reads = ReadCounter(zk, monkeypatch)
        lose_connection(zk)
        sent = threading.Event()
        cache._in_background(sent.set)  # after its reconnection's requests were sent
        assert sent.wait(TIMEOUT_S)
        assert reads.calls == {"get_async": 61, "get_children_async": 61}  # 60 + the root
    finally:
        cache.close()
