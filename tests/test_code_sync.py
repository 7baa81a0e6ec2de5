"""CodeSync against a real ZooKeeper: what it keeps, fetches and removes."""

from __future__ import annotations

import pytest

from nimbus.cluster_state import StormClusterState
from nimbus.code_sync import CodeSync
from nimbus.distributors import CodeDistributor
from nimbus.hookspecs import hookimpl
from nimbus.local_code import LocalCodeStore
from nimbus.records import ACTIVE, StormBase

pytestmark = pytest.mark.integration
TOPOLOGY = "fresh-1-1"


class RecordingDistributor:
    """A distributor that records cleanups (the sync's behaviour is under test)."""

    name = "recording"
    cleaned: list[str] = []

    @hookimpl
    def prepare(self, conf, context):
        pass

    @hookimpl
    def upload(self, dir_path, topology_id):
        return dir_path

    @hookimpl
    def download(self, dest_dir, topology_id, metafile):
        raise RuntimeError("not expected in this test")

    @hookimpl
    def get_replication_count(self, topology_id):
        return 0

    @hookimpl
    def cleanup(self, topology_id):
        RecordingDistributor.cleaned.append(topology_id)

    @hookimpl
    def close(self, conf):
        pass


@pytest.fixture
def setup(make_zk, zk_root, tmp_path):
    state = StormClusterState(make_zk(), zk_root)
    state.setup()
    store = LocalCodeStore(tmp_path)
    store.path(TOPOLOGY).mkdir()
    RecordingDistributor.cleaned = []
    return state, store, CodeDistributor(RecordingDistributor)


def test_submission_finishing_during_a_run_keeps_its_code(setup):
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

    sync = CodeSync(state, store, distributor, period_s=3600, protected=protected)
    sync.sync_once()
    assert store.has(TOPOLOGY)
    assert RecordingDistributor.cleaned == []


def test_code_of_a_removed_topology_is_cleaned_up(setup):
    state, store, distributor = setup
    sync = CodeSync(state, store, distributor, period_s=3600)
    sync.sync_once()
    assert not store.has(TOPOLOGY)
    assert RecordingDistributor.cleaned == [TOPOLOGY]
