"""Resident memory of a worker: its process group (the worker, its JVM, its command).

Read from ``/proc`` (Linux): every process whose group is the worker's, ``statm``'s
resident pages. A process that exits mid-scan is skipped. Reads are cached per group for
a few seconds: beats arrive every second, memory is reported far less often.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
CACHE_S = 5.0


def group_pids(pgid: int, proc: Path = Path("/proc")) -> list[int]:
    """Pids of every process in group ``pgid`` (a process that exits mid-scan is left
    out)."""
    pids = []
    try:
        entries = os.listdir(proc)
    except OSError:
        return pids
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            stat = (proc / entry / "stat").read_text()
            # Fields after the command (which may hold spaces and parentheses).
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[2]) == pgid:  # state, ppid, pgrp, ...
                pids.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return pids


def group_rss_bytes(pgid: int, proc: Path = Path("/proc")) -> int:
    """Bytes resident in memory of every process in group ``pgid`` (0 if none)."""
    total = 0
    for pid in group_pids(pgid, proc):
        try:
            resident = int((proc / str(pid) / "statm").read_text().split()[1])
        except (OSError, ValueError, IndexError):
            continue
        total += resident * PAGE_BYTES
    return total


class GroupMemory:
    """:func:`group_rss_bytes` of one group, read at most every :data:`CACHE_S`."""

    def __init__(self, pgid: int):
        self.pgid = pgid
        self._value = 0
        self._read_at = float("-inf")

    def bytes(self) -> int:
        now = time.monotonic()
        if now - self._read_at >= CACHE_S:
            self._value = group_rss_bytes(self.pgid)
            self._read_at = now
        return self._value
