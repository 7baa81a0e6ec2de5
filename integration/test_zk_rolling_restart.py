"""A ZooKeeper rolling restart restarts no pipeline (issue 20).

Real processes: a 3-server ensemble (as ``nimbus-ha zookeeper --ensemble 3`` runs it), 2
nimbuses, a supervisor and a word-count pipeline in real Spark. Each ZooKeeper server is
restarted in turn (SIGTERM, start, back in the quorum), the ensemble's leader last.
Between restarts the pipeline must commit what was fed meanwhile; at the end the same
worker process must still run it, never restarted, and the output must hold every record
exactly once. A supervisor used to kill every worker on kazoo's SUSPENDED, so each
restart of the server it was connected to cost a cold Spark start.
"""

from __future__ import annotations

import pytest
from helpers import observer

from nimbus.devcluster import LocalCluster, wait_for
from nimbus.distribution.archive import pack_directory
from nimbus.runtime_demo import DEMO_SPARK_CONF
from nimbus.state.records import WorkerBeat
from nimbus.state.zkserver import ZooKeeperEnsemble, server_mode
from nimbus.testing.pipelines import (
    WORDCOUNT,
    WORKER_MODULE,
    CommittedOutput,
    RecordFeed,
    exactly_once_report,
    processes_with_arg,
)

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SESSION_MS = 6000
SPARK_CONF = DEMO_SPARK_CONF  # what a 2-core machine affords a worker
COMMIT_TIMEOUT_S = 150


def test_a_rolling_restart_of_the_ensemble_restarts_no_worker(tmp_path):
    ensemble = ZooKeeperEnsemble(tmp_path / "zookeeper", size=3).start()
    cluster = LocalCluster(
        tmp_path / "cluster", nimbuses=2, supervisors=1, slots_per_supervisor=1,
        zk_servers=[server.hosts for server in ensemble.servers],
        conf={"storm.zookeeper.session.timeout": SESSION_MS,
              "supervisor.monitor.frequency.secs": 1,
              "supervisor.heartbeat.frequency.secs": 1,
              "topology.spark.master": "local[1]", "topology.spark.conf": SPARK_CONF,
              "topology.spark.checkpoint.dir": str(tmp_path / "checkpoints")})
    try:
        cluster.start()
        _roll(cluster, ensemble, tmp_path)
    finally:
        cluster.stop()
        ensemble.stop()


def _roll(cluster: LocalCluster, ensemble: ZooKeeperEnsemble, tmp_path) -> None:
    feed = RecordFeed(tmp_path / "input")
    output = CommittedOutput(tmp_path / "output")
    topology_id = cluster.client(deadline_s=120).submit("rolling", pack_directory(WORDCOUNT), {
        "wordcount.input.dir": str(feed.input_dir),
        "wordcount.output.dir": str(output.output_dir), "wordcount.trigger.secs": 1})
    feed.feed(100)
    wait_for(lambda: output.holds(feed.fed), COMMIT_TIMEOUT_S, "the first records")
    workers = processes_with_arg(WORKER_MODULE, f"{topology_id}-")
    assert len(workers) == 1
    state = observer(cluster)
    supervisor_id = cluster.supervisors[0].id

    # Followers first, the ensemble's leader last.
    order = sorted(ensemble.servers, key=lambda s: server_mode(s.port) == "leader")
    assert server_mode(order[-1].port) == "leader"
    for server in order:
        server.stop()  # SIGTERM
        feed.feed(100)
        server.start_process()
        server.wait_serving(60)
        wait_for(lambda: output.holds(feed.fed), COMMIT_TIMEOUT_S,
                 f"the records fed while server {server.server_id} restarted")
        assert processes_with_arg(WORKER_MODULE, f"{topology_id}-") == workers, (
            f"a worker was replaced while server {server.server_id} restarted")

    beat = WorkerBeat.decode(state.get_worker_heartbeat(
        topology_id, supervisor_id, cluster.supervisors[0].ports[0]))
    assert beat.restarts == 0
    log = cluster.supervisors[0].log_text()
    assert "ZooKeeper session lost" not in log
    assert "ZooKeeper connection suspended" in log  # it did live through suspensions
    report = exactly_once_report(feed.fed, output.ids())
    assert report == {"lost": [], "duplicated": [], "unexpected": []}, report
    assert len(feed.fed) == 400
    state.zk.stop()
