"""The leader's lease: leadership that expires unless ZooKeeper keeps answering.

kazoo's CONNECTED state is no proof that the session lives. kazoo counts every request it
*sends* as a sign of life, while the server expires a session ``T`` (the negotiated
session timeout) after the last packet it *received*. Over a silent partition (packets
dropped, sockets left open) a nimbus whose clients keep asking it things looks connected
for long after its lock node is gone and another nimbus leads.

So a nimbus leads only while it holds a lease, earned by round trips:

* every ``T / 10`` (at most 1 s) the lease thread sends ``sync`` and ``exists`` of this
  nimbus's lock node, pipelined, noting ``time.monotonic()`` *before* sending them; the
  ``sync`` goes through the ensemble's leader, so a server cut off from its quorum (which
  may answer reads for ``syncLimit`` ticks more) cannot answer the round;
* an answer that shows the node owned by the current session proves that the server
  heard the session at or after that moment, so the session cannot expire, and no other
  nimbus can take the lock, before ``sent + T``;
* the lease then runs until ``sent + FRACTION * T`` (FRACTION = 2/3). The third left
  over absorbs a late wake-up of this thread and the time the leadership callback takes.

Only answers renew the lease: requests that go unanswered (client reads on the same
session, say) cannot keep it. When the lease runs out the elector steps down at once, at
the latest ``FRACTION * T`` after the last answer, which is before the session can have
expired; an answer that comes back later (a blip, not an expiry) renews it and the
elector may lead again, since its node never left the head of the queue.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kazoo.client import KazooClient

from nimbus.background_loop import BackgroundLoop
from nimbus.state.session_timeout import SessionTimeout

log = logging.getLogger(__name__)

#: The lease's share of the negotiated session timeout.
FRACTION = 2.0 / 3.0


def _session(zk: KazooClient) -> int | None:
    client_id = zk.client_id
    return client_id[0] if client_id else None


class LeaderLease:
    """Prove ``node()`` (this nimbus's lock node) again and again; see the module doc.

    ``on_change(valid)`` runs on the lease thread when the lease runs out (False) and when
    an answer renews a lease that had run out or was never held (True).
    """

    def __init__(self, zk: KazooClient, timeout: SessionTimeout,
                 node: Callable[[], str | None],
                 on_change: Callable[[bool], None] = lambda valid: None,
                 clock: Callable[[], float] = time.monotonic,
                 probe: Callable[[], str] | None = None):
        """``probe()`` names a node to ask about while ``node()`` is None (a nimbus that
        is not queued): its answers earn no lease, but they keep :meth:`silent_for`
        current, which tells callers whether ZooKeeper answers at all."""
        self._zk = zk
        self._probe = probe
        self._timeout = timeout
        self._node = node
        self._on_change = on_change
        self._clock = clock
        self._lock = threading.Lock()
        self._proven: str | None = None   # the node the deadline was earned for
        self._deadline = 0.0
        self._valid_reported = False
        self._last_answer_at: float | None = None
        self._renew_now = threading.Event()
        self._next_renewal = clock()
        self._loop = BackgroundLoop("leader-lease", self._tick, period=self._until_next)

    # -- what callers ask ------------------------------------------------------------------
    def valid(self, node: str | None) -> bool:
        """Whether ``node`` holds a lease that has not run out."""
        if node is None:
            return False
        with self._lock:
            return self._proven == node and self._clock() < self._deadline

    @property
    def length_s(self) -> float:
        """How long one answer keeps the lease: FRACTION of the negotiated timeout."""
        return FRACTION * self._timeout.seconds

    def silent_for(self) -> float | None:
        """Seconds since the last answer that renewed the lease (None: none yet)."""
        last = self._last_answer_at
        return None if last is None else self._clock() - last

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop(join_timeout=10)

    def wake(self) -> None:
        """Renew now (say, a node was just created)."""
        self._renew_now.set()
        self._loop.wake()

    @property
    def interval_s(self) -> float:
        return min(1.0, max(0.05, self._timeout.seconds / 10.0))

    # -- renewing --------------------------------------------------------------------------
    def renew_once(self, wait_s: float | None = None) -> bool:
        """One round trip, waiting up to ``wait_s`` (default: the lease's length) for
        the answer; returns whether that answer renewed the lease. An answer that comes
        later still renews it (it counts from when it was sent). Thread-safe: the elector
        calls this directly before it claims leadership."""
        node = self._node()
        session = _session(self._zk)
        if session is None:
            return False
        if node is None:
            self._ask_only()
            return False
        sent = self._clock()
        renewed = threading.Event()

        def answered(result: object) -> None:  # kazoo's completion thread
            if self._answer(node, session, sent, result, synced):
                renewed.set()
            self._loop.wake()  # the lease loop reports a change

        try:
            # No retry: while a partition lasts kazoo just queues the requests. Answers
            # come in the order sent: the sync's is in when the exists' is.
            synced = self._zk.sync_async(node)
            self._zk.exists_async(node).rawlink(answered)
        except Exception as exc:
            log.debug("leader lease request not sent: %s", exc)
            return False
        return renewed.wait(self.length_s if wait_s is None else wait_s)

    def _ask_only(self) -> None:
        if self._probe is None:
            return

        def answered(result: object) -> None:
            try:
                result.get_nowait()  # type: ignore[attr-defined]
            except Exception:
                return
            self._last_answer_at = self._clock()

        try:
            self._zk.exists_async(self._probe()).rawlink(answered)
        except Exception as exc:
            log.debug("ZooKeeper probe not sent: %s", exc)

    def answering(self) -> bool:
        """Whether ZooKeeper answered within the last lease length (no ZooKeeper call)."""
        silent = self.silent_for()
        return silent is not None and silent < self.length_s

    def _answer(self, node: str, session: int, sent: float, result: object,
                synced: object) -> bool:
        try:
            synced.get_nowait()  # type: ignore[attr-defined]  # raises: not answered, or failed
            stat = result.get_nowait()  # type: ignore[attr-defined]
        except Exception as exc:
            log.debug("leader lease round trip failed: %s", exc)
            return False
        if stat is None or stat.ephemeralOwner != session or _session(self._zk) != session:
            with self._lock:  # the node is gone, or belongs to a dead session
                if self._proven == node:
                    self._deadline = 0.0
            return False
        deadline = sent + self.length_s
        with self._lock:
            if self._proven != node or deadline > self._deadline:
                self._proven, self._deadline = node, deadline
            self._last_answer_at = self._clock()
        return True

    def _tick(self) -> None:
        """One step of the ``leader-lease`` loop: renew when due, report any change."""
        if self._renew_now.is_set() or self._clock() >= self._next_renewal:
            self._renew_now.clear()
            self._next_renewal = self._clock() + self.interval_s
            try:
                self.renew_once(wait_s=0)  # the answer arrives through the callback
            except Exception:
                log.exception("leader lease renewal failed")
        self._report()

    def _until_next(self) -> float:
        # Wake at the next renewal, at an answer, or when the lease runs out, whichever
        # is first, so that an expiry is acted on at once.
        return max(0.0, self._until_deadline(self._next_renewal - self._clock()))

    def _until_deadline(self, at_most: float) -> float:
        with self._lock:
            left = self._deadline - self._clock()
        return min(at_most, left) if left > 0 else at_most

    def _report(self) -> None:
        valid = self.valid(self._node())
        if valid == self._valid_reported:
            return
        self._valid_reported = valid
        try:
            self._on_change(valid)
        except Exception:
            log.exception("leader lease callback failed")
