"""The session timeout the ZooKeeper server negotiated, as opposed to the one asked for.

A server clamps the timeout a client asks for (``storm.zookeeper.session.timeout``) into
``[minSessionTimeout, maxSessionTimeout]`` (by default 2 and 20 ticks). It expires a
session after *that* long without a packet, so every safety margin derived from the
session (the leader's lease, the workers' leases) must use it.

kazoo reads the negotiated value from the server's connect reply but keeps it in a local
variable; what it returns from ``ConnectionHandler._connect`` is a read timeout of two
thirds of it. :func:`track_negotiated_timeout` wraps that method on one client to recover
the value (kazoo 2.9 to 2.11 all compute it this way; a release that changes the return
value is caught by ``tests/test_session_timeout.py`` against a real server). Until the
first connection, or if the wrap cannot be made, the configured value is used.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

from kazoo.client import KazooClient

log = logging.getLogger(__name__)

# The tracker of each client that has one (see session_timeout_of).
_TRACKERS: weakref.WeakKeyDictionary[KazooClient, SessionTimeout] = weakref.WeakKeyDictionary()

# kazoo: read_timeout = negotiated_session_timeout * 2.0 / 3.0 (milliseconds).
_READ_TIMEOUT_FRACTION = 2.0 / 3.0


class SessionTimeout:
    """The negotiated session timeout of one kazoo client, in seconds."""

    def __init__(self, configured_s: float):
        self.configured_s = float(configured_s)
        self._negotiated_s: float | None = None
        self._lock = threading.Lock()

    @property
    def negotiated_s(self) -> float | None:
        """What the server granted on the newest connection (None before one)."""
        return self._negotiated_s

    @property
    def seconds(self) -> float:
        """The timeout the server enforces: the negotiated one once known, else the
        configured one."""
        negotiated = self._negotiated_s
        return negotiated if negotiated is not None else self.configured_s

    def observe(self, negotiated_s: float) -> None:
        """Record the value of a new connection; logs it when it differs from the
        configured one (once per distinct value)."""
        with self._lock:
            before, self._negotiated_s = self._negotiated_s, negotiated_s
        if before != negotiated_s and abs(negotiated_s - self.configured_s) > 0.001:
            log.warning("ZooKeeper negotiated a session timeout of %.0f ms, not the "
                        "%.0f ms asked for (storm.zookeeper.session.timeout; the server's "
                        "min/maxSessionTimeout decide): leases and timings use %.0f ms",
                        negotiated_s * 1000, self.configured_s * 1000, negotiated_s * 1000)


def track_negotiated_timeout(zk: KazooClient, configured_s: float) -> SessionTimeout:
    """A :class:`SessionTimeout` kept current by every (re)connection of ``zk``.

    Call before ``zk.start()`` so that the first connection is seen too; on a client that
    is already connected the value is learnt at its next connection (until then the
    configured value counts)."""
    timeout = SessionTimeout(configured_s)
    connection: Any = getattr(zk, "_connection", None)
    original = getattr(connection, "_connect", None)
    if original is None:
        log.warning("this kazoo release has no ConnectionHandler._connect: the negotiated "
                    "session timeout is unknown, the configured one is used")
        return timeout

    def connect(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        try:
            read_timeout_ms = float(result[0])
        except (TypeError, ValueError, IndexError):
            return result
        if read_timeout_ms > 0:
            timeout.observe(round(read_timeout_ms / _READ_TIMEOUT_FRACTION) / 1000.0)
        return result

    connection._connect = connect
    _TRACKERS[zk] = timeout
    return timeout


def session_timeout_of(zk: KazooClient, configured_s: float) -> SessionTimeout:
    """The tracker :func:`track_negotiated_timeout` made for ``zk``, or one that only
    knows ``configured_s`` (a client made elsewhere, say by a test)."""
    return _TRACKERS.get(zk) or SessionTimeout(configured_s)
