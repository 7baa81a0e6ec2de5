"""The core's conformance suite, run against localfs with a real ZooKeeper server and a
real Thrift file server per simulated host (the transport localfs downloads over)."""

from __future__ import annotations

import pytest
from faults import expire_session

from nimbus.distribution.distributors import resolve_distributor_class
from nimbus.state.cluster_state import StormClusterState
from nimbus.testing.conformance import (
    PER_HOST,
    ConformanceHost,
    DistributorConformance,
    flip_byte,
)
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
    no_store_reason = ("localfs has no central store to stop: each nimbus keeps its own "
                       "copy and serves it to the others over Thrift")

    def corrupt(self, host: ConformanceHost, topology_id: str) -> None:
        corrupt_jar(host, topology_id)


def test_registration_comes_back_after_session_expiry(hosts, zk_server, make_zk, zk_root):
    """A replica registration lost with an expired session is re-created by itself."""
    from waiting import wait_for

    from nimbus.testing.conformance import write_code

    group = hosts(1)
    topology_id = DistributorConformance.topology_id
    write_code(group[0].code_dir / topology_id, big_bytes=10)
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

    from nimbus.testing.conformance import tree_digests, write_code

    source, good, target = hosts(3)
    topology_id = DistributorConformance.topology_id
    digests = write_code(source.code_dir / topology_id, big_bytes=100_000)
    metafile = source.distributor.upload(source.code_dir / topology_id, topology_id)
    meta = tmp_path / "meta"
    meta.write_bytes(metafile.read_bytes())
    good.distributor.download(good.code_dir / topology_id, topology_id, meta)
    corrupt_jar(source, topology_id)
    bad_peer = source.distributor._pm.get_plugins().pop()._ctx.address
    monkeypatch.setattr(localfs.random, "shuffle",
                        lambda peers: peers.sort(key=lambda p: p != bad_peer))
    target.distributor.download(target.code_dir / topology_id, topology_id, meta)
    assert tree_digests(target.code_dir / topology_id) == digests
    assert f"from {bad_peer} failed" in caplog.text and "sha256 mismatch" in caplog.text


def test_a_fleet_spreads_over_the_replicas_by_rank(tmp_path, zk_server, zk_root):
    """Each supervisor named in the Assignment starts at replica (its rank mod the
    replicas): six supervisors on three replicas start twice at each."""
    from nimbus.testing.conformance import write_code

    simulated = SimulatedHosts(tmp_path, zk_server.hosts, zk_root, "localfs",
                               topology_ids=(DistributorConformance.topology_id,))
    try:
        topology_id = DistributorConformance.topology_id
        group = simulated.make(3)
        write_code(group[0].code_dir / topology_id, big_bytes=10)
        meta = tmp_path / "meta"
        meta.write_bytes(group[0].distributor.upload(group[0].code_dir / topology_id,
                                                     topology_id).read_bytes())
        for host in group[1:]:
            host.distributor.download(host.code_dir / topology_id, topology_id, meta)
        supervisors = [simulated.make_supervisor() for _ in range(6)]
        ids = [f"sim-{3 + i}" for i in range(6)]   # make_supervisor's addresses
        simulated.assign(topology_id, ids, {})
        firsts = []
        for host in supervisors:
            plugin = host.distributor._pm.get_plugins().pop()
            order = plugin._download_order(topology_id)
            assert sorted(order) == sorted(simulated.addresses)
            firsts.append(order[0])
        assert sorted(firsts.count(a) for a in simulated.addresses) == [2, 2, 2]
    finally:
        simulated.close()
