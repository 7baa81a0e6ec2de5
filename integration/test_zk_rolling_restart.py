"""A ZooKeeper rolling restart, and then a quorum loss longer than a worker's lease,
restart no pipeline (issue 20).

Real processes: a 3-server ensemble (as ``nimbus-ha zookeeper --ensemble 3`` runs it), 2
nimbuses, a supervisor and a word-count pipeline in real Spark. Each ZooKeeper server is
restarted in turn (SIGTERM, start, back in the quorum), the ensemble's leader last.
Between restarts the pipeline must commit what was fed meanwhile. A supervisor used to
kill every worker on kazoo's SUSPENDED, so each restart of the server it was connected
to cost a cold Spark start.

Then two of the three servers are killed (kill -9) and kept down until the worker's lease
has run out: the worker freezes in its cgroup and commits nothing more, and when the
quorum is back its supervisor's first renewal thaws it. At the end the same worker
process must still run the pipeline, never restarted, and the output must hold every
record exactly once.
"""

from __future__ import annotations

import time

import pytest
from helpers import observer
from waiting import wait_for

from nimbus.dev.cluster import LocalCluster
from nimbus.dev.demo import DEMO_SPARK_CONF
from nimbus.dev.feed import (
    WORDCOUNT,
    WORKER_MODULE,
    CommittedOutput,
    RecordFeed,
    exactly_once_report,
    processes_with_arg,
)
from nimbus.dev.zookeeper import ZooKeeperEnsemble, server_mode
from nimbus.distribution.archive import pack_directory
from nimbus.state.records import WorkerBeat

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SESSION_MS = 6000
SPARK_CONF = DEMO_SPARK_CONF  # what a 2-core machine affords a worker
COMMIT_TIMEOUT_S = 150


def test_a_rolling_restart_and_a_quorum_loss_restart_no_worker(tmp_path):
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

    _lose_the_quorum(cluster, ensemble, feed, output, topology_id, workers)

    beat = WorkerBeat.decode(state.get_worker_heartbeat(
        topology_id, supervisor_id, cluster.supervisors[0].ports[0]))
    assert beat.restarts == 0
    log = cluster.supervisors[0].log_text()
    assert "ZooKeeper session lost" not in log
    assert "ZooKeeper connection suspended" in log  # it did live through suspensions
    report = exactly_once_report(feed.fed, output.ids())
    assert report == {"lost": [], "duplicated": [], "unexpected": []}, report
    assert len(feed.fed) == 500
    state.zk.stop()


def _lose_the_quorum(cluster: LocalCluster, ensemble: ZooKeeperEnsemble, feed: RecordFeed,
                     output: CommittedOutput, topology_id: str, workers: list[int]) -> None:
    supervisor = cluster.supervisors[0]
    worker_log = supervisor.worker_log(topology_id, supervisor.ports[0])
    frozen_before = worker_log.read_text().count("frozen until the supervisor renews it")
    doomed = ensemble.servers[:2]
    for server in doomed:
        server.kill9()
    # Kept down until the lease (2/3 of the session) has surely run out: the worker froze.
    wait_for(lambda: worker_log.read_text().count("frozen until the supervisor renews it")
             > frozen_before, 4 * SESSION_MS / 1000, "the worker to freeze")
    committed = len(output.ids())
    feed.feed(100)
    # Watched for a while (an observation, not a wait): a running worker commits a batch
    # every second here.
    watch_until = time.monotonic() + 3.0
    while time.monotonic() < watch_until:
        assert len(output.ids()) == committed, "a frozen worker committed a batch"
        time.sleep(0.2)
    for server in doomed:
        server.start_process()
    for server in ensemble.servers:
        server.wait_serving(60)
    wait_for(lambda: output.holds(feed.fed), COMMIT_TIMEOUT_S,
             "the records fed while the quorum was lost")
    assert processes_with_arg(WORKER_MODULE, f"{topology_id}-") == workers, (
        "a worker was replaced after the quorum loss")
    assert "thawed: its lease is renewed" in supervisor.log_text()
