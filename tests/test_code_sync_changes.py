"""The code sync and the leader's code check by change, against a real ZooKeeper: each
pass and each check does what one over every topology does, and costs what changed."""

from __future__ import annotations

import random
import shutil

import pytest
from stub_distributors import StubDistributor

from nimbus.distribution.distributors import CodeDistributor
from nimbus.distribution.hookspecs import hookimpl
from nimbus.distribution.local_code import LocalCodeStore
from nimbus.master.code_sync import CodeSync
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.cluster_view import ClusterView
from nimbus.state.records import ACTIVE, CodeMeta, StormBase

pytestmark = pytest.mark.zookeeper


class CopyingDistributor(StubDistributor):
    """Downloads make the copy (its one file holds the metafile); one replica each."""

    name = "copying"
    failing: set[str] = set()

    @hookimpl
    def download(self, dest_dir, topology_id, metafile):
        if topology_id in CopyingDistributor.failing:
            raise RuntimeError("no source serves it")
        dest_dir.mkdir(parents=True)
        (dest_dir / "meta").write_bytes(metafile.read_bytes())
        return [dest_dir / "meta"]

    @hookimpl
    def get_replication_count(self, topology_id):
        return 1


META = CodeMeta(distributor="copying", metafile_b64=CodeMeta.pack(b"m"), uploaded_by="x",
                created_secs=1).encode()


@pytest.fixture
def cluster(make_zk, zk_root):
    state = StormClusterState(make_zk(), zk_root)
    state.setup()
    view = ClusterView(state, name="sync-changes")
    view.start()
    CopyingDistributor.failing = set()
    yield state, view
    view.close()


@pytest.fixture
def clock(monkeypatch) -> list[float]:
    """The code sync's monotonic clock, moved by the test."""
    now = [1000.0]
    monkeypatch.setattr("nimbus.master.code_sync.time.monotonic", lambda: now[0])
    return now


def sync_of(state: StormClusterState, view: ClusterView, store: LocalCodeStore) -> CodeSync:
    return CodeSync(state, store, CodeDistributor(CopyingDistributor), period_s=3600,
                    view=view)


def submit(state: StormClusterState, topology_id: str, published: bool = True) -> None:
    state.zk.create(state.storm_path(topology_id), StormBase(
        storm_name=topology_id, launch_time_secs=1, status=ACTIVE).encode())
    state.zk.create(state.code_path(topology_id), META if published else b"")


def test_each_pass_by_change_does_what_a_pass_over_everything_does(cluster, tmp_path):
    """Two nimbuses' syncs on one view: one passes by change, the other looks at every
    topology each time. Through random submits, kills, late metafiles, code nodes left
    without a topology, replica registrations and failing downloads, their disks and
    their missing counts agree after every pass. Fails if a pass by change misses a
    removal, a fetch or a retry."""
    state, view = cluster
    zk = state.zk
    rng = random.Random(27)
    by_change = sync_of(state, view, LocalCodeStore(tmp_path / "a"))
    whole = sync_of(state, view, LocalCodeStore(tmp_path / "b"))
    ids = [f"t{n}-{n}-1" for n in range(15)]
    retried = 0
    for step in range(160):
        topology_id = rng.choice(ids)
        storm, code = state.storm_path(topology_id), state.code_path(topology_id)
        action = rng.choice(["submit", "submit", "half submit", "publish", "kill",
                             "orphan code", "drop code", "replica", "fail", "heal"])
        if action in ("submit", "half submit") and not zk.exists(storm):
            zk.delete(code, recursive=True) if zk.exists(code) else None
            submit(state, topology_id, published=action == "submit")
        elif action == "publish" and zk.exists(code):
            zk.set(code, META)
        elif action == "kill" and zk.exists(storm):
            zk.delete(storm)
            zk.delete(code, recursive=True)
        elif action == "orphan code" and zk.exists(storm):
            zk.delete(storm)  # a leader that died between its two steps
        elif action == "drop code" and zk.exists(code) and not zk.exists(storm):
            zk.delete(code, recursive=True)
        elif action == "replica" and zk.exists(code):
            state.register_replica(topology_id, f"h{step}:6627", "x")
        elif action == "fail" and not zk.exists(storm):  # a submit no source serves
            CopyingDistributor.failing.add(topology_id)
            zk.delete(code, recursive=True) if zk.exists(code) else None
            submit(state, topology_id)
        elif action == "heal":
            CopyingDistributor.failing.clear()
            retried += bool(by_change._retry_at)
            by_change._retry_at = dict.fromkeys(by_change._retry_at, 0.0)
            whole._retry_at = dict.fromkeys(whole._retry_at, 0.0)
        view.barrier()
        whole.resync()
        whole.sync_once()
        by_change.sync_once()
        assert by_change._store.topologies() == whole._store.topologies(), (step, action)
        assert by_change.missing_count == whole.missing_count, (step, action)
        assert by_change._retry_at.keys() == whole._retry_at.keys(), (step, action)
    assert by_change._store.topologies(), "the walk left some copy held"
    assert retried, "some failed download was retried"


