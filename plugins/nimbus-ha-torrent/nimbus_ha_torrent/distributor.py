"""Code distributor over BitTorrent (libtorrent), in a closed swarm of nimbus hosts.

* ``upload`` makes a private, v1 .torrent of the topology's code directory (piece size
  chosen from the bundle's size), starts seeding it and registers this host with its
  BitTorrent endpoint under ``<root>/code-distributor/<id>/<host:port>``. The .torrent is
  the metafile, published by the leader in ZooKeeper.
* ``download`` joins the swarm with the peers registered in ZooKeeper and the hosts
  downloading the same code (and any that appear meanwhile; see ``members``), waits until
  libtorrent has every piece verified, moves the copy into place, keeps seeding it and
  registers. It fails if no verified data arrives for ``stall.timeout.secs`` (a tampered
  piece is never accepted; the sender is banned), or after ``download.timeout.secs``.
* ``get_replication_count`` counts hosts that completed (the registrations).
* On a supervisor (``context.on_supervisor``) ``download`` joins the same swarm: it
  announces itself among the downloaders before it starts, trades pieces with nimbuses
  and other supervisors, and after its copy is complete stays announced there and keeps
  seeding it until ``cleanup``. It never registers a replica, so a supervisor's copy never
  counts toward the nimbuses' replication count; but every downloader, a nimbus that lost
  its copy included, finds it as a source (docs/plugins.md, "Supervisors as sources").
* A copy is seeded (and registered) only once every piece is verified against the
  .torrent's SHA-1 hashes: by libtorrent's full hash check at upload and for copies found
  on disk at start-up; after a download, as each piece arrived (libtorrent's resume data
  carries that verified bitfield over to the seeding torrent, without re-reading the copy).
* ``upload.rate.limit.bytes`` / ``download.rate.limit.bytes`` cap this host's BitTorrent
  traffic over all its torrents (bytes/s, 0 = unlimited), loopback and local-network
  peers included.
* With ``storm.thrift.transport: tls`` the swarm is closed by certificates: .torrents
  carry the cluster CA, and only hosts presenting a certificate it signed (with
  ``DNS:*``) may join (``closed_swarm``; libtorrent's SSL torrents).
* Errors are ``nimbus.distribution.distributors.DistributorError``: ``TorrentMetafileError`` (a
  ``MetafileError``) for a metafile that is not a .torrent of the topology,
  ``TorrentVerificationError`` (a ``CodeVerificationError``) when the download stalled
  on pieces that fail their hash, ``TorrentCodeError`` for any other stall or failure.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import libtorrent as lt

from nimbus.plugin_api import (
    CodeVerificationError,
    DistributorContext,
    DistributorError,
    MetafileError,
    ReplicaReader,
    ReplicaRegistry,
    TransferMeter,
    atomic_dir,
    check_relative_path,
    check_topology_id,
    discard_copy,
    hookimpl,
    leftover_copies,
    list_files,
)
from nimbus_ha_torrent.closed_swarm import same_certificate, swarm_identity
from nimbus_ha_torrent.members import SwarmMembers
from nimbus_ha_torrent.swarm import Swarm

log = logging.getLogger(__name__)

PREFIX = "nimbus.codedistributor.torrent."
MIN_PIECE, MAX_PIECE, TARGET_PIECES = 16 * 1024, 4 * 1024 * 1024, 1500
RECONNECT_S = 2.0
# How often a download reads ZooKeeper for peers that appeared. Not every poll (5 a
# second): with a fleet downloading, each read lists every member, so reads per second
# grow with the square of the fleet.
PEER_REFRESH_S = 0.5
RESTART_AFTER_S = 3.0
MAX_RESTARTS = 3


class TorrentCodeError(DistributorError):
    """A .torrent is invalid, or the swarm could not deliver a verified copy."""


class TorrentMetafileError(TorrentCodeError, MetafileError):
    """The metafile is not a valid .torrent of that topology."""


class TorrentVerificationError(TorrentCodeError, CodeVerificationError):
    """Peers sent only pieces that fail their hash: the download stalled on them."""


def choose_piece_size(total_bytes: int) -> int:
    """A power of two from 16 KiB to 4 MiB giving at most ~1500 pieces."""
    size = MIN_PIECE
    while size < MAX_PIECE and total_bytes / size > TARGET_PIECES:
        size *= 2
    return size


def make_torrent(code_dir: Path, piece_size: int = 0, root_cert: str = "") -> bytes:
    """A private v1 .torrent of ``code_dir`` (its name is the directory's name); with
    ``root_cert`` (a CA's PEM) an SSL torrent that admits only peers it signed."""
    files = list_files(code_dir)  # refuses symlinks
    total = sum((code_dir / f).stat().st_size for f in files)
    if total == 0:
        raise TorrentCodeError(f"{code_dir.name}: nothing to distribute (no bytes)")
    storage = lt.list_files(str(code_dir))
    creator = lt.create_torrent(storage, piece_size or choose_piece_size(total),
                                lt.create_torrent.v1_only)
    creator.set_priv(True)
    creator.set_creator("nimbus-ha")
    if root_cert:
        creator.set_root_cert(root_cert)
    lt.set_piece_hashes(creator, str(code_dir.parent))
    return lt.bencode(creator.generate())


def rate_limit(conf: dict[str, Any], key: str) -> int:
    """The rate limit ``PREFIX + key`` in bytes/s (0: unlimited)."""
    value = conf[PREFIX + key]
    if value < 0:
        raise TorrentCodeError(f"{PREFIX + key} must be 0 (unlimited) or a rate in bytes/s, "
                               f"got {value}")
    return value


def read_torrent(data: bytes, topology_id: str) -> Any:
    """Parse and check a .torrent for ``topology_id``; raises TorrentCodeError."""
    try:
        info = lt.torrent_info(data)
    except RuntimeError as exc:
        raise TorrentMetafileError(
            f"metafile of {topology_id} is not a valid .torrent: {exc}") from None
    if info.name() != topology_id:
        raise TorrentMetafileError(f"metafile is for {info.name()!r}, not {topology_id!r}")
    layout = info.layout()
    for index in range(layout.num_files()):
        path = layout.file_path(index)
        check_relative_path(path)
        if not path.startswith(topology_id + os.sep):
            raise TorrentMetafileError(f"torrent file {path!r} is outside {topology_id}/")
    return info


def _files_of_pieces(handle: Any, pieces: list[int]) -> list[str]:
    """The files (``<topology id>/<path>``) that the given pieces belong to."""
    info = handle.torrent_file()
    if info is None:
        return []
    layout = info.layout()
    names: list[str] = []
    for piece in pieces:
        for part in info.map_block(piece, 0, info.piece_size(piece)):
            name = layout.file_path(part.file_index)
            if name not in names:
                names.append(name)
    return names


def _address(endpoint: str) -> tuple[str, int]:
    address, _, port = endpoint.rpartition(":")
    return address, int(port)


class TorrentCodeDistributor:
    """Topology code shared by BitTorrent between nimbus hosts; see module docstring."""

    name = "torrent"
    serves_supervisors = True

    def __init__(self) -> None:
        self._ctx: DistributorContext | None = None
        self._conf: dict[str, Any] = {}
        self._swarm: Swarm | None = None
        self._replicas: ReplicaRegistry | None = None
        self._members: SwarmMembers | None = None
        self._seeding: dict[str, str] = {}  # info hash -> topology id
        # _seeding and the replica registration that goes with each entry change together,
        # from hook threads and from the swarm's alert thread (_on_corrupt_seed).
        self._seeding_lock = threading.Lock()
        # On a supervisor: the replicas are read, never registered.
        self._readonly_replicas: ReplicaReader | None = None
        self._root_cert = ""   # the cluster CA's PEM with TLS on: what .torrents carry

    @hookimpl
    def config_defaults(self) -> dict[str, Any]:
        return {
            PREFIX + "listen.interface": "127.0.0.1",
            PREFIX + "listen.port": 0,               # 0: any free port (published in ZK)
            PREFIX + "piece.size.kb": 0,             # 0: chosen from the bundle's size
            PREFIX + "stall.timeout.secs": 60,
            PREFIX + "download.timeout.secs": 900,
            PREFIX + "upload.rate.limit.bytes": 0,   # bytes/s, 0: unlimited
            PREFIX + "download.rate.limit.bytes": 0,  # bytes/s, 0: unlimited
        }

    @hookimpl
    def prepare(self, conf: dict[str, Any], context: DistributorContext) -> None:
        self._conf = {**self.config_defaults(),
                      **{k: v for k, v in conf.items() if k.startswith(PREFIX)}}
        self._ctx = context
        context.local_dir.mkdir(parents=True, exist_ok=True)
        closed = swarm_identity(conf, context.local_dir)
        identity, self._root_cert = closed if closed is not None else (None, "")
        self._swarm = Swarm(self._conf[PREFIX + "listen.interface"],
                            self._conf[PREFIX + "listen.port"],
                            on_corrupt_seed=self._on_corrupt_seed,
                            upload_rate=rate_limit(self._conf, "upload.rate.limit.bytes"),
                            download_rate=rate_limit(self._conf, "download.rate.limit.bytes"),
                            ssl=identity)
        if context.zk is not None:
            if context.on_supervisor:
                self._readonly_replicas = ReplicaReader(context.zk, context.zk_root)
            else:
                self._replicas = ReplicaRegistry(context.zk, context.zk_root,
                                                 context.address, name="torrent")
            self._members = SwarmMembers(context.zk, context.zk_root, context.address)
        self._adopt_existing_copies()

    # -- hooks ----------------------------------------------------------------------------
    @hookimpl
    def upload(self, dir_path: Path, topology_id: str) -> Path:
        check_topology_id(topology_id)
        total = sum((dir_path / f).stat().st_size for f in list_files(dir_path))
        with TransferMeter(f"hash {topology_id} for seeding", total) as meter:
            torrent = make_torrent(dir_path, self._conf[PREFIX + "piece.size.kb"] * 1024,
                                   self._root_cert)
            meter.advance(total)
        metafile = self._metafile(topology_id)
        metafile.write_bytes(torrent)
        if not self._seed(torrent, topology_id, dir_path.parent):
            raise TorrentCodeError(f"cannot seed {topology_id}: its files changed while hashing")
        return metafile

    @hookimpl
    def download(self, dest_dir: Path, topology_id: str, metafile: Path) -> list[Path]:
        swarm = self._require_swarm()
        torrent = Path(metafile).read_bytes()
        info = read_torrent(torrent, topology_id)
        self._check_admission(info, topology_id)
        if self._members is not None:
            self._members.join(topology_id, swarm.endpoint)
        done = False
        try:
            files = self._download(swarm, torrent, info, dest_dir, topology_id)
            done = True
            return files
        finally:
            # A nimbus is now a registered replica, or failed: no longer a downloader
            # either way. A supervisor that completed stays announced while it seeds.
            if self._members is not None and not (done and self._ctx.on_supervisor):
                self._members.leave(topology_id)

    def _download(self, swarm: Swarm, torrent: bytes, info: Any, dest_dir: Path,
                  topology_id: str) -> list[Path]:
        with atomic_dir(dest_dir) as tmp:
            with TransferMeter(f"download {topology_id} by BitTorrent",
                               info.total_size()) as meter:
                handle, state = self._fetch(torrent, str(tmp), topology_id, meter)
            try:
                # Pieces count as finished once verified in memory: flush before moving.
                # The resume data lists the verified pieces, so that seeding the copy
                # does not read it all back to hash it again.
                resume = swarm.resume_data(handle, state)
            finally:
                swarm.remove(handle)
            # The torrent's root directory is the topology id: lift its content up.
            root = tmp / topology_id
            staged = tmp / ".torrent-root"
            os.replace(root, staged)
            for child in staged.iterdir():
                os.replace(child, tmp / child.name)
            staged.rmdir()
            # Before the copy is committed: a committed copy always has its .torrent.
            self._metafile(topology_id).write_bytes(torrent)
        if not self._seed(torrent, topology_id, dest_dir.parent, resume):
            discard_copy(self._metafile(topology_id), dest_dir)
            raise TorrentVerificationError(
                f"the downloaded copy of {topology_id} failed libtorrent's hash check")
        layout = info.layout()
        return [dest_dir.parent / layout.file_path(i) for i in range(layout.num_files())]

    @hookimpl
    def get_replication_count(self, topology_id: str) -> int:
        return self._replicas.count(topology_id) if self._replicas is not None else 0

    @hookimpl
    def cleanup(self, topology_id: str) -> None:
        swarm = self._require_swarm()
        with self._seeding_lock:
            for info_hash, tid in list(self._seeding.items()):
                if tid == topology_id:
                    handle = swarm.find(info_hash)
                    if handle is not None:
                        swarm.remove(handle)
                    self._seeding.pop(info_hash, None)
            if self._replicas is not None:
                self._replicas.unregister(topology_id)
        if self._members is not None:
            if self._ctx.on_supervisor:
                self._members.leave(topology_id)
            else:
                self._members.forget(topology_id)
        self._metafile(topology_id).unlink(missing_ok=True)

    @hookimpl
    def close(self, conf: dict[str, Any]) -> None:
        if self._members is not None:
            self._members.close()
        if self._replicas is not None:
            self._replicas.close()
        if self._swarm is not None:
            self._swarm.close()

    # -- internals ------------------------------------------------------------------------
    def _check_admission(self, info: Any, topology_id: str) -> None:
        """Refuse a .torrent whose admission is not this swarm's: plain in a TLS swarm,
        SSL without TLS, or an SSL torrent of another CA (TorrentMetafileError)."""
        carried = info.ssl_cert()
        if bool(carried) != bool(self._root_cert):
            raise TorrentMetafileError(
                f"metafile of {topology_id} is {'an SSL' if carried else 'a plain'} "
                f"torrent, but this host's swarm runs {'with' if self._root_cert else 'without'}"
                " TLS (storm.thrift.transport): every nimbus and supervisor must agree")
        if carried and not same_certificate(carried, self._root_cert):
            raise TorrentMetafileError(
                f"metafile of {topology_id} admits peers of another CA than this "
                "cluster's storm.thrift.tls.ca.file")

    def _require_swarm(self) -> Swarm:
        if self._swarm is None or self._ctx is None:
            raise RuntimeError("torrent distributor used before prepare()")
        return self._swarm

    def _metafile(self, topology_id: str) -> Path:
        return self._ctx.local_dir / f"{check_topology_id(topology_id)}.torrent"

    def _seed(self, torrent: bytes, topology_id: str, save_path: Path,
              resume: bytes | None = None) -> bool:
        """Seed a copy once every piece is verified; register it then.

        Without ``resume`` libtorrent hash-checks the files in full. With the resume data
        of the download that just verified every piece as it arrived, it only checks the
        files' sizes (a mismatch makes it reject the resume data and check in full): a
        second pass would re-read, from the page cache, the bytes it has just written.

        seed_mode (trust the files, verify each piece when first sent) is not used: a
        request that arrives while such a piece is being verified is rejected, and the
        downloader then takes the seeder for one lacking that piece and stalls.
        """
        swarm = self._require_swarm()
        handle, state = swarm.add(torrent, str(save_path), resume)
        state.checked.wait(self._conf[PREFIX + "download.timeout.secs"])
        if state.error or not handle.status().is_seeding:
            log.warning("copy of %s fails libtorrent's check (%s): not seeding it",
                        topology_id, state.error or handle.status().state)
            swarm.remove(handle)
            return False
        info_hash = str(handle.info_hashes().v1)
        swarm.mark_seeding(info_hash)
        with self._seeding_lock:
            self._seeding[info_hash] = topology_id
            if self._replicas is not None:
                self._replicas.register(topology_id, swarm.endpoint)
        return True

    def _peer_endpoints(self, topology_id: str) -> list[str]:
        """The BitTorrent endpoints (``address:port``) of the other hosts that hold a copy
        (registered replicas) or are downloading one."""
        peers: dict[str, str] = {}
        if self._members is not None:
            peers.update(self._members.endpoints(topology_id))
        if self._replicas is not None:
            peers.update(self._replicas.peers(topology_id))
        elif self._readonly_replicas is not None:
            peers.update(self._readonly_replicas.peers(topology_id))
        peers.pop(self._ctx.address, None)
        return sorted(set(peers.values()))

    def _connect_peers(self, handle: Any, topology_id: str, known: set[str]) -> None:
        for endpoint in self._peer_endpoints(topology_id):
            if endpoint not in known:
                # As from a tracker: ZooKeeper still lists the peer, so libtorrent forgives
                # one earlier failure to reach it (e.g. while it re-added its torrent).
                handle.connect_peer(_address(endpoint), lt.peer_info.tracker)
                known.add(endpoint)

    def _fetch(self, torrent: bytes, save_path: str, topology_id: str,
               meter: TransferMeter) -> tuple[Any, Any]:
        """Download until every piece is verified; returns the finished handle.

        After a corrupt piece libtorrent may ban a good peer along with the bad one and be
        left with nobody to fetch from. If progress then stops, the torrent is added
        again over the same partial files (libtorrent re-checks them, keeping verified
        pieces) with a fresh peer list, at most MAX_RESTARTS times.
        """
        swarm = self._require_swarm()
        # save_path is a new, empty directory: the torrent connects to the peers known
        # now as soon as it is added (later ones are offered below).
        handle, state = swarm.add(torrent, save_path, empty=True, peers=[
            _address(endpoint) for endpoint in self._peer_endpoints(topology_id)])
        try:
            stall_s = self._conf[PREFIX + "stall.timeout.secs"]
            restart_s = min(RESTART_AFTER_S, stall_s / 2)
            deadline = time.monotonic() + self._conf[PREFIX + "download.timeout.secs"]
            known: set[str] = set()
            last_done, last_progress = -1, time.monotonic()
            next_reconnect, next_refresh, restarts, hash_failures = 0.0, 0.0, 0, 0
            while True:
                if time.monotonic() >= next_reconnect:
                    # Offer every registered peer again: libtorrent ignores connected ones,
                    # and a dropped connection must not end the swarm.
                    known.clear()
                    next_reconnect = time.monotonic() + RECONNECT_S
                if time.monotonic() >= next_refresh:
                    self._connect_peers(handle, topology_id, known)
                    next_refresh = time.monotonic() + PEER_REFRESH_S
                if state.finished.wait(0.2):
                    break
                status = handle.status()
                if status.total_wanted_done > last_done:
                    meter.advance(status.total_wanted_done - max(last_done, 0))
                    last_done, last_progress = status.total_wanted_done, time.monotonic()
                now = time.monotonic()
                if (state.hash_failures and now - last_progress > restart_s
                        and restarts < MAX_RESTARTS):
                    hash_failures += state.hash_failures
                    log.warning("%s stalled after %d corrupt pieces: restarting with fresh "
                                "peers", topology_id, state.hash_failures)
                    swarm.remove(handle)
                    handle, state = swarm.add(torrent, save_path)
                    restarts += 1
                    known.clear()
                    next_refresh = 0.0
                    last_progress = now
                    continue
                if now - last_progress > stall_s or now > deadline:
                    corrupt = hash_failures + state.hash_failures
                    error = TorrentVerificationError if corrupt else TorrentCodeError
                    raise error(self._stall_report(handle, status, topology_id, corrupt))
            if state.error:
                raise TorrentCodeError(f"download of {topology_id} failed: {state.error}")
            status = handle.status()
            if not status.is_seeding or status.total_wanted_done != status.total_wanted:
                raise TorrentCodeError(f"download of {topology_id} ended incomplete")
            meter.advance(max(0, status.total_wanted_done - max(last_done, 0)))
            return handle, state
        except BaseException:
            swarm.remove(handle)
            raise

    def _stall_report(self, handle: Any, status: Any, topology_id: str,
                      hash_failures: int) -> str:
        peers = len(self._peer_endpoints(topology_id))
        missing = [i for i, have in enumerate(status.pieces) if not have][:5]
        connected = [f"{p.ip[0]}:{p.ip[1]}" for p in handle.get_peer_info()]
        log.warning("stall of %s: missing pieces %s, connected %s", topology_id, missing,
                    connected)
        why = (f"{hash_failures} corrupt pieces received, " if hash_failures else "") + \
            (f"{peers} peers known (replicas and downloaders), connected: "
             f"{', '.join(connected) or 'none'}")
        files = _files_of_pieces(handle, missing)
        lacking = (f"; missing pieces {', '.join(map(str, missing))} of "
                   f"{', '.join(files)}") if files else ""
        return (f"download of {topology_id} stalled at {status.progress:.1%} ({why}"
                f"{lacking}); no partial copy is kept")

    def _on_corrupt_seed(self, info_hash: str) -> None:
        # The swarm's alert thread. Under the lock, so that a copy seeded again meanwhile
        # (same info hash) is never unregistered by this older report.
        with self._seeding_lock:
            topology_id = self._seeding.pop(info_hash, None)
            if topology_id is None:
                return
            handle = self._swarm.find(info_hash)
            if handle is not None:
                self._swarm.remove(handle)
            if self._replicas is not None:
                self._replicas.unregister(topology_id)

    def _adopt_existing_copies(self) -> None:
        """Seed again, after a full hash check, the copies an earlier run left on disk."""
        ctx = self._ctx
        for topology_id, metafile, code in leftover_copies(ctx.local_dir, ".torrent",
                                                           ctx.code_dir):
            torrent = metafile.read_bytes()
            try:
                self._check_admission(read_torrent(torrent, topology_id), topology_id)
                intact = self._seed(torrent, topology_id, ctx.code_dir)
            except (TorrentCodeError, RuntimeError) as exc:
                log.warning("cannot re-seed %s: %s", topology_id, exc)
                intact = False
            if not intact:
                log.warning("local copy of %s is not intact: deleting it", topology_id)
                discard_copy(metafile, code)
            elif ctx.on_supervisor and self._members is not None:
                # A supervisor's seed is found among the swarm's members, not replicas.
                self._members.join(topology_id, self._require_swarm().endpoint)
