"""A nimbus's cycle, read top to bottom (patroni's ``run_cycle``).

One loop, ``nimbus-cycle``, runs :meth:`NimbusCycle.run_cycle` on every nimbus:

1. **registration**: ``/nimbuses/<host:port>`` exists on the current session
   (:mod:`nimbus.master.registration`; written again after a lost session);
2. **view current**: whether the in-memory view of the cluster is loaded on a live
   session; the duties wait for it (:mod:`nimbus.state.cluster_view`);
3. **code check**: that the ZooKeeper root still holds this nimbus's cluster (every
   cycle), then, when the elector needs it (to queue, or at the head of the queue),
   whether this host holds the code of every live topology, read from ZooKeeper and the
   local store (:meth:`nimbus.master.code_sync.CodeSync.check_code`). A ZooKeeper root
   that no longer holds this nimbus's cluster makes it stand aside;
4. **leadership decision**: one queue step of the elector with that check
   (:meth:`nimbus.master.elector.LeaderElector.step`): queue, claim the lock, or give it
   up for lack of code, in which case the code sync is asked for it;
5. **summary**: when leadership changed, the observer (metrics) hears it and the cluster
   summary is refreshed;
6. **duties**, when this nimbus leads and they are due (:mod:`nimbus.master.duties`):
   kills, rebalances, orphan code, scheduling, the index, sweeps;
7. the cycle is recorded as completed, for the leader's watchdog
   (:mod:`nimbus.master.leader_watchdog`).

Nothing else decides. The elector, the code sync and the summary only supply facts and
ring the cycle's bell: a predecessor's lock node gone, a connection change, a lease
renewed, a sync pass ended, a submit or a kill (:meth:`NimbusCycle.wake_duties`), a new
rebalance deadline. Losing leadership is the one thing that takes effect outside the
cycle, at once on the thread that learns of it (kazoo's, the lease's), since it must
never wait for a cycle; the next cycle then sees it.

The cycle steps at least every :attr:`~nimbus.master.elector.LeaderElector.SAFETY_INTERVAL_S`
(so a missed watch delays a decision that long at most), and sooner when the duties
are due.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from kazoo.exceptions import KazooException

from nimbus.background_loop import BackgroundLoop
from nimbus.master.code_sync import CodeCheck
from nimbus.master.duties import LeaderDuties
from nimbus.master.elector import ElectionStep, LeaderElector, Leadership
from nimbus.state.cluster_state import LayoutMissingError

log = logging.getLogger("nimbus.master.daemon")


class Bell:
    """A wake-up handed out before the loop it wakes exists: :meth:`ring` wakes the loop
    attached later, or its first step if rung before."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: BackgroundLoop | None = None
        self._rung = False

    def attach(self, loop: BackgroundLoop) -> None:
        with self._lock:
            self._loop = loop
            rung, self._rung = self._rung, False
        if rung:
            loop.wake()

    def ring(self, _event: object = None) -> None:
        """Ask for a cycle soon; only signals, so any thread (kazoo's included) may."""
        with self._lock:
            loop = self._loop
            if loop is None:
                self._rung = True
        if loop is not None:
            loop.wake()


class Registration(Protocol):
    def ensure(self) -> None: ...


class CodeFacts(Protocol):
    """What the cycle reads of the code sync (:class:`~nimbus.master.code_sync.CodeSync`)."""

    def check_cluster(self) -> None: ...

    def check_code(self, leading: bool = False) -> CodeCheck: ...

    def resync(self) -> None: ...


class ViewFacts(Protocol):
    @property
    def loaded(self) -> bool: ...


class SummaryRefresh(Protocol):
    def wake(self, _event: object = None) -> None: ...


class LeadershipObserver(Protocol):
    """Told of every change of leadership the cycle sees (the metrics)."""

    def on_leadership(self, leader: bool) -> None: ...


