"""The tree cache under the view, against a real ZooKeeper: the update-ordering race of
kazoo's TreeCache (python-zk/kazoo#645), provoked deterministically, and its fix.

The race: the cache's thread sends the first ``get`` of a new node and attaches its
callback afterwards. If the node changes in between, kazoo's watch thread sends a second
``get`` whose answer is applied first; the older answer then overwrites it, for good.
"""

from __future__ import annotations

import posixpath
import threading
from collections.abc import Callable
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.protocol.states import Callback
from kazoo.recipe.cache import TreeCache, TreeEvent

from nimbus.state.ordered_tree_cache import OrderedTreeCache
from nimbus.state.watched_tree import WatchedTree

TIMEOUT_S = 10.0


def drain(put: Callable[[Callable[[], None]], None]) -> None:
    """Wait until everything queued before now on one of kazoo's queues has run."""
    done = threading.Event()
    put(done.set)
    assert done.wait(TIMEOUT_S), "queue not drained in time"


def drain_all(zk: KazooClient, cache: TreeCache) -> None:
    """Every answer to a request sent so far applied, twice over (applying one may send
    another): a round trip, then the watch, completion and cache queues drained."""
    for _ in range(2):
        zk.sync("/")
        drain(lambda f: zk.handler.dispatch_callback(Callback("watch", f, ())))
        drain(zk.handler.completion_queue.put)
        drain(cache._in_background)


