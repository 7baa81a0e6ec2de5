"""What the supervisor reports of its workers: their beats to ``/workerbeats`` and their
errors to ``/errors``.

Each worker has a reader thread, ``worker-status-<topology>:<port>``
(:class:`~nimbus.supervisor.worker_handle.WorkerHandle`), that hands every status the
worker sends to :meth:`Reporter.on_status`; :mod:`nimbus.supervisor.status_input` checks
everything a tenant's worker says before it becomes a node. Warm workers
(:mod:`nimbus.supervisor.warm_pool`) have one such thread each too, from the moment they
start. The monitor thread reports what the workers cannot say themselves: an exit
without a word (with the last lines of its log), a silent worker killed, a start that
failed. An error of a slot is recorded once per :data:`ERROR_REPEAT_S`, so a crash loop
records one error, not one per try.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError

from nimbus.state import worker_state
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.records import WORKER_PREFIX, ErrorInfo, WorkerBeat
from nimbus.supervisor.lease import session_id
from nimbus.supervisor.policy import DesiredWorker
from nimbus.supervisor.slots import SlotRecord
from nimbus.supervisor.status_input import (
    ERRORS_PER_MINUTE,
    MAX_DECLARED_COMPONENTS,
    batched_components,
    checked_beat,
    checked_component_list,
    checked_components,
    checked_error,
    health_said,
    share_committed,
)
from nimbus.supervisor.worker_handle import WorkerHandle
from nimbus.worker_protocol import health

log = logging.getLogger(__name__)

# The supervisor records an error of a slot's worker in /errors once; the same error of
# that slot again (a crash loop's, a refused fetch retried) only after this long. The
# slot's state (SupervisorInfo.workers) says meanwhile that it is restarting, and why.
ERROR_REPEAT_S = 600.0
RECORDED_KEYS = 16   # errors remembered per slot for that (a worker's two, alternating)
# Bytes of a worker's log read for the lines quoted when it exits without saying why.
LOG_TAIL_BYTES = 4096
LOG_TAIL_LINES = 3


def handle_executor(handle: WorkerHandle) -> str:
    """The executor key (``worker-<i>``) of a worker: the component its own errors use."""
    return f"{WORKER_PREFIX}{handle.worker_index}"


def log_tail(path: Path, offset: int, max_bytes: int = LOG_TAIL_BYTES,
             lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` non-empty lines a worker wrote to its log from ``offset`` on
    (of its last ``max_bytes``), joined by " | ": what a worker that exited without
    saying why last printed (a shell that could not exec its command, an interpreter
    that failed before the worker's code ran). "" if there is none."""
    try:
        with open(path, "rb") as log_file:
            size = os.fstat(log_file.fileno()).st_size
            if offset > size:  # rotated since (nimbus/worker/log_pump.py): its newest file
                offset = 0
            log_file.seek(max(offset, size - max_bytes))
            text = log_file.read(max_bytes).decode("utf-8", "replace")
    except OSError:
        return ""
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept)