class NimbusCycle:
    """The ``nimbus-cycle`` loop and its cycle; see the module doc.

    ``completed()`` is called at the end of every cycle, however it ended (the
    watchdog's ``cycle_completed``). ``bell`` is the one the elector, the code sync and
    the rest were given; the cycle attaches its loop to it.
    """

    def __init__(self, bell: Bell, registration: Registration | None, view: ViewFacts | None,
                 code: CodeFacts, elector: LeaderElector, duties: LeaderDuties | None,
                 summary: SummaryRefresh | None, observer: LeadershipObserver | None = None,
                 completed: Callable[[], None] = lambda: None):
        self._registration = registration
        self._view = view
        self._code = code
        self._elector = elector
        self._duties = duties
        self._summary = summary
        self._observer = observer
        self._completed = completed
        self._leadership: Leadership | None = None   # what the observer was last told
        self._retry_in_s: float | None = None
        self._view_waiting = False     # logged once per wait
        self._one_at_a_time = threading.Lock()
        self.cycles = 0   # cycles completed (tests wait on it)
        self._loop = BackgroundLoop("nimbus-cycle", self.run_cycle, period=self._wait_s,
                                    wait_first=True)
        bell.attach(self._loop)

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        self._loop.start()
        self._loop.wake()

    def stop(self, join_timeout: float = 10.0) -> None:
        """No cycle begins after this; waits for the one under way."""
        self._loop.stop(join_timeout)

    def wake(self) -> None:
        """Run a cycle now (or right after the one under way)."""
        self._loop.wake()

    def wake_duties(self) -> None:
        """Run the leader's duties in the next cycle, now (a submit, a kill)."""
        if self._duties is not None:
            self._duties.ask()
        self._loop.wake()

    def _wait_s(self) -> float:
        wait = self._elector.SAFETY_INTERVAL_S
        if self._retry_in_s is not None:
            wait = min(wait, self._retry_in_s)
        if self._duties is not None and self._elector.is_leader():
            wait = min(wait, max(0.0, self._duties.due_in_s()))
        return wait

    # -- the cycle ----------------------------------------------------------------------
    def run_cycle(self, duties: bool = False) -> None:
        """One pass, in order (see the module doc); ``duties``: run the leader's duties
        whether or not they are due. One cycle at a time: a caller's waits for the
        loop's."""
        with self._one_at_a_time:
            self._run(duties)

    def _run(self, force_duties: bool) -> None:
        try:
            self._retry_in_s = None
            if not self._register():                          # 1
                return
            view_current = self._view_current()               # 2
            step = self._decide()                             # 3, 4
            if step.lacks_code:
                self._code.resync()
            self._note_leadership(step.leadership)            # 5
            if step.leadership is not None and view_current:  # 6
                self._run_duties(step.leadership, force_duties)
        finally:
            self.cycles += 1
            self._completed()                                 # 7

    def _register(self) -> bool:
        if self._registration is None:
            return True
        try:
            self._registration.ensure()
            return True
        except KazooException as exc:
            log.warning("registering this nimbus failed, retrying: %s", exc)
            self._retry_in_s = 1.0
            return False

    def _view_current(self) -> bool:
        if self._view is None or self._view.loaded:
            self._view_waiting = False
            return True
        if not self._view_waiting:
            log.info("duties wait: the view of the cluster is being read again")
        self._view_waiting = True
        return False

    def _decide(self) -> ElectionStep:
        code: CodeCheck | None = None
        try:
            # At every step, wherever this nimbus is in the queue: one left over from a
            # wiped cluster never keeps a place in the new one's queue.
            self._code.check_cluster()
            if self._elector.wants_code_check():
                code = self._code.check_code(leading=self._elector.is_leader())
        except LayoutMissingError as exc:
            self._elector.stand_aside(exc)
            return ElectionStep(None)
        except KazooException as exc:
            step = self._elector.step_failed(exc)
        else:
            step = self._elector.step(code)
        self._retry_in_s = step.retry_in_s
        return step

    def _run_duties(self, leadership: Leadership, force: bool) -> None:
        if self._duties is not None and (force or self._duties.due(leadership)):
            self._duties.run(leadership)

    def _note_leadership(self, leadership: Leadership | None) -> None:
        before, self._leadership = self._leadership, leadership
        if before == leadership:
            return
        # A spell that ended and another that began between two cycles: both are told.
        changes = ([False] if before is not None else []) + \
            ([True] if leadership is not None else [])
        if self._observer is not None:
            for leading in changes:
                try:
                    self._observer.on_leadership(leading)
                except Exception:
                    log.exception("leadership observer failed")
        if self._summary is not None:
            self._summary.wake()
