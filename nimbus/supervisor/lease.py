"""The lease thread: workers live only while this supervisor's ZooKeeper session does,
and only while their slot is still assigned to them.

Every ``L / 8`` (at most 1 s; ``L`` the lease, below) the thread sends, pipelined on the
current session, one ``sync``, one ``exists`` of the supervisor's own ephemeral node and
one ``get`` of the assignment of every topology it runs a worker of, noting
``time.monotonic()`` *before* sending them. The ``sync`` goes through the ensemble's
leader, so a server cut off from its quorum (which may go on answering reads for
``syncLimit`` ticks) cannot answer the round; the reads after it are answered after it.
If the node exists and belongs to that same session, the ensemble heard from the session
after that moment, so the session cannot expire, and the leader cannot move the workers,
before ``sent + L``, where ``L`` is
:data:`~nimbus.timing.WORKER_LEASE_FRACTION` (2/3) of ``T``, the negotiated session
timeout. A worker is renewed up to that deadline only if the assignment the server
answered with still places it (its ``worker-<i>`` on this supervisor and port): an answer
given after ``sent`` shows the assignment unchanged at a moment after ``sent``. So a
worker's lease ends at most ``L`` after the leader changed its assignment, whatever this
supervisor's reconcile loop is doing, and the leader's scheduler waits that long before it
places the work anywhere else (docs/runtime.md, "A worker runs only while it is
assigned"). A frozen, partitioned or expired supervisor renews nothing, and its workers
kill themselves.

Rounds do not wait for each other: a new one is sent every interval whether or not the
earlier ones were answered (at most :data:`MAX_IN_FLIGHT` at once), and each answer is
applied as it comes, in the order sent. So a slow ZooKeeper (a loaded server, a long
link) keeps the leases as long as a round trip takes less than ``L`` minus the interval;
with each round waiting for the one before, it had to take less than half of ``L``.

A newly started worker gets its first lease from the next round trip (the supervisor
asks for one at once): it starts nothing before.

A worker whose lease ran out froze itself where it could (nimbus/worker/lease.py). A
renewal thaws it only if the assignment's ``mzxid`` is the one its last renewal read: no
write to the assignment came in between, so its work cannot have moved away and back
while it was frozen (a running worker could not see that happen: its lease would have
killed it). Otherwise it is killed, and its slot starts it afresh. The proof holds across
sessions: a worker kept frozen through a lost session, or taken over frozen by the
supervisor's next process, is thawed by the same rule (nimbus/supervisor/adoption.py,
nimbus/supervisor/lease_record.py).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from nimbus.background_loop import BackgroundLoop
from nimbus.supervisor.worker_handle import WorkerHandle
from nimbus.timing import WORKER_LEASE_FRACTION

log = logging.getLogger(__name__)

RENEW_INTERVAL_S = 1.0
#: Rounds sent and not yet answered, at most: beyond that (a connection that answers
#: nothing, which the connection watchdog will drop) no more are sent.
MAX_IN_FLIGHT = 16


def session_id(zk: KazooClient) -> int | None:
    """The id of the client's current session, or None when it has none."""
    client_id = zk.client_id
    return client_id[0] if client_id else None


