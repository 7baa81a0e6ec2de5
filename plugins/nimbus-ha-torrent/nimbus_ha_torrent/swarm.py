"""A libtorrent session for a closed swarm, and a named thread that pumps its alerts.

Closed means: no trackers, no DHT, no local peer discovery, no UPnP or NAT-PMP, listening
only on the configured interface (127.0.0.1 by default). Peers are added explicitly, from
the replica registrations in ZooKeeper. libtorrent checks every piece against the SHA-1
in the .torrent before it counts it (and hash-checks files already on disk when a
torrent is added without resume data), so a finished or seeding torrent is a verified copy.

With an :class:`SslIdentity` the swarm is an SSL swarm (libtorrent's SSL torrents): the
session listens only on an SSL port, every torrent it adds presents this host's
certificate, and a peer is accepted only with a certificate signed by the CA that the
.torrent carries (its ``ssl-cert``), whose names include ``*``.

Rate limits (bytes/s, 0 = unlimited) are session-wide and apply to every peer,
loopback and local-network peers included: libtorrent exempts those by default, through
its "local" peer class; here every address maps to the global class, which carries the
limits.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import libtorrent as lt

log = logging.getLogger(__name__)

ALERT_MASK = (lt.alert_category.error | lt.alert_category.status
              | lt.alert_category.storage | lt.alert_category.peer | lt.alert_category.connect)


@dataclass(frozen=True)
class SslIdentity:
    """PEM files this host presents to its swarm peers (and the DH parameters libtorrent
    requires alongside them)."""

    cert: str
    key: str
    dh_params: str


def closed_swarm_settings(interface: str, port: int, upload_rate: int = 0,
                          download_rate: int = 0, ssl: bool = False) -> dict:
    """Session settings: one listening address, no discovery of any kind.

    ``upload_rate`` and ``download_rate`` are the session's limits in bytes/s (0: none);
    ``ssl`` makes the one listening socket an SSL one (``s`` after the port).
    """
    return {
        "listen_interfaces": f"{interface}:{port}{'s' if ssl else ''}",
        "outgoing_interfaces": "",
        "enable_dht": False, "enable_lsd": False, "enable_upnp": False,
        "enable_natpmp": False, "dht_bootstrap_nodes": "", "enable_ip_notifier": False,
        # uTP's congestion control throttles loopback transfers; TCP only.
        "enable_outgoing_utp": False, "enable_incoming_utp": False,
        "enable_outgoing_tcp": True, "enable_incoming_tcp": True,
        # Every peer of a test cluster is 127.0.0.1.
        "allow_multiple_connections_per_ip": True,
        "upload_rate_limit": upload_rate, "download_rate_limit": download_rate,
        # The limits hold for peers on local networks and loopback too (see
        # every_peer_global), and count BitTorrent bytes, not estimated TCP/IP headers.
        "ignore_limits_on_local_network": False, "rate_limit_ip_overhead": False,
        # Under a rate limit, a peer's sends wait for quota, handed out once a tick; the
        # send buffer must hold a tick's worth and more. At the defaults (500 ms ticks, a
        # 10 kB buffer until a peer's first second of upload is measured, 500 kB after)
        # a capped 16 MiB/s uplink sends 80 kB/s for a second, then bursts past the cap
        # on quota banked meanwhile.
        "tick_interval": 20,
        "send_buffer_low_watermark": 1 << 20, "send_buffer_watermark": 4 << 20,
        # Not the default "whole pieces, then up to 8 MiB of contiguous ones" from any
        # fast-enough peer: every downloader then requests the same runs of pieces from a
        # seeder, whose capped uplink sends them again and again. Rarest first.
        "whole_pieces_threshold": 0,
        # Requests queued per peer: one second's worth at its rate, not three. A capped
        # seeder serves its queues slowly, and what several downloaders queued at once
        # it sends several times; a second's worth keeps even a 20 ms tick busy.
        "request_queue_time": 1,
        # Choking rations upload slots among strangers; in a closed swarm of a few nimbus
        # hosts it only starves a downloader (the default 8 slots are shared by every
        # torrent of the session), so every peer is unchoked.
        "unchoke_slots_limit": -1,
        "connections_limit": 400, "auto_manage_startup": 0,
        # A host that finishes a download drops its connections (it seeds the copy from
        # its final place, a new torrent): the others may connect again after a second,
        # not the default minute meant for strangers.
        "min_reconnect_time": 1,
        # Fail loudly on a busy port instead of silently listening elsewhere.
        "max_retry_port_bind": 0, "listen_system_port_fallback": False,
        "alert_mask": int(ALERT_MASK),
        "user_agent": "nimbus-ha-torrent",
    }


def every_peer_global(session: lt.session) -> lt.ip_filter:
    """A peer-class filter putting every IPv4 and IPv6 address in the global class only.

    libtorrent's default filter puts local networks (10/8, 172.16/12, 192.168/16,
    169.254/16, 127/8) in its "local" class, whose peers the session's rate limits skip.
    """
    classes = lt.ip_filter()
    flags = 1 << session.global_peer_class_id
    classes.add_rule("0.0.0.0", "255.255.255.255", flags)
    classes.add_rule("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", flags)
    return classes


@dataclass
class TorrentState:
    """What the alert thread learned about one torrent."""

    finished: threading.Event = field(default_factory=threading.Event)
    checked: threading.Event = field(default_factory=threading.Event)
    flushed: threading.Event = field(default_factory=threading.Event)
    resumed: threading.Event = field(default_factory=threading.Event)
    hash_failures: int = 0
    error: str | None = None
    resume_data: bytes | None = None   # libtorrent's resume data, once ``resumed`` is set
    resume_error: str | None = None
    # The torrent these are about: a removed torrent of the same info hash may still post
    # alerts (a file error once its files were moved, say) after this one was added.
    handle: Any = None


class Swarm:
    """One libtorrent session per nimbus; see the module docstring."""

    def __init__(self, interface: str, port: int,
                 on_corrupt_seed: Callable[[str], None] = lambda info_hash: None,
                 upload_rate: int = 0, download_rate: int = 0,
                 ssl: SslIdentity | None = None):
        self.ssl = ssl
        self.session = lt.session(closed_swarm_settings(interface, port, upload_rate,
                                                        download_rate, ssl is not None))
        self.session.set_peer_class_filter(every_peer_global(self.session))
        # After a corrupt piece, ban only the peer whose blocks were bad: without this
        # every peer that sent part of the piece is banned, good seeders included.
        self.session.add_extension("smart_ban")
        self.interface = interface
        self.port = self._wait_listening()
        self._states: dict[str, TorrentState] = {}
        self._seeding: set[str] = set()
        self._lock = threading.Lock()
        self._on_corrupt_seed = on_corrupt_seed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pump, name="torrent-alerts", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"{self.interface}:{self.port}"

    def _wait_listening(self, timeout_s: float = 10.0) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for alert in self.session.pop_alerts():
                if isinstance(alert, lt.listen_failed_alert):
                    raise RuntimeError(f"BitTorrent session cannot listen: {alert.message()}")
                if isinstance(alert, lt.listen_succeeded_alert):
                    if self.ssl is None and alert.socket_type == lt.socket_type_t.tcp:
                        return self.session.listen_port()
                    if self.ssl is not None and \
                            alert.socket_type == lt.socket_type_t.tcp_ssl:
                        return self.session.ssl_listen_port()
            self.session.wait_for_alert(100)
        raise RuntimeError("BitTorrent session did not start listening")

    def set_rate_limits(self, upload_rate: int, download_rate: int) -> None:
        """Change the session's rate limits (bytes/s, 0 = unlimited) while it runs."""
        self.session.apply_settings({"upload_rate_limit": upload_rate,
                                     "download_rate_limit": download_rate})

    def add(self, torrent: bytes, save_path: str, resume: bytes | None = None,
            peers: list[tuple[str, int]] | None = None,
            empty: bool = False) -> tuple[object, TorrentState]:
        """Add a torrent; libtorrent checks any files already under ``save_path``.

        With ``resume`` (from :meth:`resume_data`, for this very torrent) the pieces it
        lists as verified are taken as such if the files have the expected sizes;
        otherwise libtorrent rejects the resume data and checks the files in full.
        ``empty`` says that ``save_path`` holds none of the torrent's files: there is
        nothing to check, so the torrent connects to ``peers`` as soon as it is added
        (a torrent still checking waits for libtorrent's next once-a-second round of
        connection attempts, half a second on average).
        """
        params = lt.load_torrent_buffer(torrent)
        if resume is not None:
            resumed = lt.read_resume_data(resume)
            if resumed.ti is None or \
                    str(resumed.ti.info_hashes().v1) != str(params.ti.info_hashes().v1):
                raise ValueError("resume data of another torrent")
            params = resumed
        params.peers = list(peers or [])  # the peers come from ZooKeeper, not resume data
        if empty:
            params.flags |= lt.torrent_flags.no_verify_files
        params.save_path = save_path
        params.flags &= ~lt.torrent_flags.auto_managed
        params.flags &= ~lt.torrent_flags.paused
        # Without this flag libtorrent hands back the handle of a torrent with the same
        # hash that is still being removed: the new copy would silently never be served.
        params.flags |= lt.torrent_flags.duplicate_is_error
        info_hash = str(params.ti.info_hashes().v1)
        stale = self.find(info_hash)
        if stale is not None:
            # e.g. a copy deleted under us is fetched again: the new handle replaces it.
            self.remove(stale)
        if bool(params.ti.ssl_cert()) != (self.ssl is not None):
            raise ValueError(
                "an SSL torrent needs a swarm with TLS (storm.thrift.transport: tls)"
                if self.ssl is None else
                "this swarm runs with TLS and takes SSL torrents only; the metafile was "
                "written without TLS")
        state = TorrentState()
        with self._lock:  # the alert thread waits: it must not see the torrent unregistered
            state.handle = self.session.add_torrent(params)
            if self.ssl is not None:
                # Presented to every peer of this torrent; peers present theirs.
                state.handle.set_ssl_certificate(self.ssl.cert, self.ssl.key,
                                                 self.ssl.dh_params)
            self._states[info_hash] = state
        return state.handle, state

    def resume_data(self, handle: object, state: TorrentState,
                    timeout_s: float = 60.0) -> bytes:
        """Write every downloaded block to disk, then return libtorrent's resume data.

        "Finished" does not mean "on disk": pieces are verified in memory, their writes
        may still be queued. The resume data (with the info dict) lists the pieces
        verified against their hashes, for :meth:`add` to seed them again without
        reading them back.
        """
        state.flushed.clear()
        handle.flush_cache()  # cache_flushed_alert once every queued write is done
        if not state.flushed.wait(timeout_s):
            raise RuntimeError("libtorrent did not flush the downloaded data to disk")
        state.resumed.clear()
        state.resume_data = state.resume_error = None
        # (Its flush_disk_cache flag would not wait for the writes: the alert comes first.)
        handle.save_resume_data(lt.torrent_handle.save_info_dict)
        if not state.resumed.wait(timeout_s):
            raise RuntimeError("libtorrent did not produce resume data")
        if state.resume_data is None:
            raise RuntimeError(f"libtorrent could not save resume data: {state.resume_error}")
        return state.resume_data

    def remove(self, handle: object, timeout_s: float = 10.0) -> None:
        """Remove a torrent and wait until it is gone (its files are then closed)."""
        info_hash = str(handle.info_hashes().v1)
        with self._lock:
            self._states.pop(info_hash, None)
            self._seeding.discard(info_hash)
        self.session.remove_torrent(handle)
        deadline = time.monotonic() + timeout_s
        while self.find(info_hash) is not None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"libtorrent did not remove torrent {info_hash}")
            time.sleep(0.005)  # removal is asynchronous and posts no awaitable result here

    def find(self, info_hash: str) -> object | None:
        for handle in self.session.get_torrents():
            if str(handle.info_hashes().v1) == info_hash:
                return handle
        return None

    def mark_seeding(self, info_hash: str) -> None:
        with self._lock:
            self._seeding.add(info_hash)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for handle in self.session.get_torrents():
            self.session.remove_torrent(handle)
        self.session.pause()

    def _pump(self) -> None:
        while not self._stop.is_set():
            if self.session.wait_for_alert(250) is None:
                continue
            for alert in self.session.pop_alerts():
                self._dispatch(alert)

    def _dispatch(self, alert: object) -> None:
        if isinstance(alert, (lt.peer_ban_alert, lt.peer_error_alert)):
            log.warning("%s", alert.message())
        elif isinstance(alert, lt.peer_disconnected_alert):
            log.debug("%s", alert.message())
        handle = getattr(alert, "handle", None)
        if handle is None or not handle.is_valid():
            return
        info_hash = str(handle.info_hashes().v1)
        with self._lock:
            state = self._states.get(info_hash)
            seeding = info_hash in self._seeding
        if state is None or handle != state.handle:
            return
        if isinstance(alert, lt.torrent_finished_alert):
            state.finished.set()
        elif isinstance(alert, lt.torrent_checked_alert):
            state.checked.set()
        elif isinstance(alert, lt.cache_flushed_alert):
            state.flushed.set()
        elif isinstance(alert, lt.save_resume_data_alert):
            # Serialised here: an alert's data is only valid until the next pop_alerts.
            state.resume_data = lt.write_resume_data_buf(alert.params)
            state.resumed.set()
        elif isinstance(alert, lt.save_resume_data_failed_alert):
            state.resume_error = alert.message()
            state.resumed.set()
        elif isinstance(alert, lt.hash_failed_alert):
            state.hash_failures += 1
            if seeding:
                # Our own copy changed on disk: it must stop counting as a replica.
                log.error("piece %d of our seeded copy %s fails its hash", alert.piece_index,
                          info_hash)
                self._on_corrupt_seed(info_hash)
            else:
                log.warning("a peer sent a corrupt piece %d of %s (the peer is banned)",
                            alert.piece_index, info_hash)
        elif isinstance(alert, (lt.torrent_error_alert, lt.file_error_alert)):
            state.error = alert.message()
            state.finished.set()
            state.checked.set()
