"""The lease thread: workers live only while this supervisor's ZooKeeper session does,
and only while their slot is still assigned to them.

Roughly every second the thread sends, pipelined on the current session, one ``exists``
of the supervisor's own ephemeral node and one ``get`` of the assignment of every
topology it runs a worker of, noting ``time.monotonic()`` *before* sending them. If the
node exists and belongs to that same session, the server heard from the session after
that moment, so the session cannot expire, and the leader cannot move the workers, before
``sent + T / 2`` (``T`` the negotiated session timeout). A worker is renewed up to that
deadline only if the assignment the server answered with still places it (its
``worker-<i>`` on this supervisor and port): an answer given after ``sent`` shows the
assignment unchanged at a moment after ``sent``. So a worker's lease ends at most
``T / 2`` after the leader changed its assignment, whatever this supervisor's reconcile
loop is doing, and the leader's scheduler waits that long before it places the work
anywhere else (docs/runtime.md, "A worker runs only while it is assigned"). A frozen,
partitioned or expired supervisor renews nothing, and its workers kill themselves.

A newly started worker gets its first lease from the next round trip (the supervisor
asks for one at once): it starts nothing before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from nimbus.background_loop import BackgroundLoop
from nimbus.supervisor.worker_handle import WorkerHandle

log = logging.getLogger(__name__)

RENEW_INTERVAL_S = 1.0


def session_id(zk: KazooClient) -> int | None:
    """The id of the client's current session, or None when it has none."""
    client_id = zk.client_id
    return client_id[0] if client_id else None


class LeaseKeeper:
    """Renew the leases of ``workers()`` after each good round trip; see module doc.

    ``assignment_path(topology_id)`` is the node of a topology's assignment, and
    ``holds(worker, data)`` tells whether the assignment ``data`` (None: no node) still
    places ``worker``. ``on_unassigned(worker)`` is called (from this thread) when a round
    trip showed that it no longer does, so that the supervisor stops it at once.
    ``session_timeout_s()`` is the negotiated session timeout, read at every renewal.
    """

    def __init__(self, zk: KazooClient, node_path: Callable[[], str],
                 session_timeout_s: Callable[[], float],
                 workers: Callable[[], Iterable[WorkerHandle]],
                 assignment_path: Callable[[str], str],
                 holds: Callable[[WorkerHandle, bytes | None], bool],
                 may_renew: Callable[[], bool] = lambda: True,
                 on_unassigned: Callable[[WorkerHandle], None] = lambda worker: None,
                 interval_s: float = RENEW_INTERVAL_S):
        self._zk = zk
        self._node_path = node_path
        self._session_timeout_s = session_timeout_s
        self._workers = workers
        self._assignment_path = assignment_path
        self._holds = holds
        self._may_renew = may_renew
        self._on_unassigned = on_unassigned
        self._max_interval_s = interval_s
        self._round_started = time.monotonic()
        self._loop = BackgroundLoop("supervisor-lease", self._round,
                                    period=self._until_next_round)

    @property
    def half_s(self) -> float:
        """The lease one round trip earns: half the negotiated session timeout."""
        return self._session_timeout_s() / 2.0

    @property
    def interval_s(self) -> float:
        # Never longer than a quarter of the lease, so one lost round trip is not fatal.
        return min(self._max_interval_s, self.half_s / 4)

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop(join_timeout=10)

    def wake(self) -> None:
        """Renew now: a worker was just started and waits for its first lease."""
        self._loop.wake()

    def renew_once(self) -> float | None:
        """One round trip and, if it proves the session, one renewal of every worker whose
        assignment still holds; returns the deadline sent (None: nothing renewed)."""
        if not self._may_renew():
            return None
        before = session_id(self._zk)
        if before is None:
            return None
        half_s = self.half_s
        workers = [w for w in list(self._workers())
                   if w.session_id == before and not w.ended_by]
        sent = time.monotonic()
        try:
            # One pipelined round trip, no retry. While disconnected kazoo queues the
            # requests; a late answer would still be safe (the deadline counts from
            # ``sent``), the timeout only keeps this thread responsive.
            node = self._zk.exists_async(self._node_path())
            assignments = {t: self._zk.get_async(self._assignment_path(t))
                           for t in sorted({w.topology_id for w in workers})}
            stat = node.get(timeout=half_s)
            data = {t: _data_or_none(r, half_s) for t, r in assignments.items()}
        except Exception as exc:
            log.debug("lease round trip failed: %s", exc)
            return None
        # The node must be there and ours: a node left by an earlier session of this
        # supervisor (a restart) proves nothing about the current one.
        if stat is None or stat.ephemeralOwner != before or session_id(self._zk) != before:
            return None
        if not self._may_renew():
            return None
        deadline = sent + half_s
        for worker in workers:
            if worker.ended_by:
                continue
            if self._holds(worker, data[worker.topology_id]):
                worker.renew(deadline)
            else:
                self._on_unassigned(worker)
        return deadline

    def _round(self) -> None:
        self._round_started = time.monotonic()
        self.renew_once()  # an unexpected error is logged by the loop; the next round runs

    def _until_next_round(self) -> float:
        # A round every interval_s, counted from when the previous one began.
        return max(0.0, self.interval_s - (time.monotonic() - self._round_started))


def _data_or_none(result: object, timeout_s: float) -> bytes | None:
    """The data of a ``get_async`` answer; None when the node does not exist."""
    try:
        data, _stat = result.get(timeout=timeout_s)  # type: ignore[attr-defined]
    except NoNodeError:
        return None
    return data
