"""A query's progress as the worker beats it: the flat numbers, Spark's full progress and
the history that the topology page charts.

Spark hands over each micro-batch's ``StreamingQueryProgress`` (``query.lastProgress``,
and the last ones in ``query.recentProgress``): a dict (PySpark 3) or a dict subclass
with the same keys (PySpark 4), its offsets as JSON text or as JSON values. The worker
turns it into the fields of docs/runtime.md (WorkerBeat) and keeps the charts' history
itself, since it is the one that sees every batch. The supervisor checks and bounds all
of it again (nimbus.state.beat_progress): the worker runs the tenant's code.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from nimbus.state.beat_progress import (
    HISTORY_BUCKET_S,
    HISTORY_POINTS,
    HISTORY_WINDOW_S,
    MAX_DESCRIPTION_CHARS,
    MAX_DURATIONS,
    MAX_OFFSET_CHARS,
    MAX_SHORT_CHARS,
    MAX_SOURCES,
    MAX_STATE_OPERATORS,
    text,
)

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery


def _number(value: Any, default: float) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return default


def _count(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        and math.isfinite(value) else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _offset(value: Any) -> str | None:
    """An offset as text: Spark's own JSON text as it is ("null" is none), any other
    JSON value serialised; cut to MAX_OFFSET_CHARS."""
    if value is None or value == "null":
        return None
    if not isinstance(value, str):
        try:
            value = json.dumps(value, sort_keys=True, default=str)
        except (TypeError, ValueError, RecursionError):
            return None
    return text(value, MAX_OFFSET_CHARS)


def epoch_secs(timestamp: Any) -> float | None:
    """Spark's progress ``timestamp`` (``2026-11-27T14:31:44.000Z``) in epoch seconds."""
    if not isinstance(timestamp, str):
        return None
    try:
        return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def batch_duration_ms(progress: Mapping[str, Any]) -> float | None:
    """How long the batch took: ``durationMs.triggerExecution`` (``batchDuration``, new in
    Spark 4, is the same number)."""
    duration = _count(_mapping(progress.get("durationMs")).get("triggerExecution"))
    return float(duration) if duration is not None else _count(progress.get("batchDuration"))


def flat_progress(progress: Mapping[str, Any] | None) -> dict[str, Any]:
    """The beat's flat numbers of one progress (batch_id -1 before any)."""
    if not progress:
        return {"batch_id": -1, "num_input_rows": 0, "input_rows_per_second": 0.0,
                "processed_rows_per_second": 0.0, "timestamp": None}
    batch = _count(progress.get("batchId"))
    return {"batch_id": batch if batch is not None else -1,
            "num_input_rows": _count(progress.get("numInputRows")) or 0,
            "input_rows_per_second": _number(progress.get("inputRowsPerSecond"), 0.0),
            "processed_rows_per_second": _number(progress.get("processedRowsPerSecond"),
                                                 0.0),
            "timestamp": progress.get("timestamp")}


def full_progress(progress: Mapping[str, Any] | None) -> dict[str, Any]:
    """The beat's ``progress`` of one StreamingQueryProgress (nimbus.state.beat_progress
    names its fields): sources with their offsets, the sink, the state operators, the
    watermark and the durations. Texts are cut here already, as the supervisor cuts
    them: a status line longer than 1 MiB would be dropped whole."""
    progress = progress or {}
    sources = [_mapping(s) for s in (progress.get("sources") or [])][:MAX_SOURCES]
    operators = [_mapping(s) for s in (progress.get("stateOperators") or [])]
    sink = progress.get("sink")
    durations = _mapping(progress.get("durationMs"))
    batch = _count(progress.get("batchId"))
    return {
        "batch_id": batch if batch is not None else -1,
        "timestamp": text(progress.get("timestamp"), MAX_SHORT_CHARS),
        "sources": [{"description": text(s.get("description"), MAX_DESCRIPTION_CHARS),
                     "start_offset": _offset(s.get("startOffset")),
                     "end_offset": _offset(s.get("endOffset")),
                     "latest_offset": _offset(s.get("latestOffset")),
                     "num_input_rows": _count(s.get("numInputRows")),
                     "input_rows_per_second": _number(s.get("inputRowsPerSecond"), 0.0),
                     "processed_rows_per_second": _number(s.get("processedRowsPerSecond"),
                                                          0.0)} for s in sources],
        "sink": {"description": text(_mapping(sink).get("description"),
                                     MAX_DESCRIPTION_CHARS),
                 "num_output_rows": _count(_mapping(sink).get("numOutputRows"))}
        if isinstance(sink, Mapping) else None,
        "state_operators": [{"operator_name": text(s.get("operatorName"), MAX_SHORT_CHARS),
                             "num_rows_total": _count(s.get("numRowsTotal")),
                             "num_rows_updated": _count(s.get("numRowsUpdated")),
                             "memory_used_bytes": _count(s.get("memoryUsedBytes")),
                             "num_rows_dropped_by_watermark":
                                 _count(s.get("numRowsDroppedByWatermark"))}
                            for s in operators[:MAX_STATE_OPERATORS]],
        "watermark": text(_mapping(progress.get("eventTime")).get("watermark"),
                          MAX_SHORT_CHARS),
        "duration_ms": dict(list({str(k): v for k, v in durations.items()
                                  if _count(v) is not None}.items())[:MAX_DURATIONS])}


