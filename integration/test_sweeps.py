"""The sweeps in real clusters (ZooKeeper, nimbus and supervisor processes, a shared
directory): the leader deletes shared code whose removal never finished while
submissions upload beside it, and the heartbeat a moved worker left behind."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from helpers import observer
from required_plugins import require_plugin
from waiting import wait_for

from nimbus.dev.cluster import LocalCluster, sample_topology
from nimbus.dev.feed import WORKER_MODULE, processes_with_arg
from nimbus.distribution.archive import pack_directory

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ORPHAN = "orphan-1-1700000000"
CONF = {
    "storm.zookeeper.session.timeout": 4000,
    "nimbus.monitor.freq.secs": 1,
    "nimbus.sweep.freq.secs": 1,
    "supervisor.monitor.frequency.secs": 1,
    "supervisor.heartbeat.frequency.secs": 1,
    "supervisor.worker.shutdown.sleep.secs": 1,
    "worker.heartbeat.frequency.secs": 1,
}


def sleeper(tmp_path: Path, name: str, size_bytes: int) -> bytes:
    source = sample_topology(tmp_path / name, size_bytes)
    (source / "topology.yaml").write_text(yaml.safe_dump(
        {"command": [sys.executable, "-c", "import time; time.sleep(3600)"]}))
    return pack_directory(source)


def dump(c: LocalCluster) -> None:
    for daemon in [*c.nimbuses, *c.supervisors]:
        print(f"--- {daemon.log_file.name} ---\n{daemon.log_text()[-3000:]}")


def test_orphaned_shared_code_is_swept_and_live_code_never(tmp_path):
    """A bundle with no topology sits in the share; the leader sweeps every second with
    no grace while three topologies are submitted, uploaded and replicated: the orphan
    goes, and every live bundle stays and runs."""
    require_plugin("shareddir")
    share = tmp_path / "share"
    share.mkdir()
    with LocalCluster(tmp_path / "cluster", 2, supervisors=1, slots_per_supervisor=3, conf={
            **CONF, "storm.codedistributor.class": "shareddir",
            "nimbus.codedistributor.shareddir.path": str(share),
            "nimbus.codedistributor.shareddir.replication.count": 2,
            "nimbus.code.orphan.grace.secs": 0}) as c:
        try:
            (share / ORPHAN).mkdir()
            (share / ORPHAN / "stormjar.jar").write_bytes(b"left by a dead leader")
            client = c.client()
            ids = [client.submit(f"s{i}", sleeper(tmp_path, f"s{i}", 4 << 20),
                                 {"topology.min.replication.count": 2}) for i in range(3)]
            wait_for(lambda: not (share / ORPHAN).exists(), 30, "the orphan to be swept")
            leader = c.wait_for_leader()
            assert f"deleting the shared code of {ORPHAN}" in leader.log_text()
            for topology_id in ids:
                assert (share / topology_id / ".manifest.json").is_file(), topology_id
            wait_for(lambda: all(len(processes_with_arg(WORKER_MODULE, t)) == 1
                                 for t in ids), 90, "a worker of each topology")
            assert sorted(t.replication_count for t in client.cluster_info().topologies) \
                == [2, 2, 2]
            assert not [line for line in leader.log_text().splitlines()
                        if "deleting the shared code of" in line and ORPHAN not in line]
        except BaseException:
            dump(c)
            raise


def test_the_heartbeat_of_a_moved_worker_is_removed(tmp_path):
    """The supervisor running the worker stops; the leader moves the work to the other
    one, and the sweep deletes the heartbeat node of the slot it left."""
    with LocalCluster(tmp_path / "cluster", 1, supervisors=2, slots_per_supervisor=1,
                      conf=dict(CONF)) as c:
        state = observer(c)
        try:
            topology_id = c.client().submit("mover", sleeper(tmp_path, "mover", 16 << 10), {})
            beats = state.path("workerbeats", topology_id)
            first = wait_for(lambda: state.zk.get_children(beats), 60, "a first beat")
            [node] = first
            running = next(s for s in c.supervisors if node.startswith(s.id))
            other = next(s for s in c.supervisors if s is not running)
            running.terminate()
            wait_for(lambda: state.zk.get_children(beats) == [f"{other.id}-{other.ports[0]}"],
                     60, "only the new slot's heartbeat to remain")
        except BaseException:
            dump(c)
            raise
        finally:
            state.zk.stop()
