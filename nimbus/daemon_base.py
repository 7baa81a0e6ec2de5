"""What every long-running process of nimbus-ha shares: the nimbus, the supervisor and the
UI (each a :class:`Daemon`).

* :class:`StopOnce`, the stop-once guard: a daemon's ``stop()`` does its work once,
  however often and from whichever threads it is called, and its ``stopping`` event is
  set the moment that begins.
* :func:`run_in_foreground`: start it, stop it on SIGTERM or SIGINT, and block until it
  has stopped (what ``nimbus-ha nimbus|supervisor|ui`` do).

Each daemon joins its own threads in ``stop()``, each with a timeout of its own
(:class:`~nimbus.background_loop.BackgroundLoop.stop`'s ``join_timeout``).

A daemon's ``start()`` starts threads one after another. A SIGTERM that arrives half-way
must not run ``stop()`` beside it: ``stop()`` would close what ``start()`` goes on to use
(a ZooKeeper client a later step waits on for ever) and miss the threads started after
it, and the process would never exit. So a stop requested before ``start()`` has returned
is carried out as soon as it returns.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Protocol


class Daemon(Protocol):
    """A long-running part of a process: started once, stopped once."""

    def start(self) -> object: ...

    def stop(self) -> None: ...

    @property
    def stopping(self) -> threading.Event: ...


class StopOnce:
    """The stop-once guard: the first :meth:`begin` returns True (its caller stops the
    daemon) and sets :attr:`stopping`; every later one returns False at once."""

    def __init__(self, stopping: threading.Event | None = None) -> None:
        self.stopping = stopping if stopping is not None else threading.Event()
        self._lock = threading.Lock()
        self._begun = False

    def begin(self) -> bool:
        with self._lock:
            if self._begun:
                return False
            self._begun = True
        self.stopping.set()
        return True


def run_in_foreground(daemon: Daemon, thread_name: str, *,
                      started: Callable[[], None] = lambda: None,
                      stop_if_start_fails: bool = True) -> None:
    """Start ``daemon``, have SIGTERM and SIGINT stop it (on a thread named
    ``thread_name``), call ``started()``, then block until it has stopped. A start that
    fails stops what it began (``stop_if_start_fails``; a daemon whose start releases
    what it took by itself says False) and raises."""
    foreground = Foreground(daemon.start, daemon.stop, daemon.stopping, thread_name)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: foreground.request_stop())
    try:
        foreground.start()
    except BaseException:
        if stop_if_start_fails:
            daemon.stop()
        raise
    started()
    foreground.run_forever()


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
