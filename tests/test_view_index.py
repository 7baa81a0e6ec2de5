"""The view's whole-directory reads kept up to date by name, against a real ZooKeeper: a
change costs the nodes that changed, never a pass over every node, and what the index
holds is what a fresh read finds."""

from __future__ import annotations

import random

import pytest
from test_cluster_view import add
from waiting import wait_until

from nimbus.master.summary_cache import ClusterSummaryCache
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.cluster_view import ClusterView
from nimbus.state.records import INACTIVE, CodeMeta, StormBase, SupervisorInfo


@pytest.fixture
def views(make_zk, zk_root, writer):
    made: list[ClusterView] = []

    def new() -> ClusterView:
        view = ClusterView(StormClusterState(make_zk(), zk_root), name=f"test{len(made)}")
        view.start()
        made.append(view)
        return view

    yield new
    for view in made:
        view.close()


def test_a_change_decodes_only_the_nodes_that_changed(writer, fence, views):
    ids = [add(writer, fence, i) for i in range(30)]
    view = views()
    assert len(view.storms()) == 30 and len(view.assignments()) == 30
    decoded: list[str] = []
    real = view._decode
    view._decode = lambda cls, path, got: decoded.append(path) or real(cls, path, got)
    added = add(writer, fence, 99)
    base = view.storm_base(ids[3])
    writer.update_storm(fence, ids[3], StormBase(**{**base.__dict__, "num_workers": 4}),
                        writer.storm_base_versioned(ids[3])[1])
    view.barrier()
    decoded.clear()  # storm_base above decoded once itself
    assert len(view.storms()) == 31 and len(view.assignments()) == 31
    assert view.storms()[ids[3]].num_workers == 4
    assert view.find_storm_by_name("t99") == (added, view.storms()[added])
    assert sorted(decoded) == sorted([writer.storm_path(added), writer.storm_path(ids[3]),
                                      writer.path("assignments", added)])


def fresh_reads(view: ClusterView) -> tuple:
    return (dict(view.storms()), dict(view.assignments()), dict(view.supervisors()),
            dict(view.code_metas()), view.unreadable("storms"),
            view.unreadable("code-distributor"))


def test_the_index_holds_what_a_fresh_read_finds_after_any_changes(make_zk, zk_root, writer,
                                                                    fence, views):
    """Adds, renames, removals, nodes made unreadable and mended, supervisors coming and
    going and code nodes published, in a random order; after each step the long-lived
    view answers as a view loaded afresh does, names included."""
    rng = random.Random(27)
    view = views()
    supervisors = StormClusterState(make_zk(), zk_root)
    live: list[str] = []
    for step in range(60):
        action = rng.choice(["add", "add", "rename", "remove", "garble", "mend",
                             "supervisor", "code"])
        if action == "add" or not live:
            live.append(add(writer, fence, step, name=f"n{rng.randrange(8)}x{step}"))
        elif action == "rename":
            target = rng.choice(live)
            got = writer.zk.get(writer.storm_path(target))
            try:
                base = StormBase.decode(got[0])
            except Exception:
                continue
            writer.update_storm(fence, target, StormBase(**{**base.__dict__,
                                                            "storm_name": f"r{step}"}),
                                got[1].version)
        elif action == "remove":
            target = live.pop(rng.randrange(len(live)))
            writer.remove_storm(fence, target)
        elif action == "garble":
            writer.zk.set(writer.storm_path(rng.choice(live)), b'{"format": 99}')
        elif action == "mend":
            target = rng.choice(live)
            writer.zk.set(writer.storm_path(target), StormBase(
                storm_name=f"m{step}", launch_time_secs=1, status=INACTIVE,
                num_workers=1).encode())
        elif action == "supervisor":
            supervisors.supervisor_heartbeat(f"s{rng.randrange(4)}", SupervisorInfo(
                time_secs=step, hostname="h"))
        else:
            target = rng.choice(live)
            if writer.zk.exists(writer.code_path(target)) is None:
                writer.begin_code(fence, target)
            else:
                writer.publish_code(fence, target, CodeMeta(
                    distributor="x", metafile_b64=CodeMeta.pack(b"m"), uploaded_by="a",
                    created_secs=step))
        view.barrier()
        fresh = views()
        assert fresh_reads(view) == fresh_reads(fresh), f"step {step}: {action}"
        for base in fresh.storms().values():
            assert view.find_storm_by_name(base.storm_name) == \
                fresh.find_storm_by_name(base.storm_name)
        fresh.close()


def summary(view: ClusterView, delay_s: float) -> ClusterSummaryCache:
    from types import SimpleNamespace

    cache = ClusterSummaryCache(view.state, SimpleNamespace(
        get_replication_count=lambda t: 1), view)
    cache.SAFETY_INTERVAL_S = 3600
    cache.HEARTBEAT_DELAY_S = delay_s
    cache.start()
    return cache


def test_heartbeats_do_not_each_make_a_snapshot(make_zk, zk_root, views):
    """1,000 supervisors beat 200 times a second: a heartbeat of a supervisor already
    shown waits for the next reload (HEARTBEAT_DELAY_S at the latest), while a
    supervisor that joins is shown at once."""
    view = views()
    cache = summary(view, delay_s=3600)
    own = StormClusterState(make_zk(), zk_root)
    try:
        own.supervisor_heartbeat("s1", SupervisorInfo(time_secs=1, hostname="h1"))
        wait_until(lambda: "s1" in cache.snapshot.supervisors, 10)  # joined: no refresh
        before = cache.snapshot.version
        for beat in range(2, 12):
            own.supervisor_heartbeat("s1", SupervisorInfo(time_secs=beat, hostname="h1"))
        view.barrier()
        assert cache.snapshot.version == before, "a heartbeat made a snapshot"
        shown = cache.refresh_now()
        assert (shown.version, shown.supervisors["s1"].time_secs) == (before + 1, 11)
    finally:
        cache.stop()


def test_a_heartbeat_is_shown_within_the_delay(make_zk, zk_root, views):
    view = views()
    cache = summary(view, delay_s=0.2)
    own = StormClusterState(make_zk(), zk_root)
    try:
        own.supervisor_heartbeat("s1", SupervisorInfo(time_secs=1, hostname="h1"))
        wait_until(lambda: "s1" in cache.snapshot.supervisors, 10)
        own.supervisor_heartbeat("s1", SupervisorInfo(time_secs=2, hostname="h1"))
        wait_until(lambda: cache.snapshot.supervisors["s1"].time_secs == 2, 10)
        own.zk.delete(own.path("supervisors", "s1"))
        wait_until(lambda: "s1" not in cache.snapshot.supervisors, 10)  # left: at once
    finally:
        cache.stop()


def test_a_change_whose_wake_up_was_lost_is_shown_at_the_next_tick(views):
    """A wake-up that lands just as a tick's wait times out is cleared with it: the
    change it announced must still be shown at the next tick (at most
    HEARTBEAT_DELAY_S), not at the safety net's (here an hour)."""
    view = views()
    cache = summary(view, delay_s=0.2)
    try:
        before = cache.refresh_now().version
        with cache._stale_lock:  # a change noted, its wake-up lost
            cache._dirty.add("nimbuses")
        wait_until(lambda: cache.snapshot.version > before, 10)
    finally:
        cache.stop()
