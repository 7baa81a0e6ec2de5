"""What a worker beat's component may carry beyond its rates: Spark's full progress and the
history for the charts, checked and bounded.

A beat (:class:`~nimbus.state.records.WorkerBeat`) is written to ZooKeeper by a supervisor
every few seconds for each of its workers, from what the worker sent on its status pipe:
input from a tenant's code. The supervisor keeps only what passes these checks
(:mod:`nimbus.supervisor.status_input`), and readers (``topology-info``, the UI) check
again what they read, since a beat may have been written by another release. Whatever is
not valid is dropped, field by field; nothing here raises.

A component's entry may hold, besides the flat numbers of docs/runtime.md:

``progress`` (:func:`checked_progress`), the newest ``StreamingQueryProgress`` of its query::

    {"batch_id": int | None, "timestamp": str | None,
     "sources": [{"description": str | None, "start_offset": str | None,
                  "end_offset": str | None, "latest_offset": str | None,
                  "num_input_rows": number | None, "input_rows_per_second": number | None,
                  "processed_rows_per_second": number | None}],      # at most MAX_SOURCES
     "sink": {"description": str | None, "num_output_rows": number | None} | None,
     "state_operators": [{"operator_name": str | None, "num_rows_total": number | None,
                          "num_rows_updated": number | None,
                          "memory_used_bytes": number | None,
                          "num_rows_dropped_by_watermark": number | None}],
     "watermark": str | None,                  # eventTime.watermark
     "duration_ms": {name: number}}            # triggerExecution, addBatch, walCommit, ...

Offsets are whatever JSON a source makes of them (Spark hands them over as text): they
are kept as text of at most :data:`MAX_OFFSET_CHARS`, cut with an ellipsis.

``history`` (:func:`checked_history`), the charts' last :data:`HISTORY_WINDOW_S` seconds:
``[[time_secs, input_rows_per_second, processed_rows_per_second, batch_duration_ms], ...]``,
oldest first, at most :data:`HISTORY_POINTS` points, one per :data:`HISTORY_BUCKET_S`
seconds in which batches ran (times are the worker host's clock, the bucket's start;
rates are the mean of the bucket's batches, the duration its slowest batch's
``triggerExecution``). A bucket in which no batch ran has no point: a gap, not a zero.

Why 90 points of 10 s: 15 minutes is what the page shows; 10 s is a few triggers at the
usual intervals, so a point still means something, and a slow batch stays visible as its
bucket's maximum; 90 points draw one every 4 pixels on a 360-pixel chart; and they cost
about 3.5 KB per component in a beat that is rewritten every few seconds. The worker
keeps the history of its own process; its supervisor puts the points of the slot's
earlier processes before it (:func:`merge_history`), so a restart is a gap in the
charts, not their end.

A whole beat's ``components`` are kept within :data:`MAX_COMPONENTS_BYTES` of JSON by
:func:`fit_components`, which drops the histories, then the progress, of the largest
components first, and marks each such component ``"details_cut": true``.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any
from urllib.parse import urlsplit

#: Sources and state operators kept of one progress.
MAX_SOURCES = 8
MAX_STATE_OPERATORS = 8
#: ``durationMs`` entries kept, and their names' form (Spark's are camelCase words).
MAX_DURATIONS = 16
_DURATION_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,39}")
#: The longest source or sink description, offset, and short text (a name, a time).
MAX_DESCRIPTION_CHARS = 256
MAX_OFFSET_CHARS = 512
MAX_SHORT_CHARS = 64
#: The charts' window, their resolution and hence the most points a history holds.
HISTORY_WINDOW_S = 900
HISTORY_BUCKET_S = 10
HISTORY_POINTS = HISTORY_WINDOW_S // HISTORY_BUCKET_S
#: The longest Spark UI address kept.
MAX_URL_CHARS = 512
#: The JSON of a beat's ``components`` is kept within this (the rest of a beat is a few
#: hundred bytes), so that a beat node stays within MAX_BEAT_BYTES.
MAX_COMPONENTS_BYTES = 60 * 1024
MAX_BEAT_BYTES = 64 * 1024
#: Numbers beyond this are no count or rate of anything (and JavaScript cannot hold them).
_MAX_NUMBER = 2.0 ** 53
ELLIPSIS = "…"


def number(value: Any) -> int | float | None:
    """``value`` if it is a finite JSON number of sane size (not a boolean), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value if abs(value) <= _MAX_NUMBER else None


def text(value: Any, limit: int) -> str | None:
    """``value`` if it is a string UTF-8 can encode, cut to ``limit`` characters (the cut
    marked with an ellipsis); else None."""
    if not isinstance(value, str):
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no reply could carry it
        return None
    return value if len(value) <= limit else value[:limit - 1] + ELLIPSIS


def _record(raw: Any, texts: dict[str, int], numbers: tuple[str, ...]) -> dict[str, Any]:
    raw = raw if isinstance(raw, dict) else {}
    out: dict[str, Any] = {key: text(raw.get(key), limit) for key, limit in texts.items()}
    out.update({key: number(raw.get(key)) for key in numbers})
    return out


_SOURCE_TEXTS = {"description": MAX_DESCRIPTION_CHARS, "start_offset": MAX_OFFSET_CHARS,
                 "end_offset": MAX_OFFSET_CHARS, "latest_offset": MAX_OFFSET_CHARS}
