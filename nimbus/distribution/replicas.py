"""Replica registrations: which hosts hold a complete copy of a topology's code.

Host-based distributors (localfs, torrent) announce a complete copy with an ephemeral
node ``<root>/code-distributor/<topology-id>/<nimbus host:port>`` whose data is the
address peers fetch from. Ephemeral nodes die with the session, so a named thread
re-creates this host's registrations after the session expires and is re-established
(see ``nimbus.state.session_renewal``).
"""

from __future__ import annotations

import logging
import threading

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from nimbus.state.cluster_state import StormClusterState
from nimbus.state.session_renewal import SessionRenewal

log = logging.getLogger(__name__)


class ReplicaReader:
    """The replica registrations, read only: what a host that holds no registered copy
    (a supervisor) looks at to find where to fetch from."""

    def __init__(self, zk: KazooClient, zk_root: str):
        self._state = StormClusterState(zk, zk_root)

    def peers(self, topology_id: str) -> dict[str, str]:
        """host -> endpoint of every registered replica."""
        return self._state.replica_endpoints(topology_id)

    def count(self, topology_id: str) -> int:
        return len(self._state.replica_hosts(topology_id))


def supervisor_rank(zk: KazooClient, zk_root: str, supervisor_id: str,
                    topology_id: str) -> int | None:
    """``supervisor_id``'s index among the supervisors the topology's Assignment places
    work on (sorted by id), or None when it is not among them or the Assignment cannot
    be read: a way for a fleet to spread its downloads evenly over the sources."""
    try:
        assignment = StormClusterState(zk, zk_root).assignment_info(topology_id)
    except Exception as exc:  # a hint only: an unreadable Assignment spreads nothing
        log.debug("no Assignment of %s to spread by: %s", topology_id, exc)
        return None
    if assignment is None:
        return None
    nodes = sorted({slot[0] for slot in assignment.executor_node_port.values()})
    return nodes.index(supervisor_id) if supervisor_id in nodes else None


class ReplicaRegistry:
    """This host's replica registrations, kept alive across session expiry."""

    def __init__(self, zk: KazooClient, zk_root: str, host: str, name: str = "replicas"):
        self._state = StormClusterState(zk, zk_root)
        self._reader = ReplicaReader(zk, zk_root)
        self._host = host
        self._held: dict[str, str] = {}   # topology id -> endpoint peers fetch from
        self._lock = threading.Lock()
        self._renewal = SessionRenewal(zk, name, self._register_all)

    def register(self, topology_id: str, endpoint: str) -> bool:
        """Announce a complete copy; False if the topology's code node is gone."""
        with self._lock:
            self._held[topology_id] = endpoint
        return self._state.zk.retry(self._state.register_replica, topology_id, self._host,
                                    endpoint)

    def unregister(self, topology_id: str) -> None:
        with self._lock:
            self._held.pop(topology_id, None)
        self._state.unregister_replica(topology_id, self._host)

    def peers(self, topology_id: str) -> dict[str, str]:
        """host -> endpoint of every registered replica, this host included."""
        return self._reader.peers(topology_id)

    def count(self, topology_id: str) -> int:
        return self._reader.count(topology_id)

    def close(self) -> None:
        """Stop, and withdraw every registration: this host no longer serves its copies."""
        self._renewal.close()
        with self._lock:
            held, self._held = list(self._held), {}
        for topology_id in held:
            try:
                self._state.unregister_replica(topology_id, self._host)
            except KazooException as exc:  # the session's end removes them anyway
                log.debug("could not withdraw replica of %s: %s", topology_id, exc)

    def _register_all(self) -> None:
        with self._lock:
            held = sorted(self._held)
        for topology_id in held:
            with self._lock:  # withdrawn meanwhile (e.g. a corrupt copy): keep it so
                endpoint = self._held.get(topology_id)
                if endpoint is not None and self._state.register_replica(
                        topology_id, self._host, endpoint):
                    log.info("re-registered replica of %s after session expiry", topology_id)
