"""nimbus-ha-torrent with real libtorrent sessions on loopback and a real ZooKeeper."""

from __future__ import annotations

import threading
import time

import libtorrent as lt
import pytest
from nimbus_ha_torrent.distributor import PREFIX, TorrentCodeDistributor, TorrentCodeError

from nimbus.distribution.distributors import (
    CodeVerificationError,
    DistributorError,
    MetafileError,
    resolve_distributor_class,
)
from nimbus.testing.conformance import (
    PER_HOST,
    ConformanceHost,
    DistributorConformance,
    flip_byte,
    tree_digests,
    write_code,
)
from nimbus.testing.hosts import SimulatedHosts
from nimbus.testing.kit import DistributorKit

pytest_plugins = ["nimbus.testing.zookeeper"]
TOPOLOGY = DistributorConformance.topology_id
FAST = {PREFIX + "stall.timeout.secs": 3, PREFIX + "download.timeout.secs": 120}


@pytest.fixture
def hosts(tmp_path, zk_server, zk_root):
    simulated = SimulatedHosts(tmp_path, zk_server.hosts, zk_root, "torrent", FAST,
                               topology_ids=(TOPOLOGY,))
    yield simulated.make
    simulated.close()


def corrupt_file(host: ConformanceHost, topology_id: str) -> None:
    flip_byte(host.code_dir / topology_id / "stormjar.jar")


class TestTorrentConformance(DistributorKit):
    distributor = "torrent"
    replication_model = PER_HOST  # one registration per host seeding a verified copy
    no_store_reason = ("torrent has no central store to stop: each nimbus seeds its own "
                       "copy to the others' swarm")

    @pytest.fixture
    def settings(self) -> dict:
        return dict(FAST)

    @pytest.fixture
    def bad_settings(self) -> list:
        return [({**FAST, PREFIX + "upload.rate.limit.bytes": -1},
                 PREFIX + "upload.rate.limit.bytes")]

    def corrupt(self, host: ConformanceHost, topology_id: str) -> None:
        corrupt_file(host, topology_id)


def plugin(host: ConformanceHost) -> TorrentCodeDistributor:
    return host.distributor._pm.get_plugins().pop()


def upload(source: ConformanceHost, tmp_path, big_bytes: int = 3_000_000):
    digests = write_code(source.code_dir / TOPOLOGY, big_bytes=big_bytes)
    metafile = source.distributor.upload(source.code_dir / TOPOLOGY, TOPOLOGY)
    meta = tmp_path / "meta.torrent"
    meta.write_bytes(metafile.read_bytes())
    return digests, meta


def test_selected_by_entry_point_name():
    assert resolve_distributor_class("torrent") is TorrentCodeDistributor