def hold_first_get(zk: KazooClient, writer: KazooClient, target: str,
                   monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make the cache's first ``get`` of ``target`` return to its caller only after its
    answer is in, ``target`` was changed by ``writer``, and whatever kazoo's watch thread
    did about that change has been answered and passed on to the cache: the widest form
    of the preemption window. Returns the names of the threads that sent each ``get``."""
    real_get_async = zk.get_async
    senders: list[str] = []
    later: list[Any] = []

    def get_async(path: str, watch: Any = None) -> Any:
        result = real_get_async(path, watch=watch)
        if path != target:
            return result
        senders.append(threading.current_thread().name)
        if len(senders) > 1:
            later.append(result)
            return result
        assert result.wait(TIMEOUT_S)
        zk.exists(posixpath.dirname(target))  # the answer's watch is registered by now
        writer.set(target, b"new")
        zk.sync(target)  # the change's event has reached this session
        drain(lambda f: zk.handler.dispatch_callback(Callback("watch", f, ())))
        for answer in later:  # a get sent by the watch thread, answered and passed on
            assert answer.wait(TIMEOUT_S)
        drain(zk.handler.completion_queue.put)
        return result

    monkeypatch.setattr(zk, "get_async", get_async)
    return senders


def node_added(cache: TreeCache, path: str) -> threading.Event:
    added = threading.Event()

    def listener(event: TreeEvent) -> None:
        if event.event_type == TreeEvent.NODE_ADDED and event.event_data.path == path:
            added.set()

    cache.listen(listener)
    return added


@pytest.fixture
def root(make_zk, zk_root) -> str:
    make_zk().ensure_path(zk_root)
    return zk_root


def race(cache_class: type[TreeCache], make_zk, root: str,
         monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[str], Any]:
    """Run the interleaving on a cache of ``cache_class``: (the node's data as the cache
    holds it once everything sent is applied, the threads that sent its gets, the node's
    stat in ZooKeeper)."""
    zk, writer = make_zk(), make_zk()
    cache = cache_class(zk, root)
    cache.start()
    try:
        target = posixpath.join(root, "x")
        senders = hold_first_get(zk, writer, target, monkeypatch)
        added = node_added(cache, target)
        writer.create(target, b"old")
        assert added.wait(TIMEOUT_S)
        drain_all(zk, cache)
        assert writer.get(target)[0] == b"new"
        return cache.get_data(target), senders, writer.exists(target)
    finally:
        cache.close()


def test_kazoos_tree_cache_keeps_an_old_value_for_good(make_zk, root, monkeypatch):
    """The upstream race, shown on kazoo's own TreeCache: if this starts failing, a kazoo
    release changed the recipe, and ``OrderedTreeCache`` must be checked against it."""
    held, senders, _stat = race(TreeCache, make_zk, root, monkeypatch)
    assert len(senders) == 2 and senders[0] != senders[1]  # two threads sent them
    assert held.data == b"old"  # stale, and no event will mend it


def test_ordered_tree_cache_ends_with_the_newest_value(make_zk, root, monkeypatch):
    held, senders, stat = race(OrderedTreeCache, make_zk, root, monkeypatch)
    assert len(senders) == 2 and senders[0] == senders[1]  # one thread sent both
    assert held.data == b"new"
    assert held.stat == stat


def test_watched_tree_barrier_sees_a_change_racing_a_new_node(make_zk, root, monkeypatch):
    """The same interleaving through WatchedTree: after a barrier the view holds what
    ZooKeeper holds."""
    zk, writer = make_zk(), make_zk()
    tree = WatchedTree(zk, root, "race")
    tree.start()
    try:
        target = posixpath.join(root, "x")
        hold_first_get(zk, writer, target, monkeypatch)
        writer.create(target, b"old")
        tree.barrier()
        assert tree.get(target) == writer.get(target)
        assert tree.get(target)[0] == b"new"
    finally:
        tree.close()


class _Answer:
    """A successful ``get`` answer as kazoo's AsyncResult gives it."""

    def __init__(self, value: Any):
        self.value = value
        self.exception = None

    def successful(self) -> bool:
        return True

    def get(self) -> Any:
        return self.value


def test_an_older_answer_never_replaces_newer_data(make_zk, root):
    """The second guard: however an old answer comes late, it is dropped."""
    zk, writer = make_zk(), make_zk()
    target = posixpath.join(root, "x")
    writer.create(target, b"old")
    old = writer.get(target)
    writer.set(target, b"new")
    cache = OrderedTreeCache(zk, root)
    events: list[TreeEvent] = []
    loaded = threading.Event()
    cache.listen(events.append)
    cache.listen(lambda e: e.event_type == TreeEvent.INITIALIZED and loaded.set())
    cache.start()
    try:
        assert loaded.wait(TIMEOUT_S)
        drain_all(zk, cache)
        assert cache.get_data(target).data == b"new"
        events.clear()
        node = cache._root._children["x"]
        cache._outstanding_ops += 1  # the late answer's request, as _call_client counts it
        cache._in_background(node._process_result, "get", target, _Answer(old))
        drain_all(zk, cache)
        assert cache.get_data(target).data == b"new"
        assert events == []  # no update was published for it
        assert cache._outstanding_ops == 0
    finally:
        cache.close()


# -- the audit: a view that missed a change finds out and re-reads -------------------------
def deafen(zk: KazooClient, tree: WatchedTree, path: str) -> None:
    """Make the view miss every later change of ``path`` (data, children, deletion), as a
    lost watch event would: ZooKeeper still sends the events, kazoo calls nobody (the
    recursive watch's events about the node and its children are dropped too)."""
    node = tree._cache._find_node(path)
    zk._data_watchers[path].discard(node._process_watch)
    zk._child_watchers[path].discard(node._process_watch)
    cache = tree._cache
    if cache.children_by_recursive_watch:
        heard = cache._on_recursive

        def deaf(event: Any) -> None:
            if path not in (event.path, posixpath.dirname(event.path)):
                heard(event)

        cache._on_recursive = deaf  # type: ignore[method-assign]


@pytest.fixture(params=["recursive-watch", "child-watches"])
def watched(request, make_zk, zk_server, root):
    """(a client, an unstarted tree on it): on a client that holds a recursive watch
    (nimbus-ha's), and on kazoo's own, which lists directories on child watches."""
    if request.param == "recursive-watch":
        zk = make_zk()
    else:
        zk = KazooClient(hosts=zk_server.hosts, timeout=4.0)
        zk.start(timeout=15)
    made = WatchedTree(zk, root, "audit")
    assert made._cache.children_by_recursive_watch == (request.param == "recursive-watch")
    yield zk, made
    made.close()
    if request.param == "child-watches":
        zk.stop()
        zk.close()


def deaf_node(make_zk, root: str, watched) -> tuple[KazooClient, WatchedTree, str]:
    """(a writer, a started tree, a node created with b"v1" whose changes it misses)."""
    zk, tree = watched
    writer = make_zk()
    target = posixpath.join(root, "x")
    writer.create(target, b"v1")
    tree.start()
    deafen(zk, tree, target)
    return writer, tree, target


def test_audit_re_reads_data_the_view_missed(make_zk, root, watched, caplog):
    writer, tree, target = deaf_node(make_zk, root, watched)
    writer.set(target, b"new")
    tree.barrier()
    assert tree.get(target)[0] == b"v1"  # missed, and a barrier does not help
    assert tree.audit(100) == ([], True)  # differs: maybe a change in flight
    with caplog.at_level("WARNING", logger="nimbus.state.watched_tree"):
        # still behind the first look after a barrier: stale
        assert tree.audit(0) == ([target], False)
    assert f"the view held {target} stale" in caplog.text
    tree.barrier()
    assert tree.get(target)[0] == b"new"
    assert tree.audit(100) == ([], True)
    assert tree._suspects == {}


def test_audit_finds_a_missed_node_that_zookeeper_keeps_changing(make_zk, root, watched):
    """The view must hold at least what ZooKeeper had at the last look: a node that
    changes between two audits is judged against the first look, and found."""
    writer, tree, target = deaf_node(make_zk, root, watched)
    writer.set(target, b"v2")
    assert tree.audit(100)[0] == []
    writer.set(target, b"v3")
    assert tree.audit(0)[0] == [target]
    tree.barrier()
    assert tree.get(target)[0] == b"v3"


def test_audit_never_reports_a_view_that_keeps_up(make_zk, root, watched):
    """Changes in flight between the looks are not staleness (the barrier brings them in)."""
    zk, tree = watched
    writer = make_zk()
    paths = [posixpath.join(root, name) for name in ("a", "b", "c")]
    for path in paths:
        writer.create(path, b"0")
    tree.start()
    for round_ in range(30):
        for path in paths:
            writer.set(path, str(round_).encode())
        writer.create(posixpath.join(root, f"n{round_}"), b"")
        assert tree.audit(100)[0] == []
    tree.barrier()
    assert tree.audit(100)[0] == []
    assert tree._suspects == {}


def slowed(make_zk, root: str, watched, monkeypatch: pytest.MonkeyPatch,
           in_barrier: Callable[[KazooClient, str], None] = lambda _writer, _path: None,
           ) -> tuple[KazooClient, WatchedTree, str]:
    """(a writer, a started tree, its node "a"): the tree's cache thread is held up from
    now until the tree's next barrier, which first runs ``in_barrier(writer, path)``."""
    zk, tree = watched
    writer = make_zk()
    target = posixpath.join(root, "a")
    writer.create(target, b"old")
    tree.start()
    thawed = threading.Event()
    tree._cache._in_background(thawed.wait)  # busy: later events wait behind this
    real_barrier = tree.barrier

    def barrier(timeout_s: float = 10.0) -> None:
        thawed.set()
        in_barrier(writer, target)
        real_barrier(timeout_s)

    monkeypatch.setattr(tree, "barrier", barrier)
    return writer, tree, target


def test_audit_does_not_mistake_a_slow_view_for_a_stale_one(make_zk, root, watched,
                                                             monkeypatch):
    """The cache's thread is held up through both looks and catches up only in the
    audit's barrier: nothing is reported."""
    writer, tree, target = slowed(make_zk, root, watched, monkeypatch)
    writer.set(target, b"new")
    writer.create(posixpath.join(root, "b"), b"")
    assert tree.audit(100)[0] == []
    assert sorted(tree._suspects) == [root, target]  # both differ while in flight
    assert tree.audit(0)[0] == []  # the barrier brought the view up to the first look
    assert tree.audit(0)[0] == []  # and now the looks agree
    assert tree._suspects == {}
    assert tree.get(target)[0] == b"new"


def test_audit_does_not_mistake_a_deletion_just_before_its_barrier(make_zk, root, watched,
                                                                    monkeypatch):
    """A suspect deleted between the audit's look and its barrier is rightly not held."""
    writer, tree, target = slowed(make_zk, root, watched, monkeypatch,
                                  in_barrier=lambda writer, path: writer.delete(path))
    writer.set(target, b"new")
    assert tree.audit(100)[0] == []
    assert target in tree._suspects  # the change is in flight
    assert tree.audit(0)[0] == []
    assert tree.children() == []


def test_audit_drops_a_node_whose_deletion_was_missed(make_zk, root, watched):
    writer, tree, target = deaf_node(make_zk, root, watched)
    writer.delete(target)
    tree.barrier()
    assert tree.children() == ["x"]
    assert tree.audit(100)[0] == []
    # the node, and its directory, which ZooKeeper says has one child fewer
    assert sorted(tree.audit(0)[0]) == [root, target]
    tree.barrier()
    assert tree.children() == []
    assert tree.get(target) is None


def test_audit_finds_a_child_the_view_missed(make_zk, root, watched):
    zk, tree = watched
    writer = make_zk()
    writer.create(posixpath.join(root, "a"), b"")
    tree.start()
    deafen(zk, tree, root)
    writer.create(posixpath.join(root, "b"), b"late")
    tree.barrier()
    assert tree.children() == ["a"]
    assert tree.audit(100)[0] == []
    assert tree.audit(0)[0] == [root]
    tree.barrier()
    assert tree.children() == ["a", "b"]
    assert tree.get(posixpath.join(root, "b"))[0] == b"late"


def test_audit_goes_round_the_tree_in_steps(make_zk, root, watched):
    zk, tree = watched
    writer = make_zk()
    for name in ("a", "b", "c", "d"):
        writer.create(posixpath.join(root, name), b"", makepath=True)
    tree.start()
    assert tree.audit(0) == ([], False) and tree._audit_queue == []  # no budget: no walk
    # five nodes (the directory and four children), two at a time: three steps a round
    assert [tree.audit(2)[1] for _ in range(6)] == [False, False, True] * 2
