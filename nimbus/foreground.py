"""Running a daemon in the foreground until a signal stops it.

A daemon's ``start()`` starts threads one after another. A SIGTERM that arrives half-way
must not run ``stop()`` beside it: ``stop()`` would close what ``start()`` goes on to use
(a ZooKeeper client a later step waits on for ever) and miss the threads started after
it, and the process would never exit. So a stop requested before ``start()`` has returned
is carried out as soon as it returns.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Foreground:
    """Runs ``start`` and then waits until ``stopped`` is set; :meth:`request_stop` (safe in
    a signal handler) runs ``stop`` on a thread named ``thread_name``, at once or, during
    ``start``, right after it."""

    def __init__(self, start: Callable[[], None], stop: Callable[[], None],
                 stopped: threading.Event, thread_name: str) -> None:
        self._start = start
        self._stop = stop
        self._stopped = stopped
        self._thread_name = thread_name
        # Signal handlers run on the main thread between two bytecodes, so flags, not a
        # lock: the handler may interrupt start() while it would hold one.
        self._started = False
        self._requested = False

    def start(self) -> None:
        """Run the daemon's start; then carry out a stop requested meanwhile."""
        self._start()
        self._started = True
        if self._requested:
            self._spawn_stop()

    def request_stop(self) -> None:
        """Signal-safe: stop now, or as soon as the start has returned."""
        self._requested = True
        if self._started:
            self._spawn_stop()  # stop() runs once however often it is called

    def run_forever(self) -> None:
        """Block until the daemon has stopped (its ``stopped`` event is set)."""
        while not self._stopped.wait(1.0):
            pass

    def _spawn_stop(self) -> None:
        threading.Thread(target=self._stop, name=self._thread_name, daemon=False).start()