def fetch_together(peers: list[ConformanceHost], meta, name: str) -> list[Exception]:
    """Every peer downloads the topology at once, each in its own named thread; returns
    the errors (a thread still running after 120 s is one too)."""
    errors: list[Exception] = []

    def fetch(peer: ConformanceHost) -> None:
        try:
            peer.distributor.download(peer.code_dir / TOPOLOGY, TOPOLOGY, meta)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=fetch, args=(p,), name=f"{name}-{i}")
               for i, p in enumerate(peers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    errors += [TimeoutError(f"{t.name} still downloading") for t in threads if t.is_alive()]
    return errors

def test_eight_peers_complete_and_count_as_replicas(hosts, tmp_path):
    source, *peers = hosts(9)
    digests, meta = upload(source, tmp_path)
    assert fetch_together(peers, meta, "peer") == []
    assert all(tree_digests(p.code_dir / TOPOLOGY) == digests for p in peers)
    assert source.distributor.get_replication_count(TOPOLOGY) == 9


def test_listens_on_loopback_only(hosts):
    port = plugin(hosts(1)[0])._swarm.port
    listening = []
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:
            listening.append(address)
    assert listening == ["0100007F"]  # 127.0.0.1, and nothing else


def test_tampered_piece_with_a_good_seeder_ends_in_a_good_copy(hosts, tmp_path):
    source, good, target = hosts(3)
    digests, meta = upload(source, tmp_path)
    good.distributor.download(good.code_dir / TOPOLOGY, TOPOLOGY, meta)
    corrupt_file(source, TOPOLOGY)
    target.distributor.download(target.code_dir / TOPOLOGY, TOPOLOGY, meta)
    assert tree_digests(target.code_dir / TOPOLOGY) == digests


def test_torrent_for_another_topology_is_refused(hosts, tmp_path):
    source, target = hosts(2)
    _, meta = upload(source, tmp_path)
    dest = target.code_dir / "other-1-1"
    with pytest.raises(TorrentCodeError, match="not 'other-1-1'"):
        target.distributor.download(dest, "other-1-1", meta)
    assert not dest.exists()


def test_forged_piece_hashes_never_complete(hosts, tmp_path):
    """A .torrent whose piece hashes were altered parses, but nobody can satisfy it."""
    source, target = hosts(2)
    _, meta = upload(source, tmp_path)
    decoded = lt.bdecode(meta.read_bytes())
    pieces = bytearray(decoded[b"info"][b"pieces"])
    pieces[0] ^= 0xFF
    decoded[b"info"][b"pieces"] = bytes(pieces)
    meta.write_bytes(lt.bencode(decoded))
    dest = target.code_dir / TOPOLOGY
    with pytest.raises(TorrentCodeError, match="stalled"):
        target.distributor.download(dest, TOPOLOGY, meta)
    assert not dest.exists()
    assert source.distributor.get_replication_count(TOPOLOGY) == 1


def test_download_cut_off_half_way_leaves_nothing(hosts, tmp_path, monkeypatch):
    import nimbus_ha_torrent.distributor as torrent_module

    source, target = hosts(2, {PREFIX + "piece.size.kb": 16})
    _, meta = upload(source, tmp_path, big_bytes=64 * 1024 * 1024)

    # Throttle the seeder so that the download is observed part-way.
    plugin(source)._swarm.session.apply_settings(
        {"upload_rate_limit": 16 * 1024 * 1024, "ignore_limits_on_local_network": False})
    closed = threading.Event()

    class CutOff(torrent_module.TransferMeter):
        """Closes the only seeder once a quarter has arrived."""

        def advance(self, nbytes: int) -> None:
            super().advance(nbytes)
            if self.done >= self.total // 4 and not closed.is_set():
                closed.set()
                source.distributor.close({})

    monkeypatch.setattr(torrent_module, "TransferMeter", CutOff)
    dest = target.code_dir / TOPOLOGY
    with pytest.raises(TorrentCodeError, match=f"download of {TOPOLOGY} stalled") as err:
        target.distributor.download(dest, TOPOLOGY, meta)
    # The seeder went away: nothing was corrupt, so not a verification error.
    assert not isinstance(err.value, CodeVerificationError)
    assert not dest.exists() and not list(dest.parent.glob(".incoming-*"))
    assert closed.is_set() and target.distributor.get_replication_count(TOPOLOGY) == 0


CAP = 2 * 1024 * 1024  # bytes/s


def _capped_hosts(hosts, direction: str) -> tuple[ConformanceHost, ConformanceHost]:
    """A seeder and a downloader, the cap set on the side that ``direction`` names."""
    capped = {PREFIX + f"{direction}.rate.limit.bytes": CAP}
    (source,) = hosts(1, capped if direction == "upload" else {})
    (target,) = hosts(1, capped if direction == "download" else {})
    return source, target


def _payload(host: ConformanceHost, direction: str) -> int:
    """Payload bytes the host's torrent (its only one) has sent or received so far."""
    torrents = plugin(host)._swarm.session.get_torrents()
    if not torrents:
        return 0
    status = torrents[0].status()
    return status.total_payload_upload if direction == "upload" else \
        status.total_payload_download


@pytest.mark.parametrize("direction", ["upload", "download"])
def test_rate_cap_holds_for_loopback_peers(hosts, tmp_path, direction):
    """libtorrent exempts local-network peers from rate limits unless told otherwise.

    Over a window that starts with the first payload byte, the capped side moves at most
    the cap's worth of bytes (plus one tick's burst), and the bundle, six seconds' worth
    at the cap, is not through by the window's end. Without the cap in force on
    127.0.0.1 the whole bundle moves in a fraction of a second and both fail. A slow
    machine can only move fewer bytes. The cap is then lifted and the copy completes.
    """
    source, target = _capped_hosts(hosts, direction)
    digests, meta = upload(source, tmp_path, big_bytes=6 * CAP)
    measured = source if direction == "upload" else target
    errors: list[Exception] = []
    stop = threading.Event()

    def fetch() -> None:
        try:
            target.distributor.download(target.code_dir / TOPOLOGY, TOPOLOGY, meta)
        except Exception as exc:
            errors.append(exc)

    thread = threading.Thread(target=fetch, name="capped-download")
    thread.start()
    try:
        while _payload(measured, direction) == 0 and thread.is_alive():
            stop.wait(0.005)
        started, first = time.monotonic(), _payload(measured, direction)
        stop.wait(1.5)
        moved = _payload(measured, direction) - first
        window = time.monotonic() - started
        still_going = thread.is_alive()
    finally:
        plugin(measured)._swarm.set_rate_limits(0, 0)
        thread.join(timeout=120)
    assert not errors and not thread.is_alive()
    assert tree_digests(target.code_dir / TOPOLOGY) == digests
    assert moved <= CAP * window * 1.1 + CAP // 4, (moved, window)
    assert still_going


def test_rate_limits_are_session_settings(hosts):
    (host,) = hosts(1, {PREFIX + "upload.rate.limit.bytes": 3_000_000,
                        PREFIX + "download.rate.limit.bytes": 5_000_000})
    settings = plugin(host)._swarm.session.get_settings()
    assert (settings["upload_rate_limit"], settings["download_rate_limit"]) == \
        (3_000_000, 5_000_000)
    assert settings["ignore_limits_on_local_network"] is False
    with pytest.raises(DistributorError, match="upload.rate.limit.bytes must be 0"):
        hosts(1, {PREFIX + "upload.rate.limit.bytes": -1})


def test_downloaders_trade_pieces_with_each_other(hosts, tmp_path, zk_root):
    """Hosts downloading at once find each other (``torrent-swarm/<id>`` in ZooKeeper).

    Replicas register only once complete, so without that announcement each downloader
    pulls the whole bundle from the seeder, which sends it exactly twice (measured: 2.00).
    Trading pieces, the downloaders need 1.4 to 1.65 times the bundle from it (measured;
    the rest of the second copy they send each other).
    """
    (source,) = hosts(1, {PREFIX + "upload.rate.limit.bytes": CAP})
    downloaders = hosts(2)
    digests, meta = upload(source, tmp_path, big_bytes=3 * CAP)
    assert fetch_together(downloaders, meta, "trading-peer") == []
    assert all(tree_digests(p.code_dir / TOPOLOGY) == digests for p in downloaders)
    bundle = sum(f.stat().st_size for f in (source.code_dir / TOPOLOGY).rglob("*"))
    (seeded,) = plugin(source)._swarm.session.get_torrents()
    assert seeded.status().total_payload_upload < 1.9 * bundle
    # Every announcement is withdrawn, with the topology's directory.
    assert plugin(source)._ctx.zk.exists(f"{zk_root}/torrent-swarm/{TOPOLOGY}") is None


# -- the swarm closed by certificates (storm.thrift.transport: tls) ---------------------
@pytest.fixture(scope="module")
def cluster_ca(tmp_path_factory):
    from tls_certs import CertificateAuthority

    return CertificateAuthority(tmp_path_factory.mktemp("ca"))


def tls_conf(identity) -> dict:
    return {**FAST, **identity.conf()}


class TestTorrentTlsConformance(DistributorKit):
    """The whole kit, supervisors included, with the swarm closed by certificates."""

    distributor = "torrent"
    replication_model = PER_HOST
    no_store_reason = TestTorrentConformance.no_store_reason

    @pytest.fixture
    def settings(self, cluster_ca) -> dict:
        return tls_conf(cluster_ca.issue("swarm-host"))

    def corrupt(self, host: ConformanceHost, topology_id: str) -> None:
        corrupt_file(host, topology_id)


def test_tls_torrents_carry_the_cluster_ca(hosts, cluster_ca, tmp_path):
    (source,) = hosts(1, tls_conf(cluster_ca.issue("nimbus-a")))
    _, meta = upload(source, tmp_path, big_bytes=100_000)
    info = lt.torrent_info(meta.read_bytes())
    assert info.ssl_cert() == cluster_ca.ca_file.read_text()
    assert plugin(source)._swarm.ssl is not None


def test_a_host_without_a_cluster_certificate_cannot_join(hosts, cluster_ca, tmp_path):
    """A peer presenting a certificate of another CA (with the cluster's CA file, which is
    public) is refused by every member: its download stalls, and nothing is written."""
    from tls_certs import CertificateAuthority

    (source,) = hosts(1, tls_conf(cluster_ca.issue("nimbus-a")))
    _, meta = upload(source, tmp_path, big_bytes=100_000)
    outsider = CertificateAuthority(tmp_path / "evil", name="evil CA").issue("mallory")
    (intruder,) = hosts(1, {**tls_conf(outsider), "storm.thrift.tls.ca.file":
                            str(cluster_ca.ca_file)})
    dest = intruder.code_dir / TOPOLOGY
    with pytest.raises(TorrentCodeError, match="stalled at 0.0%"):
        intruder.distributor.download(dest, TOPOLOGY, meta)
    assert not dest.exists()
    # A member with a cluster certificate gets it from the same seeder.
    (member,) = hosts(1, tls_conf(cluster_ca.issue("sup-1")))
    member.distributor.download(member.code_dir / TOPOLOGY, TOPOLOGY, meta)


def test_a_certificate_without_the_swarm_name_is_refused_at_start(hosts, cluster_ca):
    identity = cluster_ca.issue("no-star", swarm=False)
    with pytest.raises(DistributorError, match="has no subject alternative name DNS:"):
        hosts(1, tls_conf(identity))


def test_plain_and_ssl_torrents_do_not_mix(hosts, cluster_ca, tmp_path):
    (plain,) = hosts(1)
    _, plain_meta = upload(plain, tmp_path, big_bytes=10_000)
    (secure,) = hosts(1, tls_conf(cluster_ca.issue("nimbus-b")))
    with pytest.raises(MetafileError, match="a plain torrent, but this host's swarm runs "
                                            "with TLS"):
        secure.distributor.download(secure.code_dir / TOPOLOGY, TOPOLOGY, plain_meta)


def test_a_seeding_supervisor_is_announced_again_after_its_session_expired(
        zk_server, zk_root, make_zk):
    """Issue 27: a supervisor stays announced while it seeds; after a session expiry the
    announcement comes back on the new session (a left one does not)."""
    from faults import expire_session
    from kazoo.client import KazooClient
    from nimbus_ha_torrent.members import SwarmMembers

    zk = KazooClient(hosts=zk_server.hosts, timeout=4)
    zk.start(timeout=15)
    members = SwarmMembers(zk, zk_root, "supervisor-a")
    observer = SwarmMembers(make_zk(), zk_root, "observer")
    try:
        members.join("seeding-1-1", "127.0.0.1:7001")
        members.join("done-1-1", "127.0.0.1:7001")
        members.leave("done-1-1")
        assert observer.endpoints("seeding-1-1") == {"supervisor-a": "127.0.0.1:7001"}
        expire_session(zk, zk_server.hosts)
        deadline = time.monotonic() + 30
        while observer.endpoints("seeding-1-1") != {"supervisor-a": "127.0.0.1:7001"}:
            assert time.monotonic() < deadline, "not announced again"
            time.sleep(0.05)
        assert observer.endpoints("done-1-1") == {}
        assert any(t.name == "torrent-swarm-renewal" for t in threading.enumerate())
    finally:
        members.close()
        observer.close()
        zk.stop()
        zk.close()
    assert not any(t.name == "torrent-swarm-renewal" and t.is_alive()
                   for t in threading.enumerate())


class _CountedReads:
    """Counts a kazoo client's reads (each sync read goes through its async form)."""

    def __init__(self, zk):
        self.count = 0
        for name in ("get_async", "get_children_async", "exists_async"):
            original = getattr(zk, name)

            def counted(*args, _original=original, **kwargs):
                self.count += 1
                return _original(*args, **kwargs)

            setattr(zk, name, counted)

    def take(self) -> int:
        count, self.count = self.count, 0
        return count


def test_a_listing_reads_each_announcement_once(make_zk, zk_root):
    """A fleet of downloaders lists the announcements twice a second each: a listing
    that found nothing changed costs one read, a new announcement one more, and an
    announcement removed and made again (a restarted host on a new port) between two
    listings is read again, not served from memory."""
    from nimbus_ha_torrent.members import SwarmMembers

    writer_zk, reader_zk = make_zk(), make_zk()
    hosts = {f"supervisor-{i}": SwarmMembers(writer_zk, zk_root, f"supervisor-{i}")
             for i in range(5)}
    reader = SwarmMembers(reader_zk, zk_root, "nimbus-a")
    reads = _CountedReads(reader_zk)
    topology = "fleet-1-1"
    late = None
    try:
        for i, members in enumerate(hosts.values()):
            members.join(topology, f"127.0.0.1:{7000 + i}")
        expected = {f"supervisor-{i}": f"127.0.0.1:{7000 + i}" for i in range(5)}
        assert reader.endpoints(topology) == expected
        assert reads.take() == 1 + 5
        for _ in range(3):
            assert reader.endpoints(topology) == expected
        assert reads.take() == 3

        late = SwarmMembers(writer_zk, zk_root, "supervisor-late")
        late.join(topology, "127.0.0.1:7100")
        assert reader.endpoints(topology) == {**expected, "supervisor-late": "127.0.0.1:7100"}
        assert reads.take() == 1 + 1
        late.leave(topology)
        assert reader.endpoints(topology) == expected
        assert reads.take() == 1

        # supervisor-2 restarts on another port between two listings: same names.
        hosts["supervisor-2"].leave(topology)
        hosts["supervisor-2"].join(topology, "127.0.0.1:7202")
        expected["supervisor-2"] = "127.0.0.1:7202"
        assert reader.endpoints(topology) == expected
        assert reads.take() == 1 + 5

        # Everyone leaves (the directory goes), then one host downloads it again.
        for members in hosts.values():
            members.leave(topology)
        hosts["supervisor-4"].join(topology, "127.0.0.1:7404")
        assert reader.endpoints(topology) == {"supervisor-4": "127.0.0.1:7404"}
        assert reads.take() == 1 + 1
    finally:
        for members in [*hosts.values(), *([late] if late is not None else [])]:
            members.close()
        reader.close()
