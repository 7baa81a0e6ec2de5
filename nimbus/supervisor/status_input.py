"""A worker's status pipe, read as what it is: input from a tenant's code.

The worker runs a tenant's pipeline or command in its own process, and that code can
write anything to the status pipe (it can reopen the inherited descriptor). Whatever a
line says, the supervisor writes only below the worker's own nodes:

* an error's component must be a component id (:mod:`nimbus.state.component_ids`);
  anything else is refused and recorded as an error of the worker itself
  (``worker-<i>``), naming what was sent;
* error texts are cut to :data:`MAX_ERROR_CHARS`, and a worker may record at most
  :data:`ERRORS_PER_MINUTE` errors a minute (ZooKeeper keeps the newest 10 per
  component anyway; the budget bounds the writes), the excess dropped with one log line;
* a beat keeps at most :data:`MAX_BEAT_COMPONENTS` components, valid ids only, each with
  the known progress fields only, as numbers or short strings, and its Spark ``progress``
  and ``history`` as :mod:`nimbus.state.beat_progress` checks them (every field typed,
  every text and list bounded, offsets as capped text); :func:`checked_beat` then keeps
  the whole beat within :data:`~nimbus.state.beat_progress.MAX_BEAT_BYTES`, dropping the
  largest components' details first, and keeps a Spark UI address only if it is an
  ``http(s)`` URL;
* whether a worker proved its code version (what its supervisor reports as
  "committed") is read from its beats with the same care: a pipeline's from the Spark
  progress it forwards, once every component of its declared share shows a batch
  (:func:`batched_components`, :func:`share_committed`), a process topology's from the
  one word it says of its health check (:func:`health_said`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nimbus.state.beat_progress import (
    checked_history,
    checked_progress,
    checked_url,
    fit_components,
    merge_history,
)
from nimbus.state.component_ids import is_component_id
from nimbus.worker_protocol import health

#: The longest error text recorded (characters); the rest is cut, and says so.
MAX_ERROR_CHARS = 8192
#: Errors a worker may record per minute (a token bucket; a burst of that many).
ERRORS_PER_MINUTE = 12
#: Components a beat may report.
MAX_BEAT_COMPONENTS = 64
#: The fields of a component's progress a beat carries (WorkerBeat, docs/runtime.md).
BEAT_FIELDS = ("batch_id", "num_input_rows", "input_rows_per_second",
               "processed_rows_per_second", "timestamp", "pid", "input_waiting")
_MAX_FIELD_CHARS = 64


@dataclass(frozen=True)
class ReportedError:
    """What to record for one ``{"error": ...}`` line."""

    component: str
    text: str


def _shown(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _cut(text: str) -> str:
    if len(text) <= MAX_ERROR_CHARS:
        return text
    return text[:MAX_ERROR_CHARS] + f"\n[... {len(text) - MAX_ERROR_CHARS} more characters cut]"


def checked_error(raw: Any, own_component: str) -> ReportedError:
    """The error to record for ``{"error": raw}`` from the worker whose own component is
    ``own_component`` (``worker-<i>``)."""
    if not isinstance(raw, dict):
        return ReportedError(own_component, _cut(
            f"the worker sent an error that is not an object: {_shown(raw)}"))
    component = raw.get("component") or own_component
    text = raw.get("error")
    text = text if isinstance(text, str) and text else "unknown error"
    if not is_component_id(component):
        return ReportedError(own_component, _cut(
            f"the worker reported an error under {_shown(component)}, which is not a "
            f"component id (refused): {text}"))
    return ReportedError(component, _cut(text))


def checked_components(raw: Any) -> dict[str, dict[str, Any]]:
    """A beat's ``components``, keeping what a WorkerBeat may hold (see module doc)."""
    if not isinstance(raw, dict):
        return {}
    out: dict[str, dict[str, Any]] = {}
    for name, stats in raw.items():
        if len(out) >= MAX_BEAT_COMPONENTS:
            break
        if not is_component_id(name) or not isinstance(stats, dict):
            continue
        kept = {key: value for key, value in stats.items()
                if key in BEAT_FIELDS and _plain(value)}
        if "progress" in stats:
            kept["progress"] = checked_progress(stats["progress"])
        if "history" in stats:
            kept["history"] = checked_history(stats["history"])
        out[name] = kept
    return out


