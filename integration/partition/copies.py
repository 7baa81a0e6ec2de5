"""How many copies of a topology run at once, sampled from /proc, and what Spark said.

A worker is ``python -m nimbus.worker <storm.local.dir>/workers/<topology-id>-<port>``
(in a process group of its own, in its supervisor's namespace; /proc shows every
namespace's processes). With ``topology.workers: 1`` two live worker processes of one
topology are two live copies of its pipeline: the one thing the lease rule forbids. A
worker frozen in its cgroup (its lease ran out: nimbus/worker/lease.py) acts no more than
a dead one and is not counted.

The sampler also reads every worker log of the topology as it grows (a log rotates, and
goes after logviewer.cleanup.age.mins, so it may not be whole at the end) for Spark's
own detection of two queries on one checkpoint.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from processes import frozen

from nimbus.dev.feed import WORKER_MODULE, processes_with_arg

CONCURRENT_MARKERS = ("Concurrent update to the log", "Multiple streaming jobs detected",
                      "ConcurrentModificationException")
LOG_SCAN_EVERY = 5  # samples


@dataclass
class Episode:
    """An interval in which more than one copy was seen alive (wall clock)."""

    start: float
    end: float
    pids: set[int] = field(default_factory=set)


@dataclass
class TopologyCopies:
    """What the sampler saw of one topology."""

    topology_id: str
    samples: int = 0
    multi_samples: int = 0
    episodes: list[Episode] = field(default_factory=list)
    # pid -> [first seen, last seen] (wall clock)
    lifetimes: dict[int, list[float]] = field(default_factory=dict)
    concurrent_log_lines: list[str] = field(default_factory=list)

    @property
    def two_copies_s(self) -> float:
        return sum(e.end - e.start for e in self.episodes)

    def last_seen(self, pid: int) -> float | None:
        seen = self.lifetimes.get(pid)
        return seen[1] if seen else None


class CopySampler:
    """Samples the worker processes of the watched topologies on a named thread
    (``copies-sampler``) every ``interval_s``; :meth:`stop` joins it."""

    def __init__(self, worker_roots: Iterable[Path], interval_s: float = 0.2):
        """``worker_roots``: each supervisor's ``<storm.local.dir>/workers`` (its workers'
        logs are beside them, in ``<storm.local.dir>/workers-artifacts``)."""
        self.worker_roots = list(worker_roots)
        self.interval_s = interval_s
        self.topologies: dict[str, TopologyCopies] = {}
        self._offsets: dict[Path, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="copies-sampler", daemon=True)

    def watch(self, topology_id: str) -> TopologyCopies:
        with self._lock:
            return self.topologies.setdefault(topology_id, TopologyCopies(topology_id))

    def start(self) -> CopySampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join(10)
        self._scan_logs()  # whatever was written since the last scan

    def _run(self) -> None:
        count = 0
        while not self._stop.wait(self.interval_s):
            self.sample()
            count += 1
            if count % LOG_SCAN_EVERY == 0:
                self._scan_logs()

    def sample(self) -> None:
        now = time.time()
        pids = processes_with_arg(WORKER_MODULE)
        by_topology: dict[str, set[int]] = {}
        for pid in pids:
            if frozen(pid):
                continue
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            for topology_id in list(self.topologies):
                if f"/{topology_id}-" in cmdline:
                    by_topology.setdefault(topology_id, set()).add(pid)
        with self._lock:
            for topology_id, seen in self.topologies.items():
                alive = by_topology.get(topology_id, set())
                seen.samples += 1
                for pid in alive:
                    seen.lifetimes.setdefault(pid, [now, now])[1] = now
                if len(alive) > 1:
                    seen.multi_samples += 1
                    last = seen.episodes[-1] if seen.episodes else None
                    # Consecutive samples with two copies are one episode.
                    if last is not None and now - last.end <= 2.5 * self.interval_s:
                        last.end = now
                        last.pids |= alive
                    else:
                        seen.episodes.append(Episode(now, now, set(alive)))

    def _scan_logs(self) -> None:
        for topology_id in list(self.topologies):
            for root in self.worker_roots:
                for log in (root.parent / "workers-artifacts" / topology_id).glob(
                        "*/worker.log"):
                    self._scan(topology_id, log)

    def _scan(self, topology_id: str, log: Path) -> None:
        try:
            with open(log, "rb") as fh:
                fh.seek(self._offsets.get(log, 0))
                data = fh.read()
                self._offsets[log] = fh.tell()
        except OSError:
            return
        for line in data.decode(errors="replace").splitlines():
            if any(marker in line for marker in CONCURRENT_MARKERS):
                with self._lock:
                    self.topologies[topology_id].concurrent_log_lines.append(
                        f"{topology_id}-{log.parent.name}: {line.strip()[:300]}")
