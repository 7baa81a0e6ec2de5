"""What the worker's log pump costs a worker that prints a lot.

    .venv/bin/python benchmarks/bench_log_pump.py [--megabytes 200] [--line-bytes 120] \
        [--trials 3] [--max-mb 20]

A child process (the worker's command, say) prints ``--megabytes`` of lines to its
standard output, and the time until every byte is in the log is measured:

* baseline: its output appended straight to a file, as a worker's ``worker.log`` was
  before the pump (the supervisor opened it, O_APPEND);
* pump: through the pump of nimbus/worker/log_pump.py (a pipe, one thread, size-rotated
  files of ``--max-mb`` with their time index), as every worker runs now.

Prints each trial, and the ratios of the medians (pump / baseline) of the wall time and
of the CPU time the processes used (the writer's in both; the pump's thread, and the
Python process that holds it, in the second), measured in the same run on this machine.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WRITER = ("import sys\n"
          "line = (b'x' * (int(sys.argv[2]) - 1)) + b'\\n'\n"
          "out = sys.stdout.buffer\n"
          "for _ in range(int(sys.argv[1])):\n"
          "    out.write(line)\n"
          "out.flush()\n")


def _writer(lines: int, line_bytes: int) -> list[str]:
    return [sys.executable, "-c", WRITER, str(lines), str(line_bytes)]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def baseline(directory: Path, lines: int, line_bytes: int) -> float:
    path = directory / "worker.log"
    with open(path, "ab") as log:
        started = time.perf_counter()
        subprocess.run(_writer(lines, line_bytes), stdout=log, check=True)
        elapsed = time.perf_counter() - started
    assert path.stat().st_size == lines * line_bytes
    return elapsed


PUMPED = """
import subprocess, sys, time
from pathlib import Path
from nimbus.state.worker_logs import LogSettings
from nimbus.worker.log_pump import LogPump
directory, max_bytes = Path(sys.argv[1]), int(sys.argv[4])
pump = LogPump(directory, LogSettings(max_bytes=max_bytes, backups=1000))
started = time.perf_counter()
pump.start()
subprocess.run(sys.argv[5:], check=True)
pump.stop()
elapsed = time.perf_counter() - started
print(elapsed, file=open(directory / "elapsed", "w"))
"""


def pumped(directory: Path, lines: int, line_bytes: int, max_bytes: int) -> float:
    subprocess.run([sys.executable, "-c", PUMPED, str(directory), str(lines),
                    str(line_bytes), str(max_bytes), *_writer(lines, line_bytes)],
                   check=True)
    written = sum(p.stat().st_size for p in directory.iterdir()
                  if p.name.startswith("worker.log") and not p.name.endswith(".idx"))
    assert written >= lines * line_bytes, (written, lines * line_bytes)
    return float((directory / "elapsed").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--megabytes", type=int, default=200)
    parser.add_argument("--line-bytes", type=int, default=120)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--max-mb", type=int, default=20)
    args = parser.parse_args()
    lines = args.megabytes * 1024 * 1024 // args.line_bytes
    base, pump, base_cpu, pump_cpu = [], [], [], []
    for trial in range(args.trials):
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            cpu = _children_cpu()
            base.append(baseline(Path(a), lines, args.line_bytes))
            base_cpu.append(_children_cpu() - cpu)
            cpu = _children_cpu()
            pump.append(pumped(Path(b), lines, args.line_bytes, args.max_mb * 1024 * 1024))
            pump_cpu.append(_children_cpu() - cpu)
        print(f"trial {trial + 1}: baseline {base[-1]:.2f} s ({base_cpu[-1]:.2f} s CPU), "
              f"pump {pump[-1]:.2f} s ({pump_cpu[-1]:.2f} s CPU; "
              f"{args.megabytes / pump[-1]:.0f} MB/s through the pump)", flush=True)
    wall = statistics.median(pump) / statistics.median(base)
    cpu = statistics.median(pump_cpu) / statistics.median(base_cpu)
    print(f"{args.megabytes} MB in {args.line_bytes}-byte lines, files of {args.max_mb} MB: "
          f"pump / baseline: wall {wall:.2f}, CPU {cpu:.2f} (medians "
          f"{statistics.median(pump):.2f} s / {statistics.median(base):.2f} s wall, "
          f"{statistics.median(pump_cpu):.2f} s / {statistics.median(base_cpu):.2f} s CPU; "
          f"{os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
