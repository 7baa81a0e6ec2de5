"""One worker process, its lease pipe and its status pipe (docs/runtime.md).

The worker runs ``python -m nimbus.worker <worker-dir>`` in a process group of its own,
with its output appended to its log file (:attr:`WorkerHandle.log_file`: the slot's
``<log root>/<topology-id>/<port>/worker.log``, made by nimbus/supervisor/log_dirs.py;
a warm worker's ``<warm-dir>/worker.log``). That is where its first words go: the worker
then writes its log itself, rotated (nimbus/worker/log_pump.py). Two pipes connect it to
the supervisor, passed as inherited descriptors whose numbers ``worker.json`` names:

* lease (supervisor -> worker): ``lease <monotonic deadline>`` lines, see
  :mod:`nimbus.supervisor.lease`;
* status (worker -> supervisor): JSON lines, ``{"beat": {...}}`` or ``{"error": {...}}``,
  read by a named thread that hands each to a callback.

Stopping means SIGTERM to the group, then SIGKILL after a grace period; killing means
SIGKILL to the group at once. Both reach the worker's children (its command, its JVM),
and so does the clean-up after a worker exited on its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nimbus.state.worker_logs import LOG_FILE
from nimbus.supervisor.cgroups import (
    CGROUP_ENV,
    WorkerCgroups,
    in_cgroup,
    is_frozen,
    kill_cgroup,
    thaw,
)
from nimbus.supervisor.lease_record import LeaseRecord, remove_record
from nimbus.supervisor.memory import GroupMemory
from nimbus.supervisor.run_as_user import as_account
from nimbus.supervisor.status_input import ErrorBudget
from nimbus.supervisor.takeover import Orphan, TakenOverProcess
from nimbus.worker_protocol.warm import TAKE, WARM_FILE

log = logging.getLogger(__name__)

WORKER_COMMAND = (sys.executable, "-m", "nimbus.worker")
#: A frozen worker is thawed only by a renewal with at least this long left (the worker
#: allows itself as long to read the line after a thaw: nimbus/worker/lease.py).
THAW_MARGIN_S = 1.0
#: A warm worker's log in its directory, and a worker's of an earlier release (which
#: wrote ``<worker-dir>/worker.log``).
MAX_STATUS_LINE = 1 << 20   # a longer line is cut off and dropped: it is no status

# (handle, decoded status object) -> None; called on the handle's reader thread.
StatusCallback = Callable[["WorkerHandle", dict[str, Any]], None]
# (lease fd, status fd) -> None: writes worker.json naming the worker's descriptors.
SpecWriter = Callable[[int, int], None]
# (handle) -> None; called on the reader thread when the status pipe reaches EOF.
ClosedCallback = Callable[["WorkerHandle"], None]


class WorkerHandle:
    """A started worker; see the module docstring. Not thread-safe except where noted."""

    def __init__(self, topology_id: str, port: int, worker_dir: Path, session_id: int,
                 restarts: int, on_status: StatusCallback,
                 on_closed: ClosedCallback | None = None,
                 command: Sequence[str] = WORKER_COMMAND):
        self.topology_id = topology_id
        self.port = port
        self.worker_dir = Path(worker_dir)
        # The ZooKeeper session this worker was started under: only its round trips
        # renew this worker's lease (never those of a later session).
        self.session_id = session_id
        self.restarts = restarts
        self.worker_index = 0    # its executor worker-<i>, and the topology's worker count:
        self.num_workers = 1     # a change of either means it must be restarted
        # The code version it runs (nimbus.state.code_versions) and that version's code
        # key; another version wanted on its slot means it is stopped and started anew.
        self.code_version = 1
        self.code_key = topology_id
        self._on_status = on_status
        self._on_closed = on_closed
        self._command = list(command)
        self.process: subprocess.Popen[bytes] | TakenOverProcess | None = None
        self.started_at = 0.0            # time.monotonic()
        self.last_status_at: float | None = None
        # When its supervisor last wrote its beat to ZooKeeper (time.monotonic(); None
        # before the first): it counts as running only from then (worker_state).
        self.last_beat_at: float | None = None
        self.last_error = ""             # the first line of its newest error
        # Its log (None: <worker_dir>/worker.log), and where this process's output
        # begins in it (what it printed is quoted if it exits without a word).
        self.log_file: Path | None = None
        self.log_offset: int | None = None
        self.errors_reported = 0
        self.error_budget = ErrorBudget()   # errors it may still record (status_input)
        self.lease_deadline: float | None = None   # the newest deadline sent
        self.thaws = 0                   # times it froze on a lapsed lease and was thawed
        # The mzxid of its assignment as read by the round trip of its newest renewal.
        self.assignment_version: int | None = None
        # Where its lease is written down for this supervisor's next process
        # (nimbus/supervisor/lease_record.py), and what was written there last.
        self.record_path: Path | None = None
        self._recorded: LeaseRecord | None = None
        self.unassigned_seen = False     # a lease round trip found it unassigned (logged)
        self.kind = "pipeline"           # or "process": what its bundle holds
        self.cgroups: WorkerCgroups | None = None   # set before start() where cgroups work
        self.cgroup: Path | None = None
        self.run_as: tuple[int, int] | None = None  # (uid, gid) of its own account
        # A pipeline's beat showed a trigger of its queries (they are up: a batch, or one
        # that found no data), and one showed a batch that ran and committed in this
        # process (nimbus.supervisor.status_input.committed_batch): its restart backoff
        # starts afresh.
        self.triggered = False
        self.committed = False
        # A pipeline's components whose beats showed such a batch in this process.
        self.batched_components: set[str] = set()
        # What the heartbeat says as "committed" (SupervisorInfo.workers): this process
        # proved its version works: a pipeline committed a batch of every component of
        # its own share (own_components); a process topology's declared health check
        # passed, or, with none declared, it started and beat.
        self.version_committed = False
        # Warm workers (nimbus/supervisor/warm_pool.py): "" for a worker started cold;
        # "warming", "ready", then "taken" for one started ahead of any topology.
        self.warm = ""
        self.warm_refused = ""           # why a taken warm worker could not run it
        self.warm_dir: Path | None = None  # where a taken warm worker was started
        self.child_fds = (-1, -1)        # (lease, status) descriptors as the worker has them
        # Every component of its topology, as the worker declared them (a pipeline's,
        # once built): what tells whether a rebalance leaves its share as it is.
        self.topology_components: tuple[str, ...] | None = None
        # The components it runs itself ("mine" of that declaration; None: not said yet,
        # or nothing believable).
        self.own_components: tuple[str, ...] | None = None
        self._memory: GroupMemory | None = None
        # Why the supervisor ended it ("" while it runs or when it exited by itself):
        # "lost" (connection), "timeout", "stop".
        self.ended_by = ""
        self._lease_w = -1
        self._status_r = -1
        self._reader: threading.Thread | None = None
        self._reader_stop = threading.Event()
        self._status_done = threading.Event()  # the status stream ended (set on EOF)
        self._lease_lock = threading.Lock()

    @property
    def name(self) -> str:
        return f"{self.topology_id}:{self.port}"

    @property
    def log_path(self) -> Path:
        """Where its output goes (see :attr:`log_file`)."""
        return self.log_file if self.log_file is not None else self.worker_dir / LOG_FILE

    @property
    def is_taken_over(self) -> bool:
        """Whether an earlier process of this supervisor started it."""
        return isinstance(self.process, TakenOverProcess)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    # -- start ----------------------------------------------------------------------------
    def start(self, write_spec: SpecWriter, env: dict[str, str] | None = None) -> None:
        """Make the pipes, have ``write_spec`` write worker.json, spawn the worker."""
        self.worker_dir.mkdir(parents=True, exist_ok=True)
        lease_r, lease_w = os.pipe()       # non-inheritable (PEP 446): no other worker
        status_r, status_w = os.pipe()     # gets a copy, so EOF means this one is gone
        try:
            write_spec(lease_r, status_w)
            command = [*self._command, str(self.worker_dir)]
            if self.run_as is not None:  # supervisor.run.worker.as.user
                command = as_account(command, *self.run_as)
            if self.cgroup is not None:  # the worker and all it starts stay in it
                command = in_cgroup(self.cgroup, command)
                env = {**(env if env is not None else os.environ),
                       CGROUP_ENV: str(self.cgroup)}
            with open(self.log_path, "ab") as out:
                if self.run_as is not None:  # its log pump appends to it as its account
                    os.fchown(out.fileno(), *self.run_as)
                # Where this process's output begins in the log (a slot's processes
                # share it): what it printed is quoted if it exits without a word.
                self.log_offset = os.fstat(out.fileno()).st_size
                self.process = subprocess.Popen(
                    command, stdin=subprocess.DEVNULL,
                    stdout=out, stderr=subprocess.STDOUT, pass_fds=(lease_r, status_w),
                    start_new_session=True, env=env, cwd=self.worker_dir)
        except BaseException:
            for fd in (lease_r, lease_w, status_r, status_w):
                os.close(fd)
            raise
        self.child_fds = (lease_r, status_w)  # pass_fds keeps the numbers
        os.close(lease_r)
        os.close(status_w)
        self._connect(lease_w, status_r)

    def _connect(self, lease_w: int, status_r: int) -> None:
        """Use the supervisor's ends of the lease and status streams; start reading."""
        # A worker that stops reading must never block the lease thread. (A taken-over
        # worker's two are one socket: the status reader selects before it reads.)
        flags = fcntl.fcntl(lease_w, fcntl.F_GETFL)
        fcntl.fcntl(lease_w, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        self._lease_w, self._status_r = lease_w, status_r
        self.started_at = time.monotonic()
        self._reader = threading.Thread(target=self._read_status, daemon=True,
                                        name=f"worker-status-{self.name}")
        self._reader.start()

    @classmethod
    def taken_over(cls, orphan: Orphan, session_id: int, on_status: StatusCallback,
                   on_closed: ClosedCallback | None) -> WorkerHandle:
        """A handle of a worker an earlier process of this supervisor started
        (:mod:`nimbus.supervisor.takeover`): its connection becomes both pipes."""
        handle = cls(orphan.topology_id, orphan.port, orphan.worker_dir, session_id,
                     orphan.restarts, on_status, on_closed)
        handle.worker_index, handle.num_workers = orphan.worker_index, orphan.num_workers
        handle.code_version, handle.code_key = orphan.code_version, orphan.code_key
        handle.kind = orphan.kind
        handle.assignment_version = orphan.assignment_version
        handle.process = TakenOverProcess(orphan.pid, orphan.pidfd, handle._status_done)
        orphan.pidfd = -1  # the process object's now
        lease_w = orphan.sock.detach()
        handle._connect(lease_w, os.dup(lease_w))
        return handle

    # -- lease ----------------------------------------------------------------------------
    def renew(self, deadline: float, assignment_version: int | None = None) -> bool:
        """Send ``lease <deadline>``, earned by a round trip that read the worker's
        assignment at ``assignment_version`` (its ``mzxid``). A worker that froze itself
        when its lease ran out (nimbus/worker/lease.py) is thawed after the line is
        written if its assignment was not rewritten since its last renewal; if it was,
        its work may have moved away and back meanwhile, and it is killed instead. False
        if the worker is gone, not reading, or killed.

        Safe from any thread.
        """
        with self._lease_lock:
            if self._lease_w < 0:
                return False
            cgroup = self.cgroup
            frozen = cgroup is not None and is_frozen(cgroup)
            if frozen and (assignment_version is None
                           or assignment_version != self.assignment_version):
                log.warning("worker %s: its assignment was rewritten while it was frozen; "
                            "killed, not thawed", self.name)
                self.kill("lease")
                return False
            try:
                os.write(self._lease_w, f"lease {deadline:.3f}\n".encode())
            except (BlockingIOError, BrokenPipeError, OSError):
                return False
            self.lease_deadline = deadline
            if assignment_version is not None:
                self.assignment_version = assignment_version
                self._write_record()
            # Thawed only now that the renewal is in its pipe, and only while it has at
            # least THAW_MARGIN_S to run: after a thaw the worker may take up to that long
            # to read the line, and kills itself if it finds none.
            if frozen and cgroup is not None and deadline > time.monotonic() + THAW_MARGIN_S \
                    and thaw(cgroup):
                self.thaws += 1
                if self.last_status_at is not None:  # it could not speak while frozen
                    self.last_status_at = time.monotonic()
                log.info("worker %s thawed: its lease is renewed", self.name)
            return True

    def is_frozen(self) -> bool:
        """Whether the worker froze itself when its lease ran out and is not thawed yet."""
        return self.cgroup is not None and is_frozen(self.cgroup)

    def take(self, worker_dir: Path) -> bool:
        """Hand a warm worker its worker directory (``take <dir>`` on the lease pipe, the
        line it waits for); False if it is gone. Safe from any thread."""
        with self._lease_lock:
            if self._lease_w < 0:
                return False
            try:
                os.write(self._lease_w, f"{TAKE} {worker_dir}\n".encode())
                return True
            except (BlockingIOError, BrokenPipeError, OSError):
                return False

    def reassign(self, worker_index: int, num_workers: int) -> bool:
        """Tell the worker it runs on as ``worker-<worker_index>`` of ``num_workers``
        (``assign`` on the lease pipe); False if it is gone. Safe from any thread."""
        with self._lease_lock:
            if self._lease_w < 0:
                return False
            try:
                os.write(self._lease_w, f"assign {worker_index} {num_workers}\n".encode())
            except (BlockingIOError, BrokenPipeError, OSError):
                return False
            self.worker_index, self.num_workers = worker_index, num_workers
            self._write_record()
        return True

    def _write_record(self) -> None:
        """Write down what a frozen worker cannot tell this supervisor's next process,
        once it changed (:mod:`nimbus.supervisor.lease_record`); after the line it
        describes, under the lease lock. Only a worker that can freeze needs one."""
        pid = self.pid
        if self.record_path is None or self.cgroup is None or pid is None or \
                self.assignment_version is None or self.run_as is not None:
            return
        record = LeaseRecord(pid, self.topology_id, self.port, self.worker_index,
                             self.num_workers, self.restarts, str(self.cgroup),
                             self.assignment_version, self.code_version)
        if record == self._recorded:
            return
        try:
            record.save(self.record_path)
        except OSError as exc:  # it costs a restart if this supervisor is killed, no more
            log.warning("worker %s: cannot write its lease record %s: %s", self.name,
                        self.record_path, exc)
            return
        self._recorded = record

    def rebind(self, on_status: StatusCallback, on_closed: ClosedCallback | None) -> None:
        """Send this worker's status lines and its exit to other callbacks from now on
        (a warm worker taken for a slot)."""
        self._on_status = on_status
        self._on_closed = on_closed

    def memory_bytes(self) -> int:
        """Resident bytes of the worker's process group (cached for a few seconds)."""
        if self.process is None:
            return 0
        if self._memory is None:
            self._memory = GroupMemory(self.process.pid)
        return self._memory.bytes()

    # -- status ---------------------------------------------------------------------------
    def _read_status(self) -> None:
        buffered = b""
        while not self._reader_stop.is_set():
            try:
                ready, _, _ = select.select([self._status_r], [], [], 0.5)
                if not ready:
                    continue
                chunk = os.read(self._status_r, 65536)
            except (OSError, ValueError):
                self._status_done.set()
                return
            if not chunk:
                self._status_done.set()
                # EOF: every holder of the write end has exited. The process closes its
                # files a moment before it can be reaped; wait for that moment (bounded:
                # a worker that closed the pipe but lives on is the monitor's to judge),
                # so the monitor woken next sees the exit and restarts at once.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    if self.process is not None:
                        self.process.wait(timeout=2)
                if self._on_closed is not None:
                    self._on_closed(self)
                return
            buffered += chunk
            *lines, buffered = buffered.split(b"\n")
            if len(buffered) > MAX_STATUS_LINE:
                buffered = b""
            for line in lines:
                self._handle_line(line)

    def _handle_line(self, line: bytes) -> None:
        try:
            status = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            log.debug("worker %s: not a status line: %r", self.name, line[:200])
            return
        if not isinstance(status, dict):
            return
        code = status.get("exit")
        if isinstance(code, int) and not isinstance(code, bool) and \
                isinstance(self.process, TakenOverProcess):
            self.process.reported_exit = code  # its exit status is not this process's
        self.last_status_at = time.monotonic()
        try:
            self._on_status(self, status)
        except Exception:
            log.exception("worker %s: handling its status failed", self.name)

    # -- ending ---------------------------------------------------------------------------
    def exit_code(self) -> int | None:
        """The worker's exit status once it has exited (negative: killed by a signal)."""
        return self.process.poll() if self.process else None

    def _signal_group(self, sig: int) -> None:
        if self.process is None:
            return
        # The group id is the worker's pid (start_new_session); it outlives the worker
        # while any child of it lives, so this also reaches orphaned children.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)

    def _kill_everything(self) -> None:
        self._signal_group(signal.SIGKILL)
        if self.cgroup is not None:  # what left the group (setsid, a daemon) too
            kill_cgroup(self.cgroup)

    def kill(self, reason: str) -> None:
        """SIGKILL the worker's group (and cgroup) now, without waiting; safe from any
        thread."""
        if not self.ended_by:
            self.ended_by = reason
        self._kill_everything()

    def stop(self, grace_s: float) -> None:
        """SIGTERM the group, SIGKILL it after ``grace_s``, wait, and release the pipes."""
        stop_all([self], grace_s)

    def release(self) -> None:
        """After the worker exited: kill what is left of its group, reap it, close the
        pipes and join the reader thread."""
        self._kill_everything()
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
            if isinstance(self.process, TakenOverProcess):
                self.process.close()
        if self.cgroup is not None and self.cgroups is not None:
            self.cgroups.remove(self.cgroup)
        if self.warm_dir is not None:
            tidy_warm_dir(self.warm_dir)
        if self.record_path is not None:
            remove_record(self.record_path, self.pid)
        if self.log_file is not None:
            # Its logs are kept for logviewer.cleanup.age.mins from now, its end
            # (nimbus/supervisor/log_sweep.py), however long it was silent before.
            with contextlib.suppress(OSError):
                os.utime(self.log_file.parent)
        self._reader_stop.set()
        if self._reader is not None:
            self._reader.join(timeout=5)
        with self._lease_lock:
            for fd in (self._lease_w, self._status_r):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            self._lease_w = self._status_r = -1


def tidy_warm_dir(directory: Path) -> None:
    """Remove a warm worker's directory once its process is gone, unless Spark left data
    in it: a session's default warehouse and metastore live in its JVM's working
    directory, which stays the warm directory after the worker is taken."""
    if (directory / "spark-warehouse").exists() or (directory / "metastore_db").exists():
        with contextlib.suppress(OSError):
            (directory / WARM_FILE).unlink()
        log.info("kept %s: Spark left a warehouse or metastore in it", directory)
        return
    shutil.rmtree(directory, ignore_errors=True)


def stop_all(handles: Sequence[WorkerHandle], grace_s: float) -> None:
    """Stop several workers together: SIGTERM to every group, SIGKILL to the groups of
    those still running after ``grace_s``, then release them all."""
    for handle in handles:
        if not handle.ended_by:
            handle.ended_by = "stop"
        if handle.is_frozen():
            handle._kill_everything()  # it could not act on SIGTERM, nor should it
            continue
        handle._signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for handle in handles:
        if handle.process is None:
            continue
        with contextlib.suppress(subprocess.TimeoutExpired):
            handle.process.wait(timeout=max(0.0, deadline - time.monotonic()))
    for handle in handles:
        handle.release()  # SIGKILLs whatever of the group is left
