"""Looking at worker processes from outside (Linux /proc and cgroup v2), for the tests."""

from __future__ import annotations

import os
from pathlib import Path

from nimbus.dev.feed import WORKER_MODULE, processes_with_arg


def workers_in(worker_dir: Path) -> list[int]:
    """Pids of live worker processes working in ``worker_dir``: a cold worker starts
    there, a warm one moves there when it is taken (its command line names its warm
    directory, not the slot's)."""
    pids = []
    for pid in processes_with_arg(WORKER_MODULE):
        try:
            if Path(os.readlink(f"/proc/{pid}/cwd")) == Path(worker_dir):
                pids.append(pid)
        except OSError:
            continue
    return pids


def running(pid: int) -> bool:
    """Whether ``pid`` runs: a killed child that its (maybe frozen) parent has not reaped
    yet is a zombie, not a running process."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def frozen(pid: int) -> bool:
    """Whether ``pid`` sits in a frozen cgroup v2 (``cgroup.events`` says ``frozen 1``): a
    worker whose lease ran out freezes there (nimbus/worker/lease.py), and a frozen
    process acts no more than a dead one."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return False
    relative = next((line[3:] for line in lines if line.startswith("0::/")), None)
    root = next((fields[1] for fields in (m.split() for m in mounts)
                 if len(fields) >= 3 and fields[2] == "cgroup2"), None)
    if relative is None or root is None or relative == "/":
        return False
    try:
        events = (Path(root) / relative.lstrip("/") / "cgroup.events").read_text()
    except OSError:
        return False
    return "frozen 1" in events.splitlines()


def acting(pid: int) -> bool:
    """Whether ``pid`` can still do anything: running, and not frozen."""
    return running(pid) and not frozen(pid)


def process_tree_rss_kib(pid: int) -> int:
    """Resident memory of ``pid`` and all its descendants, in KiB (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        todo.extend(children.get(current, []))
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total
