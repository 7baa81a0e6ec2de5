"""Long-lived objects kept out of Python's full garbage collections.

A nimbus holds the whole cluster in memory (the view, the summary, the code index): at
10,000 topologies some millions of objects. CPython's cyclic collector walks every one of
them at each full collection, with the interpreter stopped, and the heartbeats of a large
fleet make long-lived objects fast enough to start one every 15-25 seconds. Measured
inside the nimbuses of ``benchmarks/bench_scale.py`` at 10,000 topologies and 1,000
supervisors (``docs/fleet.md``): 360-750 ms a time when idle, on whichever thread
allocated last (a Thrift call, the kazoo event loop, the elector), while each found only
some hundreds of objects to free.

:class:`HeapFreezer` moves what survived into the collector's permanent generation
(:func:`gc.freeze`) every ``refreeze_s``, after collecting what was not frozen yet: the
collections in between, full ones included, walk only what was made since. Frozen
objects are still freed by reference counting when the last reference goes; only a
*cycle* among them waits for the next thaw. Every ``thaw_s`` the freezer unfreezes
everything and collects it in full once (one long pause per ``thaw_s`` instead of
several a minute), then freezes again.

The permanent generation belongs to the process, not to one daemon: :func:`freezer`
hands out one shared freezer, started by its first user and stopped by its last (tests
run several daemons in one process), and the last stop unfreezes what it froze.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from nimbus.background_loop import BackgroundLoop

log = logging.getLogger(__name__)

THREAD_NAME = "heap-freeze"


@dataclass(frozen=True)
class FreezeSettings:
    """``refreeze_s``: how often new survivors are frozen (0: never freeze).
    ``thaw_s``: how often everything is unfrozen and collected in full."""

    refreeze_s: float
    thaw_s: float

    def __post_init__(self) -> None:
        if self.refreeze_s < 0 or self.thaw_s < 0:
            raise ValueError("heap freeze periods must not be negative")
        if self.refreeze_s and self.thaw_s < self.refreeze_s:
            raise ValueError(f"the thaw period ({self.thaw_s:g}s) must be at least the "
                             f"refreeze period ({self.refreeze_s:g}s)")

    @property
    def enabled(self) -> bool:
        return self.refreeze_s > 0


def _full_collections() -> int:
    return gc.get_stats()[2]["collections"]


class HeapFreezer:
    """Freeze survivors every ``refreeze_s``, thaw and collect in full every ``thaw_s``,
    on a named thread (see the module docstring). ``clock`` and ``collect`` are for
    tests."""

    def __init__(self, settings: FreezeSettings,
                 clock: Callable[[], float] = time.monotonic,
                 collect: Callable[[], int] = gc.collect):
        self.settings = settings
        self._clock = clock
        self._collect = collect
        self._thawed_at = clock()
        self._thaw_due = False
        # Held by a step and by stop(): a step that outlasts stop()'s join cannot freeze
        # after stop() has unfrozen.
        self._lock = threading.Lock()
        self.full_collections = 0      # thaws done (tests and logs)
        self._loop = BackgroundLoop(THREAD_NAME, self.step, settings.refreeze_s or None)

    def start(self) -> HeapFreezer:
        if self.settings.enabled:
            self._loop.start()
        return self

    def stop(self, join_timeout: float = 10.0) -> None:
        """Stop the thread, then unfreeze: the process is left as it was found."""
        self._loop.stop(join_timeout)
        if self.settings.enabled:
            with self._lock:
                gc.unfreeze()

    def step(self) -> None:
        """Collect what is not frozen (little, once frozen), then freeze the survivors;
        when a thaw is due, unfreeze first, so that this one collection is full."""
        with self._lock:
            if self._loop.stopping:
                return
            now = self._clock()
            if now - self._thawed_at >= self.settings.thaw_s:
                self._thaw_due = True
            if self._thaw_due:
                gc.unfreeze()
            before = _full_collections()
            started = time.perf_counter()
            found = self._collect()
            took = time.perf_counter() - started
            # gc.collect() returns at once, collecting nothing, while another collection
            # is under way (its finalizers may let this thread in): a thaw stays due.
            collected = _full_collections() > before
            gc.freeze()
            if self._thaw_due and collected:
                self._thaw_due = False
                self._thawed_at = now
                self.full_collections += 1
                # What it found is the cyclic garbage held while frozen (and since the
                # last step): the cost of freezing, in objects.
                log.info("full garbage collection (thaw) took %.0f ms, found %d "
                         "unreachable objects", took * 1000, found)


# -- one per process -----------------------------------------------------------------------
_lock = threading.Lock()
_shared: HeapFreezer | None = None
_users = 0


class _Lease:
    """One daemon's use of the shared freezer; :meth:`release` once."""

    def __init__(self) -> None:
        self._released = False

    def release(self) -> None:
        global _shared, _users
        with _lock:
            if self._released:
                return
            self._released = True
            _users -= 1
            last = _shared if _users == 0 else None
            if last is not None:
                _shared = None
            # Stopped under the lock: a new first user must not freeze before this one
            # has unfrozen.
            if last is not None:
                last.stop()


def freezer(settings: FreezeSettings) -> _Lease:
    """Use the process's freezer (started with ``settings`` by its first user; later
    users share it as it is). Release the lease when the daemon stops."""
    global _shared, _users
    with _lock:
        if _shared is None:
            _shared = HeapFreezer(settings).start()
        _users += 1
    return _Lease()
