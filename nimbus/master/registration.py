"""A nimbus's registration (``/nimbuses/<host:port>``): step 1 of its cycle.

The node is ephemeral, so it dies with the session. :meth:`NimbusRegistration.ensure`
writes it when the session it was written on is no longer the client's, so the first
step of the cycle after a lost session registers again, before the elector queues anew.

A nimbus started again after a kill -9 (or a crash) first removes the lock node its
previous process left, when that process is certainly dead
(:mod:`nimbus.state.incarnation`): otherwise a node at the head of the queue keeps every
nimbus from leading until the dead session expires.
"""

from __future__ import annotations

import logging

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from nimbus import __version__
from nimbus.master.elector import LeaderElector
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.incarnation import Incarnation
from nimbus.state.records import NimbusInfo

log = logging.getLogger("nimbus.master.daemon")


class NimbusRegistration:
    """Register ``host:port`` in ``state`` with ``elector``'s lock token."""

    def __init__(self, zk: KazooClient, state: StormClusterState, elector: LeaderElector,
                 host: str, port: int, started_at: float):
        self._zk = zk
        self._state = state
        self._elector = elector
        self._host = host
        self._port = port
        self._started_at = started_at
        self._session: int | None = None   # the session the node was written on

    @property
    def address(self) -> str:
        return f"{self._host}:{self._port}"

    def ensure(self) -> None:
        """Register unless already registered on the current session; a ZooKeeper
        error is raised (the cycle tries again)."""
        session = self._zk.client_id[0] if self._zk.client_id else None
        if session is None or session == self._session:
            return
        renewed = self._session is not None
        me = Incarnation.of_process()
        self._state.register_nimbus(NimbusInfo(
            host=self._host, port=self._port, start_time_secs=int(self._started_at),
            version=__version__, boot_id=me.boot_id, pid_namespace=me.pid_namespace,
            pid=me.pid, pid_started_ticks=me.started_ticks,
            lock_token=self._elector.token))
        self._session = session
        if renewed:
            log.info("re-registered %s after session expiry", self.address)

    def remove_dead_predecessor(self) -> None:
        """Remove the lock node this nimbus's previous process left, if that process is
        certainly dead (see the module doc); at start, before registering."""
        try:
            previous = [n for n in self._state.nimbuses()
                        if (n.host, n.port) == (self._host, self._port)]
            if not previous or not previous[0].lock_token:
                return
            before = previous[0]
            dead = Incarnation(before.boot_id, before.pid_namespace, before.pid,
                               before.pid_started_ticks)
            if not dead.is_dead():
                if dead.known:
                    log.info("the previous registration of %s (pid %d) is not known to "
                             "be dead here: its lock node is left to expire with its "
                             "session", self.address, before.pid)
                return
            removed = self._elector.remove_nodes_of(before.lock_token)
        except KazooException as exc:
            log.warning("could not look for the lock node of %s's previous process: %s; "
                        "it expires with that process's session", self.address, exc)
            return
        if removed:
            log.warning("removed leader-lock node %s of %s's previous process (pid %d, no "
                        "longer running) instead of waiting for its session to expire",
                        ", ".join(removed), self.address, before.pid)
