"""ClusterView / WatchedTree against a real ZooKeeper: loading, following changes made
by another session, the barrier, wiped directories, unreadable nodes, session expiry."""

from __future__ import annotations

import threading

import pytest
from faults import expire_session
from waiting import wait_until

from nimbus.state.cluster_state import Fence, LayoutMissingError, StormClusterState
from nimbus.state.cluster_view import ClusterView, ViewNotLoadedError
from nimbus.state.records import INACTIVE, Assignment, RecordError, StormBase


def add(writer: StormClusterState, fence: Fence, index: int, name: str = "") -> str:
    topology_id = f"t{index}-1-1700000000"
    writer.activate_storm(fence, topology_id,
                          StormBase(storm_name=name or f"t{index}", launch_time_secs=1,
                                    status=INACTIVE, num_workers=1),
                          Assignment(master_code_dir="/code"))
    return topology_id


@pytest.fixture
def view(make_zk, zk_root, writer):
    made = ClusterView(StormClusterState(make_zk(), zk_root), name="test")
    yield made
    made.close()


def test_loads_what_exists_and_follows_another_sessions_writes(writer, fence, view):
    first = [add(writer, fence, i) for i in range(5)]
    view.start()
    assert view.active_storms() == sorted(first)
    assert sorted(view.assignments()) == sorted(first)
    added = add(writer, fence, 99, name="late")
    view.barrier()
    assert len(view.storms()) == 6
    assert view.find_storm_by_name("late")[0] == added
    base = view.storm_base(added)
    writer.update_storm(fence, added, StormBase(**{**base.__dict__, "num_workers": 7}),
                        writer.storm_base_versioned(added)[1])
    view.barrier()
    assert view.storm_base(added).num_workers == 7
    writer.remove_storm(fence, first[0])
    view.barrier()
    assert view.storm_base(first[0]) is None
    assert len(view.active_storms()) == 5
    assert view.assignment(first[0]) is None


def test_barrier_sees_every_write_made_before_it(writer, fence, view):
    view.start()
    for i in range(40):  # no sleeps: each write must be visible right after the barrier
        topology_id = add(writer, fence, i)
        view.barrier()
        assert view.storm_base(topology_id) is not None, f"write {i} missed"
        writer.begin_code(fence, topology_id)
        assert writer.register_replica(topology_id, f"host{i}:6627", "x")
        view.barrier()
        assert view.replica_hosts(topology_id) == [f"host{i}:6627"]


def test_one_barrier_waits_for_every_directory(writer, fence, view):
    """The directories go through the barrier together, and each cache's thread must
    catch up: one held up makes the barrier time out."""
    view.start()
    thawed = threading.Event()
    view._trees["code-distributor"]._cache._in_background(thawed.wait)
    try:
        with pytest.raises(ViewNotLoadedError, match="not in memory within"):
            view.barrier(timeout_s=0.5)
    finally:
        thawed.set()
    topology_id = add(writer, fence, 1)
    view.barrier()
    assert view.code_topologies() == [] and view.active_storms() == [topology_id]


def test_records_are_decoded_once_per_version(writer, fence, view):
    topology_id = add(writer, fence, 1)
    view.start()
    assert view.storm_base(topology_id) is view.storm_base(topology_id)
    assert view.storms()[topology_id] is view.storm_base(topology_id)


def test_an_unreadable_node_raises_for_itself_and_hides_no_other(writer, fence, view):
    good = add(writer, fence, 1)
    bad = add(writer, fence, 2)
    writer.zk.set(writer.storm_path(bad), b'{"format": 1, "storm_name": 5}')
    view.start()
    with pytest.raises(RecordError, match=bad):
        view.storm_base(bad)
    assert list(view.storms()) == [good]
    writer.zk.set(writer.storm_path(bad), b'{"format": 99}')
    view.barrier()
    with pytest.raises(RecordError, match="format 99"):
        view.storm_base(bad)


def test_a_missing_directory_is_refused_not_created(make_zk, zk_root):
    zk = make_zk()
    with pytest.raises(LayoutMissingError, match="storms"):
        ClusterView(StormClusterState(zk, zk_root)).start(timeout_s=5)
    assert zk.exists(zk_root) is None


def test_a_wiped_directory_is_layout_missing_not_empty(writer, fence, view):
    add(writer, fence, 1)
    view.start()
    writer.zk.delete(writer.path("storms"), recursive=True)
    view.barrier()
    with pytest.raises(LayoutMissingError, match="storms"):
        view.active_storms()


