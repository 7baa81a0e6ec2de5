"""The lease (supervisor -> worker): the worker may run only while its lease is valid.

The supervisor writes ``lease <deadline>\\n`` lines to the inherited ``lease_fd``; the
deadline is a ``time.monotonic()`` value (same host, same clock). When the newest
deadline has passed, the worker kills its whole process group with SIGKILL at once: its
Spark JVM and any child command die with it, so no batch or command outlives the
supervisor's ZooKeeper session (see docs/runtime.md for why the deadline makes that safe).
When the pipe reaches EOF (the supervisor is gone), a worker running a slot runs on to
the deadline already granted, in case its supervisor, started again, takes it over
(:mod:`nimbus.worker.takeover`); one that holds no lease yet is killed at once.

A worker in a cgroup of its own whose supervisor is still there (the pipe open) freezes
instead of dying when the deadline passes: it writes ``1`` to its cgroup's
``cgroup.freeze``, which stops every process in the cgroup, the writing thread included,
before any of them runs another instruction in user space. A frozen worker acts no more
than a dead one, and only its supervisor thaws it, right after it has written a renewal
that a round trip earned, which read the assignment unchanged since the worker's last
renewal (:mod:`nimbus.supervisor.lease`; the session may be a later one): a supervisor
that comes back after a ZooKeeper quorum loss, a cut longer than the lease or a lost
session resumes the pipeline where it stood, instead of restarting it. A worker thawed
with no renewal in its pipe kills itself at once; one never thawed is killed by its
supervisor (work moved, or frozen longer than ``supervisor.worker.timeout.secs``).
Where the cgroup
cannot be frozen (no cgroup, or a worker run as another account, which may not write
it), the deadline kills as before.

A worker whose supervisor is gone (the pipe at EOF) and which has a take-over point to
be found at (:mod:`nimbus.worker.takeover`) freezes the same way at the end of its lease:
the supervisor's next process may take it over frozen, write a renewal into the take-over
connection and thaw it. Thawed, it must find that connection waiting or already
attached, and a valid renewal on it within a second, or it kills itself.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from nimbus.worker import frozen, log_pump
from nimbus.worker.log_pump import before_kill, current_log_file
from nimbus.worker_protocol.frozen_cgroup import clear_mark

log = logging.getLogger(__name__)

# How often the reader looks at its stop event while no lease line arrives.
_POLL_SECS = 0.5
# After a thaw, how long the watchdog waits for the reader to take the renewal that is in
# the pipe (it is there: the supervisor writes it before it thaws). Then it looks again.
_THAW_READ_S = 1.0


def kill_process_group(reason: str) -> None:
    """Log ``reason`` and SIGKILL this process's group (this process included); no return.

    The worker is the leader of its group (the supervisor starts it with
    ``start_new_session``; ``ensure_group_leader`` makes sure), so the group is exactly
    the worker and everything it started.
    """
    # Its last words go to its log file itself, not into the log pump's pipe: the pump
    # dies with the group (a few milliseconds for what the pipe holds, no more).
    before_kill()
    log.critical("lease lost (%s): killing process group %d", reason, os.getpgrp())
    _flush_logs()
    try:
        sys.stderr.flush()
    finally:
        cgroup = os.environ.get("NIMBUS_HA_CGROUP")  # set by the supervisor (its cgroups)
        if cgroup:
            # Everything in the worker's cgroup, what left its process group included.
            try:
                with open(os.path.join(cgroup, "cgroup.kill"), "w") as kill:
                    kill.write("1")
            except OSError:
                pass
        os.killpg(os.getpgrp(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)  # not reached; belt and braces


def freeze_own_cgroup(end_after_s: float | None = None) -> bool:
    """Freeze this worker's cgroup (``NIMBUS_HA_CGROUP``), this process included; returns
    once something thawed it: True. False, at once, if this process cannot be frozen that
    way (no cgroup named, not in it, or not allowed to write its ``cgroup.freeze``).

    ``end_after_s`` (``supervisor.worker.orphan.timeout.secs``): the cgroup is ended if
    it is still frozen that long after the freeze (:mod:`nimbus.worker.frozen`: a mark
    on the cgroup, and a reaper outside it, armed before the freeze)."""
    cgroup = os.environ.get("NIMBUS_HA_CGROUP")
    if not cgroup or not _in_cgroup(cgroup):
        return False
    try:
        fd = os.open(os.path.join(cgroup, "cgroup.freeze"), os.O_WRONLY)
    except OSError:
        return False
    mark = None
    if end_after_s is not None:
        # The reaper writes where this worker does: its log file (not the pump's pipe,
        # which is frozen with this process), or its standard output without a pump.
        mark = frozen.arm(Path(cgroup), end_after_s,
                          current_log_file() or Path(f"/proc/{os.getpid()}/fd/1"))
    log_pump.flush()  # what it said so far is in its log before the pump freezes too
    try:
        # The kernel freezes this thread on its way back from the write: the next line
        # runs only after a thaw.
        os.write(fd, b"1")
    except OSError:
        return False
    finally:
        os.close(fd)
        if mark is not None:  # thawed (or never frozen): its reaper leaves
            clear_mark(Path(cgroup))
    return True


def _in_cgroup(cgroup: str) -> bool:
    """Whether this process is in the cgroup v2 directory ``cgroup`` (by its path under
    the hierarchy's mount point, as ``/proc/self/cgroup`` gives it)."""
    try:
        with open("/proc/self/cgroup") as own:
            lines = own.read().splitlines()
    except OSError:
        return False
    for line in lines:
        if line.startswith("0::/"):
            relative = line[3:].rstrip("/")
            return bool(relative) and cgroup.rstrip("/").endswith(relative)
    return False


def ensure_group_leader() -> None:
    """Make this process the leader of its own process group if it is not already.

    Killing "our group" must never reach the supervisor: when the worker was started
    without ``start_new_session`` it would share the supervisor's group.
    """
    if os.getpgrp() != os.getpid():
        os.setpgid(0, 0)
        log.warning("not started as a process-group leader; made a group of its own")


class Lease:
    """Reads lease lines from ``fd`` and enforces the newest deadline.

    Two daemon threads, ``lease-reader`` and ``lease-watchdog``, run from :meth:`start`
    until :meth:`stop`. ``on_expiry(reason)`` is called once when the lease runs out or
    the pipe closes; the default kills the process group and does not return.
    """

    def __init__(self, fd: int,
                 on_expiry: Callable[[str], None] = kill_process_group,
                 outlives_supervisor: bool = False,
                 freeze: Callable[[], bool] | None = None) -> None:
        """``outlives_supervisor``: on EOF of the lease pipe, run on to the deadline
        already granted (a supervisor started again may :meth:`attach` meanwhile,
        :mod:`nimbus.worker.takeover`) instead of expiring at once.
        ``freeze``: called when the deadline passes while a supervisor is attached; it
        returns once thawed (True), or at once if it cannot freeze (False: expire)."""
        self._fd = fd
        self._on_expiry = on_expiry
        self._outlives_supervisor = outlives_supervisor
        self._freeze = freeze
        self._frozen_s = 0.0  # time spent frozen, in all
        self._frozen_since: float | None = None  # a freeze not yet counted began then
        self._reading = False  # the reader has lines out of the pipe not yet applied
        self._orphaned = False  # the lease pipe reached EOF and nothing is attached yet
        # Called on the reader thread with (worker_index, num_workers) of an "assign" line.
        self.on_assign: Callable[[int, int], None] | None = None
        # Whether a supervisor's take-over connection waits or is being accepted; set by
        # the take-over point that listens (None: an orphan has none and cannot freeze).
        self.attach_pending: Callable[[], bool] | None = None
        self._lapsed = False  # ran out and frozen (or about to be): attach() may still
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._expired = False
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._read_loop, name="lease-reader", daemon=True),
            threading.Thread(target=self._watch_loop, name="lease-watchdog", daemon=True),
        ]

    def start(self) -> Lease:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Stop enforcing the lease and join both threads (at the end of a clean exit)."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=2 * _POLL_SECS + 1)

    @property
    def deadline(self) -> float | None:
        """The newest deadline received (a ``time.monotonic()`` value), None before any."""
        with self._cond:
            return self._deadline

    def wait_first(self, timeout: float, stop: threading.Event) -> bool:
        """Wait up to ``timeout`` seconds for the first lease; False on timeout or ``stop``."""
        end = time.monotonic() + timeout
        with self._cond:
            while self._deadline is None:
                remaining = end - time.monotonic()
                if remaining <= 0 or stop.is_set():
                    return False
                # Short waits so that a stop request (SIGTERM) is seen promptly.
                self._cond.wait(min(remaining, 0.2))
            return True

    @property
    def frozen_s(self) -> float:
        """Seconds this worker has spent frozen so far (see the module doc)."""
        with self._cond:
            return self._frozen_s

    def running_clock(self) -> float:
        """``time.monotonic()`` less the time spent frozen: the clock for judging the
        worker's own progress (health checks, stalls), which cannot advance while it is
        frozen. It stands still from the freeze until the watchdog has counted it, so a
        thread that runs first after a thaw does not see the frozen time either."""
        with self._cond:
            if self._frozen_since is not None:
                return self._frozen_since - self._frozen_s
            return time.monotonic() - self._frozen_s

    @property
    def orphaned(self) -> bool:
        """Whether the supervisor that granted the lease is gone and none has attached."""
        with self._cond:
            return self._orphaned and not self._expired

    def attach(self, fd: int) -> bool:
        """Read lease lines from ``fd`` (a supervisor started again) from now on; False
        if the lease has already run out (the caller closes ``fd``), unless the worker
        froze on it and was thawed to be taken over (see the module doc)."""
        with self._cond:
            if self._expired or self._stop.is_set() or not self._orphaned:
                return False
            if self._deadline is None or \
                    (time.monotonic() >= self._deadline and not self._lapsed):
                return False  # ran out: the watchdog is about to act on it
            self._fd = fd
            self._orphaned = False
            self._cond.notify_all()
        return True

    def _expire(self, reason: str) -> None:
        with self._cond:
            if self._expired or self._stop.is_set():
                return
            self._expired = True
        self._on_expiry(reason)
        self._stop.set()

    def _read_loop(self) -> None:
        buffer = b""
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([self._fd], [], [], _POLL_SECS)
                if not ready:
                    continue
                with self._cond:
                    # From before the read until its lines are applied: a watchdog just
                    # thawed must not take a renewal being read for no renewal at all.
                    self._reading = True
                chunk = os.read(self._fd, 4096)
            except OSError as exc:
                self._done_reading()
                self._expire(f"lease pipe unreadable: {exc}")
                return
            if not chunk:
                self._done_reading()
                if not self._wait_for_successor():
                    return
                buffer = b""
                continue
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                self._accept(line)
            self._done_reading()

    def _done_reading(self) -> None:
        with self._cond:
            self._reading = False
            self._cond.notify_all()

    def _wait_for_successor(self) -> bool:
        """After EOF: expire at once, or (``outlives_supervisor`` and a lease granted)
        wait until a supervisor attaches (True) or the lease ends (False)."""
        with self._cond:
            granted = self._deadline
            if not self._outlives_supervisor or granted is None:
                reason = "lease pipe closed: the supervisor is gone"
            else:
                os.close(self._fd)
                self._orphaned = True
                reason = ""
        if reason:
            self._expire(reason)
            return False
        log.warning("the supervisor is gone: this worker runs to the end of its lease "
                    "(%.1f s) unless the supervisor, started again, takes it over first",
                    granted - time.monotonic())
        with self._cond:
            while self._orphaned and not self._stop.is_set():
                self._cond.wait(_POLL_SECS)
            return not self._stop.is_set()

    def _accept(self, line: bytes) -> None:
        word, _, value = line.decode("utf-8", "replace").strip().partition(" ")
        if word == "assign":
            self._accept_assign(value)
            return
        try:
            if word != "lease":
                raise ValueError
            deadline = float(value)
        except ValueError:
            # Ignored rather than fatal: without a valid renewal the lease runs out anyway.
            log.warning("ignoring malformed lease line %r", line[:100])
            return
        with self._cond:
            first = self._deadline is None
            self._deadline = deadline  # the newest line wins, as the supervisor decides
            self._cond.notify_all()
        if first:
            log.info("first lease received: %.1f s left", deadline - time.monotonic())

    def _accept_assign(self, value: str) -> None:
        """``assign <worker_index> <num_workers>``: a rebalance left this worker's
        components as they were, so it runs on under its new place in the topology."""
        try:
            index, count = (int(v) for v in value.split())
        except ValueError:
            log.warning("ignoring malformed assign line %r", value[:100])
            return
        callback = self.on_assign
        if callback is None:
            log.warning("ignoring assign %d %d: nothing runs yet", index, count)
            return
        callback(index, count)

    def _watch_loop(self) -> None:
        while True:
            with self._cond:
                while not self._stop.is_set():
                    if self._deadline is None:
                        self._cond.wait(_POLL_SECS)
                        continue
                    remaining = self._deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    # Woken early by a renewal (notify); the cap only bounds a lost wake-up.
                    self._cond.wait(min(remaining, 1.0))
                else:
                    return
                late = time.monotonic() - self._deadline
                may_freeze = self._freeze is not None and \
                    (not self._orphaned or self.attach_pending is not None)
                self._lapsed = may_freeze
            if may_freeze and self._freeze_until_renewed(late):
                continue
            self._expire(f"lease deadline passed {late:.3f} s ago")
            return

    def _freeze_until_renewed(self, late: float) -> bool:
        """Freeze (see the module doc); True once thawed with a renewal to read, False if
        the worker could not be frozen or was thawed without one (it must die now)."""
        log.warning("lease ran out %.3f s ago: frozen until the supervisor renews it",
                    late)
        _flush_logs()
        with self._cond:
            frozen_at = self._frozen_since = time.monotonic()
        assert self._freeze is not None
        froze = self._freeze()
        thawed_at = time.monotonic()
        with self._cond:
            was_orphaned = self._orphaned
        # Where a renewal would be: in the pipe, or, for an orphan, on a take-over
        # connection. Those first, the reader's (and take-over point's) state after: each
        # marks itself busy before it empties the pipe (the listener's queue) and clears
        # the mark after the line is applied (attached), so a renewal is seen in one place
        # or the other, whichever order the threads run in.
        pending = self.attach_pending
        offered = froze and was_orphaned and pending is not None and pending()
        in_pipe = froze and not was_orphaned and self._pipe_readable()
        with self._cond:
            self._frozen_since = None
            if not froze:
                self._lapsed = False
                return False
            self._frozen_s += thawed_at - frozen_at
            renewed = not self._orphaned and self._deadline is not None and \
                self._deadline > thawed_at
            busy = self._reading or (was_orphaned and not self._orphaned)
        # Only a supervisor that has just written a renewal thaws a worker: it is in the
        # pipe, being read from it, or on a take-over connection. Nothing else may run.
        if not (renewed or busy or in_pipe or offered):
            with self._cond:
                self._lapsed = False
            log.critical("thawed after %.1f s with no renewal", thawed_at - frozen_at)
            return False
        with self._cond:  # the reader, thawed too, takes the line at once
            end = thawed_at + _THAW_READ_S
            while (self._orphaned or self._deadline is None
                   or self._deadline <= thawed_at) and \
                    time.monotonic() < end and not self._stop.is_set():
                self._cond.wait(0.05)
            renewed = not self._orphaned and self._deadline is not None and \
                self._deadline > time.monotonic()
            self._lapsed = False
        if not renewed:
            log.critical("thawed after %.1f s with no valid renewal",
                         thawed_at - frozen_at)
            return False
        log.info("thawed after %.1f s frozen: the supervisor renewed the lease",
                 thawed_at - frozen_at)
        return True

    def _pipe_readable(self) -> bool:
        try:
            ready, _, _ = select.select([self._fd], [], [], 0)
        except (OSError, ValueError):
            return False
        return bool(ready)


def _flush_logs() -> None:
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # nothing may stop the freeze
            pass
