"""Replica registrations: which hosts hold a complete copy of a topology's code.

Host-based distributors (localfs, torrent) announce a complete copy with an ephemeral
node ``<root>/code-distributor/<topology-id>/<nimbus host:port>`` whose data is the
address peers fetch from. Ephemeral nodes die with the session, so a named thread
re-creates this host's registrations after the session expires and is re-established.
"""

from __future__ import annotations

import logging
import threading

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.protocol.states import KazooState

from nimbus.cluster_state import StormClusterState

log = logging.getLogger(__name__)


class ReplicaRegistry:
    """This host's replica registrations, kept alive across session expiry."""

    def __init__(self, zk: KazooClient, zk_root: str, host: str, name: str = "replicas"):
        self._state = StormClusterState(zk, zk_root)
        self._zk = zk
        self._host = host
        self._held: dict[str, str] = {}   # topology id -> endpoint peers fetch from
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lost = False
        self._thread = threading.Thread(target=self._run, name=f"{name}-reregister",
                                        daemon=True)
        zk.add_listener(self._on_connection_state)
        self._thread.start()

    def register(self, topology_id: str, endpoint: str) -> bool:
        """Announce a complete copy; False if the topology's code node is gone."""
        with self._lock:
            self._held[topology_id] = endpoint
        return self._state.register_replica(topology_id, self._host, endpoint)

    def unregister(self, topology_id: str) -> None:
        with self._lock:
            self._held.pop(topology_id, None)
        self._state.unregister_replica(topology_id, self._host)

    def peers(self, topology_id: str) -> dict[str, str]:
        """host -> endpoint of every registered replica, this host included."""
        return self._state.replica_endpoints(topology_id)

    def count(self, topology_id: str) -> int:
        return len(self._state.replica_hosts(topology_id))

    def close(self) -> None:
        """Stop, and withdraw every registration: this host no longer serves its copies."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=10)
        self._zk.remove_listener(self._on_connection_state)
        with self._lock:
            held, self._held = list(self._held), {}
        for topology_id in held:
            try:
                self._state.unregister_replica(topology_id, self._host)
            except KazooException as exc:  # the session's end removes them anyway
                log.debug("could not withdraw replica of %s: %s", topology_id, exc)

    def _on_connection_state(self, state: str) -> None:
        # kazoo's event thread: only signal.
        if state == KazooState.LOST:
            self._lost = True
        elif state == KazooState.CONNECTED and self._lost:
            self._lost = False
            self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            if self._stop.is_set():
                return
            with self._lock:
                held = dict(self._held)
            for topology_id, endpoint in sorted(held.items()):
                try:
                    if self._state.register_replica(topology_id, self._host, endpoint):
                        log.info("re-registered replica of %s after session expiry", topology_id)
                except KazooException as exc:
                    log.warning("re-registering %s failed, retrying: %s", topology_id, exc)
                    self._stop.wait(1.0)
                    self._wake.set()
                    break
