"""The checker: judges a whole run at the end, from logs, client history, the audit trail,
the worker samples and the committed output.

Safety counts (:attr:`Report.violations`) must all be zero:

* ``two_leaders_by_logs``: overlapping leadership intervals of two nimbuses, by their
  own "gained leadership" / "lost leadership" lines;
* ``two_leaders_by_clients``: two nimbuses each answering "I am the leader" with
  overlapping ``[sent, received]``;
* ``deposed_writes``: leader writes committed by a deposed leader (the audit trail,
  :mod:`nimbus.state.leader_audit`);
* ``two_copies_moments``: episodes in which two workers of one pipeline were alive,
  and ``spark_concurrent_updates``: Spark's own report of two queries on one checkpoint;
* ``records_lost`` / ``records_duplicated`` / ``records_unexpected``: exactly once.

Bounded times are figures, most of them ratios to the negotiated session timeout
(``*_ratio``); a scenario states each bound with :meth:`Report.bound`, and a figure
that is missing (the event never happened) fails its bound.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from copies import TopologyCopies
from leadership import Interval, claims, log_intervals, overlaps

from nimbus.dev.feed import exactly_once_report
from nimbus.state.leader_audit import AuditedWrite, deposed_writes


@dataclass
class Report:
    """The verdict on one run of one scenario."""

    scenario: str
    seed: int
    session_s: float
    figures: dict[str, float | None] = field(default_factory=dict)
    violations: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failures and not any(self.violations.values())

    def problems(self) -> list[str]:
        """Every violation and failed bound, one line each (empty when ok)."""
        return [f"{name}: {count}" for name, count in self.violations.items() if count] \
            + self.failures

    # -- figures and bounds ------------------------------------------------------------------
    def ratio(self, name: str, seconds: float | None) -> float | None:
        """Record ``seconds`` as ``<name>_ratio`` (to the session timeout) and return it."""
        value = None if seconds is None else round(seconds / self.session_s, 3)
        self.figures[f"{name}_ratio"] = value
        return value

    def bound(self, name: str, limit: float, why: str = "") -> None:
        """Figure ``name`` must exist and be at most ``limit``."""
        value = self.figures.get(name)
        if value is None:
            self.failures.append(f"{name}: never measured (the event did not happen)"
                                 + (f"; {why}" if why else ""))
        elif value > limit:
            self.failures.append(f"{name} = {value} > {limit}" + (f" ({why})" if why else ""))

    def require(self, condition: bool, failure: str) -> None:
        if not condition:
            self.failures.append(failure)

    # -- safety ------------------------------------------------------------------------------
    def leadership(self, events: Mapping[str, list[tuple[float, str]]],
                   ends: Mapping[str, float]) -> list[Interval]:
        """Two leaders at once by the nimbus logs; returns the intervals."""
        intervals = log_intervals(events, ends)
        found = overlaps(intervals)
        self.violations["two_leaders_by_logs"] = len(found)
        self.details["leaderships"] = [_rounded(asdict(i)) for i in intervals]
        if found:
            self.details["two_leaders_by_logs"] = [_rounded(asdict(o)) for o in found]
            self.figures["two_leaders_by_logs_s"] = round(max(o.seconds for o in found), 3)
        return intervals

    def client_claims(self, history: Iterable[Mapping[str, Any]]) -> None:
        """Two nimbuses each answering "I am the leader" at overlapping times."""
        found = overlaps(claims(history))
        self.violations["two_leaders_by_clients"] = len(found)
        if found:
            self.details["two_leaders_by_clients"] = [_rounded(asdict(o)) for o in found[:20]]

    def audit_trail(self, writes: Iterable[Mapping[str, Any]]) -> None:
        trail = [AuditedWrite(w["order"], w["lock"], w["by"], w["time"]) for w in writes]
        deposed = deposed_writes(trail)
        self.violations["deposed_writes"] = len(deposed)
        self.figures["leader_writes_audited"] = len(trail)
        if deposed:
            self.details["deposed_writes"] = [asdict(w) for w in deposed[:20]]

    def copies(self, seen: TopologyCopies, supervisor_logs: Iterable[str] = ()) -> None:
        """Two live copies of one pipeline, by the samples and by Spark."""
        self.violations["two_copies_moments"] = len(seen.episodes)
        self.figures["two_copies_s"] = round(seen.two_copies_s, 2)
        self.figures["worker_samples"] = seen.samples
        lines = list(seen.concurrent_log_lines)
        for text in supervisor_logs:
            lines += [line for line in text.splitlines()
                      if "Concurrent update to the log" in line]
        self.violations["spark_concurrent_updates"] = len(lines)
        if seen.episodes:
            self.details["two_copies"] = [_rounded({"start": e.start, "end": e.end,
                                                    "pids": sorted(e.pids)})
                                          for e in seen.episodes]
        if lines:
            self.details["spark_concurrent_updates"] = lines[:10]

    def exactly_once(self, fed: list[int], committed: Counter) -> None:
        check = exactly_once_report(fed, committed)
        self.figures["records_fed"] = len(fed)
        self.violations["records_lost"] = len(check["lost"])
        self.violations["records_duplicated"] = len(check["duplicated"])
        self.violations["records_unexpected"] = len(check["unexpected"])
        if any(check.values()):
            self.details["exactly_once"] = {k: v[:20] for k, v in check.items()}

    def history_counts(self, history: Iterable[Mapping[str, Any]]) -> None:
        """How the client's calls ended, by kind and outcome (a figure for the docs)."""
        counts: Counter = Counter(f"{r['kind']}_{r['outcome']}" for r in history)
        self.details["calls"] = dict(sorted(counts.items()))

    def to_json(self) -> str:
        return json.dumps(_rounded(asdict(self)) | {"ok": self.ok}, indent=1, default=str)


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value