class Reporter:
    """Beats and errors of this supervisor's workers; see the module doc.

    ``connected`` is set while the ZooKeeper connection is up (a beat is written only
    then); ``observe(handle, components)`` takes every beat's component progress (for
    the metrics);
    ``beat_now()`` asks for an early heartbeat (a worker's state changed) and
    ``wake_monitor()`` for a reconcile pass (a worker exited).
    """

    def __init__(self, zk: KazooClient, state: StormClusterState, supervisor_id: str,
                 host: str, connected: threading.Event,
                 observe: Callable[[WorkerHandle, dict[str, Any]], None],
                 beat_now: Callable[[], None], wake_monitor: Callable[[], None]):
        self._zk = zk
        self._state = state
        self._id = supervisor_id
        self._host = host
        self._connected = connected
        self._observe = observe
        self._beat_now = beat_now
        self._wake_monitor = wake_monitor
        # (topology, port) -> {what was recorded in /errors for the slot's worker: when}
        # (see ERROR_REPEAT_S; at most RECORDED_KEYS each). Written by the monitor and
        # the status reader threads.
        self._recorded: dict[tuple[str, int], dict[str, float]] = {}
        self._recorded_lock = threading.Lock()
        # (topology, port) -> {component: the charts' history last written}: a worker
        # started again on the slot continues it (beat_progress.merge_history).
        self._histories: dict[tuple[str, int], dict[str, list[list[Any]]]] = {}

    # -- from the worker (its reader thread) ----------------------------------------------
    def on_status(self, handle: WorkerHandle, status: dict[str, Any]) -> None:
        warm = status.get("warm")
        if isinstance(warm, dict) and handle.warm == "taken" and not handle.committed \
                and isinstance(warm.get("refused"), str):
            handle.warm_refused = warm["refused"][:500]
        declared = status.get("components")
        if isinstance(declared, dict) and handle.kind == "pipeline":
            # Untrusted, but it decides only whether this topology's own worker is kept,
            # whether it proved its version, and what the slot's next worker is told.
            handle.topology_components = checked_component_list(declared.get("all"))
            handle.own_components = checked_component_list(declared.get("mine"))
        beat = status.get("beat")
        if isinstance(beat, dict):
            components = checked_components(beat.get("components"))
            self._observe(handle, components)
            proven = handle.version_committed
            if handle.kind == "pipeline":
                if any(isinstance(b := c.get("batch_id"), int) and not isinstance(b, bool)
                       and b >= 0 for c in components.values()):
                    handle.triggered = True  # its queries are up
                batched = batched_components(components)
                if batched:
                    handle.committed = True  # a batch went through: its queries work
                    # Bounded as a declaration is: a worker's odd names cost it only its
                    # own proof.
                    room = MAX_DECLARED_COMPONENTS - len(handle.batched_components)
                    handle.batched_components.update(
                        sorted(batched - handle.batched_components)[:max(0, room)])
                # Its version proved only once every query of its share committed a batch
                # here, and never before it said what its share is.
                proven = share_committed(handle.own_components, handle.batched_components)
            elif handle.kind == "process":
                # Its declared health check passed, or it declares none and beats: its
                # command started.
                proven = proven or health_said(beat.get("health")) != health.PENDING
            self.write_beat(handle, beat)
            if proven and not handle.version_committed and not handle.ended_by:
                handle.version_committed = True
                log.info("worker %s: version %d %s", handle.name, handle.code_version,
                         "committed a batch of every component it runs"
                         if handle.kind == "pipeline" else
                         "is up (its health check passed, or it declares none)")
                self._beat_now()  # the leader of an upgrade waits for this: said now
        if "error" in status:
            handle.errors_reported += 1
            # Untrusted: only a valid component id becomes a node (status_input).
            error = checked_error(status["error"], handle_executor(handle))
            if not handle.error_budget.take():
                if handle.error_budget.dropped == 1:
                    log.warning("worker %s reports more than %d errors a minute: the "
                                "excess is dropped", handle.name, ERRORS_PER_MINUTE)
                return
            first = error.text.splitlines()[0] if error.text else error.text
            log.warning("worker %s: %s: %s", handle.name, error.component,
                        first if len(first) <= 300 else first[:297] + "...")
            self.report(handle, error.component, error.text)

    def on_closed(self, _handle: WorkerHandle) -> None:
        self._wake_monitor()   # the worker has exited: reap it now

    def write_beat(self, handle: WorkerHandle, beat: dict[str, Any]) -> None:
        # A worker of an earlier session, or one being killed, speaks for nobody.
        if handle.ended_by or session_id(self._zk) != handle.session_id \
                or not self._connected.is_set():
            return
        # Only what WorkerBeat holds, bounded: a worker's odd entry must neither make the
        # whole beat unreadable nor grow the node without limit (MAX_BEAT_BYTES).
        slot = (handle.topology_id, handle.port)
        checked = checked_beat(beat, self._histories.get(slot))
        self._histories[slot] = checked.histories
        record = WorkerBeat(
            time_secs=int(time.time()), topology_id=handle.topology_id, supervisor_id=self._id,
            host=self._host, port=handle.port,
            uptime_secs=int(time.monotonic() - handle.started_at), restarts=handle.restarts,
            components=checked.components, memory_bytes=handle.memory_bytes(),
            code_version=handle.code_version,
            warm_start=handle.warm == "taken", spark_ui_url=checked.spark_ui_url)
        try:
            self._state.worker_heartbeat(handle.topology_id, self._id, handle.port,
                                         record.encode())
        except NoNodeError:
            return  # the topology was removed: its beats directory is gone for good
        except KazooException as exc:
            log.debug("beat of %s not written: %s", handle.name, exc)
            return
        first = handle.last_beat_at is None
        handle.last_beat_at = time.monotonic()
        if first:  # it runs now: said at once, not a heartbeat later
            self._beat_now()

    # -- what the worker cannot say (monitor thread) --------------------------------------
    def exited(self, handle: WorkerHandle, code: int | None) -> None:
        """A worker that exited on its own, unless it said why (or was killed silent):
        its exit code and the last lines of its log, as its error."""
        if handle.ended_by == "timeout" or handle.errors_reported != 0:
            return
        message = f"worker exited with code {code}"
        tail = log_tail(handle.log_path, handle.log_offset) \
            if code and code > 0 and handle.log_offset is not None else ""
        self.report(handle, handle_executor(handle), f"{message}: {tail}" if tail else message)

    def failed_start(self, want: DesiredWorker, record: SlotRecord, delay: float,
                     text: str, key: str) -> None:
        """A worker that could not be started (its code, its command): its slot is
        restarting after ``delay`` because of ``text``, recorded as its error (its
        ``worker-<i>``; once per ``key`` and ERROR_REPEAT_S)."""
        record.failed, record.backoff_s = True, delay
        record.last_error = worker_state.first_line(text)
        self.record_error(want.topology_id, want.port, want.executor, text, key)
        self._beat_now()

    # -- recording ------------------------------------------------------------------------
    def report(self, handle: WorkerHandle, component: str, text: str,
               key: str | None = None) -> None:
        """Record an error of ``handle``'s worker (see :meth:`record_error`)."""
        handle.last_error = worker_state.first_line(text)
        self.record_error(handle.topology_id, handle.port, component, text, key)

    def record_error(self, topology_id: str, port: int, component: str, text: str,
                     key: str | None = None) -> bool:
        """Record an error of the worker of slot ``port`` in /errors (what ``nimbus-ha
        errors`` and the UI show), unless the slot's last recorded error had the same
        ``key`` (default: the component and the text) less than ERROR_REPEAT_S ago: a
        crash loop, or a fetch retried, records one error, not one per try. True if
        recorded. Called from the monitor and the status reader threads."""
        key = key if key is not None else f"{component}\n{text}"
        slot = (topology_id, port)
        now = time.monotonic()
        with self._recorded_lock:
            seen = self._recorded.setdefault(slot, {})
            if now - seen.get(key, -ERROR_REPEAT_S) < ERROR_REPEAT_S:
                log.debug("error of %s:%d not recorded again: %s", topology_id, port,
                          worker_state.first_line(text))
                return False
            seen[key] = now
            while len(seen) > RECORDED_KEYS:
                del seen[min(seen, key=seen.__getitem__)]
        try:
            self._state.report_error(topology_id, component, ErrorInfo(
                error=text, error_time_secs=int(time.time()), host=self._host, port=port))
            return True
        except KazooException as exc:
            with self._recorded_lock:  # not recorded: the next one may be
                if self._recorded.get(slot, {}).get(key) == now:
                    del self._recorded[slot][key]
            log.warning("error of %s:%d not recorded in ZooKeeper: %s", topology_id, port,
                        exc)
            return False

    def forget_except(self, keep: set[str]) -> None:
        """Forget what was recorded for the slots of topologies not in ``keep``."""
        with self._recorded_lock:
            for slot in [s for s in self._recorded if s[0] not in keep]:
                del self._recorded[slot]
        for slot in [s for s in list(self._histories) if s[0] not in keep]:
            self._histories.pop(slot, None)
