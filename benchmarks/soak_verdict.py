"""The chaos soak's verdict: its report judged against guarantees and targets.

A **guarantee** is a correctness property: no topology lost, no record lost, duplicated or
unexpected, no leader write by a deposed leader, never two leaders at once. A **target**
is a figure of availability the issue asks for (issue 20, item 7): the longest time
without progress ≤ 15 × the session timeout, the longest time without a leader ≤ 3 ×,
and, with spaced faults, every pipeline's longest stall ≤ 2 × (session timeout + warm
restart). See ``benchmarks/soak.py`` for how each figure is measured.

:func:`exit_status` keeps them apart, so that a run can be gated on correctness alone:
0 when everything passed, 1 when a guarantee failed, 3 when every guarantee held but a
target was missed (not 2: argparse exits 2 on a usage error).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NO_PROGRESS_TARGET = 15.0   # × the session timeout
NO_LEADER_TARGET = 3.0      # × the session timeout
STALL_BOUND_FACTOR = 2.0    # × (session timeout + warm restart), with spaced faults

GUARANTEE_FAILED = 1
TARGET_MISSED = 3


@dataclass(frozen=True)
class Verdict:
    """One figure of a report against its limit (``value <= limit`` passes)."""

    kind: str      # "guarantee" or "target"
    name: str
    value: float
    limit: float
    reading: str   # the figure as a person reads it, with its unit
    unit: str = ""  # of value and limit

    @property
    def passed(self) -> bool:
        return self.value <= self.limit


def judge(report: dict[str, Any]) -> list[Verdict]:
    """Every guarantee and target of ``report`` (from ``soak.Soak.report``)."""
    records = report["records"].values()
    verdicts = [Verdict("guarantee", name, value, 0, str(value)) for name, value in (
        ("topologies lost", report["topologies_lost"]),
        ("records lost", sum(r["lost"] for r in records)),
        ("records duplicated", sum(r["duplicated"] for r in records)),
        ("records unexpected", sum(r["unexpected"] for r in records)),
        ("leader writes by a deposed leader", report["leader_writes_by_deposed_leaders"]),
        ("moments with two leaders", report["two_leaders_at_once"]))]
    session = report["session_timeout_s"]
    stalls = report["longest_no_progress_s"]
    worst = max(stalls, key=stalls.get)
    verdicts.append(Verdict(
        "target", "longest time without progress (x session timeout)",
        report["longest_no_progress_ratio"], NO_PROGRESS_TARGET,
        f"{report['longest_no_progress_ratio']} × ({stalls[worst]} s, {worst}, "
        f"from {report['longest_no_progress_from'][worst]})", " ×"))
    verdicts.append(Verdict(
        "target", "longest time without a leader (x session timeout)",
        report["longest_no_leader_ratio"], NO_LEADER_TARGET,
        f"{report['longest_no_leader_ratio']} × ({report['longest_no_leader_s']} s)", " ×"))
    if report.get("spacing_s") is not None:
        bound = report["stall_bound_s"]
        for name, stall in stalls.items():
            verdicts.append(Verdict(
                "target", f"{name} longest stall, spaced faults", stall, bound,
                f"{stall} s = {stall / session:.2f} × (from "
                f"{report['longest_no_progress_from'][name]}; faults: "
                f"{report['longest_no_progress_faults'][name]})", " s"))
    return verdicts


def summary(verdicts: list[Verdict]) -> dict[str, dict[str, str]]:
    """``{"guarantees": {name: "PASS" or "FAIL"}, "targets": {...}}``, for the JSON report
    (the values are the report's own figures)."""
    return {f"{kind}s": {v.name: "PASS" if v.passed else "FAIL"
                         for v in verdicts if v.kind == kind}
            for kind in ("guarantee", "target")}


def exit_status(verdicts: list[Verdict]) -> int:
    """0, :data:`GUARANTEE_FAILED` or :data:`TARGET_MISSED`; see the module docstring."""
    if any(not v.passed for v in verdicts if v.kind == "guarantee"):
        return GUARANTEE_FAILED
    if any(not v.passed for v in verdicts if v.kind == "target"):
        return TARGET_MISSED
    return 0


def render(verdicts: list[Verdict], report: dict[str, Any]) -> str:
    """The verdict as lines of text: one per figure with PASS or FAIL, then the outcome."""
    width = max(len(v.name) for v in verdicts)
    lines = []
    for kind, heading in (("guarantee", "guarantees (must be 0):"),
                          ("target", "targets:")):
        lines.append(heading)
        for v in (v for v in verdicts if v.kind == kind):
            limit = "" if kind == "guarantee" else f"  (target <= {v.limit:g}{v.unit})"
            lines.append(f"  {'PASS' if v.passed else 'FAIL'}  {v.name:<{width}}  "
                         f"{v.reading}{limit}")
    if report.get("spacing_s") is not None:
        low, high = report["spacing_s"]
        lines.append(
            f"spaced faults: {low:g}-{high:g} s apart; warm restart "
            f"{report['warm_restart_s']} s (kill -9 of {report['warm_restart_pipeline']}'s "
            f"worker to its next commit, before the faults; warm workers ready before: "
            f"{report['warm_restart_ready_before']}, it started warm: "
            f"{report['warm_restart_started_warm']}); stall bound "
            f"{STALL_BOUND_FACTOR:g} × ({report['session_timeout_s']:g} + "
            f"{report['warm_restart_s']}) = {report['stall_bound_s']} s")
    status = exit_status(verdicts)
    failed = [v for v in verdicts if not v.passed]
    outcome = {0: "every guarantee held and every target was met",
               GUARANTEE_FAILED: "a GUARANTEE FAILED",
               TARGET_MISSED: f"every guarantee held; {len(failed)} target(s) missed"}[status]
    lines.append(f"result: {outcome} (exit status {status})")
    return "\n".join(lines)
