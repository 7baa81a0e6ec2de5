"""Upgrading a running pipeline: versions switch at a batch boundary, bad versions roll
back by themselves, and every record lands exactly once, across a leader and a supervisor
killed mid-switch.

One cluster for the module (ZooKeeper, 2 nimbus processes, 2 supervisor processes with one
slot each, real Spark in local mode in each worker) and one stateful pipeline
(testsupport/upgrade_pipeline.py: file source, dropDuplicates state, file sink; each
version writes its number into its rows). The tests run in order on the same topology,
each upgrading it while records flow, and each checks the committed output: every fed id
exactly once, and one version per batch, changing at exactly one batch boundary per
switch.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from helpers import observer, run_cli
from upgrade_pipeline import (
    BUILD_ERROR,
    SteadyFeed,
    pipeline_conf,
    version_bundle,
    version_dir,
    version_sequence,
)
from waiting import wait_for

from nimbus.dev.cluster import LocalCluster
from nimbus.dev.feed import (
    WORKER_MODULE,
    CommittedOutput,
    RecordFeed,
    exactly_once_report,
    processes_with_arg,
)

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SESSION_MS = 6000
# A Spark start plus a batch on a busy 2-core machine, with room to spare.
COMMIT_TIMEOUT_S = 150
NAME = "upgraded"


class Upgrades:
    def __init__(self, cluster: LocalCluster, work: Path):
        self.cluster = cluster
        self.work = work
        self.state = observer(cluster)
        self.feed = RecordFeed(work / "input")
        self.output = CommittedOutput(work / "output")
        self.topology_id = ""

    def cli(self, *args: str) -> tuple[int, str]:
        result = run_cli(*args, "--config", str(self.cluster.config_file))
        return result.returncode, result.stdout + result.stderr

    def upgrade(self, version: int, kind: str = "good", *more: str) -> tuple[int, str]:
        return self.cli("upgrade", NAME, str(version_dir(self.work, version, kind)),
                        "--timeout", "240", *more)

    def history(self) -> dict:
        code, out = self.cli("history", NAME, "--json")
        assert code == 0, out
        return json.loads(out)

    def states(self) -> dict[int, str]:
        return {v["version"]: v["state"] for v in self.history()["versions"]}

    def switch_applied(self, version: int) -> bool:
        assignment = self.state.assignment_info(self.topology_id)
        return assignment is not None and assignment.code_version == version

    def worker_pids(self) -> list[int]:
        return processes_with_arg(WORKER_MODULE, f"{self.topology_id}-")

    def all_committed_once(self) -> None:
        """Wait until every record fed so far is committed; then exactly once."""
        fed = list(self.feed.fed)
        wait_for(lambda: self.output.holds(fed), COMMIT_TIMEOUT_S,
                 f"the {len(fed)} records fed to be committed")
        assert exactly_once_report(self.feed.fed, self.output.ids()) == {
            "lost": [], "duplicated": [], "unexpected": []}

    def versions_committed(self) -> list[int]:
        """The version of each run of batches, in batch order (one version per batch)."""
        return [version for _batch, version in version_sequence(self.output.output_dir)]

    def committed_by(self, version: int) -> bool:
        return bool(self.versions_committed()) and self.versions_committed()[-1] == version


@pytest.fixture(scope="module")
def upgrades(tmp_path_factory):
    work = tmp_path_factory.mktemp("upgrades")
    cluster = LocalCluster(work / "cluster", nimbuses=2, supervisors=2, slots_per_supervisor=1,
                           conf={"storm.zookeeper.session.timeout": SESSION_MS,
                                 "nimbus.monitor.freq.secs": 1,
                                 "supervisor.monitor.frequency.secs": 1,
                                 "supervisor.heartbeat.frequency.secs": 1,
                                 "topology.spark.master": "local[1]",
                                 "topology.spark.checkpoint.dir": str(work / "checkpoints")})
    with cluster:
        scenario = Upgrades(cluster, work)
        scenario.topology_id = cluster.client().submit(
            NAME, version_bundle(work, 1), {"topology.min.replication.count": 2,
                                            **pipeline_conf(scenario.feed,
                                                            scenario.output.output_dir)})
        scenario.feed.feed(10)
        scenario.all_committed_once()
        yield scenario
        for process in [*cluster.supervisors, *cluster.nimbuses]:
            print(f"--- {process.log_file.name} ---\n{process.log_text()[-4000:]}")
        for log in sorted(work.glob("cluster/**/workers-artifacts/*/*/worker.log")):
            print(f"--- {log} ---\n{log.read_text()[-2500:]}")
        scenario.state.zk.stop()


def test_an_upgrade_while_records_flow_switches_at_one_batch_boundary(upgrades):
    with SteadyFeed(upgrades.feed):
        code, out = upgrades.upgrade(2)
        assert code == 0, out
        wait_for(lambda: upgrades.committed_by(2), COMMIT_TIMEOUT_S, "a batch of version 2")
    upgrades.all_committed_once()
    assert upgrades.versions_committed() == [1, 2]
    history = upgrades.history()
    assert history["topology_id"] == upgrades.topology_id, "the same topology, not a new one"
    assert history["running"] == 2 and history["switch"] is None
    assert upgrades.states() == {2: "running", 1: "previous"}
    assert len(upgrades.worker_pids()) == 1


def test_a_version_whose_build_raises_is_rolled_back(upgrades):
    with SteadyFeed(upgrades.feed):
        code, out = upgrades.upgrade(3, "raise")
        assert code == 1, out
    upgrades.all_committed_once()
    assert upgrades.versions_committed() == [1, 2], "version 3 committed nothing"
    history = upgrades.history()
    assert history["running"] == 2 and history["switch"] is None
    failed = next(v for v in history["versions"] if v["version"] == 3)
    assert failed["state"] == "failed"
    assert BUILD_ERROR in failed["error"]
    code, out = upgrades.cli("topology-info", NAME, "--json")
    assert code == 0, out
    assert json.loads(out)["code_version"] == 2


def test_an_incompatible_state_change_is_rolled_back(upgrades):
    with SteadyFeed(upgrades.feed):
        code, out = upgrades.upgrade(4, "incompatible")
        assert code == 1, out
    upgrades.all_committed_once()
    assert upgrades.versions_committed() == [1, 2]
    failed = next(v for v in upgrades.history()["versions"] if v["version"] == 4)
    assert failed["state"] == "failed"
    assert "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE" in failed["error"]
    # topology.code.versions.kept (3) keeps the newest three, and never the running
    # version (2) or the previous one (1): nothing is pruned yet.
    assert upgrades.states() == {4: "failed", 3: "failed", 2: "running", 1: "previous"}


def test_a_leader_killed_mid_upgrade_leaves_it_to_the_next(upgrades):
    most = []
    stop = threading.Event()

    def sample() -> None:   # never two workers of the topology at once
        while not stop.wait(0.1):
            most.append(len(upgrades.worker_pids()))

    sampler = threading.Thread(target=sample, name="worker-sampler")
    sampler.start()
    try:
        with SteadyFeed(upgrades.feed):
            code, out = upgrades.upgrade(5, "good", "--no-wait")
            assert code == 0, out
            wait_for(lambda: upgrades.switch_applied(5), 60, "the switch to version 5")
            leader = upgrades.cluster.wait_for_leader()
            leader.kill9()
            upgrades.cluster.wait_for_leader(exclude=leader.address)
            wait_for(lambda: upgrades.history()["switch"] is None, COMMIT_TIMEOUT_S,
                     "the next leader to finish the switch")
            wait_for(lambda: upgrades.committed_by(5), COMMIT_TIMEOUT_S, "a batch of v5")
    finally:
        stop.set()
        sampler.join()
    upgrades.all_committed_once()
    assert upgrades.history()["running"] == 5
    assert upgrades.versions_committed() == [1, 2, 5]
    assert max(most) == 1, f"two workers at once: {most}"
    leader.start()   # two nimbuses again, for the replication count of the next upgrade
    wait_for(lambda: len(upgrades.state.nimbuses()) == 2, 60, "the nimbus to be back")


def test_the_supervisor_of_a_switching_worker_killed(upgrades):
    with SteadyFeed(upgrades.feed):
        code, out = upgrades.upgrade(6, "good", "--no-wait")
        assert code == 0, out
        wait_for(lambda: upgrades.switch_applied(6), 60, "the switch to version 6")
        assignment = upgrades.state.assignment_info(upgrades.topology_id)
        supervisor_id, _port = assignment.executor_node_port["worker-0"]
        supervisor = next(s for s in upgrades.cluster.supervisors if s.id == supervisor_id)
        supervisor.kill9_group()
        wait_for(lambda: upgrades.history()["switch"] is None, COMMIT_TIMEOUT_S + 60,
                 "the switch to end on the other supervisor")
        moved = upgrades.state.assignment_info(upgrades.topology_id)
        assert moved.executor_node_port["worker-0"][0] != supervisor_id
        wait_for(lambda: upgrades.committed_by(6), COMMIT_TIMEOUT_S, "a batch of v6")
    upgrades.all_committed_once()
    assert upgrades.history()["running"] == 6
    assert upgrades.versions_committed() == [1, 2, 5, 6]
    supervisor.start()


def test_rollback_by_hand_returns_to_the_previous_version(upgrades):
    with SteadyFeed(upgrades.feed):
        code, out = upgrades.cli("rollback", NAME, "--timeout", "240")
        assert code == 0, out
        wait_for(lambda: upgrades.committed_by(5), COMMIT_TIMEOUT_S, "a batch of v5 again")
    upgrades.all_committed_once()
    assert upgrades.versions_committed() == [1, 2, 5, 6, 5]
    states = upgrades.states()
    assert states[5] == "running" and states[6] == "rolled back"
