"""A frozen worker that nobody thaws ends (issue 29), on real cgroups with real processes:
the mark and the reaper a worker arms before it freezes (nimbus/worker/frozen.py), and
the sweep and the count of a host's frozen orphans that every supervisor makes
(nimbus/supervisor/orphans.py).

Each test works in a cgroup tree of its own (``<cgroup2>/test-<uuid>``, standing for the
cgroup v2 root), so that nothing of the host's real workers is looked at or ended."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest
from waiting import wait_until

from nimbus.state.incarnation import Incarnation
from nimbus.supervisor import orphans
from nimbus.supervisor.cgroups import in_cgroup, thaw, unified_root
from nimbus.worker import frozen
from nimbus.worker_protocol import frozen_cgroup


class Tree:
    """A stand-in cgroup v2 root with supervisors' directories and workers' cgroups."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.processes: list[subprocess.Popen[bytes]] = []

    def base(self, supervisor_id: str) -> Path:
        path = self.root / orphans.TREE / supervisor_id
        path.mkdir(parents=True, exist_ok=True)
        return path

    def worker(self, base: Path, name: str) -> tuple[Path, subprocess.Popen[bytes]]:
        """A worker's cgroup under ``base`` and a process (``sleep``) in it."""
        cgroup = base / name
        cgroup.mkdir()
        process = subprocess.Popen(in_cgroup(cgroup, ["sleep", "600"]))
        self.processes.append(process)
        wait_until(lambda: str(process.pid) in (cgroup / "cgroup.procs").read_text().split())
        return cgroup, process

    @staticmethod
    def freeze(cgroup: Path) -> None:
        (cgroup / "cgroup.freeze").write_text("1")
        wait_until(lambda: "frozen 1" in (cgroup / "cgroup.events").read_text())

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()   # SIGKILL ends a frozen process too
            process.wait(timeout=10)
        for path in sorted(self.root.rglob("*"), key=lambda p: -len(p.parts)):
            if path.is_dir():
                wait_until(lambda p=path: _removed(p))
        wait_until(lambda: _removed(self.root))


def _removed(path: Path) -> bool:
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:  # EBUSY while the kernel sees processes go
        return False
    return True


@pytest.fixture
def tree() -> Iterator[Tree]:
    root = unified_root()
    assert root is not None, "this host must give workers cgroups (root, cgroup2)"
    made = Tree(root / f"test-{uuid.uuid4().hex[:12]}")
    made.root.mkdir()
    try:
        yield made
    finally:
        made.close()


def _reapers(base: Path) -> list[str]:
    try:
        return (base / frozen_cgroup.REAPERS_CGROUP / "cgroup.procs").read_text().split()
    except FileNotFoundError:
        return []


def test_a_worker_still_frozen_at_its_deadline_is_ended_by_its_reaper(tree, tmp_path):
    base = tree.base("sup")
    cgroup, worker = tree.worker(base, "topo-1-1-6700")
    log = tmp_path / "worker.log"
    mark = frozen.arm(cgroup, 1.0, log)
    assert mark is not None and frozen_cgroup.read_mark(cgroup) == mark
    assert mark.deadline - mark.frozen_at == 1.0
    # The reaper runs outside the cgroup about to freeze, in no session of the worker's.
    (reaper,) = _reapers(base)
    assert reaper not in (cgroup / "cgroup.procs").read_text().split()
    assert os.getsid(int(reaper)) not in (os.getsid(0), os.getsid(worker.pid))
    tree.freeze(cgroup)
    wait_until(lambda: worker.poll() is not None, 15)
    assert worker.returncode == -signal.SIGKILL
    wait_until(lambda: not cgroup.exists() and _reapers(base) == [], 15)
    assert f"ended frozen worker cgroup {cgroup}: nothing thawed it within " \
           "supervisor.worker.orphan.timeout.secs" in log.read_text()


