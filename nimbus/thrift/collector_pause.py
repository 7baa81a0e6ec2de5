"""Python's cyclic garbage collector paused while a client decodes a reply.

Decoding a large reply allocates many objects at once: getClusterInfo at 10,000
topologies is 11,000 structs and their strings, some 100,000 objects. Each 700
allocations start a collection of the youngest generation, and the survivors soon
trigger full collections, which walk every object the process holds. None of that
finds anything: a decoded Thrift struct refers to its fields and never back, so
reference counting frees it whole when the caller drops it. Measured at 10,000
topologies, a client spent 10 ms decoding such a reply with the collector off, and one
call in ten took 21-30 ms with it on (``docs/fleet.md``).

:func:`collector_paused` turns the collector off for the decoding only (never while
waiting for the reply) and back on afterwards, unless someone else had turned it off.
Pauses of several threads nest: the collector comes back on when the last one ends.
Objects allocated meanwhile are counted as usual, so the collector catches up with any
cyclic garbage at its next run.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator
from typing import Any

_lock = threading.Lock()
_pauses = 0             # threads inside collector_paused() now
_resume = False         # the collector was on when the first of them came in


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Run the block with the cyclic garbage collector off (see the module docstring)."""
    global _pauses, _resume
    with _lock:
        if _pauses == 0:
            _resume = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _lock:
            _pauses -= 1
            if _pauses == 0 and _resume:
                gc.enable()


class QuietDecoding:
    """A Thrift protocol whose struct reads (a reply's decoding) run with the collector
    paused; everything else is the wrapped protocol's own."""

    def __init__(self, protocol: Any):
        self._protocol = protocol

    def read_struct(self, obj: Any) -> Any:
        with collector_paused():
            return self._protocol.read_struct(obj)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._protocol, name)
