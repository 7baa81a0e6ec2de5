"""Run partition scenarios with seeded repetitions and print their figures.

    sudo .venv/bin/python integration/partition/run.py --scenario all --runs 5 --seed 1
    sudo NIMBUS_LAB_PYTHONPATH=/tmp/nimbus-base .venv/bin/python \\
        integration/partition/run.py --scenario leader_cut_polled --runs 3

Run ``i`` (from 0) of a scenario uses seed ``--seed + i``: a failing run is repeated
with ``--runs 1 --seed <its seed>``. Per scenario it prints how many runs passed, the
median and maximum of every ratio (to the negotiated session timeout), the total of
every safety violation, and each failing run's problems. ``--json FILE`` also writes
every report. Exits 1 if any run failed, 2 if the lab cannot run here.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from checker import Report
from netlab import preflight, remove_stale
from scenarios import SCENARIOS, run
from steps import Options


def summarize(name: str, reports: list[Report]) -> str:
    """One scenario's figures over its runs, as printable lines."""
    passed = sum(r.ok for r in reports)
    lines = [f"== {name}: {passed}/{len(reports)} runs passed"]
    figures = sorted({k for r in reports for k in r.figures if k.endswith("_ratio")})
    for figure in figures:
        values = [r.figures.get(figure) for r in reports]
        measured = [v for v in values if v is not None]
        missing = len(values) - len(measured)
        if measured:
            lines.append(f"   {figure:34s} median {statistics.median(measured):6.3f}  "
                         f"max {max(measured):6.3f}"
                         + (f"  (not measured in {missing} runs)" if missing else ""))
        else:
            lines.append(f"   {figure:34s} never measured")
    for key in sorted({k for r in reports for k in r.violations}):
        total = sum(r.violations.get(key, 0) for r in reports)
        runs = sum(1 for r in reports if r.violations.get(key))
        lines.append(f"   {key:34s} {total} (in {runs} runs)")
    for report in reports:
        for problem in report.problems():
            lines.append(f"   seed {report.seed}: {problem}")
        for note in report.notes:
            lines.append(f"   seed {report.seed} note: {note}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="all",
                        help=f"one of {', '.join(SCENARIOS)}, or all")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--session-ms", type=int, default=6000)
    parser.add_argument("--flap-s", type=float, default=60.0)
    parser.add_argument("--work", type=Path, help="keep every run's files here")
    parser.add_argument("--json", type=Path, help="write every report to this file")
    args = parser.parse_args()
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario {unknown[0]!r}; known: {', '.join(SCENARIOS)}")
    reason = preflight()
    if reason:
        print(f"cannot run the partition lab: {reason}", file=sys.stderr)
        sys.exit(2)
    for stale in remove_stale():
        print(f"removed namespace {stale} of a dead run", file=sys.stderr)
    work = args.work or Path(tempfile.mkdtemp(prefix="nimbus-partition-"))
    results: dict[str, list[Report]] = {}
    started = time.monotonic()
    try:
        for name in names:
            for index in range(args.runs):
                seed = args.seed + index
                opts = Options(work / f"{name}-seed{seed}", session_ms=args.session_ms,
                               flap_s=args.flap_s)
                began = time.monotonic()
                try:
                    report = run(name, seed, opts)
                except Exception as exc:  # a run that could not finish is a failed run
                    report = Report(name, seed, args.session_ms / 1000)
                    report.failures.append(f"the run failed: {type(exc).__name__}: {exc}")
                report.figures["wall_time_s"] = round(time.monotonic() - began, 1)
                results.setdefault(name, []).append(report)
                print(f"{name} seed {seed}: {'ok' if report.ok else 'FAILED'} "
                      f"({report.figures['wall_time_s']}s)", flush=True)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n{sum(len(r) for r in results.values())} runs in "
          f"{time.monotonic() - started:.0f}s")
    for name, reports in results.items():
        print(summarize(name, reports))
    if args.json:
        args.json.write_text(json.dumps(
            {name: [json.loads(r.to_json()) for r in reports]
             for name, reports in results.items()}, indent=1))
    sys.exit(0 if all(r.ok for reports in results.values() for r in reports) else 1)


if __name__ == "__main__":
    main()
