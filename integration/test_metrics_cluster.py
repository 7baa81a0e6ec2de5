"""/metrics of a real cluster (ZooKeeper, 2 nimbus processes, 1 supervisor process and its
worker), parsed with prometheus_client's parser, against what the cluster reports; and
``nimbus-ha top --once`` showing the same topology."""

from __future__ import annotations

import os
import signal
import sys
import urllib.request

import pytest
import yaml
from helpers import run_cli
from waiting import wait_for

from nimbus.dev.cluster import DaemonProcess, LocalCluster, sample_topology
from nimbus.dev.feed import processes_with_arg
from nimbus.distribution.archive import pack_directory
from nimbus.state.records import ACTIVE, INACTIVE, KILLED

pytestmark = [pytest.mark.slow, pytest.mark.integration]

CONF = {
    "storm.zookeeper.session.timeout": 4000,
    "nimbus.monitor.freq.secs": 1,
    "supervisor.monitor.frequency.secs": 1,
    "supervisor.heartbeat.frequency.secs": 1,
    "supervisor.worker.shutdown.sleep.secs": 1,
    "worker.heartbeat.frequency.secs": 1,
}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(daemon: DaemonProcess) -> Samples:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(daemon.metrics_url, timeout=5) as response:
        text = response.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def top_row(cluster: LocalCluster, name: str) -> list[str] | None:
    result = run_cli("top", "--once", "--config", str(cluster.config_file))
    assert result.returncode == 0, result.stderr
    for line in result.stdout.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("│").split("│")]
        if cells and cells[0] == name:
            return cells
    return None


@pytest.fixture
def cluster(tmp_path):
    c = LocalCluster(tmp_path / "cluster", 2, conf=dict(CONF), supervisors=1,
                     slots_per_supervisor=1, metrics=True)
    try:
        c.start()
        yield c
    except BaseException:
        for daemon in [*c.nimbuses, *c.supervisors]:
            print(f"--- {daemon.DAEMON} {daemon.index} ---\n{daemon.log_text()[-4000:]}")
        raise
    finally:
        c.stop()


def test_metrics_of_every_daemon_agree_with_the_cluster(cluster, tmp_path):
    bundle = sample_topology(tmp_path / "sleeper", 16 * 1024)
    (bundle / "topology.yaml").write_text(yaml.safe_dump(
        {"command": [sys.executable, "-c", "import time; time.sleep(3600)"]}))
    client = cluster.client()
    topology_id = client.submit("sleeper", pack_directory(bundle),
                                {"topology.min.replication.count": 2})
    supervisor = cluster.supervisors[0]
    port = str(supervisor.ports[0])

    # Each nimbus: exactly one leads, both see one ACTIVE topology held by both nimbuses.
    leader = cluster.wait_for_leader()
    follower = next(n for n in cluster.nimbuses if n is not leader)

    def settled() -> dict[str, Samples] | None:
        got = {n.address: scrape(n) for n in cluster.nimbuses}
        if all(value(s, "nimbus_topologies", status=ACTIVE) == 1
               and value(s, "nimbus_topology_replication_count", topology_id=topology_id,
                         topology="sleeper") == 2 for s in got.values()):
            return got
        return None

    got = wait_for(settled, 60, "both nimbuses to report the replicated topology")
    assert [value(got[n.address], "nimbus_is_leader") for n in cluster.nimbuses] == [
        1 if n is leader else 0 for n in cluster.nimbuses]
    [summary] = client.cluster_info().topologies
    for samples in got.values():
        assert value(samples, "nimbus_topologies", status=INACTIVE) == 0
        assert value(samples, "nimbus_topologies", status=KILLED) == 0
        assert value(samples, "nimbus_topology_replication_count", topology_id=topology_id,
                     topology="sleeper") == summary.replication_count == 2
        assert value(samples, "nimbus_topology_min_replication_count",
                     topology_id=topology_id, topology="sleeper") == 2
        assert value(samples, "nimbus_code_sync_bytes_total", distributor="localfs") \
            is not None
    leading = got[leader.address]
    assert value(leading, "nimbus_leader_changes_total", change="gained") == 1
    assert value(leading, "nimbus_leadership_wait_seconds_count") == 1
    # The submit went to the leader; getClusterInfo just above too.
    assert value(leading, "nimbus_thrift_calls_total", method="submitTopologyWithOpts",
                 outcome="ok") == 1
    assert value(leading, "nimbus_thrift_calls_total", method="getClusterInfo",
                 outcome="ok") >= 1
    # The follower fetched the code: bytes and one download counted there.
    assert value(got[follower.address], "nimbus_code_sync_bytes_total",
                 distributor="localfs") > 16 * 1024
    assert value(got[follower.address], "nimbus_code_sync_duration_seconds_count",
                 distributor="localfs", outcome="ok") == 1

    # The supervisor: its worker runs; kill -9 it and the restart is counted.
    worker_pid = wait_for(lambda: processes_with_arg("nimbus.worker", topology_id), 60,
                          "the worker to start")[0]
    samples = wait_for(lambda: (s := scrape(supervisor)) and value(
        s, "supervisor_component_input_rows_per_second", topology_id=topology_id,
        port=port, component="main") is not None and s, 60, "the worker's first beat")
    assert value(samples, "supervisor_workers") == 1
    assert value(samples, "supervisor_worker_restarts_total", topology_id=topology_id,
                 port=port) == 0
    os.kill(worker_pid, signal.SIGKILL)
    samples = wait_for(lambda: (s := scrape(supervisor)) and value(
        s, "supervisor_worker_restarts_total", topology_id=topology_id, port=port) == 1
        and s, 60, "the restart to be counted")
    wait_for(lambda: [p for p in processes_with_arg("nimbus.worker", topology_id)
                      if p != worker_pid], 60, "the restarted worker")

    # top shows the topology as the cluster has it: restarted once, with the crash.
    expected = ["sleeper", topology_id, ACTIVE, "1/1", "1", "0.0", "0.0", "-",
                "worker-0: worker exited with code -9"]
    wait_for(lambda: top_row(cluster, "sleeper") == expected, 60,
             f"top to show {expected} (last: {top_row(cluster, 'sleeper')})")

    # kill -9 the leader: the follower takes over and counts it.
    assert value(scrape(follower), "nimbus_leader_changes_total", change="gained") == 0
    leader.kill9()
    after = wait_for(lambda: (s := scrape(follower)) and value(s, "nimbus_is_leader") == 1
                     and s, 60, "the follower to lead")
    assert value(after, "nimbus_leader_changes_total", change="gained") == 1
    assert value(after, "nimbus_leadership_wait_seconds_count") == 1
    assert value(after, "nimbus_topologies", status=ACTIVE) == 1
