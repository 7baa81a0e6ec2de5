"""How long Python's garbage collections stop this process, for /metrics.

A collection holds the interpreter: while a full one walks a large heap, no Thrift call
is answered and no ZooKeeper event is handled. :func:`recorder` installs one
``gc.callbacks`` hook per process, which counts each collection's duration into
histogram buckets by generation; :class:`GcPauseCollector` exports them as
``nimbus_gc_pause_seconds{generation}``. With :mod:`nimbus.heap_freeze` on, generation 2
counts its own collections too (one every ``nimbus.gc.freeze.secs``, short once the
heap is frozen, and a full one at each thaw).

The hook takes no lock: a collection may start inside any allocation, including one made
while a metrics lock is held, so it only adds to lists that the scrape reads (a scrape
may see a collection in the buckets before its seconds are in the sum). The number of
frozen objects is not exported: ``gc.get_freeze_count()`` walks every one of them.
"""

from __future__ import annotations

import bisect
import gc
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

PAUSE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
GENERATIONS = (0, 1, 2)


class GcPauses:
    """Per generation: collections in each bucket (the last is +Inf), and seconds in all."""

    def __init__(self) -> None:
        self.buckets = [[0] * (len(PAUSE_BUCKETS) + 1) for _ in GENERATIONS]
        self.seconds = [0.0 for _ in GENERATIONS]
        self._started: float | None = None

    def on_collection(self, phase: str, info: dict[str, Any]) -> None:
        """The ``gc.callbacks`` hook."""
        if phase == "start":
            self._started = time.perf_counter()
            return
        if self._started is None:  # hooked in while a collection ran: no start to time
            return
        took = time.perf_counter() - self._started
        self._started = None
        generation = info.get("generation", 2)
        self.buckets[generation][bisect.bisect_left(PAUSE_BUCKETS, took)] += 1
        self.seconds[generation] += took


_lock = threading.Lock()
_recorder: GcPauses | None = None


def recorder() -> GcPauses:
    """This process's recorder, hooked into the collector on first use."""
    global _recorder
    with _lock:
        if _recorder is None:
            _recorder = GcPauses()
            gc.callbacks.append(_recorder.on_collection)
        return _recorder


class GcPauseCollector(Collector):
    """Exports :class:`GcPauses` at each scrape."""

    def __init__(self, pauses: GcPauses):
        self._pauses = pauses

    def collect(self) -> Iterator[Metric]:
        pauses = HistogramMetricFamily(
            "nimbus_gc_pause_seconds",
            "Seconds Python's garbage collections held this process, by generation "
            "(2: a full collection)", labels=["generation"])
        for generation in GENERATIONS:
            counts = list(self._pauses.buckets[generation])
            running, cumulative = 0, []
            for bound, count in zip((*PAUSE_BUCKETS, float("inf")), counts, strict=True):
                running += count
                cumulative.append((_bound(bound), running))
            pauses.add_metric([str(generation)], cumulative,
                              sum_value=self._pauses.seconds[generation])
        yield pauses


def _bound(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)