@dataclass
class _Round:
    """One pipelined round trip: what was asked, when, on which session, for whom."""

    sent: float
    session: int
    workers: list[WorkerHandle]
    synced: Any                    # kazoo's IAsyncResult of the sync
    node: Any                      # kazoo's IAsyncResult of the exists
    assignments: dict[str, Any]    # topology id -> IAsyncResult of its get
    answered: threading.Event = field(default_factory=threading.Event)
    waiting: int = 0               # answers still to come (kazoo's completion thread)


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
        self._answers: queue.SimpleQueue[_Round] = queue.SimpleQueue()
        self._in_flight = 0         # the lease thread's rounds sent and not yet applied
        self._last_applied = 0.0    # ``sent`` of the newest round applied
        self._next_round = time.monotonic()
        self._round_now = threading.Event()
        self._loop = BackgroundLoop("supervisor-lease", self._tick, period=self._until_next)

    @property
    def length_s(self) -> float:
        """The lease one round trip earns: WORKER_LEASE_FRACTION of the negotiated
        session timeout, counted from when the round was sent."""
        return WORKER_LEASE_FRACTION * self._session_timeout_s()

    @property
    def interval_s(self) -> float:
        # Several rounds per lease, so that a late or lost answer is not fatal.
        return min(self._max_interval_s, self.length_s / 8)

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop(join_timeout=10)

    def wake(self) -> None:
        """Renew now: a worker was just started and waits for its first lease."""
        self._round_now.set()
        self._loop.wake()

    def renew_once(self, wait_s: float | None = None) -> float | None:
        """One round trip, waited for (up to ``wait_s``, default the lease's length),
        and, if it proves the session, one renewal of every worker whose assignment
        still holds; returns the deadline sent (None: nothing renewed). For a keeper that
        was not started: the lease thread applies its own rounds."""
        sent = self._send(queued=False)
        if sent is None:
            return None
        if not sent.answered.wait(self.length_s if wait_s is None else wait_s):
            return None
        return self._apply(sent)

    # -- the lease thread ------------------------------------------------------------------
    def _tick(self) -> None:
        while True:  # every answer that came, in the order sent
            try:
                answered = self._answers.get_nowait()
            except queue.Empty:
                break
            self._in_flight -= 1
            self._apply(answered)
        now = time.monotonic()
        if self._round_now.is_set() or now >= self._next_round:
            self._next_round = now + self.interval_s
            # At the cap, a round asked for (a new worker's first lease) is sent when an
            # answer makes room: answers wake this loop.
            if self._in_flight < MAX_IN_FLIGHT:
                self._round_now.clear()
                if self._send(queued=True) is not None:
                    self._in_flight += 1

    def _until_next(self) -> float:
        return max(0.0, self._next_round - time.monotonic())

    def _send(self, queued: bool) -> _Round | None:
        """Send one round (not waiting for it). ``queued``: its answer goes to the lease
        thread; otherwise the caller waits on ``answered`` and applies it."""
        if not self._may_renew():
            return None
        session = session_id(self._zk)
        if session is None:
            return None
        workers = [w for w in list(self._workers())
                   if w.session_id == session and not w.ended_by]
        sent = time.monotonic()
        try:
            # No retry: while disconnected kazoo queues the requests, and fails them when
            # the connection drops. A late answer is still safe: the deadline counts
            # from ``sent``.
            synced = self._zk.sync_async(self._node_path())
            node = self._zk.exists_async(self._node_path())
            assignments = {t: self._zk.get_async(self._assignment_path(t))
                           for t in sorted({w.topology_id for w in workers})}
        except Exception as exc:
            log.debug("lease round trip not sent: %s", exc)
            return None
        sent_round = _Round(sent, session, workers, synced, node, assignments)
        results = [synced, node, *assignments.values()]
        sent_round.waiting = len(results)
        lock = threading.Lock()

        def answer(_result: object) -> None:  # kazoo's completion thread
            with lock:
                sent_round.waiting -= 1
                if sent_round.waiting:
                    return
            sent_round.answered.set()
            if queued:
                self._answers.put(sent_round)
                self._loop.wake()

        for result in results:
            result.rawlink(answer)
        return sent_round

    def _apply(self, answered: _Round) -> float | None:
        """Renew the workers a round's answer proves; returns the deadline (None: none)."""
        try:
            answered.synced.get_nowait()  # raises if the ensemble's leader did not answer
            stat = answered.node.get_nowait()
            found = {t: _data_and_version(r) for t, r in answered.assignments.items()}
        except Exception as exc:
            log.debug("lease round trip failed: %s", exc)
            return None
        # The node must be there and ours: a node left by an earlier session of this
        # supervisor (a restart) proves nothing about the current one.
        session = answered.session
        if stat is None or stat.ephemeralOwner != session or session_id(self._zk) != session:
            return None
        if not self._may_renew() or answered.sent < self._last_applied:
            return None
        self._last_applied = answered.sent
        deadline = answered.sent + self.length_s
        for worker in answered.workers:
            if worker.ended_by:
                continue
            data, version = found[worker.topology_id]
            if self._holds(worker, data):
                worker.renew(deadline, version)
            else:
                self._on_unassigned(worker)
        return deadline


def _data_and_version(result: object) -> tuple[bytes | None, int | None]:
    """The data of an answered ``get_async`` and the zxid of the write that made it
    (``mzxid``: every write to the node changes it, a delete and re-create too); (None,
    None) when the node does not exist."""
    try:
        data, stat = result.get_nowait()  # type: ignore[attr-defined]
    except NoNodeError:
        return None, None
    return data, stat.mzxid
