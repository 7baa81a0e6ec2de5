"""Re-create ephemeral state after a ZooKeeper session expires and a new one begins.

Ephemeral nodes (a nimbus's registration, replica registrations) die with their session.
kazoo reports LOST, then CONNECTED once a new session exists; this runs an action in a
named thread at that moment (never on kazoo's event thread), retrying while ZooKeeper
errors persist.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.protocol.states import KazooState

log = logging.getLogger(__name__)


class SessionRenewal:
    """Call ``action()`` after every session expiry, once reconnected; see module doc."""

    RETRY_PAUSE_S = 1.0

    def __init__(self, zk: KazooClient, name: str, action: Callable[[], None]):
        self._zk = zk
        self._action = action
        self._lost = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{name}-renewal", daemon=True)
        zk.add_listener(self._on_connection_state)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=10)
        self._zk.remove_listener(self._on_connection_state)

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
            try:
                self._action()
            except KazooException as exc:
                log.warning("%s after session expiry failed, retrying: %s",
                            self._thread.name, exc)
                self._stop.wait(self.RETRY_PAUSE_S)
                self._wake.set()
