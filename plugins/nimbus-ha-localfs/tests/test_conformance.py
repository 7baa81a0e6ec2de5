"""The core's conformance suite, run against localfs with a real ZooKeeper server and a
real Thrift file server per simulated host (the transport localfs downloads over)."""

from __future__ import annotations

import pytest

from nimbus.distribution.distributors import resolve_distributor_class
from nimbus.state.cluster_state import StormClusterState
from nimbus.testing.conformance import (
    PER_HOST,
    ConformanceHost,
    DistributorConformance,
    flip_byte,
)
from nimbus.testing.faults import expire_session
from nimbus.testing.hosts import SimulatedHosts
from nimbus.testing.kit import DistributorKit

pytest_plugins = ["nimbus.testing.zookeeper"]


@pytest.fixture
def hosts(tmp_path, zk_server, zk_root):
    simulated = SimulatedHosts(tmp_path, zk_server.hosts, zk_root, "localfs",
                               topology_ids=(DistributorConformance.topology_id,))
    yield simulated.make
    simulated.close()


def corrupt_jar(host: ConformanceHost, topology_id: str) -> None:
    """Flip one byte of the copy that this host serves to its peers."""
    flip_byte(host.code_dir / topology_id / "stormjar.jar")


class TestLocalfsConformance(DistributorKit):
    distributor = "localfs"
    replication_model = PER_HOST  # one registration per host holding a verified copy

    def corrupt(self, host: ConformanceHost, topology_id: str) -> None:
        corrupt_jar(host, topology_id)


def test_registration_comes_back_after_session_expiry(hosts, zk_server, make_zk, zk_root):
    """A replica registration lost with an expired session is re-created by itself."""
    from nimbus.devcluster import wait_for
    from nimbus.testing.conformance import _write_code

    group = hosts(1)
    topology_id = DistributorConformance.topology_id
    _write_code(group[0].code_dir / topology_id, big_bytes=10)
    group[0].distributor.upload(group[0].code_dir / topology_id, topology_id)
    assert group[0].distributor.get_replication_count(topology_id) == 1
    zk = group[0].distributor._pm.get_plugins().pop()._ctx.zk
    expire_session(zk, zk_server.hosts)
    observer = StormClusterState(make_zk(), zk_root)
    wait_for(lambda: len(observer.replica_hosts(topology_id)) == 1, 20,
             "the replica registration to come back")


def test_storm_class_name_selects_localfs():
    cls = resolve_distributor_class(
        "org.apache.storm.codedistributor.LocalFileSystemCodeDistributor")
    assert cls.name == "localfs"


def test_corrupt_replica_is_skipped_for_a_good_one(hosts, tmp_path, monkeypatch, caplog):
    """With a tampered replica tried first and a good one second, download succeeds."""
    import nimbus_ha_localfs.distributor as localfs

    from nimbus.testing.conformance import _digests, _write_code

    source, good, target = hosts(3)
    topology_id = DistributorConformance.topology_id
    digests = _write_code(source.code_dir / topology_id, big_bytes=100_000)
    metafile = source.distributor.upload(source.code_dir / topology_id, topology_id)
    meta = tmp_path / "meta"
    meta.write_bytes(metafile.read_bytes())
    good.distributor.download(good.code_dir / topology_id, topology_id, meta)
    corrupt_jar(source, topology_id)
    bad_peer = source.distributor._pm.get_plugins().pop()._ctx.address
    monkeypatch.setattr(localfs.random, "shuffle",
                        lambda peers: peers.sort(key=lambda p: p != bad_peer))
    target.distributor.download(target.code_dir / topology_id, topology_id, meta)
    assert _digests(target.code_dir / topology_id) == digests
    assert f"from {bad_peer} failed" in caplog.text and "sha256 mismatch" in caplog.text
