"""The core's conformance suite, run against localfs with a real ZooKeeper server and a
real Thrift file server per simulated host (the transport localfs downloads over)."""

from __future__ import annotations

import pytest

from nimbus.client import fetch_file
from nimbus.cluster_state import StormClusterState
from nimbus.distributors import CodeDistributor, resolve_distributor_class
from nimbus.file_transfer import FileTransfers
from nimbus.hookspecs import DistributorContext
from nimbus.local_code import LocalCodeStore
from nimbus.testing.conformance import ConformanceHost, DistributorConformance
from nimbus.testing.faults import expire_session
from nimbus.thrift_server import ThriftServer

pytest_plugins = ["nimbus.testing.zookeeper"]


class FileServer:
    """The part of the Nimbus service localfs downloads through."""

    def __init__(self, transfers: FileTransfers):
        self._transfers = transfers

    def beginFileDownload(self, file: str) -> str:
        return self._transfers.begin_download(file)

    def downloadChunk(self, id: str) -> bytes:  # noqa: A002
        return self._transfers.download_chunk(id)


@pytest.fixture
def hosts(tmp_path, make_zk, zk_root):
    servers, distributors = [], []

    def make(n: int) -> list[ConformanceHost]:
        group = []
        for _ in range(n):
            index = len(servers)
            local = tmp_path / f"host-{index}"
            store = LocalCodeStore(local)
            transfers = FileTransfers(local, store, 1 << 30)
            server = ThriftServer(FileServer(transfers), "127.0.0.1", 0)
            server.start()
            servers.append(server)
            zk = make_zk()
            StormClusterState(zk, zk_root).setup()
            distributor = CodeDistributor(resolve_distributor_class("localfs"))
            context = DistributorContext(
                zk=zk, zk_root=zk_root, address=f"127.0.0.1:{server.port}",
                local_dir=local / "code-distributor" / "localfs", code_dir=store.root,
                fetch_file=fetch_file)
            distributor.prepare({}, context)
            distributors.append(distributor)
            group.append(ConformanceHost(distributor, store.root, {}))
        # The leader creates a topology's code node before uploading (see lifecycle).
        zk.ensure_path(f"{zk_root}/code-distributor/{DistributorConformance.topology_id}")
        return group

    yield make
    for distributor in distributors:
        distributor.close({})
    for server in servers:
        server.stop()


def corrupt_jar(host: ConformanceHost, topology_id: str) -> None:
    """Flip one byte of the copy that this host serves to its peers."""
    jar = host.code_dir / topology_id / "stormjar.jar"
    data = bytearray(jar.read_bytes())
    data[len(data) // 2] ^= 0xFF
    jar.write_bytes(bytes(data))


class TestLocalfsConformance(DistributorConformance):
    @pytest.fixture
    def tamper(self):
        return corrupt_jar


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