def test_after_session_expiry_the_view_catches_up(zk_server, writer, fence, view):
    kept = add(writer, fence, 1)
    view.start()
    expire_session(view.state.zk, zk_server.hosts)
    gone = kept
    writer.remove_storm(fence, gone)
    added = add(writer, fence, 2)
    wait_until(lambda: view.loaded)
    view.barrier()
    assert view.active_storms() == [added]


def test_reads_refused_while_not_loaded(writer, view):
    with pytest.raises(ViewNotLoadedError):
        view.storms()


def test_threads_are_named_and_joined_on_close(writer, view):
    view.start()
    names = {t.name for t in threading.enumerate()}
    assert {f"zk-tree-test-{d}" for d in ("storms", "assignments", "supervisors",
                                          "code-distributor", "workerbeats")} <= names
    view.close()
    wait_until(lambda: not any(t.name.startswith("zk-tree-test-")
                               for t in threading.enumerate()), 5)


def test_whole_directory_results_are_shared_until_a_change(writer, fence, view):
    first = add(writer, fence, 1)
    view.start()
    storms = view.storms()
    assert view.storms() is storms, "no change: the same dict, nothing decoded again"
    assert view.find_storm_by_name("t1") == (first, storms[first])
    second = add(writer, fence, 2)
    view.barrier()
    assert view.storms() is not storms
    assert sorted(view.storms()) == sorted([first, second])
    assert view.find_storm_by_name("t2")[0] == second


def test_the_summary_rebuilds_only_what_changed(make_zk, zk_root, writer, fence, view):
    """A supervisor's heartbeat (every few seconds, from every supervisor) makes a new
    snapshot that shares the topology parts of the last one: at thousands of topologies
    a heartbeat must not cost a pass over all of them."""
    from types import SimpleNamespace

    from nimbus.master.summary_cache import ClusterSummaryCache
    from nimbus.state.records import SupervisorInfo

    add(writer, fence, 1)
    view.start()
    counted: list[str] = []
    distributor = SimpleNamespace(get_replication_count=lambda t: counted.append(t) or 1)
    cache = ClusterSummaryCache(view.state, distributor, view)
    cache.SAFETY_INTERVAL_S = 3600  # only the first load sweeps: the counts are exact
    cache.start()
    try:
        before = cache.refresh_now()
        assert (list(before.storms), counted) == (["t1-1-1700000000"], ["t1-1-1700000000"])
        supervisor = StormClusterState(make_zk(), zk_root)
        supervisor.supervisor_heartbeat("s1", SupervisorInfo(time_secs=1, hostname="h1"))
        after = cache.refresh_now()
        assert list(after.supervisors) == ["s1"]
        assert after.storms is before.storms and after.assignments is before.assignments
        assert after.replication is before.replication
        assert counted == ["t1-1-1700000000"], "no replica recount for a heartbeat"
        added = add(writer, fence, 2)
        grown = cache.refresh_now()
        assert sorted(grown.storms) == sorted(["t1-1-1700000000", added])
        assert grown.supervisors is after.supervisors
        assert counted == ["t1-1-1700000000", added], "only the new topology is counted"
    finally:
        cache.stop()


def test_the_summary_holds_replica_hosts_and_tells_its_listeners(writer, fence, view):
    """The one read model: each snapshot has a new version, the hosts registered as
    replicas (a UI shows them), and every listener hears of it until it stops
    listening."""
    from types import SimpleNamespace

    from nimbus.master.summary_cache import ClusterSummaryCache

    topology_id = add(writer, fence, 1)
    writer.begin_code(fence, topology_id)
    view.start()
    cache = ClusterSummaryCache(view.state, SimpleNamespace(
        get_replication_count=lambda t: len(view.replica_hosts(t))), view)
    cache.SAFETY_INTERVAL_S = 3600
    told: list[int] = []

    def listener() -> None:
        told.append(cache.snapshot.version)

    cache.listen(listener)
    assert not cache.snapshot.loaded and cache.layout_error == ""
    cache.start()
    try:
        first = cache.refresh_now()
        assert first.loaded and first.replica_hosts == {topology_id: []}
        assert writer.register_replica(topology_id, "host1:6627", "x")
        wait_until(lambda: cache.snapshot.replica_hosts == {topology_id: ["host1:6627"]})
        later = cache.snapshot
        assert later.version > first.version and later.replication == {topology_id: 1}
        assert first.version in told
        wait_until(lambda: told[-1] == cache.snapshot.version)
        cache.unlisten(listener)
        cache.refresh_now()  # one loop thread: no reload started before this one tells
        heard = len(told)
        assert cache.refresh_now().version > later.version
        assert len(told) == heard, "no longer listening"
    finally:
        cache.stop()


