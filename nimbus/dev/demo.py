"""The runtime demo of ``nimbus-ha dev-cluster --demo`` (with 2 or more supervisors).

It submits the example word-count pipeline, feeds it numbered records, kill -9s the
supervisor running it together with its worker, watches the pipeline move to another
supervisor and resume from its checkpoint, and prints whether the committed output holds
every record exactly once.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click
import yaml

from nimbus.dev.cluster import LocalCluster, sample_topology, wait_for
from nimbus.dev.feed import (
    WORDCOUNT,
    WORKER_MODULE,
    CommittedOutput,
    RecordFeed,
    exactly_once_report,
    processes_with_arg,
)
from nimbus.distribution.archive import pack_directory
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.runtime_view import newest_error
from nimbus.thrift.client import NimbusClient

# What a 2-core laptop can afford per worker; a real cluster sets its own.
DEMO_SPARK_CONF = {"spark.ui.enabled": "false", "spark.driver.memory": "512m",
                   "spark.sql.shuffle.partitions": "2"}
TIMEOUT_S = 240
T = TypeVar("T")


def _slot(state: StormClusterState, topology_id: str) -> tuple[str, int] | None:
    assignment = state.assignment_info(topology_id)
    if assignment is None or "worker-0" not in assignment.executor_node_port:
        return None
    supervisor_id, port = assignment.executor_node_port["worker-0"]
    return supervisor_id, int(port)


class ErrorWatch:
    """Shows a topology's newest error (as ``nimbus-ha errors`` would) while the demo
    waits, so that a failing pipeline reads as its error rather than a bare timeout."""

    #: Seconds between two looks at the errors: a wait polls far more often.
    INTERVAL_S = 2.0

    def __init__(self, state: StormClusterState, name: str, topology_id: str):
        self.state = state
        self.name = name
        self.topology_id = topology_id
        self.shown: str | None = None
        self._next_look = 0.0

    def look(self) -> None:
        if time.monotonic() < self._next_look:
            return
        self._next_look = time.monotonic() + self.INTERVAL_S
        try:
            newest = newest_error(self.state, self.topology_id)
        except Exception:  # ZooKeeper mid-failover: the next look tells
            return
        if newest and newest != self.shown:
            self.shown = newest
            click.echo(f"{self.topology_id} reported an error: {newest}", err=True)

    def wait(self, condition: Callable[[], T], what: str) -> T:
        """:func:`wait_for` that looks at the errors as it goes, and names the newest in
        the error it raises on a timeout."""
        def watched() -> T:
            self.look()
            return condition()

        try:
            return wait_for(watched, TIMEOUT_S, what)
        except TimeoutError as exc:
            self._next_look = 0.0
            self.look()
            if self.shown:
                raise TimeoutError(f"{exc}; the pipeline's newest error: {self.shown} "
                                   f"(nimbus-ha errors {self.name} shows "
                                   "them all)") from None
            raise


def run(cluster: LocalCluster, work_dir: Path) -> bool:
    """Run the demo on a started cluster; returns whether every record committed once."""
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=cluster.zk.hosts)
    zk.start(timeout=15)
    state = StormClusterState(zk, "/storm")
    try:
        return _run(cluster, work_dir, state)
    finally:
        zk.stop()
        zk.close()


def _run(cluster: LocalCluster, work_dir: Path, state: StormClusterState) -> bool:
    feed = RecordFeed(work_dir / "wordcount-in")
    output = CommittedOutput(work_dir / "wordcount-out")
    topology_id = cluster.client().submit("wordcount-pipeline", pack_directory(WORDCOUNT), {
        "topology.spark.master": "local[1]",
        "topology.spark.conf": DEMO_SPARK_CONF,
        "topology.spark.checkpoint.dir": str(work_dir / "checkpoints"),
        "wordcount.input.dir": str(feed.input_dir),
        "wordcount.output.dir": str(output.output_dir),
        "wordcount.trigger.secs": 1})
    click.echo(f"submitted the word-count pipeline as {topology_id}")
    errors = ErrorWatch(state, "wordcount-pipeline", topology_id)

    def worker() -> tuple[tuple[str, int], int] | None:
        slot = _slot(state, topology_id)
        pids = processes_with_arg(WORKER_MODULE, f"{topology_id}-")
        return (slot, pids[0]) if slot and len(pids) == 1 else None

    def feed_and_wait(batches: int) -> None:
        for _ in range(batches):
            feed.feed(100, words=5)
        started = time.monotonic()
        errors.wait(lambda: output.holds(feed.fed), "the records to be committed")
        click.echo(f"fed {len(feed.fed)} records so far; all committed "
                   f"({time.monotonic() - started:.1f}s after the last feed)")

    slot, pid = errors.wait(worker, "the pipeline's worker")
    click.echo(f"running on supervisor {slot[0]} slot {slot[1]} (worker pid {pid})")
    feed_and_wait(5)

    supervisor = next(s for s in cluster.supervisors if s.id == slot[0])
    click.echo(f"kill -9 supervisor {slot[0]} and its worker ...")
    killed_at = time.monotonic()
    supervisor.kill9_group()
    os.killpg(pid, signal.SIGKILL)
    feed.feed(100, words=5)  # records arrive while nothing runs the pipeline
    new_slot, new_pid = errors.wait(
        lambda: (w := worker()) and w[0][0] != slot[0] and w, "the pipeline to move")
    click.echo(f"moved to supervisor {new_slot[0]} slot {new_slot[1]} after "
               f"{time.monotonic() - killed_at:.1f}s (session timeout "
               f"{cluster.conf_values['storm.zookeeper.session.timeout']} ms)")
    feed_and_wait(4)

    report = exactly_once_report(feed.fed, output.ids())
    ok = not any(report.values())
    click.echo(f"output: {len(feed.fed)} records fed, {sum(output.ids().values())} committed, "
               f"{len(report['lost'])} lost, {len(report['duplicated'])} duplicated"
               + (" - every record exactly once" if ok else " - NOT exactly once"))
    return ok


def failover_demo(cluster: LocalCluster, work_dir: Path) -> None:
    """The nimbus failover demo: a topology survives its leader's kill -9 and wiped disk."""
    client = cluster.client()
    bundle = sample_topology(work_dir / "sample-topology")
    # A process topology (docs/runtime.md): what a supervisor of the dev cluster runs.
    (bundle / "topology.yaml").write_text(yaml.safe_dump(
        {"command": [sys.executable, "-c", "import time; time.sleep(86400)"]}))
    topology_id = client.submit("wordcount", pack_directory(bundle),
                                {"topology.min.replication.count": 2})
    click.echo(f"submitted wordcount as {topology_id}")
    click.echo(_topology_line(client))
    leader = cluster.wait_for_leader()
    click.echo(f"kill -9 the leader {leader.address} and delete its storm.local.dir ...")
    started = time.monotonic()
    leader.kill9()
    leader.wipe()
    new = cluster.wait_for_leader(exclude=leader.address, timeout_s=120)
    click.echo(f"new leader {new.address} after {time.monotonic() - started:.1f}s "
               f"(session timeout {cluster.conf_values['storm.zookeeper.session.timeout']} ms)")
    click.echo(_topology_line(client))
    client.deactivate("wordcount")
    click.echo("deactivated on the new leader: " + _topology_line(client))
    client.activate("wordcount")
    click.echo("activated on the new leader:   " + _topology_line(client))
    click.echo("demo done: the topology survived the failover without resubmission")


def _topology_line(client: NimbusClient) -> str:
    info = client.cluster_info()
    return "; ".join(f"{t.name} {t.status} replicas={t.replication_count}"
                     for t in info.topologies) or "(no topologies)"


def run_demos(cluster: LocalCluster, work_dir: Path) -> bool:
    """What ``dev-cluster --demo`` runs: the failover demo, then, with two supervisors or
    more, the pipeline runtime's (:func:`run`); whether every record committed once."""
    failover_demo(cluster, work_dir)
    if len(cluster.supervisors) >= 2:
        return run(cluster, work_dir)
    return True
