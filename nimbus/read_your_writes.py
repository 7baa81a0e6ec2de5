"""Read-your-writes for a reloading reader: wait for a reload that *started* after the ask.

A reader that reloads on a loop of its own (the nimbus's summary, a UI's reader) serves
what its last reload read. A caller that has just changed the cluster asks
(:meth:`Reloads.wait_for_next`) and waits, bounded, until a reload that began after its
ask has finished, so that what it reads next includes its own change. The loop takes
:meth:`Reloads.begin` before it reads, and publishes what it read inside
:meth:`Reloads.finish`, under the same lock the askers wait on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Reloads:
    """Generations of asks and finished reloads; see the module doc."""

    def __init__(self) -> None:
        self._fresh = threading.Condition()
        self._asked = 0    # asks made so far
        self._covered = 0  # the newest ask a finished reload has covered

    def wait_for_next(self, wake: Callable[[], None], timeout_s: float) -> bool:
        """Ask for a reload (``wake()`` the loop) and wait up to ``timeout_s`` for one
        that began after this call to finish; returns whether one did."""
        with self._fresh:
            self._asked += 1
            wanted = self._asked
        wake()
        deadline = time.monotonic() + timeout_s
        with self._fresh:
            while self._covered < wanted:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._fresh.wait(left)
            return True

    def begin(self) -> tuple[int, bool]:
        """Before a reload reads: (its generation, whether an ask awaits it)."""
        with self._fresh:
            return self._asked, self._asked > self._covered

    @property
    def lock(self) -> threading.Condition:
        """The lock :meth:`finish` publishes under, for a change that covers no ask."""
        return self._fresh

    @contextmanager
    def finish(self, generation: int) -> Iterator[None]:
        """Publish a reload's result inside this block: the askers it covers (those of
        ``generation`` and before) wake once the block ends."""
        with self._fresh:
            yield
            self._covered = max(self._covered, generation)
            self._fresh.notify_all()