def test_background_audit_mends_a_node_the_view_missed(make_zk, zk_root, writer, fence):
    """The auditor thread (fast here) finds a topology whose change the view missed,
    re-reads it and says so; it is named, and joined on close."""
    stale: list[tuple[str, str]] = []
    view = ClusterView(StormClusterState(make_zk(), zk_root), name="audited",
                       audit_nodes_per_s=200, audit_tick_s=0.05,
                       on_stale=lambda d, p: stale.append((d, p)))
    topology_id = add(writer, fence, 1)
    view.start()
    try:
        assert [t.name for t in threading.enumerate()].count("view-audit-audited") == 1
        tree = view._trees["storms"]
        path = tree.join(topology_id)
        node = tree._cache._find_node(path)
        view.state.zk._data_watchers[path].discard(node._process_watch)  # an event lost
        base = view.storm_base(topology_id)
        writer.update_storm(fence, topology_id,
                            StormBase(**{**base.__dict__, "num_workers": 9}),
                            writer.storm_base_versioned(topology_id)[1])
        wait_until(lambda: view.storm_base(topology_id).num_workers == 9)
        wait_until(lambda: stale == [("storms", path)])
    finally:
        view.close()
    assert "view-audit-audited" not in [t.name for t in threading.enumerate()]



def test_the_id_list_follows_changes_without_listing_again(writer, fence, view, monkeypatch):
    """Topologies come and go (a removal, a re-creation, a child that is no topology id,
    a burst larger than the list's patching): after each barrier the ids are exactly
    what ZooKeeper lists, in order, and a change patches the list instead of listing
    and matching every child again."""
    import random

    zk, storms = writer.zk, writer.path("storms")
    view.start()
    rng = random.Random(7)
    present: set[str] = set()
    removed: dict[str, bytes] = {}  # re-created later, under the same id
    listings = []
    real_children = view._trees["storms"].children
    monkeypatch.setattr(view._trees["storms"], "children",
                        lambda path=None: listings.append(path) or real_children(path))
    for step in range(120):
        if step == 60:  # a burst: more names than the list patches one by one
            for index in range(1000, 1100):
                present.add(add(writer, fence, index))
        elif present and rng.random() < 0.4:
            gone = rng.choice(sorted(present))
            removed[gone] = zk.get(f"{storms}/{gone}")[0]
            zk.delete(f"{storms}/{gone}")
            present.discard(gone)
        elif removed and rng.random() < 0.3:
            back = rng.choice(sorted(removed))
            zk.create(f"{storms}/{back}", removed.pop(back))
            present.add(back)
        elif step % 25 == 0:
            zk.create(f"{storms}/not-a-topology-{step}")  # left out, as by a listing
        else:
            present.add(add(writer, fence, step))
        view.barrier()
        expected = sorted(c for c in zk.get_children(storms) if c.startswith("t"))
        assert expected == sorted(present)
        assert view.active_storms() == expected, f"step {step}"
    assert listings == [None, None], "listed when first read and after the burst only"


def test_the_id_list_is_shared_until_a_change(writer, fence, view):
    add(writer, fence, 1)
    view.start()
    ids = view.active_storms()
    assert view.active_storms() is ids
    add(writer, fence, 2)
    view.barrier()
    assert view.active_storms() is not ids and ids == ["t1-1-1700000000"]


def test_a_reader_during_a_fresh_listing_gets_that_listing(writer, fence, view, monkeypatch):
    """Two readers at once, the first listing the directory afresh (the first read here):
    the second gets the full list, never the empty one kept before."""
    expected = sorted(add(writer, fence, i) for i in range(3))
    view.start()
    tree = view._trees["storms"]
    listing, release = threading.Event(), threading.Event()
    real_children = tree.children

    def slow_children(path=None):
        listing.set()
        assert release.wait(10)
        return real_children(path)

    monkeypatch.setattr(tree, "children", slow_children)
    got: dict[str, list[str]] = {}
    first = threading.Thread(target=lambda: got.update(first=view.active_storms()))
    first.start()
    assert listing.wait(10)
    second = threading.Thread(target=lambda: got.update(second=view.active_storms()))
    second.start()
    second.join(1.0)  # a reader that does not wait for the listing answers by now
    release.set()
    first.join(10)
    second.join(10)
    assert got == {"first": expected, "second": expected}


