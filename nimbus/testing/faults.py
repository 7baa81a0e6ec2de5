"""Fault injection against a real ZooKeeper server (the technique of kazoo's harness)."""

from __future__ import annotations

import threading

from kazoo.client import KazooClient
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