_SOURCE_NUMBERS = ("num_input_rows", "input_rows_per_second", "processed_rows_per_second")
_OPERATOR_NUMBERS = ("num_rows_total", "num_rows_updated", "memory_used_bytes",
                     "num_rows_dropped_by_watermark")


def _entries(raw: Any, limit: int) -> list[Any]:
    return [entry for entry in raw[:limit] if isinstance(entry, dict)] \
        if isinstance(raw, list) else []


def checked_progress(raw: Any) -> dict[str, Any] | None:
    """A component's ``progress`` as the module docstring describes it, or None when
    ``raw`` is no object."""
    if not isinstance(raw, dict):
        return None
    batch = raw.get("batch_id")
    durations = raw.get("duration_ms")
    kept_durations: dict[str, int | float] = {}
    if isinstance(durations, dict):
        for name, value in durations.items():
            if len(kept_durations) >= MAX_DURATIONS:
                break
            value = number(value)
            if isinstance(name, str) and _DURATION_NAME.fullmatch(name) and value is not None:
                kept_durations[name] = value
    sink = raw.get("sink")
    return {
        "batch_id": batch if isinstance(batch, int) and not isinstance(batch, bool)
        and number(batch) is not None else None,
        "timestamp": text(raw.get("timestamp"), MAX_SHORT_CHARS),
        "sources": [_record(s, _SOURCE_TEXTS, _SOURCE_NUMBERS)
                    for s in _entries(raw.get("sources"), MAX_SOURCES)],
        "sink": _record(sink, {"description": MAX_DESCRIPTION_CHARS}, ("num_output_rows",))
        if isinstance(sink, dict) else None,
        "state_operators": [_record(s, {"operator_name": MAX_SHORT_CHARS}, _OPERATOR_NUMBERS)
                            for s in _entries(raw.get("state_operators"),
                                              MAX_STATE_OPERATORS)],
        "watermark": text(raw.get("watermark"), MAX_SHORT_CHARS),
        "duration_ms": kept_durations}


def _point(raw: Any) -> list[Any] | None:
    if not isinstance(raw, list | tuple) or len(raw) != 4:
        return None
    at, rate_in, rate_out, duration = (number(v) for v in raw)
    if at is None or at <= 0 or rate_in is None or rate_in < 0 or rate_out is None \
            or rate_out < 0 or (raw[3] is not None and (duration is None or duration < 0)):
        return None
    return [int(at), rate_in, rate_out, duration]


def checked_history(raw: Any) -> list[list[Any]]:
    """A component's ``history``: of the newest :data:`HISTORY_POINTS` points sent, those
    that are ``[time, rate, rate, duration or null]`` with non-negative numbers, in
    strictly increasing time (a point out of order is dropped)."""
    if not isinstance(raw, list):
        return []
    out: list[list[Any]] = []
    for entry in raw[-HISTORY_POINTS:]:
        point = _point(entry)
        if point is not None and (not out or point[0] > out[-1][0]):
            out.append(point)
    return out


def merge_history(earlier: list[list[Any]], current: list[list[Any]],
                  now: float) -> list[list[Any]]:
    """``current`` (a worker's checked history) after the points of ``earlier`` (what its
    slot showed before: a previous process of the same worker) that are older than its
    first, within the last HISTORY_WINDOW_S seconds before ``now``, at most
    HISTORY_POINTS: a restart shows as a gap, not as an empty chart."""
    first = current[0][0] if current else None
    merged = [p for p in earlier if first is None or p[0] < first] + current
    since = now - HISTORY_WINDOW_S
    return [p for p in merged if p[0] >= since][-HISTORY_POINTS:]


_URL_FORBIDDEN = re.compile(r"[\x00-\x20\x7f\"'<>\\`]")


def checked_url(raw: Any) -> str:
    """``raw`` if it is an ``http(s)://host...`` address of at most :data:`MAX_URL_CHARS`
    characters without white space, quotes or angle brackets; else ""."""
    if not isinstance(raw, str) or len(raw) > MAX_URL_CHARS or _URL_FORBIDDEN.search(raw) \
            or text(raw, MAX_URL_CHARS) is None:
        return ""
    try:
        parts = urlsplit(raw)
        parts.port  # noqa: B018 - raises ValueError for a port that is no number
    except ValueError:
        return ""
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return ""
    return raw


def _size(value: Any) -> int:
    # As WorkerBeat.encode writes it (sort_keys, default separators).
    return len(json.dumps(value, sort_keys=True).encode())


def fit_components(components: dict[str, dict[str, Any]],
                   budget: int = MAX_COMPONENTS_BYTES) -> dict[str, dict[str, Any]]:
    """``components`` (already checked) within ``budget`` bytes of JSON: the histories,
    then the progress, of the largest components are dropped first, each such component
    marked ``"details_cut": True``. Flat fields are never dropped (a checked beat's flat
    fields fit: at most 64 components of a few short fields)."""
    if _size(components) <= budget:
        return components
    out = {name: dict(stats) for name, stats in components.items()}
    for detail, empty in (("history", []), ("progress", None)):
        sizes = sorted(((_size(stats.get(detail)), name) for name, stats in out.items()
                        if stats.get(detail)), reverse=True)
        total = _size(out)
        for size, name in sizes:
            if total <= budget:
                return out
            out[name][detail] = empty
            out[name]["details_cut"] = True
            total -= size - _size(empty) - len(', "details_cut": true')
        if _size(out) <= budget:
            return out
    return out
