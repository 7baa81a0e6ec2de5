"""Warm workers (supervisor.warm.workers): a pipeline starts and restarts on a SparkSession
that is already up, and one whose Spark settings differ starts cold, saying why.

One cluster for the module: ZooKeeper, one nimbus, one supervisor process with two slots
and one warm worker, real Spark (local[1]) in every worker. The tests run in order.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest
from helpers import observer, run_cli
from processes import running
from waiting import wait_for

from nimbus.dev.cluster import LocalCluster
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

SPARK_CONF = {"spark.ui.enabled": "false", "spark.driver.memory": "512m",
              "spark.sql.shuffle.partitions": "2"}
SPARK_TIMEOUT_S = 150   # a Spark start and a batch on a busy 2-core machine


class Warm:
    def __init__(self, cluster: LocalCluster, work: Path):
        self.cluster = cluster
        self.supervisor = cluster.supervisors[0]
        self.state = observer(cluster)
        self.work = work
        self.feed = RecordFeed(work / "input")
        self.output = CommittedOutput(work / "output")
        self.topology_id = ""

    def log(self) -> str:
        return self.supervisor.log_text()

    def wait_log(self, pattern: str, what: str, after: int = 0) -> re.Match[str]:
        return wait_for(lambda: re.search(pattern, self.log()[after:]), SPARK_TIMEOUT_S, what)

    def warm_pid(self, n: int) -> int:
        warm_dir = self.supervisor.local_dir / "supervisor" / "warm" / f"warm-{n}"
        pids = processes_with_arg(WORKER_MODULE, "--warm", str(warm_dir))
        assert len(pids) == 1, pids
        return pids[0]

    def submit(self, name: str, conf: dict) -> str:
        return self.cluster.client().submit(name, pack_directory(WORDCOUNT), {
            "wordcount.input.dir": str(self.feed.input_dir),
            "wordcount.output.dir": str(self.output.output_dir),
            "wordcount.trigger.secs": 0.5, **conf})

    def feed_and_check(self, count: int = 20) -> None:
        ids = self.feed.feed(count)
        wait_for(lambda: self.output.holds(ids), SPARK_TIMEOUT_S,
                 f"records {ids[0]}..{ids[-1]} to be committed")
        assert exactly_once_report(self.feed.fed, self.output.ids()) == {
            "lost": [], "duplicated": [], "unexpected": []}

    def info(self, topology_id: str = "") -> dict:
        return runtime_view.topology_info(self.state, topology_id or self.topology_id)


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    work = tmp_path_factory.mktemp("warm")
    cluster = LocalCluster(work / "cluster", nimbuses=1, supervisors=1, slots_per_supervisor=2,
                           warm_workers=1,
                           conf={"storm.zookeeper.session.timeout": 6000,
                                 "supervisor.monitor.frequency.secs": 1,
                                 "supervisor.heartbeat.frequency.secs": 1,
                                 "topology.spark.master": "local[1]",
                                 "topology.spark.conf": SPARK_CONF,
                                 "topology.spark.checkpoint.dir": str(work / "checkpoints")})
    with cluster:
        yield Warm(cluster, work)
        print(f"--- supervisor log ---\n{cluster.supervisors[0].log_text()[-4000:]}")
        for log in sorted(cluster.supervisors[0].log_root.glob("*/*/worker.log")):
            print(f"--- {log} ---\n{log.read_text()[-3000:]}")


def test_a_warm_worker_waits_without_lease_or_checkpoint(warm):
    warm.wait_log(r"warm worker \S+/warm-1 ready", "the first warm worker to be ready")
    pid = warm.warm_pid(1)
    info = wait_for(lambda: (i := warm.state.supervisor_info(warm.supervisor.id))
                    and i.warm_ready == 1 and i.warm_memory_bytes > 0 and i, 30,
                    "the heartbeat to report the warm worker")
    assert info.warm_starting == 0
    # Python and a JVM: far more than Python alone.
    assert info.warm_memory_bytes > 100 * 2**20
    assert not (warm.work / "checkpoints").exists(), "a warm worker touches no checkpoint"
    assert running(pid)


def test_a_pipeline_starts_on_the_warm_worker(warm):
    pid = warm.warm_pid(1)
    mark = len(warm.log())
    warm.topology_id = warm.submit("wordcount", {})
    warm.wait_log(rf"starting worker {warm.topology_id}:\d+ \(restart 0\) on warm worker "
                  rf"warm-1 \(pid {pid}\)", "the pipeline to take the warm worker", mark)
    warm.feed_and_check(30)
    worker = wait_for(lambda: (w := warm.info()["workers"][0])["memory_bytes"] and w, 30,
                      "the beat to carry the worker's memory")
    assert worker["warm_start"] is True
    assert worker["memory_bytes"] > 100 * 2**20
    log = warm.supervisor.worker_log(warm.topology_id, worker["port"])
    assert "warm: Spark up in" in log.read_text() and "taken after" in log.read_text(), \
        "the warm worker's log went on in the slot's worker.log, what it said before too"
    # Replaced in the background once the taken worker has committed.
    warm.wait_log(r"warm worker \S+/warm-2 ready", "a replacement warm worker", mark)


def test_a_killed_worker_resumes_on_the_replacement(warm):
    old = warm.warm_pid(1)
    replacement = warm.warm_pid(2)
    mark = len(warm.log())
    os.killpg(old, signal.SIGKILL)
    warm.wait_log(rf"starting worker {warm.topology_id}:\d+ \(restart 1\) on warm worker "
                  rf"warm-2 \(pid {replacement}\)", "the restart to take warm-2", mark)
    warm.feed_and_check(30)
    wait_for(lambda: warm.info()["workers"][0]["restarts"] == 1, 30, "the restart counted")
    # The table lists supervisors with warm workers: warm-2's replacement, once begun.
    wait_for(lambda: (i := warm.state.supervisor_info(warm.supervisor.id)) is not None
             and i.warm_ready + i.warm_starting == 1, SPARK_TIMEOUT_S,
             "the heartbeat to show warm-2's replacement")
    out = run_cli("topology-info", "wordcount", "--config", str(warm.cluster.config_file))
    assert out.returncode == 0, out.stderr
    assert "warm" in out.stdout and "Warm workers on its supervisors" in out.stdout


def test_a_supervisor_started_again_takes_over_its_worker_and_keeps_its_warm_one(warm):
    """It keeps the taken warm worker's directory (its JVM works there) and cgroup; it
    keeps the warm worker that was waiting too, and a slot then takes that one; and it
    names its own new warm workers so that none can collide with earlier ones."""
    taken = warm.warm_pid(2)
    warm_dir = warm.supervisor.local_dir / "supervisor" / "warm" / "warm-2"
    warm.wait_log(r"warm worker \S+/warm-3 ready", "warm-2's replacement to be ready")
    waiting = warm.warm_pid(3)
    mark = len(warm.log())
    warm.supervisor.kill9_group()
    warm.cluster.start_supervisor(warm.supervisor)
    warm.wait_log(rf"took over worker {warm.topology_id}:\d+ \(pid {taken}\)",
                  "the take-over", mark)
    warm.wait_log(rf"kept warm worker warm:3 \(pid {waiting}\)", "warm-3 kept", mark)
    warm.feed_and_check(20)
    assert "starting warm worker" not in warm.log()[mark:], "warm-3 was kept: no new one"
    assert warm.warm_pid(2) == taken and warm_dir.is_dir()

    # The slot's next restart runs on the warm worker the earlier process started.
    os.killpg(taken, signal.SIGKILL)
    warm.wait_log(rf"starting worker {warm.topology_id}:\d+ \(restart 2\) on warm worker "
                  rf"warm-3 \(pid {waiting}\)", "the restart to take the kept warm-3", mark)
    warm.feed_and_check(20)
    # Its replacement is named after every earlier one (starting it makes its cgroup,
    # emptying any of that name).
    found = warm.wait_log(r"starting warm worker \S+/warm-(\d+) ", "a new warm worker",
                          mark)
    assert int(found.group(1)) >= 4
    wait_for(lambda: warm.info()["workers"][0]["restarts"] == 2, 30, "the restart counted")


def test_a_static_spark_setting_that_differs_starts_cold(warm):
    mark = len(warm.log())
    other = warm.submit("bigger", {"topology.spark.conf": {**SPARK_CONF,
                                                           "spark.driver.memory": "600m"}})
    warm.wait_log(rf"worker {other}:\d+ starts cold: Spark setting spark.driver.memory is "
                  r"600m, the warm workers' 512m", "a cold start that says why", mark)
    assert run_cli("kill", "bigger", "-w", "0", "--config",
                   str(warm.cluster.config_file)).returncode == 0
    wait_for(lambda: warm.state.storm_base(other) is None, 60, "the topology removed")


def test_spark_has_the_last_word_on_what_a_running_session_can_change(warm):
    """spark.sql.globalTempDatabase is static in Spark, though named like a SQL setting:
    the supervisor hands it to the warm worker, which refuses, and it starts cold at once
    without counting a crash or recording an error."""
    mark = len(warm.log())
    other = warm.submit("globaltemp", {"topology.spark.conf": {
        **SPARK_CONF, "spark.sql.globalTempDatabase": "nimbus_temp"}})
    warm.wait_log(rf"worker {other}:\d+: the warm worker could not take it \(Spark setting "
                  r"spark.sql.globalTempDatabase is nimbus_temp", "the worker's refusal", mark)
    warm.wait_log(rf"starting worker {other}:\d+ \(restart 0\)\n", "the cold start", mark)
    info = warm.info(other)
    assert info["errors"] == {}, "a refusal is no error of the topology's"