class History:
    """The charts' points of one query: a point per HISTORY_BUCKET_S seconds in which
    batches ran, for the last HISTORY_WINDOW_S seconds (see nimbus.state.beat_progress):
    the mean of the bucket's input and processed rates, its slowest batch's duration."""

    def __init__(self) -> None:
        # [bucket start, batches, sum of input rates, sum of processed rates, max ms]
        self._buckets: list[list[Any]] = []

    def add(self, progress: Mapping[str, Any]) -> None:
        """Count one batch's progress (in batch order)."""
        at = epoch_secs(progress.get("timestamp"))
        if at is None:
            return
        start = int(at // HISTORY_BUCKET_S) * HISTORY_BUCKET_S
        rate_in = _number(progress.get("inputRowsPerSecond"), 0.0)
        rate_out = _number(progress.get("processedRowsPerSecond"), 0.0)
        duration = batch_duration_ms(progress)
        if self._buckets and self._buckets[-1][0] == start:
            bucket = self._buckets[-1]
            bucket[1] += 1
            bucket[2] += rate_in
            bucket[3] += rate_out
            if duration is not None:
                bucket[4] = duration if bucket[4] is None else max(bucket[4], duration)
        elif not self._buckets or start > self._buckets[-1][0]:
            self._buckets.append([start, 1, rate_in, rate_out, duration])
            del self._buckets[:-HISTORY_POINTS]

    def points(self, now: float) -> list[list[Any]]:
        """``[[time, input rate, processed rate, duration ms], ...]`` of the buckets that
        started within the last HISTORY_WINDOW_S seconds before ``now``."""
        since = now - HISTORY_WINDOW_S
        return [[start, round(rate_in / n, 2), round(rate_out / n, 2),
                 round(duration) if duration is not None else None]
                for start, n, rate_in, rate_out, duration in self._buckets if start >= since]


def ran_batch(progress: Mapping[str, Any]) -> bool:
    """Whether ``progress`` reports a batch that ran: Spark also reports triggers that
    found no new data (every ``spark.sql.streaming.noDataProgressEventInterval``), with
    the id the next batch will have and no ``addBatch`` duration."""
    return "addBatch" in _mapping(progress.get("durationMs"))


class QueryProgress:
    """What one query's beats say: :meth:`report` once per beat."""

    #: A worker that fell this many batches behind reads only the newest of them.
    MAX_CATCH_UP = 100

    def __init__(self) -> None:
        self.history = History()
        self._seen_at: float | None = None   # the newest progress counted (its time)
        self._batch: int | None = None       # the newest batch that ran

    def _new(self, query: StreamingQuery, newest: Mapping[str, Any],
             at: float) -> list[Mapping[str, Any]]:
        batch = _count(newest.get("batchId"))
        if self._batch is not None and batch is not None and batch <= self._batch + 1:
            return [newest]
        # Batches ran between two beats (or this is the first look): the others are in
        # recentProgress, which is read only then (each entry crosses from the JVM).
        since = self._seen_at if self._seen_at is not None else float("-inf")
        recent = [p for p in (query.recentProgress or [])[-self.MAX_CATCH_UP:]
                  if isinstance(p, Mapping) and (epoch_secs(p.get("timestamp")) or since)
                  > since]
        return recent if any(epoch_secs(p.get("timestamp")) == at for p in recent) \
            else [*recent, newest]

    def report(self, query: StreamingQuery, now: float) -> dict[str, Any]:
        """The beat's entry of the query: the flat numbers, ``progress`` and ``history``."""
        newest = query.lastProgress
        at = epoch_secs(newest.get("timestamp")) if newest else None
        if newest and at is not None and (self._seen_at is None or at > self._seen_at):
            for progress in self._new(query, newest, at):
                self._seen_at = max(self._seen_at or at, epoch_secs(
                    progress.get("timestamp")) or at)
                if ran_batch(progress):
                    self.history.add(progress)
                    self._batch = _count(progress.get("batchId"))
        return {**flat_progress(newest), "progress": full_progress(newest),
                "history": self.history.points(now)}
