"""Benchmark: peak memory of the CLI and the nimbuses while a large bundle is submitted
and replicated.

    .venv/bin/python benchmarks/bench_bundle_memory.py [--megabytes 2048] [--dir DIR]

Writes a bundle directory of N MB of random data (incompressible, so the packed .tgz and
the upload are N MB too), starts a real ZooKeeper and two nimbus processes (LocalCluster,
localfs), and submits through the real user path, a ``nimbus-ha submit NAME DIR`` process:
first a 1 MB bundle as the baseline, then the N MB one. The follower then downloads each
bundle from the leader (the code stream: sendfile on the leader, write + sha256 on the
follower). The peak RSS of the CLI is read from wait4()'s rusage when it exits (and
sampled from VmHWM in /proc/<pid>/status meanwhile); each nimbus's peak RSS is its VmHWM
once the bundle is held by both. Target: the peak RSS of every process grows by less than
64 MB from the 1 MB to the 2048 MB bundle.

Needs about 5 x N MB free disk under DIR (bundle, the CLI's packed copy, the leader's
upload and stored copy, the follower's copy); DIR defaults to a temporary directory under
$TMPDIR.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from nimbus.dev.cluster import LocalCluster

MB = 1024 * 1024
TARGET_GROWTH_MB = 64
FILE_MB = 512  # the bundle's data is split into files of at most this size


def vm_hwm_kb(pid: int) -> int:
    """Peak resident set size of a live process, in KiB (VmHWM)."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmHWM for pid {pid}")


def write_bundle(directory: Path, megabytes: int) -> None:
    directory.mkdir(parents=True)
    (directory / "pipeline.py").write_text("def run(spark, lines):\n    return lines\n")
    # submit refuses a bundle with neither topology.py nor topology.yaml
    (directory / "topology.yaml").write_text('command: ["sleep", "3600"]\n')
    left, index = megabytes, 0
    while left > 0:
        size = min(left, FILE_MB)
        with open(directory / f"data-{index:03d}.bin", "wb") as fh:
            for _ in range(size):
                fh.write(os.urandom(MB))
        left, index = left - size, index + 1


def cli_command() -> list[str]:
    script = Path(sys.executable).with_name("nimbus-ha")  # the installed console script
    return [str(script)] if script.exists() else [sys.executable, "-m", "nimbus.cli"]


def submit(cluster: LocalCluster, name: str, bundle: Path, work: Path) -> tuple[int, float]:
    """Run ``nimbus-ha submit``; returns (its peak RSS in KiB, seconds it took)."""
    log = work / f"cli-{name}.log"
    # The CLI packs the directory under $TMPDIR: keep that on the checked file system.
    env = {**os.environ, "TMPDIR": str(work)}
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*cli_command(), "submit", name, str(bundle), "--config", str(cluster.config_file),
             "--set", "topology.min.replication.count=1"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    sampled = [0]
    done = threading.Event()

    def sample() -> None:  # a cross-check of the rusage figure
        while not done.wait(0.05):
            try:
                sampled[0] = max(sampled[0], vm_hwm_kb(proc.pid))
            except (OSError, RuntimeError):
                return

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.monotonic() - started
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"nimbus-ha submit {name} failed ({proc.returncode}):\n"
                           + log.read_text(errors="replace")[-3000:])
    return max(usage.ru_maxrss, sampled[0]), elapsed


def replicated(cluster: LocalCluster, name: str, timeout_s: float = 900.0) -> float:
    """Wait until both nimbuses hold topology ``name``; returns the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        summary = {t.name: t for t in cluster.client().cluster_info().topologies}
        if name in summary and summary[name].replication_count == 2:
            return time.monotonic() - started
        time.sleep(0.5)
    raise TimeoutError(f"{name} was not held by both nimbuses within {timeout_s:.0f}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=2048, help="bundle size (MiB)")
    parser.add_argument("--dir", type=Path, default=None,
                        help="work directory (default: a temporary one under $TMPDIR)")
    args = parser.parse_args()
    parent = args.dir or Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(parent).free
    needed = (5 * args.megabytes + 1024) * MB
    print(f"free disk under {parent}: {free / 2**30:.1f} GiB "
          f"(need about {needed / 2**30:.1f} GiB)")
    if free < needed:
        sys.exit(f"not enough free disk under {parent}; use --dir or --megabytes")

    with tempfile.TemporaryDirectory(prefix="bench-bundle-memory-", dir=parent) as tmp:
        work = Path(tmp)
        started = time.monotonic()
        write_bundle(work / "small", 1)
        write_bundle(work / "large", args.megabytes)
        print(f"wrote {args.megabytes} MB of random data in "
              f"{time.monotonic() - started:.0f}s")
        conf = {
            # The .tgz of N MB of random data is slightly larger than N MB.
            "nimbus.max.topology.bytes": (args.megabytes + 64) * MB + args.megabytes * 4096,
            "nimbus.code.sync.freq.secs": 3600,
        }
        with LocalCluster(work / "cluster", 2, conf=conf) as cluster:
            leader = cluster.wait_for_leader()
            follower = next(n for n in cluster.nimbuses if n is not leader)
            pids = {"leader nimbus": leader.process.pid,
                    "follower nimbus (downloads)": follower.process.pid}
            nimbus_start = vm_hwm_kb(leader.process.pid)
            cli_small, t_small = submit(cluster, "small", work / "small", work)
            replicated(cluster, "small")
            small = {label: vm_hwm_kb(pid) for label, pid in pids.items()}
            cli_large, t_large = submit(cluster, "large", work / "large", work)
            t_copy = replicated(cluster, "large")
            large = {label: vm_hwm_kb(pid) for label, pid in pids.items()}

    rows = [("nimbus-ha submit (CLI)", cli_small, cli_large),
            *((label, small[label], large[label]) for label in pids)]
    n = args.megabytes
    print(f"\npeak RSS (VmHWM), submitting a 1 MB then a {n} MB bundle "
          f"(nimbus at start: {nimbus_start / 1024:.1f} MB)")
    print(f"{'process':<28} {'1 MB':>9} {f'{n} MB':>9} {'growth':>9} {'ratio':>6}")
    worst = 0.0
    for label, small, large in rows:
        growth = (large - small) / 1024
        worst = max(worst, growth)
        print(f"{label:<28} {small / 1024:>6.1f} MB {large / 1024:>6.1f} MB "
              f"{growth:>+6.1f} MB {large / small:>6.2f}")
    print(f"submit wall time: 1 MB {t_small:.1f}s, {n} MB {t_large:.1f}s "
          f"({n / t_large:.0f} MB/s end to end); the follower held the {n} MB bundle "
          f"{t_copy:.1f}s after the submit returned")
    verdict = "PASS" if worst < TARGET_GROWTH_MB else "FAIL"
    print(f"target: growth < {TARGET_GROWTH_MB} MB -> {verdict}")
    if verdict == "FAIL":
        sys.exit(1)


if __name__ == "__main__":
    main()
