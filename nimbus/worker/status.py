"""The status pipe (worker -> supervisor): one JSON object per line.

``{"beat": {...}}`` carries the :class:`~nimbus.state.records.WorkerBeat` fields except
``time_secs`` (the supervisor stamps that when it writes the beat to ZooKeeper);
``{"error": {"component": ..., "error": ...}}`` reports one failure.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import threading
import time
import traceback
from typing import Any

log = logging.getLogger(__name__)

# Longest error text sent: ZooKeeper keeps it in a znode, people read it in topology-info.
MAX_ERROR_CHARS = 2048


def format_error(exc: BaseException, limit: int = MAX_ERROR_CHARS) -> str:
    """``Type: message`` and the last frames of the traceback, at most ``limit`` chars.

    The head (type and message) comes first because it is what a reader needs; a very
    long message (a Java stack trace from Spark) is cut so the traceback tail still fits.
    """
    head = f"{type(exc).__name__}: {exc}".rstrip()
    tail = "".join(traceback.format_tb(exc.__traceback__)[-3:]).rstrip()
    if len(head) > limit * 2 // 3:
        head = head[: limit * 2 // 3 - 4] + " ..."
    text = head if not tail else f"{head}\nTraceback (most recent call last, tail):\n{tail}"
    return text if len(text) <= limit else text[: limit - 4] + " ..."


def _clean(value: Any) -> Any:
    """JSON has no NaN/Infinity (Spark reports NaN rates before the first batch)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


class StatusWriter:
    """Writes status lines to the inherited ``status_fd``; safe to call from any thread.

    A supervisor that has gone away (EPIPE) is logged once and further lines are dropped
    until one takes the worker over (:meth:`redirect`): the lease, not the status pipe,
    decides when this worker dies.
    """

    def __init__(self, fd: int, *, topology_id: str, supervisor_id: str, host: str,
                 port: int, restarts: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()
        self._broken = False
        self._components: dict[str, Any] | None = None  # the last components line
        self._started = time.monotonic()
        self._identity = {"topology_id": topology_id, "supervisor_id": supervisor_id,
                          "host": host, "port": port, "restarts": restarts}

    def beat(self, components: dict[str, dict[str, Any]], spark_ui_url: str = "",
             health: str = "") -> None:
        """Send one beat with ``components`` ``{name: {...}}`` and, for a pipeline whose
        Spark UI is on, that UI's address; for a process topology, what its health check
        says: "none" (none declared), "pending" (not passed yet) or "passed"
        (nimbus/worker/health.py)."""
        beat = {**self._identity,
                "uptime_secs": int(time.monotonic() - self._started),
                "components": components}
        if spark_ui_url:
            beat["spark_ui_url"] = spark_ui_url
        if health:
            beat["health"] = health
        self._send({"beat": beat})

    def components(self, every: list[str], mine: list[str]) -> None:
        """Say once which components the topology has and which of them this worker
        runs: the supervisor keeps the worker through a rebalance that leaves ``mine``
        as it is."""
        self._components = {"components": {"all": every, "mine": mine}}
        self._send(self._components)

    def error(self, component: str, error: str) -> None:
        """Report one failure of ``component`` (the text is cut to MAX_ERROR_CHARS)."""
        log.error("error in %s: %s", component, error)
        self._send({"error": {"component": component, "error": error[:MAX_ERROR_CHARS]}})

    def _send(self, obj: dict[str, Any]) -> None:
        data = (json.dumps(_clean(obj), sort_keys=True) + "\n").encode("utf-8")
        with self._lock:
            if self._broken:
                return
            try:
                # A pipe write of up to PIPE_BUF bytes is atomic; longer ones are looped by
                # the kernel/os.write, and the lock keeps lines from interleaving.
                view = memoryview(data)
                while view:
                    view = view[os.write(self._fd, view):]
            except OSError as exc:
                self._broken = True
                log.warning("status pipe closed (%s); further status lines are dropped", exc)

    def exited(self, code: int) -> None:
        """Say the exit code this worker is about to exit with."""
        self._send({"exit": code})

    def redirect(self, fd: int) -> None:
        """Write to ``fd`` from now on (a supervisor started again took this worker over);
        the old descriptor is closed."""
        with self._lock:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = fd
            self._broken = False
        if self._components is not None:  # the new supervisor's handle needs them too
            self._send(self._components)

    def close(self) -> None:
        with self._lock:
            if not self._broken:
                self._broken = True
                try:
                    os.close(self._fd)
                except OSError:
                    pass