def test_a_pass_after_a_submit_costs_what_changed(cluster, tmp_path, monkeypatch):
    """With 300 topologies held, the pass after one submit stats the keys it names and
    reads their code nodes: no listing of the disk, no read of every code node."""
    state, view = cluster
    store = LocalCodeStore(tmp_path)
    for n in range(300):
        submit(state, f"held{n}-{n}-1")
        store.path(f"held{n}-{n}-1").mkdir()
    sync = sync_of(state, view, store)
    view.barrier()
    sync.sync_once()  # the first pass looks at everything
    calls: dict[str, int] = {"has": 0, "topologies": 0, "code_meta": 0, "code_metas": 0}

    def counted(owner, name):
        real = getattr(owner, name)

        def call(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        monkeypatch.setattr(owner, name, call)

    for owner, name in ((store, "has"), (store, "topologies"), (view, "code_meta"),
                        (view, "code_metas")):
        counted(owner, name)
    submit(state, "new-1-1")
    view.barrier()
    sync.sync_once()
    assert store.has("new-1-1")
    assert calls["topologies"] == calls["code_metas"] == 0
    assert calls["code_meta"] == 1
    assert calls["has"] <= 6
    assert sync.missing_count == 0


def test_a_copy_deleted_by_hand_is_fetched_by_the_next_pass_over_everything(
        cluster, tmp_path, clock):
    """A pass by change does not see an operator's deletion; the next pass over
    everything does (LISTING_MAX_AGE_S later at most, or at once after resync())."""
    state, view = cluster
    store = LocalCodeStore(tmp_path)
    submit(state, "a-1-1")
    sync = sync_of(state, view, store)
    view.barrier()
    sync.sync_once()
    assert store.has("a-1-1")
    shutil.rmtree(store.path("a-1-1"))
    sync.sync_once()
    assert not store.has("a-1-1"), "a pass by change looks only at what changed"
    sync.resync()
    sync.sync_once()
    assert store.has("a-1-1")
    shutil.rmtree(store.path("a-1-1"))
    clock[0] += sync.LISTING_MAX_AGE_S
    sync.sync_once()
    assert store.has("a-1-1")


def test_a_leaders_check_by_change_agrees_with_a_listing(cluster, tmp_path, clock):
    """Through submits, kills and copies added, the leader's check by change answers
    what a check that lists ZooKeeper and the disk answers; a copy deleted by hand is
    seen at the check over everything, LISTING_MAX_AGE_S after the last."""
    state, view = cluster
    store = LocalCodeStore(tmp_path)
    sync = sync_of(state, view, store)
    rng = random.Random(28)
    for step in range(80):
        topology_id = f"t{rng.randrange(10)}-1-1"
        action = rng.choice(["submit", "kill", "copy", "copy"])
        if action == "submit" and not state.zk.exists(state.storm_path(topology_id)):
            submit(state, topology_id)
        elif action == "kill" and state.zk.exists(state.storm_path(topology_id)):
            state.zk.delete(state.storm_path(topology_id))
            state.zk.delete(state.code_path(topology_id), recursive=True)
        elif action == "copy" and not store.has(topology_id):
            store.path(topology_id).mkdir()
        by_change, listed = sync.check_code(leading=True), sync.check_code()
        assert (by_change.live, by_change.missing) == (listed.live, listed.missing), step
    held = sorted(by_change.held)
    assert held, "the walk left some copy held"
    shutil.rmtree(store.path(held[0]))
    assert sync.check_code(leading=True).missing == frozenset(), "not seen by change"
    clock[0] += sync.LISTING_MAX_AGE_S
    assert sync.check_code(leading=True).missing == {held[0]}


def test_a_store_wiped_whole_is_seen_at_the_next_check_and_pass(cluster, tmp_path, clock):
    """Within LISTING_MAX_AGE_S of the last look at everything, a directory wiped whole
    (and made again) is seen at once by the leader's check and fetched by the next
    pass: one stat tells that the directory listed is gone."""
    state, view = cluster
    store = LocalCodeStore(tmp_path)
    submit(state, "a-1-1")
    sync = sync_of(state, view, store)
    view.barrier()
    sync.sync_once()
    assert sync.check_code(leading=True)
    assert not store.replaced()
    shutil.rmtree(store.root)
    store.root.mkdir()
    assert store.replaced()
    assert sync.check_code(leading=True).missing == {"a-1-1"}
    sync.sync_once()
    assert store.has("a-1-1") and sync.check_code(leading=True)


def test_a_leaders_check_that_fails_looks_at_everything_next(cluster, tmp_path,
                                                            monkeypatch):
    """A check by change whose stat fails after it took the view's changes gives them
    back: the next check looks at everything, and the copy it could not stat is seen
    missing."""
    state, view = cluster
    store = LocalCodeStore(tmp_path)
    sync = sync_of(state, view, store)
    assert sync.check_code(leading=True)
    submit(state, "new-1-1")  # needed now, and not held here

    def unreadable(code_key: str) -> bool:
        raise PermissionError("storm.local.dir unreadable")

    monkeypatch.setattr(store, "has", unreadable)
    with pytest.raises(PermissionError):
        sync.check_code(leading=True)
    monkeypatch.undo()
    assert sync.check_code(leading=True).missing == {"new-1-1"}
