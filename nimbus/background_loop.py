"""One background loop: a named thread that runs a step, waits, and runs it again.

Every long-lived loop of the nimbus and the supervisor is one of these (the elector, the
leader's duty cycle, the leases, the code sync, the watchdogs, the summaries, ...), so
starting, waking and stopping them works the same everywhere:

* ``step()`` runs once per iteration on the thread named ``name``. An exception it
  raises is logged with its traceback (then handed to ``on_error``, if given) and the
  loop goes on: one bad pass must not end a thread others rely on. Errors a step expects
  (ZooKeeper's, say) are the step's to handle, with the pause they call for
  (:meth:`BackgroundLoop.sleep`, then :meth:`BackgroundLoop.wake` to retry).
* Between two steps the loop waits ``period`` seconds, or until :meth:`wake`. ``period``
  is a number, None (wait for a wake-up only), or a callable asked after every step (for
  a deadline the step just computed). A wake-up that comes while a step runs is not lost:
  the next wait returns at once.
* :meth:`stop` sets the stop event, wakes the thread and joins it within a timeout; the
  step under way finishes first, so a step that pauses must pause with :meth:`sleep`,
  and a step that works through a list should check :attr:`stopping` between items.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

#: The wait used when a ``period`` callable raises (the error is logged).
FALLBACK_WAIT_S = 1.0

Period = float | Callable[[], float | None] | None


class BackgroundLoop:
    """Run ``step()`` on a thread named ``name`` until :meth:`stop`; see the module doc.

    ``wait_first``: wait one period (or for a wake-up) before the first step.
    ``coalesce_s``: after a wake-up, wait this much longer and take every wake-up of that
    time as the same one, so that a burst of them (watches firing) makes one step.
    ``on_error(exc)`` runs on the loop's thread after an unexpected exception is logged.
    """

    def __init__(self, name: str, step: Callable[[], object], period: Period, *,
                 wait_first: bool = False, coalesce_s: float = 0.0,
                 on_error: Callable[[Exception], object] | None = None):
        self.name = name
        self._step = step
        self._period = period
        self._wait_first = wait_first
        self._coalesce_s = coalesce_s
        self._on_error = on_error
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._woken = False
        self._start_lock = threading.Lock()
        self._started = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> BackgroundLoop:
        """Start the thread. Only the first call does: a running loop is not started
        twice, and a stopped one stays stopped."""
        with self._start_lock:
            if not self._started and not self._stop.is_set():
                self._started = True
                self._thread.start()
        return self

    def wake(self) -> None:
        """Run the next step now, or as soon as the step under way has ended."""
        self._wake.set()

    def stop(self, join_timeout: float = 10.0) -> None:
        """Begin no step after this one; wait up to ``join_timeout`` seconds for the
        step under way to end. Safe to call more than once, and from the step itself
        (it then returns at once)."""
        self._stop.set()
        self._wake.set()
        with self._start_lock:  # a start under way has started the thread by now
            started = self._started
        if not started or threading.current_thread() is self._thread:
            return
        self._thread.join(join_timeout)
        if self._thread.is_alive():
            log.warning("%s did not stop within %.1fs: its step is still running",
                        self.name, join_timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    # -- for steps ----------------------------------------------------------------------
    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._stop.is_set()

    @property
    def woken(self) -> bool:
        """Whether the wait before the current step ended by :meth:`wake` rather than
        by its period (False for a first step that had no wait)."""
        return self._woken

    def sleep(self, seconds: float) -> bool:
        """Pause for ``seconds`` unless stopped first (a step's back-off); returns
        whether the loop is stopping."""
        return self._stop.wait(seconds)

    # -- the thread ---------------------------------------------------------------------
    def _run(self) -> None:
        if self._wait_first:
            self._wait()
        else:
            self._wake.clear()  # the first step serves every wake-up made before it
        while not self._stop.is_set():
            try:
                self._step()
            except Exception as exc:
                log.exception("%s: step failed", self.name)
                self._report(exc)
            if self._stop.is_set():
                break
            self._wait()

    def _report(self, exc: Exception) -> None:
        if self._on_error is None:
            return
        try:
            self._on_error(exc)
        except Exception:
            log.exception("%s: error hook failed", self.name)

    def _wait(self) -> None:
        timeout = self._next_wait()
        self._woken = self._wake.wait(None if timeout is None else max(0.0, timeout))
        if self._woken and self._coalesce_s > 0 and not self._stop.is_set():
            self._stop.wait(self._coalesce_s)
        # Cleared after the wait, before the step: a wake-up from here on is served by
        # the next step, one from before by this one.
        self._wake.clear()

    def _next_wait(self) -> float | None:
        period = self._period
        if not callable(period):
            return period
        try:
            return period()
        except Exception:
            log.exception("%s: period failed; waiting %.1fs", self.name, FALLBACK_WAIT_S)
            return FALLBACK_WAIT_S
