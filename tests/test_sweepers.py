"""The leader's sweeps (nimbus.master.sweepers) against a real ZooKeeper and a real shared
directory: stale worker heartbeats, shared code whose removal did not finish; both
fenced, neither touching a live or pending topology."""

from __future__ import annotations

import pytest
from nimbus_ha_shareddir.distributor import PREFIX, SharedDirCodeDistributor
from waiting import wait_until

from nimbus.distribution.distributors import CodeDistributor
from nimbus.distribution.hookspecs import DistributorContext
from nimbus.master.sweepers import LeaderSweeper
from nimbus.state.cluster_state import Fence, NotLeaderError, StormClusterState
from nimbus.state.cluster_view import ClusterView
from nimbus.state.records import INACTIVE, Assignment, CodeMeta, StormBase

LIVE, GONE, PENDING, SUBMITTING = ("live-1-1700000000", "gone-1-1700000000",
                                   "pending-1-1700000000", "submitting-1-1700000000")





@pytest.fixture
def view(make_zk, zk_root, writer):
    made = ClusterView(StormClusterState(make_zk(), zk_root), name="test")
    yield made
    made.close()


@pytest.fixture
def share(tmp_path):
    root = tmp_path / "share"
    root.mkdir()
    distributor = CodeDistributor(SharedDirCodeDistributor)
    distributor.prepare({PREFIX + "path": str(root)}, DistributorContext(
        zk=None, zk_root="/storm", address="127.0.0.1:1", local_dir=tmp_path / "meta",
        code_dir=tmp_path / "code"))
    yield distributor, root
    distributor.close({})


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def activate(writer: StormClusterState, fence: Fence, topology_id: str,
             slots: dict[str, list]) -> None:
    writer.activate_storm(fence, topology_id,
                          StormBase(storm_name=topology_id.split("-")[0],
                                    launch_time_secs=1, status=INACTIVE, num_workers=1),
                          Assignment(master_code_dir="/code", executor_node_port=slots))


def test_heartbeats_of_slots_no_longer_assigned_are_removed(writer, fence, view):
    activate(writer, fence, LIVE, {"worker-0": ["sup-a", 6700]})
    for slot in ("sup-a-6700", "sup-b-6701", "sup-c-6702"):  # the latter two moved away
        writer.zk.create(writer.path("workerbeats", LIVE, slot), b"{}")
    view.start()
    wait_until(lambda: len(view.worker_beat_versions(LIVE)) == 3)
    sweeper = LeaderSweeper(writer, view, distributor=None, pending=set, period_s=30,
                            orphan_grace_s=600)
    assert sweeper.sweep_worker_beats(fence) == 2
    assert writer.zk.get_children(writer.path("workerbeats", LIVE)) == ["sup-a-6700"]
    # A beat deleted meanwhile (the view still lists it) is skipped, not an error.
    wait_until(lambda: len(view.worker_beat_versions(LIVE)) == 1)
    writer.zk.create(writer.path("workerbeats", LIVE, "sup-d-1"), b"{}")
    wait_until(lambda: len(view.worker_beat_versions(LIVE)) == 2)
    writer.zk.delete(writer.path("workerbeats", LIVE, "sup-d-1"))
    stale = sweeper.stale_beats()
    assert writer.delete_nodes(fence, stale) in (0, 1)
    assert writer.zk.get_children(writer.path("workerbeats", LIVE)) == ["sup-a-6700"]


def test_a_deposed_leader_removes_no_heartbeat(writer, fence, view):
    activate(writer, fence, LIVE, {"worker-0": ["sup-a", 6700]})
    writer.zk.create(writer.path("workerbeats", LIVE, "sup-b-6701"), b"{}")
    view.start()
    wait_until(lambda: len(view.worker_beat_versions(LIVE)) == 1)
    writer.zk.delete(fence.lock_path)   # another nimbus leads now
    sweeper = LeaderSweeper(writer, view, distributor=None, pending=set, period_s=30,
                            orphan_grace_s=600)
    with pytest.raises(NotLeaderError):
        sweeper.sweep_worker_beats(fence)
    assert writer.zk.get_children(writer.path("workerbeats", LIVE)) == ["sup-b-6701"]


def bundle(root, topology_id: str) -> None:
    (root / topology_id).mkdir()
    (root / topology_id / "stormjar.jar").write_bytes(b"x")
    (root / topology_id / ".manifest.json").write_text("{}")


def test_shared_code_with_no_topology_is_deleted_after_its_grace(writer, fence, view, share):
    """Of four bundles in the share, only the one with no code node, no topology and no
    submission in flight is deleted, and only once the grace has passed."""
    distributor, root = share
    activate(writer, fence, LIVE, {})
    writer.zk.create(writer.code_path(LIVE), CodeMeta(
        "shareddir", CodeMeta.pack(b"m"), "n:1", 0).encode())
    writer.begin_code(fence, SUBMITTING)   # a submission uploading now: code node first
    for topology_id in (LIVE, GONE, PENDING, SUBMITTING):
        bundle(root, topology_id)
    (root / ".incoming-x-1-1-abc").mkdir()   # an upload's staging: never an id
    clock = Clock()
    sweeper = LeaderSweeper(writer, view, distributor, pending=lambda: {PENDING},
                            period_s=30, orphan_grace_s=600, clock=clock)
    assert sweeper.sweep_shared_code(fence) == []            # first seen: the grace starts
    clock.now += 599
    assert sweeper.sweep_shared_code(fence) == []
    clock.now += 1
    assert sweeper.sweep_shared_code(fence) == [GONE]
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == \
        sorted([LIVE, PENDING, SUBMITTING])
    clock.now += 10_000
    assert sweeper.sweep_shared_code(fence) == []


def test_an_id_that_gets_its_code_node_back_restarts_its_grace(writer, fence, view, share):
    distributor, root = share
    bundle(root, GONE)
    clock = Clock()
    sweeper = LeaderSweeper(writer, view, distributor, pending=set, period_s=30,
                            orphan_grace_s=600, clock=clock)
    sweeper.sweep_shared_code(fence)
    clock.now += 500
    writer.begin_code(fence, GONE)        # resubmitted with that id (a retried submit)
    sweeper.sweep_shared_code(fence)
    writer.remove_code(fence, GONE)
    clock.now += 500
    assert sweeper.sweep_shared_code(fence) == [], "its grace began again"
    clock.now += 600
    assert sweeper.sweep_shared_code(fence) == [GONE]


def test_a_deposed_leader_deletes_no_shared_code(writer, fence, view, share):
    distributor, root = share
    bundle(root, GONE)
    clock = Clock()
    sweeper = LeaderSweeper(writer, view, distributor, pending=set, period_s=30,
                            orphan_grace_s=0, clock=clock)
    writer.zk.delete(fence.lock_path)
    with pytest.raises(NotLeaderError):
        sweeper.sweep_shared_code(fence)
    assert (root / GONE).is_dir()


def test_a_distributor_without_list_shared_is_not_swept(writer, fence, view):
    class Plain:
        @staticmethod
        def list_shared():
            return None

    sweeper = LeaderSweeper(writer, view, Plain(), pending=set, period_s=30,
                            orphan_grace_s=0)
    assert sweeper.sweep_shared_code(fence) == []
