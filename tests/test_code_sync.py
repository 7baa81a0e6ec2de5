"""CodeSync against a real ZooKeeper: what it keeps, fetches and removes."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from stub_distributors import StubDistributor

from nimbus.distribution.distributors import CodeDistributor
from nimbus.distribution.hookspecs import hookimpl
from nimbus.distribution.local_code import LocalCodeStore
from nimbus.master.code_sync import CodeSync
from nimbus.state.cluster_state import LayoutMissingError, StormClusterState
from nimbus.state.cluster_view import ClusterView
from nimbus.state.records import ACTIVE, CodeMeta, StormBase

pytestmark = pytest.mark.zookeeper
TOPOLOGY = "fresh-1-1"


class RecordingDistributor(StubDistributor):
    """A distributor that records cleanups (the sync's behaviour is under test)."""

    name = "recording"
    cleaned: list[str] = []
    shared_deleted: list[str] = []

    @hookimpl
    def cleanup(self, topology_id):
        RecordingDistributor.cleaned.append(topology_id)

    @hookimpl
    def delete_shared(self, topology_id):
        RecordingDistributor.shared_deleted.append(topology_id)


@pytest.fixture
def setup(make_zk, zk_root, tmp_path):
    state = StormClusterState(make_zk(), zk_root)
    state.setup()
    store = LocalCodeStore(tmp_path)
    store.path(TOPOLOGY).mkdir()
    RecordingDistributor.cleaned = []
    RecordingDistributor.shared_deleted = []
    return state, store, CodeDistributor(RecordingDistributor)


@pytest.fixture
def view(setup):
    """The in-memory view a sync pass reads (started on the test's state)."""
    made = ClusterView(setup[0], name="sync-test")
    made.start()
    yield made
    made.close()


def test_submission_finishing_during_a_run_keeps_its_code(setup, view):
    """The leader's fresh code is on disk and pending when the run starts; the submission
    completes (pending cleared, storm created) while the run reads. It must survive."""
    state, store, distributor = setup
    pending = {TOPOLOGY}

    def protected() -> set[str]:
        # The submission completes just as its pending mark is read: the storm exists
        # and the mark is gone. A run that read ZooKeeper before this would delete it.
        pending.clear()
        state.zk.create(state.storm_path(TOPOLOGY),
                        StormBase(storm_name="fresh", launch_time_secs=1, status=ACTIVE).encode())
        return set(pending)

    sync = CodeSync(state, store, distributor, period_s=3600, view=view, protected=protected)
    sync.sync_once()
    assert store.has(TOPOLOGY)
    assert RecordingDistributor.cleaned == []


def test_code_of_a_removed_topology_is_cleaned_up(setup, view):
    state, store, distributor = setup
    sync = CodeSync(state, store, distributor, period_s=3600, view=view)
    sync.sync_once()
    assert not store.has(TOPOLOGY)
    assert RecordingDistributor.cleaned == [TOPOLOGY]
    # A follower's sync drops only its own copy: shared storage is the leader's to delete.
    assert RecordingDistributor.shared_deleted == []


def test_absent_storms_directory_is_not_read_as_no_live_topology(setup, view):
    """A wrong root, or a wiped or half-restored ZooKeeper: nothing may be removed."""
    state, store, distributor = setup
    state.zk.create(state.storm_path(TOPOLOGY),
                    StormBase(storm_name="fresh", launch_time_secs=1, status=ACTIVE).encode())
    store.path("other-2-2").mkdir()  # a copy of a topology that is not live any more
    state.zk.delete(state.path("storms"), recursive=True)
    sync = CodeSync(state, store, distributor, period_s=3600, view=view)
    with pytest.raises(LayoutMissingError, match=r"/storms does not exist"):
        sync.sync_once()
    assert store.topologies() == {TOPOLOGY, "other-2-2"}
    assert RecordingDistributor.cleaned == []
    with pytest.raises(LayoutMissingError):
        sync.missing()


def test_store_of_another_cluster_is_never_cleaned(setup, view):
    state, store, distributor = setup
    sync = CodeSync(state, store, distributor, period_s=3600, view=view,
                    cleanup_blocked="holds code of cluster abc")
    sync.sync_once()
    assert store.has(TOPOLOGY)
    assert RecordingDistributor.cleaned == []


def test_cluster_id_is_made_once_and_a_foreign_store_is_reported(setup, tmp_path):
    state, store, _ = setup
    cluster = state.setup()
    assert state.setup() == cluster, "the id is kept across set-ups"
    assert store.claim(cluster) is None, "an unmarked store (earlier release) is adopted"
    assert store.claim(cluster) is None
    assert store.claim("another-cluster") == cluster, "a store with code of another id"
    assert store.has(TOPOLOGY), "claiming never deletes"
    empty = LocalCodeStore(tmp_path / "empty")
    empty.claim("another-cluster")
    assert empty.claim(cluster) is None, "an empty store simply changes hands"


def test_replica_change_during_a_failing_download_retries_at_once(setup, view, monkeypatch):
    """A replica that registers while a download fails must not wait for the backoff."""
    state, store, distributor = setup
    state.zk.create(state.storm_path("wanted-3-3"),
                    StormBase(storm_name="wanted", launch_time_secs=1, status=ACTIVE).encode())
    from nimbus.state.records import CodeMeta

    state.zk.create(state.code_path("wanted-3-3"), CodeMeta(
        distributor="recording", metafile_b64=CodeMeta.pack(b"m"), uploaded_by="x",
        created_secs=1).encode())
    sync = CodeSync(state, store, distributor, period_s=3600, view=view)
    attempts = []

    def download(dest_dir, topology_id, metafile):
        attempts.append(topology_id)
        if len(attempts) == 1:
            sync._on_replica_change(None)  # a new replica appears mid-download
            raise RuntimeError("no replica could serve it")
        dest_dir.mkdir(parents=True)
        return []

    monkeypatch.setattr(distributor, "download", download)
    sync.sync_once()
    assert attempts == ["wanted-3-3"] and not store.has("wanted-3-3")
    sync.sync_once()  # the flag raised during the failed attempt overrides the backoff
    assert attempts == ["wanted-3-3", "wanted-3-3"]
    assert store.has("wanted-3-3")


class SteppedSync(CodeSync):
    """A CodeSync that runs ``in_window`` (once) when its retry flag is read: between the
    read of the flag and the write that clears it, the window where a wake-up is lost."""

    in_window = None

    @property
    def _retry_now(self) -> bool:
        value = self.__dict__["_flag"]
        hook, self.in_window = self.in_window, None
        if hook is not None:
            hook()
        return value

    @_retry_now.setter
    def _retry_now(self, value: bool) -> None:
        self.__dict__["_flag"] = value


def test_replica_change_while_the_sync_takes_the_retry_flag_is_not_lost(setup, view, monkeypatch):
    """Two replicas register in a row: the sync thread takes the flag of the first while
    kazoo's thread raises it for the second. The second must still retry at once."""
    from faults import ObservedLock, run_until_done_or_blocked

    from nimbus.state.records import CodeMeta

    state, store, distributor = setup
    state.zk.create(state.storm_path("wanted-3-3"),
                    StormBase(storm_name="wanted", launch_time_secs=1, status=ACTIVE).encode())
    state.zk.create(state.code_path("wanted-3-3"), CodeMeta(
        distributor="recording", metafile_b64=CodeMeta.pack(b"m"), uploaded_by="x",
        created_secs=1).encode())
    sync = SteppedSync(state, store, distributor, period_s=3600, view=view)
    sync._retry_lock = ObservedLock(threading.Lock())  # a no-op for a sync without it
    sync._failures["wanted-3-3"] = 10  # each failure now pauses 30 s: only a flag retries
    attempts = []

    def download(dest_dir, topology_id, metafile):
        attempts.append(topology_id)
        raise RuntimeError("no replica could serve it")

    monkeypatch.setattr(distributor, "download", download)
    sync.sync_once()
    assert attempts == ["wanted-3-3"]
    sync._on_replica_change(None)  # replica 1 registers
    second: list[threading.Thread] = []
    sync.in_window = lambda: second.append(run_until_done_or_blocked(
        lambda: sync._on_replica_change(None), sync._retry_lock, "replica-2-watch"))
    sync.sync_once()  # takes replica 1's flag; replica 2's arrives meanwhile
    assert len(second) == 1
    second[0].join(10)
    assert not second[0].is_alive()
    assert attempts == ["wanted-3-3"] * 2, "replica 1's flag retried at once"
    sync.sync_once()
    assert attempts == ["wanted-3-3"] * 3, "replica 2's flag was kept for the next pass"


class NotLeading:
    """An elector that has just lost the lock (the state _abandon runs in)."""

    def is_leader(self) -> bool:
        return False

    def fence(self):
        from nimbus.master.elector import NoLeaderError

        raise NoLeaderError("this nimbus is not the leader")


def test_abandoned_submission_of_a_deposed_leader_keeps_shared_code(setup):
    """Deleting shared code is a leader action: a submission abandoned after the lock was
    lost drops only this host's copy; the next leader's duties remove the rest, fenced."""
    from nimbus.config import load_config
    from nimbus.master.lifecycle import TopologyLifecycle

    state, store, distributor = setup
    state.zk.create(state.code_path(TOPOLOGY), b"")
    lifecycle = TopologyLifecycle(load_config(overrides={}), state, store, distributor,
                                  NotLeading(), "127.0.0.1:1")
    lifecycle._abandon(TOPOLOGY)
    assert RecordingDistributor.shared_deleted == []
    assert RecordingDistributor.cleaned == [TOPOLOGY]
    assert not store.has(TOPOLOGY)
    assert state.zk.exists(state.code_path(TOPOLOGY)) is not None, "left to the duties"


class CountedDistributor(RecordingDistributor):
    """Replication counts set by the test."""

    name = "counted"
    counts: dict[str, int] = {}

    @hookimpl
    def get_replication_count(self, topology_id):
        return CountedDistributor.counts.get(topology_id, 0)


def live_storm(state: StormClusterState, topology_id: str) -> None:
    state.zk.create(state.storm_path(topology_id),
                    StormBase(storm_name=topology_id, launch_time_secs=1, status=ACTIVE).encode())


def test_code_on_no_source_counts_as_lost_only_after_the_grace(setup, monkeypatch):
    """STORM-3664: missing code with no replica anywhere is lost once the grace has run,
    and a reading with only lost code missing lets a nimbus lead, marked degraded."""
    state, store, _ = setup
    clock = [1000.0]
    monkeypatch.setattr("nimbus.master.code_sync.time.monotonic", lambda: clock[0])
    CountedDistributor.counts = {"gone-2-2": 0, "served-3-3": 1}
    live_storm(state, TOPOLOGY)        # held on disk (the fixture made it)
    live_storm(state, "gone-2-2")      # on no nimbus, in no store
    sync = CodeSync(state, store, CodeDistributor(CountedDistributor), period_s=3600,
                    lost_grace_s=10)
    first = sync.check_code()
    assert (first.missing, first.lost, bool(first)) == ({"gone-2-2"}, frozenset(), False)
    clock[0] += 9.9
    assert not sync.check_code() and sync.lost_topologies() == frozenset()
    clock[0] += 0.1
    check = sync.check_code()
    assert (check.lost, bool(check), check.degraded) == ({"gone-2-2"}, True, True)
    assert sync.lost_topologies() == {"gone-2-2"}
    assert str(check).endswith("; DEGRADED, code lost on every nimbus: [gone-2-2]")
    # Code that some nimbus still serves is never lost: the sync fetches it instead.
    live_storm(state, "served-3-3")
    clock[0] += 100
    check = sync.check_code()
    assert (check.missing, check.lost, bool(check)) == (
        {"gone-2-2", "served-3-3"}, {"gone-2-2"}, False)
    # A replica of the lost code appears: it is no longer lost, and its clock restarts.
    CountedDistributor.counts["gone-2-2"] = 1
    assert sync.check_code().lost == frozenset()
    CountedDistributor.counts["gone-2-2"] = 0
    clock[0] += 5
    assert sync.check_code().lost == frozenset()


def test_without_a_grace_code_is_never_lost(setup, monkeypatch):
    """nimbus.code.lost.grace.secs: -1 (None here) keeps Storm's rule."""
    state, store, _ = setup
    clock = [0.0]
    monkeypatch.setattr("nimbus.master.code_sync.time.monotonic", lambda: clock[0])
    CountedDistributor.counts = {}
    live_storm(state, "gone-2-2")
    sync = CodeSync(state, store, CodeDistributor(CountedDistributor), period_s=3600)
    for _ in range(3):
        clock[0] += 10**6
        check = sync.check_code()
        assert (check.lost, bool(check)) == (frozenset(), False)
    assert sync.lost_topologies() == frozenset()


def test_a_submission_in_flight_is_fetched_once_its_metafile_is_published(setup, view,
                                                                         monkeypatch):
    """Live, with a code node but no metafile yet (an upload in progress): nothing to
    fetch; the pass after the metafile is published (read from the view) fetches it."""
    from nimbus.state.records import CodeMeta

    state, store, distributor = setup
    live_storm(state, "wanted-3-3")
    state.zk.create(state.code_path("wanted-3-3"), b"")
    fetched = []

    def download(dest_dir, topology_id, metafile):
        fetched.append((topology_id, metafile.read_bytes()))
        dest_dir.mkdir(parents=True)
        return []

    monkeypatch.setattr(distributor, "download", download)
    sync = CodeSync(state, store, distributor, period_s=3600, view=view)
    sync.sync_once()
    assert fetched == []
    state.zk.set(state.code_path("wanted-3-3"), CodeMeta(
        distributor="recording", metafile_b64=CodeMeta.pack(b"m"), uploaded_by="x",
        created_secs=1).encode())
    sync.sync_once()
    assert fetched == [("wanted-3-3", b"m")]
    assert store.has("wanted-3-3")


def test_a_leaders_code_check_reads_the_view_not_a_listing(setup, view, monkeypatch):
    """At every cycle a leader checks that it holds all code: from its view after a
    barrier (the same answer as a listing of /storms, without reading 10,000 names
    again), and from ZooKeeper when the view cannot answer."""
    state, store, _ = setup
    CountedDistributor.counts = {}
    live_storm(state, TOPOLOGY)
    live_storm(state, "gone-2-2")
    sync = CodeSync(state, store, CodeDistributor(CountedDistributor), period_s=3600,
                    view=view)
    listed: list[str] = []
    real = state.active_storms
    monkeypatch.setattr(state, "active_storms", lambda: listed.append("x") or real())
    by_view = sync.check_code(leading=True)
    assert listed == []
    by_listing = sync.check_code()
    assert listed == ["x"]
    assert (by_view.live, by_view.held, by_view.missing) == (
        by_listing.live, by_listing.held, by_listing.missing) == (
        {TOPOLOGY, "gone-2-2"}, {TOPOLOGY}, {"gone-2-2"})
    view.close()  # not loaded: a listing again
    assert sync.check_code(leading=True).missing == {"gone-2-2"} and listed == ["x", "x"]


def test_a_leaders_check_counts_a_copy_added_after_its_recent_listing(setup, view):
    """The leader's check answers from a listing up to LISTING_MAX_AGE_S old (its
    directory changes at every submit): a copy added since is found by its own stat,
    never reported missing."""
    state, store, _ = setup  # the store holds TOPOLOGY's copy
    live_storm(state, TOPOLOGY)
    sync = CodeSync(state, store, CodeDistributor(CountedDistributor), period_s=3600,
                    view=view)
    assert sync.check_code(leading=True)
    live_storm(state, "new-2-2")
    store.path("new-2-2").mkdir()  # after the listing, within its age
    assert store.topologies(max_age_s=sync.LISTING_MAX_AGE_S) == {TOPOLOGY}
    check = sync.check_code(leading=True)
    assert check and check.held == {TOPOLOGY, "new-2-2"}


def test_a_replica_registering_for_code_held_here_costs_no_pass(setup, view):
    """Every nimbus registers as a replica of every submission: for code this host
    holds, with nothing to retry, that wakes no pass. Code not held here, its removal,
    or a download waiting for a retry still do."""
    state, store, _ = setup  # the store holds TOPOLOGY's copy
    sync = CodeSync(state, store, CodeDistributor(CountedDistributor), period_s=3600,
                    view=view)
    woken: list[int] = []
    sync._loop = SimpleNamespace(wake=lambda: woken.append(1))  # type: ignore[assignment]
    view.listen(sync._on_view_change)
    meta = CodeMeta(distributor="counted", metafile_b64=CodeMeta.pack(b"m"),
                    uploaded_by="x", created_secs=1).encode()

    def woke(change) -> bool:
        woken.clear()
        change()
        view.barrier()
        return bool(woken)

    # A leader's own submission: its copy is in place before it publishes.
    assert not woke(lambda: state.zk.create(state.code_path(TOPOLOGY), meta))
    assert not woke(lambda: state.register_replica(TOPOLOGY, "other:6627", "x"))
    assert woke(lambda: state.zk.create(state.code_path("other-2-2"), meta))  # not held
    sync._retry_at["other-2-2"] = 0.0
    assert woke(lambda: state.register_replica(TOPOLOGY, "third:6627", "x"))
    sync._retry_at.clear()
    assert woke(lambda: state.zk.delete(state.code_path(TOPOLOGY), recursive=True))