@dataclass(frozen=True)
class CheckedBeat:
    """What a WorkerBeat may hold of one ``{"beat": ...}`` line, and each component's
    history before the size bound cut any (what the slot's next process continues)."""

    components: dict[str, dict[str, Any]]
    spark_ui_url: str
    histories: dict[str, list[list[Any]]]


def checked_beat(raw: dict[str, Any], earlier: dict[str, list[list[Any]]] | None = None,
                 now: float | None = None) -> CheckedBeat:
    """The components (:func:`checked_components`, each history after the ``earlier``
    points of its slot (``merge_history``), then fitted within the beat's size bound) and
    the Spark UI address ("" unless an http(s) URL) of a beat."""
    components = checked_components(raw.get("components"))
    now = time.time() if now is None else now
    histories = {}
    for name, stats in components.items():
        if "history" in stats or (earlier or {}).get(name):
            stats["history"] = histories[name] = merge_history(
                (earlier or {}).get(name, []), stats.get("history", []), now)
    return CheckedBeat(fit_components(components), checked_url(raw.get("spark_ui_url")),
                       histories)


def batched_components(components: dict[str, dict[str, Any]]) -> set[str]:
    """The components of a beat (as :func:`checked_components` kept them) that show a
    batch that ran in the worker that sent it, which Spark reports only once the batch is
    committed (its commit log written): a component's newest progress with an
    ``addBatch`` duration, or a point in its history (the worker's own, of the batches
    it ran: nimbus/worker/progress.py). A trigger that found no data also reports a
    progress, with the id the next batch will have: that is no commit."""
    out = set()
    for name, stats in components.items():
        progress = stats.get("progress")
        if isinstance(progress, dict) and "addBatch" in (progress.get("duration_ms") or {}):
            out.add(name)
        elif stats.get("history"):
            out.add(name)
    return out


def committed_batch(components: dict[str, dict[str, Any]]) -> bool:
    """Whether any component of a beat shows a batch that ran and committed in the
    worker that sent it (:func:`batched_components`)."""
    return bool(batched_components(components))


def share_committed(own: tuple[str, ...] | None, batched: set[str]) -> bool:
    """Whether a pipeline worker proved its code: every component of its own share
    (``own``, as it declared it; None: not declared, or nothing believable) ran a batch
    that committed in it (``batched``). One query committing while another of the share
    has not run a batch yet proves nothing of the other (a stateful query may still fail
    at its first batch on a checkpoint Spark refuses). A worker whose share is empty runs
    no query: it has nothing to prove once it declared it."""
    return own is not None and set(own) <= batched


def health_said(raw: Any) -> str:
    """What a beat's ``health`` says (:mod:`nimbus.worker_protocol.health`): absent (a
    worker of an earlier release, which declared none) is ``none``; anything but
    ``none`` or ``passed`` is ``pending`` (not believed to have passed)."""
    if raw is None:
        return health.NONE
    return raw if raw in (health.NONE, health.PASSED) else health.PENDING


#: Most component names a worker may declare (``{"components": {"all": [...]}}``).
MAX_DECLARED_COMPONENTS = 10_000


def checked_component_list(raw: Any) -> tuple[str, ...] | None:
    """A worker's declared component names, sorted, or None if anything in ``raw`` is not
    a list of valid component ids (or is too long): then nothing is believed."""
    if not isinstance(raw, list) or len(raw) > MAX_DECLARED_COMPONENTS \
            or not all(is_component_id(name) for name in raw):
        return None
    return tuple(sorted(set(raw)))


def _plain(value: Any) -> bool:
    if value is None or isinstance(value, bool | int | float):
        return True
    return isinstance(value, str) and len(value) <= _MAX_FIELD_CHARS


class ErrorBudget:
    """At most ``per_minute`` errors a minute, in bursts of as many (a token bucket)."""

    def __init__(self, per_minute: int = ERRORS_PER_MINUTE,
                 clock: Callable[[], float] = time.monotonic):
        self._rate_s = per_minute / 60.0
        self._capacity = float(per_minute)
        self._tokens = float(per_minute)
        self._clock = clock
        self._at = clock()
        self.dropped = 0

    def take(self) -> bool:
        """Whether one more error may be recorded now (counts it if so)."""
        now = self._clock()
        self._tokens = min(self._capacity, self._tokens + (now - self._at) * self._rate_s)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        self.dropped += 1
        return False
