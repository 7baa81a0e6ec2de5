"""The leader's watchdog: a leader whose duty cycle stops completing is replaced.

A leader can keep its ZooKeeper session, and so its lock, while it does nothing: a
plugin call that never returns inside a duty, a deadlock. Its lease holds (ZooKeeper
answers), no other nimbus can take over, and no topology is scheduled again, ever.

So, as patroni's watchdog does for its HA loop, the ``leader-watchdog`` thread expects a
duty cycle to complete at least every ``nimbus.leader.watchdog.secs`` while this nimbus
leads (counted from the later of the last completed cycle and the moment it began to
lead). When none has, it logs the stack of every thread (what the cycle is stuck in),
gives up the lock, so that another nimbus can lead at once, and ends the process with
exit code :data:`EXIT_CODE`, for its service manager to restart it: a thread stuck in a
call cannot be taken back, only the process can be replaced.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable

from nimbus.background_loop import BackgroundLoop

log = logging.getLogger(__name__)

#: The exit code of a nimbus its watchdog ended (EX_SOFTWARE).
EXIT_CODE = 70
#: How long the watchdog waits for the lock to be given up before it exits anyway.
GIVE_UP_WAIT_S = 5.0


def thread_stacks() -> str:
    """The current stack of every thread of this process, named."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        parts.append(f"--- thread {names.get(ident, '?')} ({ident}):\n"
                     + "".join(traceback.format_stack(frame)))
    return "\n".join(parts)


class LeaderWatchdog:
    """Watch the leader's duty cycle; see the module doc.

    ``is_leader()`` says whether this nimbus leads now; ``give_up()`` releases the lock
    (it must not wait long: ZooKeeper is fine, only a duty is stuck); ``exit(code)`` ends
    the process (``os._exit`` by default: other threads may hold locks a normal exit
    would wait for).
    """

    def __init__(self, timeout_s: float, is_leader: Callable[[], bool],
                 give_up: Callable[[], None],
                 exit: Callable[[int], None] = os._exit,  # noqa: A002 - what it does
                 clock: Callable[[], float] = time.monotonic):
        self.timeout_s = timeout_s
        self._is_leader = is_leader
        self._give_up = give_up
        self._exit = exit
        self._clock = clock
        self._last_cycle = clock()
        self._leading_since: float | None = None
        self.fired = False
        # Checked several times per timeout, so that it fires close to it.
        self._loop = BackgroundLoop("leader-watchdog", self.check_once,
                                    period=min(1.0, timeout_s / 4), wait_first=True)

    def start(self) -> None:
        """Start watching (a ``timeout_s`` of 0 turns the watchdog off)."""
        if self.timeout_s > 0:
            self._loop.start()

    def stop(self) -> None:
        self._loop.stop(join_timeout=10)

    def cycle_completed(self) -> None:
        """Called by the duty cycle at the end of every cycle."""
        self._last_cycle = self._clock()

    def age_s(self) -> float:
        """Seconds since the last completed duty cycle (a metric, and the UI, show it)."""
        return self._clock() - self._last_cycle

    def check_once(self) -> bool:
        """Fire if the leader's cycle is overdue; returns whether it fired."""
        now = self._clock()
        if not self._is_leader():
            self._leading_since = None
            return False
        if self._leading_since is None:
            self._leading_since = now
        silent = now - max(self._last_cycle, self._leading_since)
        if silent <= self.timeout_s or self.fired:
            return False
        self.fired = True
        log.critical("the leader's duty cycle has not completed for %.1fs "
                     "(nimbus.leader.watchdog.secs %.0f): giving up leadership and exiting "
                     "with code %d; every thread's stack:\n%s", silent, self.timeout_s,
                     EXIT_CODE, thread_stacks())
        for handler in logging.getLogger().handlers:
            try:
                handler.flush()
            except Exception:  # nothing may stop the exit
                pass
        # On a thread of its own, waited for a little only: what is stuck may hold a lock
        # giving up needs. Exiting ends the session, which releases the lock anyway.
        giving_up = threading.Thread(target=self._try_give_up, name="leader-give-up",
                                     daemon=True)
        giving_up.start()
        giving_up.join(GIVE_UP_WAIT_S)
        self._exit(EXIT_CODE)
        return True

    def _try_give_up(self) -> None:
        try:
            self._give_up()
        except Exception as exc:
            log.error("giving up the leader lock failed (%s); the session's end releases it",
                      exc)