def test_topologies_by_status_follow_every_change(writer, fence, view):
    """Kills, rebalances, activations, removals and a re-creation: after each barrier
    ``storms_in(status)`` holds exactly the topologies ZooKeeper has in that status,
    and a caller's copy is its own."""
    import random
    from dataclasses import replace

    from nimbus.state.records import ACTIVE, KILLED, REBALANCING

    zk, storms = writer.zk, writer.path("storms")
    present = [add(writer, fence, i) for i in range(30)]
    view.start()
    rng = random.Random(11)
    for step in range(80):
        topology_id = rng.choice(present)
        if rng.random() < 0.15:
            zk.delete(f"{storms}/{topology_id}")
            present.remove(topology_id)
            present.append(add(writer, fence, 100 + step))
        else:
            base = StormBase.decode(zk.get(f"{storms}/{topology_id}")[0])
            status = rng.choice([ACTIVE, INACTIVE, KILLED, REBALANCING])
            zk.set(f"{storms}/{topology_id}", replace(base, status=status).encode())
        view.barrier()
        for status in (ACTIVE, INACTIVE, KILLED, REBALANCING):
            expected = {t for t in zk.get_children(storms)
                        if StormBase.decode(zk.get(f"{storms}/{t}")[0]).status == status}
            got = view.storms_in(status)
            assert set(got) == expected, f"step {step}, {status}"
            assert all(got[t] is view.storms()[t] for t in got)
    got = view.storms_in(KILLED)
    got["x"] = None  # type: ignore[assignment]
    assert "x" not in view.storms_in(KILLED)


def test_the_summarys_per_topology_parts_follow_churn(writer, fence, view):
    """Submits, removals, half-seen submissions (an assignment without a StormBase, a
    StormBase without one), replica registrations and a reload of every directory:
    after each step the snapshot's assignments, replica hosts and counts are exactly
    those of its topologies, as a pass over every topology would make them."""
    import random
    from types import SimpleNamespace

    from nimbus.master.summary_cache import ClusterSummaryCache

    zk = writer.zk
    present = [add(writer, fence, i) for i in range(20)]
    for topology_id in present:
        writer.begin_code(fence, topology_id)
    view.start()
    cache = ClusterSummaryCache(view.state, SimpleNamespace(
        get_replication_count=lambda t: len(view.replica_hosts(t))), view)
    cache.SAFETY_INTERVAL_S = 3600  # no safety net: the changes alone keep it right
    cache.start()
    rng = random.Random(5)
    try:
        for step in range(60):
            kind = rng.randrange(6)
            if kind == 0:
                present.append(add(writer, fence, 100 + step))
                writer.begin_code(fence, present[-1])
            elif kind == 1 and present:
                writer.remove_storm(fence, present.pop(rng.randrange(len(present))))
            elif kind == 2:  # an assignment whose StormBase is not (or no longer) there
                orphan = f"o{step}-1-1700000000"
                zk.create(writer.path("assignments", orphan),
                          Assignment(master_code_dir="/c").encode())
            elif kind == 3 and present:  # a StormBase removed before its assignment
                gone = present.pop(rng.randrange(len(present)))
                zk.delete(writer.storm_path(gone))
            elif kind == 4 and present:
                writer.register_replica(rng.choice(present), f"host{step}:6627", "x")
            elif kind == 5:
                cache._changes.everything()  # as after a reload of the directories
            snapshot = cache.refresh_now()
            storms = view.storms()
            assert snapshot.storms is storms, f"step {step}"
            assert snapshot.assignments == {t: a for t, a in view.assignments().items()
                                            if t in storms}, f"step {step}"
            assert snapshot.replica_hosts == {
                t: view.replica_hosts(view.running_code_key(t)) for t in storms}, f"step {step}"
            assert snapshot.replication == {
                t: len(view.replica_hosts(t)) for t in storms}, f"step {step}"
    finally:
        cache.stop()