def test_a_thaw_sends_the_reaper_away_and_the_worker_runs_on(tree, tmp_path):
    base = tree.base("sup")
    cgroup, worker = tree.worker(base, "topo-1-1-6700")
    assert frozen.arm(cgroup, 600.0, tmp_path / "worker.log") is not None
    tree.freeze(cgroup)
    assert len(_reapers(base)) == 1
    assert thaw(cgroup)   # as a supervisor thaws it: the mark goes with the freeze
    assert frozen_cgroup.read_mark(cgroup) is None
    wait_until(lambda: _reapers(base) == [], 15)
    assert worker.poll() is None and (tmp_path / "worker.log").read_text() == ""


def test_the_reaper_ends_only_its_own_freeze_and_only_a_frozen_cgroup(tree):
    cgroup, _worker = tree.worker(tree.base("sup"), "topo-1-1-6700")
    naps: list[float] = []
    os.setxattr(cgroup, frozen_cgroup.MARK_XATTR,
                frozen_cgroup.Mark("mine", 10.0, 12.5).encode())
    times = iter([10.0, 11.0, 12.5])
    assert frozen.reap(cgroup, "mine", now=lambda: next(times), sleep=naps.append) == \
        "not frozen"
    assert naps == [1.0, 1.0]   # polled every POLL_S, the last nap cut to the deadline
    os.setxattr(cgroup, frozen_cgroup.MARK_XATTR,
                frozen_cgroup.Mark("another", 10.0, 12.5).encode())
    assert frozen.reap(cgroup, "mine", now=lambda: 20.0) == "thawed"
    os.setxattr(cgroup, frozen_cgroup.MARK_XATTR, b"not a mark")
    assert frozen_cgroup.read_mark(cgroup) is None
    assert frozen.reap(cgroup, "mine", now=lambda: 20.0) == "thawed"


def _dead_owner(base: Path) -> None:
    """Write on ``base`` the incarnation of a supervisor process that has exited."""
    gone = subprocess.Popen(["sleep", "600"])
    incarnation = Incarnation.of_process(gone.pid)
    gone.kill()
    gone.wait()
    assert incarnation.is_dead()
    os.setxattr(base, orphans.OWNER_XATTR, json.dumps(asdict(incarnation)).encode())


def test_supervisors_count_the_hosts_frozen_orphans_and_end_the_overdue(tree):
    dead = tree.base("dead-supervisor")
    _dead_owner(dead)
    live = tree.base("live-supervisor")
    orphans.claim(live)   # this test process stands for a running supervisor
    now = frozen_cgroup.clock()
    overdue, overdue_worker = tree.worker(dead, "a-1-1-6700")
    waiting, waiting_worker = tree.worker(dead, "b-1-1-6701")
    running, _ = tree.worker(dead, "c-1-1-6702")
    held, held_worker = tree.worker(live, "d-1-1-6700")
    for cgroup, deadline in ((overdue, now - 1), (waiting, now + 600), (held, now - 1)):
        os.setxattr(cgroup, frozen_cgroup.MARK_XATTR,
                    frozen_cgroup.Mark(uuid.uuid4().hex, now - 10, deadline).encode())
        tree.freeze(cgroup)
    # Frozen by an earlier release: no mark, so nothing says since when; counted only.
    unmarked, unmarked_worker = tree.worker(dead, "e-1-1-6703")
    tree.freeze(unmarked)

    # Orphans: frozen, and their supervisor process is gone (the live one's are its own).
    assert orphans.count_orphans(tree.root) == 3
    assert orphans.count_orphans(tree.root, own_base=dead) == 0
    # Past their own deadline: ended, whatever supervisor's they were.
    assert orphans.end_overdue(tree.root) == [overdue, held]
    wait_until(lambda: overdue_worker.poll() is not None and held_worker.poll() is not None)
    assert (overdue_worker.returncode, held_worker.returncode) == (-signal.SIGKILL,) * 2
    assert not overdue.exists() and running.exists()
    assert waiting_worker.poll() is None and unmarked_worker.poll() is None
    assert orphans.count_orphans(tree.root) == 2
    assert orphans.end_overdue(tree.root) == []
