"""A PySpark pipeline kept running, exactly once, through every single failure.

One cluster for the module (ZooKeeper, 2 nimbus processes, 2 supervisor processes with one
slot each, real Spark in local mode inside each worker) and one word-count pipeline
(examples/wordcount) fed numbered records. The tests run in order, each injecting one
failure and then checking the exact set of committed output records: every fed id once,
nothing lost, nothing twice. Spark starts are the cost here (5-15 s each), so the scenario
is one pipeline that lives through all the failures.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from helpers import observer, run_cli
from processes import acting, running
from waiting import wait_for

from nimbus.dev.cluster import LocalCluster, SupervisorProcess
from nimbus.dev.feed import (
    WORDCOUNT,
    WORKER_MODULE,
    CommittedOutput,
    RecordFeed,
    exactly_once_report,
    processes_with_arg,
)
from nimbus.distribution.archive import pack_directory
from nimbus.state import runtime_view

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SESSION_MS = 6000
SPARK_CONF = {"spark.ui.enabled": "false", "spark.driver.memory": "512m",
              "spark.sql.shuffle.partitions": "2"}
# A Spark start plus a batch on a busy 2-core machine, with room to spare.
COMMIT_TIMEOUT_S = 150


class Scenario:
    def __init__(self, cluster: LocalCluster, work: Path):
        self.cluster = cluster
        self.state = observer(cluster)
        self.feed = RecordFeed(work / "input")
        self.output = CommittedOutput(work / "output")
        self.topology_id = ""

    # -- where the pipeline runs -------------------------------------------------------
    def slot(self) -> tuple[str, int] | None:
        assignment = self.state.assignment_info(self.topology_id)
        if assignment is None or "worker-0" not in assignment.executor_node_port:
            return None
        supervisor_id, port = assignment.executor_node_port["worker-0"]
        return supervisor_id, int(port)

    def supervisor(self, supervisor_id: str) -> SupervisorProcess:
        return next(s for s in self.cluster.supervisors if s.id == supervisor_id)

    def worker_pids(self, slot: tuple[str, int] | None = None) -> list[int]:
        """Worker processes of the topology (on ``slot`` only, if given)."""
        if slot is None:
            return processes_with_arg(WORKER_MODULE, f"{self.topology_id}-")
        supervisor = self.supervisor(slot[0])
        worker_dir = supervisor.worker_dir(self.topology_id, slot[1])
        return processes_with_arg(WORKER_MODULE, str(worker_dir))

    def running_worker(self) -> tuple[tuple[str, int], int]:
        """(slot, pid) once exactly one worker runs, on the assigned slot."""
        def one() -> tuple[tuple[str, int], int] | None:
            slot = self.slot()
            if slot is None:
                return None
            everywhere, here = self.worker_pids(), self.worker_pids(slot)
            return (slot, here[0]) if len(here) == 1 and everywhere == here else None

        return wait_for(one, COMMIT_TIMEOUT_S, "exactly one worker on the assigned slot")

    def info(self) -> dict:
        return runtime_view.topology_info(self.state, self.topology_id)

    # -- records -----------------------------------------------------------------------
    def feed_and_check(self, count: int = 20) -> None:
        """Feed ``count`` records, wait until they committed, and check every id fed so far
        is in the output exactly once."""
        ids = self.feed.feed(count)
        wait_for(lambda: self.output.holds(ids), COMMIT_TIMEOUT_S,
                 f"records {ids[0]}..{ids[-1]} to be committed")
        report = exactly_once_report(self.feed.fed, self.output.ids())
        assert report == {"lost": [], "duplicated": [], "unexpected": []}


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    work = tmp_path_factory.mktemp("pipeline")
    cluster = LocalCluster(work / "cluster", nimbuses=2, supervisors=2, slots_per_supervisor=1,
                           conf={"storm.zookeeper.session.timeout": SESSION_MS,
                                 "nimbus.monitor.freq.secs": 1,
                                 "supervisor.monitor.frequency.secs": 1,
                                 "supervisor.heartbeat.frequency.secs": 1,
                                 "topology.spark.master": "local[1]",
                                 "topology.spark.conf": SPARK_CONF,
                                 "topology.spark.checkpoint.dir": str(work / "checkpoints")})
    with cluster:
        scenario = Scenario(cluster, work)
        client = cluster.client()
        scenario.topology_id = client.submit("wordcount", pack_directory(WORDCOUNT), {
            "topology.min.replication.count": 2,
            "wordcount.input.dir": str(scenario.feed.input_dir),
            "wordcount.output.dir": str(scenario.output.output_dir),
            "wordcount.trigger.secs": 0.5})
        yield scenario
        for process in [*cluster.supervisors, *cluster.nimbuses]:
            print(f"--- {process.log_file.name} ---\n{process.log_text()[-3000:]}")
        scenario.state.zk.stop()


def test_the_pipeline_commits_every_record_once(scenario):
    scenario.running_worker()
    scenario.feed_and_check(50)
    info = scenario.info()
    assert info["status"] == "ACTIVE"
    assert [w["worker"] for w in info["workers"]] == ["worker-0"]
    wait_for(lambda: scenario.info()["components"].get("main", {}).get("batch_id") is not None,
             30, "the beat to carry the query's batch id")


def test_a_killed_worker_restarts_in_place(scenario):
    slot, pid = scenario.running_worker()
    os.killpg(pid, signal.SIGKILL)
    scenario.feed_and_check()
    new_slot, new_pid = scenario.running_worker()
    assert new_slot == slot, "a worker crash is handled by its supervisor, in place"
    assert new_pid != pid
    wait_for(lambda: scenario.info()["workers"][0]["restarts"] == 1, 30,
             "the restart to be counted in the beat")


def test_a_leader_failover_restarts_no_worker(scenario):
    slot, pid = scenario.running_worker()
    restarts = scenario.info()["workers"][0]["restarts"]
    leader = scenario.cluster.wait_for_leader()
    leader.kill9()
    scenario.cluster.wait_for_leader(exclude=leader.address)
    scenario.feed_and_check()
    assert scenario.running_worker() == (slot, pid), "the worker kept running"
    assert scenario.info()["workers"][0]["restarts"] == restarts
    leader.start()  # back as a follower, for the next tests


def test_a_supervisor_killed_and_started_again_takes_over_its_worker(scenario):
    slot, pid = scenario.running_worker()
    restarts = scenario.info()["workers"][0]["restarts"]
    supervisor = scenario.supervisor(slot[0])
    supervisor.kill9_group()  # not the worker: a process group of its own
    scenario.cluster.start_supervisor(supervisor)
    wait_for(lambda: "took over worker" in supervisor.log_text(), 30, "the take-over")
    scenario.feed_and_check()
    assert scenario.running_worker() == (slot, pid), "the same worker runs on"
    assert scenario.info()["workers"][0]["restarts"] == restarts


def test_a_killed_supervisor_and_its_workers_move_elsewhere(scenario):
    slot, pid = scenario.running_worker()
    supervisor = scenario.supervisor(slot[0])
    supervisor.kill9_group()
    os.killpg(pid, signal.SIGKILL)
    scenario.feed_and_check()
    new_slot, _ = scenario.running_worker()
    assert new_slot[0] != slot[0], "the pipeline moved to the other supervisor"
    scenario.cluster.start_supervisor(supervisor)  # a free slot again, for the next test


def test_a_frozen_supervisor_stops_its_worker_before_the_work_moves(scenario):
    slot, pid = scenario.running_worker()
    supervisor = scenario.supervisor(slot[0])
    supervisor.signal(signal.SIGSTOP)
    try:
        # Watch both events on one clock: the old worker's stop (its lease ran out: it
        # froze in its cgroup, or died where it cannot freeze) must come no later than
        # the leader's move of its work.
        stopped_at = moved_at = None
        deadline = time.monotonic() + 4 * SESSION_MS / 1000 + 30
        while (stopped_at is None or moved_at is None) and time.monotonic() < deadline:
            now = time.monotonic()
            if stopped_at is None and not acting(pid):
                stopped_at = now
            if moved_at is None and scenario.slot() not in (None, slot):
                moved_at = now
            time.sleep(0.02)
        assert stopped_at is not None, "the frozen supervisor's worker kept running"
        assert moved_at is not None, "the leader did not move the work"
        assert stopped_at <= moved_at, "the work moved while the old worker was running"
        assert not acting(pid), "the old worker ran again"
        scenario.feed_and_check()
    finally:
        supervisor.signal(signal.SIGCONT)
    # Back, it finds its session lost: it kills the frozen worker, registers anew and
    # starts nothing for the work that moved.
    wait_for(lambda: not running(pid), 60, "the thawed supervisor to end its frozen worker")
    wait_for(lambda: supervisor.id in scenario.cluster.registered_supervisors(), 60,
             "the thawed supervisor to register again")
    scenario.feed_and_check()
    new_slot, _ = scenario.running_worker()
    assert new_slot[0] != slot[0]
    assert scenario.worker_pids(slot) == [], "the thawed supervisor runs nothing"


def test_deactivate_stops_the_query_and_activate_resumes_it(scenario):
    scenario.running_worker()
    run_cli("deactivate", "wordcount", "--config", str(scenario.cluster.config_file),
            check=True)
    wait_for(lambda: scenario.worker_pids() == [], 60, "the worker to stop")
    committed = scenario.output.ids()
    scenario.feed.feed(20)
    assert scenario.output.ids() == committed, "nothing commits while inactive"
    run_cli("activate", "wordcount", "--config", str(scenario.cluster.config_file),
            check=True)
    scenario.running_worker()
    scenario.feed_and_check()


def test_kill_stops_the_workers_and_removes_runtime_state(scenario):
    scenario.running_worker()
    run_cli("kill", "wordcount", "--wait", "0", "--config",
            str(scenario.cluster.config_file), check=True)
    state, topology_id = scenario.state, scenario.topology_id
    wait_for(lambda: scenario.worker_pids() == [], 60, "the worker to stop")
    wait_for(lambda: state.zk.exists(f"/storm/storms/{topology_id}") is None, 60,
             "the topology to be removed")
    for sub in ("assignments", "workerbeats", "errors"):
        assert state.zk.exists(f"/storm/{sub}/{topology_id}") is None, sub
    checkpoints = Path(scenario.cluster.conf_values["topology.spark.checkpoint.dir"])
    assert (checkpoints / topology_id / "main" / "offsets").is_dir(), "checkpoints are kept"
