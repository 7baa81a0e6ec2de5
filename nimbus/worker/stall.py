"""A pipeline that stops committing while input waits is restarted.

A query can hang without failing: a sink that never answers, a source stuck in a retry
loop, a JVM thread deadlocked. Its worker stays alive and beating, so neither the
supervisor (which judges status) nor the leader (which judges heartbeats) would ever
replace it. :class:`StallWatch` judges each query by its own progress instead: when its
batch id has not advanced for ``topology.stall.timeout.secs`` (default 300; -1 turns it
off) while Spark says data is available, the query is stalled, and the worker exits with
an error that says so, for its supervisor to restart it. A query with nothing to read is
idle, not stalled.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: The configuration key, and its value that turns the watch off.
STALL_KEY = "topology.stall.timeout.secs"
OFF = -1


class StallWatch:
    """Tracks the batch id of each query; see the module doc."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic):
        self.timeout_s = timeout_s
        self._clock = clock
        self._seen: dict[str, tuple[int | None, float]] = {}  # name -> (batch id, since)

    def observe(self, name: str, batch_id: int | None, data_available: bool) -> str | None:
        """Note a query's progress now; returns the error to report if it is stalled."""
        now = self._clock()
        seen = self._seen.get(name)
        if seen is None or seen[0] != batch_id:
            self._seen[name] = (batch_id, now)
            return None
        if self.timeout_s < 0 or not data_available:
            if not data_available:
                self._seen[name] = (batch_id, now)  # idle: the clock starts when data comes
            return None
        still = now - seen[1]
        if still < self.timeout_s:
            return None
        return (f"query stalled: no batch committed for {still:.0f}s while input is "
                f"waiting ({STALL_KEY} {self.timeout_s:g}); restarting it")
