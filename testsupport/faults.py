"""Fault injection against a real ZooKeeper server (the technique of kazoo's harness).

* :func:`expire_session`: the session ends for real, its ephemeral nodes go (LOST).
* :func:`lose_connection`: the TCP connection drops, the session survives (SUSPENDED).
* :class:`ObservedLock` and :func:`run_until_done_or_blocked`: run a second thread inside
  a critical section, to drive a race into one exact interleaving.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from kazoo.client import KazooClient
from kazoo.protocol.connection import _CONNECTION_DROP
from kazoo.protocol.states import KazooState


def expire_session(zk: KazooClient, hosts: str, timeout_s: float = 30.0) -> None:
    """Expire ``zk``'s session for real and wait until ``zk`` has seen it (LOST).

    A second client joins the same session with its id and password, then closes it;
    ZooKeeper then ends the session, deleting its ephemeral nodes, exactly as after a
    timeout, and ``zk`` learns this when it next talks to the server.
    """
    lost = threading.Event()

    def listener(state: str) -> bool:
        if state == KazooState.LOST:
            lost.set()
            return True  # remove this listener
        return False

    zk.add_listener(listener)
    session_id, password = zk.client_id
    twin = KazooClient(hosts=hosts, client_id=(session_id, password),
                       timeout=zk._session_timeout / 1000)
    twin.start(timeout=timeout_s)
    twin.stop()
    twin.close()
    # Nudge the original client so that it notices at once rather than at its next ping.
    try:
        zk.exists("/")
    except Exception:
        pass
    if not lost.wait(timeout_s):
        raise TimeoutError("the expired session was not reported as LOST")


def lose_connection(zk: KazooClient, timeout_s: float = 15.0) -> None:
    """Drop ``zk``'s TCP connection (the session survives) and wait until it reconnects.

    kazoo reports SUSPENDED at once and CONNECTED when it has reconnected to the same
    session, as after a network blip shorter than the session timeout. Listeners added
    before this call see SUSPENDED before this function returns.
    """
    suspended = threading.Event()
    reconnected = threading.Event()

    def listener(state: str) -> bool:
        if state == KazooState.SUSPENDED:
            suspended.set()
        elif state == KazooState.CONNECTED and suspended.is_set():
            reconnected.set()
            return True  # remove this listener
        return False

    zk.add_listener(listener)
    # The technique of kazoo's own harness: ask the connection thread to drop the socket.
    zk._call(_CONNECTION_DROP, None)
    if not suspended.wait(timeout_s):
        zk.remove_listener(listener)
        raise TimeoutError("the dropped connection was not reported as SUSPENDED")
    if not reconnected.wait(timeout_s):
        raise TimeoutError("the client did not reconnect after the dropped connection")


class ObservedLock:
    """A lock (re-entrant unless one is given) that notes when a thread has to wait for it.

    Tests put it in place of a component's lock to force an interleaving: inside a critical
    section they start a second thread with :func:`run_until_done_or_blocked`, which
    returns once that thread has either finished (nothing held it back) or is waiting
    for this lock.
    """

    def __init__(self, lock: threading.Lock | threading.RLock | None = None):
        self._lock = lock if lock is not None else threading.RLock()
        self.contended = threading.Event()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(blocking=False):
            return True
        if not blocking:
            return False
        self.contended.set()
        return self._lock.acquire(True, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def run_until_done_or_blocked(target: Callable[[], object], lock: ObservedLock, name: str,
                              timeout_s: float = 10.0) -> threading.Thread:
    """Run ``target`` on a new thread named ``name``; return it once ``target`` has
    returned or the thread waits for ``lock``. The caller joins the thread."""
    done = threading.Event()

    def run() -> None:
        try:
            target()
        finally:
            done.set()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not (done.is_set() or lock.contended.is_set()):
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{name} neither finished nor waited for the lock "
                               f"within {timeout_s}s")
        done.wait(0.01)
    return thread
