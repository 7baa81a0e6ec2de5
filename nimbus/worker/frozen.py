"""A frozen worker that nobody thaws ends: its mark and its reaper.

A worker whose lease runs out freezes its cgroup (:mod:`nimbus.worker.lease`), so that
its supervisor, or that supervisor's next process after a crash, can thaw it and go on
where it stood. If neither does (the supervisor died and was not started again), the
worker would stay frozen for ever, holding its memory (issue 29). So every freeze gets
an end, ``supervisor.worker.orphan.timeout.secs`` after it:

* **the mark**: before it freezes, the worker writes the extended attribute
  ``user.nimbus_ha.frozen`` on its own cgroup: a token of this freeze, when it froze and
  until when it may stay frozen, on ``CLOCK_BOOTTIME`` (seconds since this host booted:
  one clock for every process of the host, which nobody sets). The worker removes the
  mark when it is thawed, and so does the supervisor that thaws it
  (:func:`nimbus.supervisor.cgroups.thaw`). The mark, and how a frozen cgroup is ended,
  are what the worker and every supervisor of the host share
  (:mod:`nimbus.worker_protocol.frozen_cgroup`); this module is the worker's side;
* **the reaper**: a frozen process cannot run its own timer, so the worker starts a small
  process (``python -m nimbus.worker.frozen <cgroup> <token>``) just before it freezes,
  detached from it (not its child, in no group of its) and moved into a cgroup beside its
  own (``<supervisor's cgroup>/frozen-reapers``), where the freeze cannot reach it. The
  reaper waits for the deadline, looking every few seconds whether the mark is still
  this freeze's (it leaves as soon as the worker is thawed); at the deadline it ends the
  cgroup, if it is still frozen under the same mark, with ``cgroup.kill``: every process
  in it, what left the worker's process group included;
* **the sweep**: every supervisor process on the host ends, when it starts and every
  minute after, each frozen worker cgroup whose mark's deadline has passed
  (:mod:`nimbus.supervisor.orphans`): the end of a reaper that could not be started, or
  was killed.

A live supervisor ends its frozen workers itself, after ``supervisor.worker.timeout.secs``
(a shorter time, by default), so in practice the reaper ends orphans only. What its mark
and its reaper cost: one extended attribute, one sleeping Python process per frozen
worker, started only when it freezes, and a few milliseconds between the lease's end and
the freeze (a shell's fork and exec, measured 6-12 ms), well within the third of the
session timeout that the lease leaves before the leader may move the work.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from nimbus.worker_protocol.frozen_cgroup import (
    MARK_XATTR,
    REAPERS_CGROUP,
    Mark,
    clock,
    end_cgroup,
    is_frozen,
    read_mark,
)

log = logging.getLogger(__name__)

#: How often a reaper looks whether the worker was thawed meanwhile.
POLL_S = 1.0


def arm(cgroup: Path, timeout_s: float, log_path: Path | None = None) -> Mark | None:
    """Before a freeze of ``cgroup`` (this process's own): mark it, ending it
    ``timeout_s`` from now, and start its reaper (its output appended to ``log_path``).
    Returns the mark, or None if it could not be written (logged: the freeze goes on,
    and only a supervisor can end it then). A reaper that cannot be started is logged:
    the supervisors' sweep ends the worker instead."""
    now = clock()
    mark = Mark(uuid.uuid4().hex, now, now + timeout_s)
    try:
        os.setxattr(cgroup, MARK_XATTR, mark.encode())
    except OSError as exc:
        log.warning("cannot mark cgroup %s for its end after %.0f s frozen (%s): only a "
                    "supervisor ends it", cgroup, timeout_s, exc)
        return None
    try:
        pid = start_reaper(cgroup, mark.token, log_path)
        log.info("frozen for at most %.0f s (supervisor.worker.orphan.timeout.secs): "
                 "reaper pid %d", timeout_s, pid)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        log.warning("no reaper for cgroup %s (%s): a supervisor of this host ends it once "
                    "frozen %.0f s", cgroup, exc, timeout_s)
    return mark


def start_reaper(cgroup: Path, token: str, log_path: Path | None = None) -> int:
    """Start the reaper of ``cgroup``'s freeze ``token`` outside ``cgroup``; its pid.

    A shell starts it in the background and exits, so that the reaper is no child of
    this process (no zombie is left when it ends, and it outlives this process), in a
    session of its own; it is moved into :data:`REAPERS_CGROUP` before this returns,
    that is before the freeze."""
    reapers = cgroup.parent / REAPERS_CGROUP
    reapers.mkdir(exist_ok=True)
    command = [sys.executable, "-m", "nimbus.worker.frozen", str(cgroup), token]
    shell = subprocess.run(
        ["/bin/sh", "-c", 'log=$1; shift; "$@" </dev/null >>"$log" 2>&1 & echo $!',
         "nimbus-ha", str(log_path) if log_path is not None else os.devnull, *command],
        stdin=subprocess.DEVNULL, capture_output=True, start_new_session=True,
        timeout=10, check=True)
    pid = int(shell.stdout.decode().strip())
    try:
        (reapers / "cgroup.procs").write_text(str(pid))
    except OSError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        raise
    return pid


def reap(cgroup: Path, token: str, now: Callable[[], float] = clock,
         sleep: Callable[[float], None] = time.sleep) -> str:
    """The reaper: wait for the deadline of freeze ``token`` of ``cgroup``, then end the
    cgroup if it is still frozen under it. Returns what happened: ``"thawed"`` (the mark
    is gone or another freeze's), ``"not frozen"`` (at the deadline) or ``"ended"``."""
    while True:
        mark = read_mark(cgroup)
        if mark is None or mark.token != token:
            return "thawed"
        left = mark.deadline - now()
        if left > 0:
            sleep(min(POLL_S, left))
            continue
        if not is_frozen(cgroup):
            return "not frozen"
        end_cgroup(cgroup)
        return "ended"


def main(argv: list[str]) -> int:
    """``python -m nimbus.worker.frozen <cgroup> <token>``: the reaper (see the module
    docstring)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s "
                        "[frozen-reaper %(process)d] %(name)s: %(message)s")
    if len(argv) != 2:
        log.error("usage: python -m nimbus.worker.frozen <cgroup> <token>")
        return 2
    cgroup, token = Path(argv[0]), argv[1]
    outcome = reap(cgroup, token)
    if outcome == "ended":
        log.warning("ended frozen worker cgroup %s: nothing thawed it within "
                    "supervisor.worker.orphan.timeout.secs", cgroup)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
