"""The lease thread: workers live only while this supervisor's ZooKeeper session does.

Roughly every second the thread makes one ZooKeeper round trip on the current session
(``exists`` of the supervisor's own ephemeral node), noting ``time.monotonic()`` *before*
sending it. If the node exists and belongs to that same session, the server heard from
the session after that moment, so the session cannot expire, and the leader cannot
move the workers, before ``sent + session_timeout / 2``: that deadline is written to the
lease pipe of every worker started under this session (docs/runtime.md). A frozen,
partitioned or expired supervisor renews nothing, and its workers kill themselves.

The session timeout used is the one this supervisor asked for
(``storm.zookeeper.session.timeout``); kazoo does not expose the negotiated one. The
server may only raise it (its minSessionTimeout) or lower it to its maxSessionTimeout
(default 40 s): keep ``storm.zookeeper.session.timeout`` at or below the server's maximum.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from kazoo.client import KazooClient

from nimbus.supervisor.worker_handle import WorkerHandle

log = logging.getLogger(__name__)

RENEW_INTERVAL_S = 1.0


def session_id(zk: KazooClient) -> int | None:
    """The id of the client's current session, or None when it has none."""
    client_id = zk.client_id
    return client_id[0] if client_id else None


class LeaseKeeper:
    """Renew the leases of ``workers()`` after each good round trip; see module doc."""

    def __init__(self, zk: KazooClient, node_path: Callable[[], str], session_timeout_s: float,
                 workers: Callable[[], Iterable[WorkerHandle]],
                 may_renew: Callable[[], bool] = lambda: True,
                 interval_s: float = RENEW_INTERVAL_S):
        self._zk = zk
        self._node_path = node_path
        self._half_s = session_timeout_s / 2.0
        self._workers = workers
        self._may_renew = may_renew
        # Never longer than a quarter of the lease, so one lost round trip is not fatal.
        self._interval_s = min(interval_s, self._half_s / 4)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._last: tuple[int, float] | None = None   # (session id, deadline)
        self._thread = threading.Thread(target=self._run, name="supervisor-lease",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def current(self, session: int | None) -> float | None:
        """The newest deadline earned under ``session`` that lies in the future, so a
        worker that was just started under it gets its first lease at once."""
        with self._lock:
            if self._last is None or session is None or self._last[0] != session:
                return None
            deadline = self._last[1]
        return deadline if deadline > time.monotonic() else None

    def renew_once(self) -> float | None:
        """One round trip and, if it proves the session, one renewal; returns the
        deadline sent (None: nothing renewed)."""
        if not self._may_renew():
            return None
        before = session_id(self._zk)
        if before is None:
            return None
        sent = time.monotonic()
        try:
            # One round trip, no retry. While disconnected kazoo queues the request; a
            # late answer would still be safe (the deadline counts from ``sent``), the
            # timeout only keeps this thread responsive.
            stat = self._zk.exists_async(self._node_path()).get(timeout=self._half_s)
        except Exception as exc:
            log.debug("lease round trip failed: %s", exc)
            return None
        # The node must be there and ours: a node left by an earlier session of this
        # supervisor (a restart) proves nothing about the current one.
        if stat is None or stat.ephemeralOwner != before or session_id(self._zk) != before:
            return None
        if not self._may_renew():
            return None
        deadline = sent + self._half_s
        with self._lock:
            self._last = (before, deadline)
        for worker in list(self._workers()):
            if worker.session_id == before and not worker.ended_by:
                worker.renew(deadline)
        return deadline

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.renew_once()
            except Exception:
                log.exception("lease renewal failed")
            self._stop.wait(max(0.0, self._interval_s - (time.monotonic() - started)))
