"""Supervisors get topology code through the code distributor, in real clusters.

Each test runs ZooKeeper, nimbus processes and supervisor processes (and SeaweedFS for
s3); a process topology (``sleep``) gets one worker per supervisor. What the tests count:
``supervisor_code_fetches_total{source}`` on every supervisor (where its copy came from)
and ``nimbus_code_served_bytes_total`` on every nimbus (the code each sent over Thrift):

* s3, shareddir and torrent: every supervisor's copy comes through the distributor and
  the nimbuses send 0 bytes of code over Thrift (with torrent, the follower nimbus too
  fetches through the swarm);
* localfs: through the distributor too, and the nimbuses together send exactly one copy
  per downloader (the follower and each supervisor), nothing more;
* torrent, every nimbus's copy lost (STORM-3664): a nimbus started on an empty disk gets
  the code from the swarm, whose only holder left is a supervisor, and leads with it;
  the same when that supervisor was restarted meanwhile and fetches nothing (it seeds
  what it held as soon as it starts).
"""

from __future__ import annotations

import shutil
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from helpers import observer, s3_store
from required_plugins import require_plugin
from waiting import wait_for

from nimbus.dev.cluster import DaemonProcess, LocalCluster, sample_topology
from nimbus.distribution.archive import pack_directory

pytestmark = [pytest.mark.slow, pytest.mark.integration]

CONF = {
    "storm.zookeeper.session.timeout": 4000,
    "nimbus.monitor.freq.secs": 1,
    "supervisor.monitor.frequency.secs": 1,
    "supervisor.heartbeat.frequency.secs": 1,
    "supervisor.worker.shutdown.sleep.secs": 1,
    "worker.heartbeat.frequency.secs": 1,
}
TORRENT = {"storm.codedistributor.class": "torrent",
           "nimbus.codedistributor.torrent.stall.timeout.secs": 20}


