"""Waiting for a condition in the tests, with a timeout, never a fixed sleep.

:func:`wait_for` is what the tests wait with (it names what it waited for and the last
error the condition raised); :func:`wait_until` is the unit tests' short form. The
shipping ``nimbus.dev.cluster.wait_for`` is dev-cluster's own: tests do not import it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout_s: float, what: str,
             interval_s: float = 0.05) -> T:
    """Poll ``condition`` until it returns a truthy value, and return that value; a
    condition that raises is asked again (a cluster may be mid-failover). TimeoutError
    naming ``what`` and the last error after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - asked again until the deadline
            last_error = exc
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}"
                       + (f" (last error: {last_error})" if last_error else ""))


def wait_until(condition: Callable[[], object], timeout_s: float = 10.0) -> None:
    """Poll ``condition`` every 10 ms until it is true; AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)
