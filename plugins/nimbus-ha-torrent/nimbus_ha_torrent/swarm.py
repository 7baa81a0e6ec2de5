"""A libtorrent session for a closed swarm, and a named thread that pumps its alerts.

Closed means: no trackers, no DHT, no local peer discovery, no UPnP or NAT-PMP, listening
only on the configured interface (127.0.0.1 by default). Peers are added explicitly, from
the replica registrations in ZooKeeper. libtorrent checks every piece against the SHA-1
in the .torrent before it counts it (and hash-checks files already on disk when a
torrent is added), so a finished or seeding torrent is a verified copy.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import libtorrent as lt

log = logging.getLogger(__name__)

ALERT_MASK = (lt.alert_category.error | lt.alert_category.status
              | lt.alert_category.storage | lt.alert_category.peer | lt.alert_category.connect)


def closed_swarm_settings(interface: str, port: int) -> dict:
    """Session settings: one listening address, no discovery of any kind."""
    return {
        "listen_interfaces": f"{interface}:{port}",
        "outgoing_interfaces": "",
        "enable_dht": False, "enable_lsd": False, "enable_upnp": False,
        "enable_natpmp": False, "dht_bootstrap_nodes": "", "enable_ip_notifier": False,
        # uTP's congestion control throttles loopback transfers; TCP only.
        "enable_outgoing_utp": False, "enable_incoming_utp": False,
        "enable_outgoing_tcp": True, "enable_incoming_tcp": True,
        # Every peer of a test cluster is 127.0.0.1.
        "allow_multiple_connections_per_ip": True,
        "upload_rate_limit": 0, "download_rate_limit": 0,
        # Choking rations upload slots among strangers; in a closed swarm of a few nimbus
        # hosts it only starves a downloader (the default 8 slots are shared by every
        # torrent of the session), so every peer is unchoked.
        "unchoke_slots_limit": -1,
        "ignore_limits_on_local_network": True,
        "connections_limit": 400, "auto_manage_startup": 0,
        # Fail loudly on a busy port instead of silently listening elsewhere.
        "max_retry_port_bind": 0, "listen_system_port_fallback": False,
        "alert_mask": int(ALERT_MASK),
        "user_agent": "nimbus-ha-torrent",
    }


@dataclass
class TorrentState:
    """What the alert thread learned about one torrent."""

    finished: threading.Event = field(default_factory=threading.Event)
    checked: threading.Event = field(default_factory=threading.Event)
    flushed: threading.Event = field(default_factory=threading.Event)
    hash_failures: int = 0
    error: str | None = None


class Swarm:
    """One libtorrent session per nimbus; see the module docstring."""

    def __init__(self, interface: str, port: int,
                 on_corrupt_seed: Callable[[str], None] = lambda info_hash: None):
        self.session = lt.session(closed_swarm_settings(interface, port))
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
                if isinstance(alert, lt.listen_succeeded_alert) and \
                        alert.socket_type == lt.socket_type_t.tcp:
                    return self.session.listen_port()
            self.session.wait_for_alert(100)
        raise RuntimeError("BitTorrent session did not start listening")

    def add(self, torrent: bytes, save_path: str) -> tuple[object, TorrentState]:
        """Add a torrent; libtorrent checks any files already under ``save_path``."""
        params = lt.load_torrent_buffer(torrent)
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
        state = TorrentState()
        with self._lock:
            self._states[info_hash] = state
        return self.session.add_torrent(params), state

    def flush(self, handle: object, state: TorrentState, timeout_s: float = 60.0) -> None:
        """Write every downloaded block to disk; "finished" does not mean "on disk"."""
        state.flushed.clear()
        handle.flush_cache()
        if not state.flushed.wait(timeout_s):
            raise RuntimeError("libtorrent did not flush the downloaded data to disk")

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
        if state is None:
            return
        if isinstance(alert, lt.torrent_finished_alert):
            state.finished.set()
        elif isinstance(alert, lt.torrent_checked_alert):
            state.checked.set()
        elif isinstance(alert, lt.cache_flushed_alert):
            state.flushed.set()
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