def scrape(daemon: DaemonProcess) -> dict[tuple[str, frozenset], float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(daemon.metrics_url, timeout=5) as response:
        text = response.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def metric(daemon: DaemonProcess, name: str, **labels: str) -> float | None:
    return scrape(daemon).get((name, frozenset(labels.items())))


def sleeper(tmp_path: Path, size_bytes: int = 256 * 1024) -> bytes:
    source = sample_topology(tmp_path / "sleeper", size_bytes)
    (source / "topology.yaml").write_text(yaml.safe_dump(
        {"command": [sys.executable, "-c", "import time; time.sleep(3600)"]}))
    return pack_directory(source)


@pytest.fixture(params=["localfs", "s3", "shareddir", "torrent"])
def backend(request, tmp_path):
    """(name, conf) of a code distributor, with the server or share it needs."""
    name = request.param
    require_plugin(name)
    if name == "localfs":
        yield name, {}
    elif name == "torrent":
        yield name, dict(TORRENT)
    elif name == "shareddir":
        share = tmp_path / "share"
        share.mkdir()
        yield name, {"storm.codedistributor.class": "shareddir",
                     "nimbus.codedistributor.shareddir.path": str(share),
                     "nimbus.codedistributor.shareddir.replication.count": 2}
    else:
        with s3_store(tmp_path / "seaweed") as conf:
            yield name, conf

@pytest.fixture
def cluster(tmp_path):
    made: list[LocalCluster] = []

    def make(nimbuses: int, supervisors: int, **conf: object) -> LocalCluster:
        c = LocalCluster(tmp_path / "cluster", nimbuses, conf={**CONF, **conf},
                         supervisors=supervisors, slots_per_supervisor=1, metrics=True)
        made.append(c)
        return c.start()

    yield make
    for c in made:
        for daemon in [*c.nimbuses, *c.supervisors]:  # shown when the test failed
            print(f"--- {daemon.log_file.name} ---\n{daemon.log_text()[-3000:]}")
        c.stop()


def running_everywhere(c: LocalCluster) -> bool:
    return all(metric(s, "supervisor_workers") == 1 for s in c.supervisors)


def code_bytes(nimbus_dir: Path, topology_id: str) -> int:
    """Bytes of a topology's code as a nimbus keeps it (what a whole copy sends)."""
    root = nimbus_dir / "nimbus" / "stormdist" / topology_id
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def test_supervisors_fetch_through_the_distributor(backend, cluster, tmp_path):
    name, conf = backend
    c = cluster(2, 2, **conf)
    client = c.client()
    topology_id = client.submit("sleeper", sleeper(tmp_path),
                                {"topology.workers": 2, "topology.min.replication.count": 2})
    wait_for(lambda: running_everywhere(c), 90, "a worker on each supervisor")
    for supervisor in c.supervisors:
        assert metric(supervisor, "supervisor_code_fetches_total", source="distributor") == 1
        assert metric(supervisor, "supervisor_code_fetches_total", source="nimbus") == 0
        assert f"supervisor fetches code through code distributor '{name}'" in \
            supervisor.log_text()
    wait_for(lambda: client.cluster_info().topologies[0].replication_count == 2, 60,
             "both nimbuses to hold the code")
    served = sum(metric(n, "nimbus_code_served_bytes_total") for n in c.nimbuses)
    if name == "localfs":
        # One whole copy to the follower nimbus and one to each supervisor: no more.
        size = code_bytes(c.nimbuses[0].local_dir, topology_id)
        assert served == 3 * size
    else:
        assert served == 0, f"{name}: the nimbuses sent {served} bytes of code over Thrift"
    # A supervisor's copy never counts as a replica.
    assert client.cluster_info().topologies[0].replication_count == 2
    state = observer(c)
    try:
        hosts = state.replica_hosts(topology_id)
        assert not [h for h in hosts if h.startswith("supervisor-")]
    finally:
        state.zk.stop()


@pytest.mark.parametrize("supervisor_restarted", [False, True],
                         ids=["supervisor running", "supervisor restarted"])
def test_a_supervisor_is_the_last_source_when_every_nimbus_lost_the_code(
        cluster, tmp_path, supervisor_restarted):
    """STORM-3664 with torrent: both nimbuses are killed and their disks wiped; a nimbus
    started again on an empty disk downloads the code from the swarm, in which the
    supervisor is the only holder left, and leads holding it. The supervisor restarted
    (kill -9) meanwhile already holds the code and fetches nothing, yet seeds its copy
    at once: its distributor is prepared when its fetch thread starts."""
    require_plugin("torrent")
    c = cluster(2, 1, **TORRENT)
    client = c.client()
    topology_id = client.submit("sleeper", sleeper(tmp_path, 1024 * 1024),
                                {"topology.min.replication.count": 2})
    wait_for(lambda: running_everywhere(c), 90, "the worker")
    supervisor = c.supervisors[0]
    assert metric(supervisor, "supervisor_code_fetches_total", source="distributor") == 1
    for nimbus in c.nimbuses:
        nimbus.kill9()
    for nimbus in c.nimbuses:
        shutil.rmtree(nimbus.local_dir)
    if supervisor_restarted:
        prepared = "supervisor fetches code through code distributor 'torrent'"
        assert supervisor.log_text().count(prepared) == 1
        supervisor.kill9()
        c.start_supervisor(supervisor)
        wait_for(lambda: supervisor.log_text().count(prepared) == 2, 60,
                 "the restarted supervisor to prepare its distributor")
    state = observer(c)
    try:
        wait_for(lambda: state.replica_hosts(topology_id) == [], 30,
                 "the dead nimbuses' replica registrations to expire")
        first = c.nimbuses[0]
        first.start()
        assert c.wait_for_leader(timeout_s=90) is first
        wait_for(lambda: (first.local_dir / "nimbus" / "stormdist" / topology_id).is_dir(),
                 60, "the restarted nimbus to hold the code again")
        assert state.replica_hosts(topology_id) == [first.address]
        log = first.log_text()
        assert "DEGRADED" not in log
        assert f"held 1 of 1 live topologies [{topology_id}]" in log
        # The worker ran on through it all, on the copy the supervisor fetched once
        # (a restarted supervisor's metrics start afresh: it fetched nothing).
        assert metric(supervisor, "supervisor_workers") == 1
        fetched = 0 if supervisor_restarted else 1
        assert metric(supervisor, "supervisor_code_fetches_total",
                      source="distributor") == fetched
        assert metric(supervisor, "supervisor_code_fetches_total", source="nimbus") == 0
    finally:
        state.zk.stop()


def test_with_tls_the_swarm_admits_cluster_certificates_only(tmp_path):
    """torrent with storm.thrift.transport tls: the .torrent the leader publishes carries
    the cluster CA, and both supervisors (cluster certificates) fetch through the swarm.
    (That a certificate of another CA is refused is proven with real libtorrent sessions in
    the plugin's own suite.)"""
    require_plugin("torrent")
    import libtorrent as lt
    from tls_certs import DAEMON, USER, CertificateAuthority

    from nimbus.dev.feed import WORKER_MODULE, processes_with_arg
    from nimbus.thrift.client import NimbusClient

    ca = CertificateAuthority(tmp_path / "ca")
    daemons = ca.issue("cluster", DAEMON)
    with LocalCluster(tmp_path / "cluster", 2, supervisors=2, slots_per_supervisor=1,
                      conf={**CONF, **TORRENT, **daemons.conf(),
                            "nimbus.supervisor.users": ["cluster"],
                            "nimbus.daemon.users": ["cluster"]}) as c:
        try:
            as_alice = NimbusClient(c.client_conf(**ca.issue("alice", USER).conf()),
                                    deadline_s=60)
            topology_id = as_alice.submit(
                "sleeper", sleeper(tmp_path),
                {"topology.workers": 2, "topology.min.replication.count": 2})
            wait_for(lambda: len(processes_with_arg(WORKER_MODULE, topology_id)) == 2,
                     90, "a worker on each supervisor")
            for supervisor in c.supervisors:
                log = supervisor.log_text()
                assert "supervisor fetches code through code distributor 'torrent'" in log
                assert f"fetched and verified the code of {topology_id} (from the code " \
                       "distributor)" in log
            state = observer(c)
            try:
                meta = state.code_meta(topology_id)
                assert lt.torrent_info(meta.metafile).ssl_cert() == ca.ca_file.read_text()
            finally:
                state.zk.stop()
        except BaseException:
            for daemon in [*c.nimbuses, *c.supervisors]:
                print(f"--- {daemon.log_file.name} ---\n{daemon.log_text()[-3000:]}")
            raise
