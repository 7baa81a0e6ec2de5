"""Re-create ephemeral state after a ZooKeeper session expires and a new one begins.

Ephemeral nodes (a nimbus's registration, replica registrations) die with their session.
kazoo reports LOST, then CONNECTED once a new session exists; this runs an action in a
named loop (``<name>-renewal``) at that moment (never on kazoo's event thread), retrying
while ZooKeeper errors persist.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.protocol.states import KazooState

from nimbus.background_loop import BackgroundLoop

log = logging.getLogger(__name__)


class SessionRenewal:
    """Call ``action()`` after every session expiry, once reconnected; see module doc."""

    RETRY_PAUSE_S = 1.0

    def __init__(self, zk: KazooClient, name: str, action: Callable[[], None]):
        self._zk = zk
        self._action = action
        self._lost = False
        # No period: it runs only when a new session follows a lost one.
        self._loop = BackgroundLoop(f"{name}-renewal", self._renew, period=None,
                                    wait_first=True)
        zk.add_listener(self._on_connection_state)
        self._loop.start()

    def close(self) -> None:
        """Stop renewing (after an action under way) and stop listening."""
        self._loop.stop(join_timeout=10)
        self._zk.remove_listener(self._on_connection_state)

    def _on_connection_state(self, state: str) -> None:
        # kazoo's event thread: only signal.
        if state == KazooState.LOST:
            self._lost = True
        elif state == KazooState.CONNECTED and self._lost:
            self._lost = False
            self._loop.wake()

    def _renew(self) -> None:
        try:
            self._action()
        except KazooException as exc:
            log.warning("%s after session expiry failed, retrying: %s", self._loop.name, exc)
            if not self._loop.sleep(self.RETRY_PAUSE_S):
                self._loop.wake()
