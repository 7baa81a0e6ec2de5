"""The worker's log pump: everything the worker process and its children print goes
through a pipe to one thread of the worker, which writes it to size-rotated files.

Why in the worker and not the supervisor: a worker outlives its supervisor (a killed
supervisor's workers run on, freeze at the end of their lease, and its next process
takes them over: nimbus/supervisor/adoption.py), so its output cannot go through the
supervisor; and a supervisor that rotated the file under the worker (copy, then
truncate) would lose what is written between the two, and could not rotate at all while
it is gone. The worker rotates its own log, whoever supervises it. docs/logs.md says
what this costs.

:meth:`LogPump.start` makes a pipe and puts its writing end in place of the process's
standard output and error (descriptors 1 and 2), so that the worker's own logging, a
process topology's command and a pipeline's JVM (Spark's log4j console output goes to
its standard error) all write into it, whatever they are. The thread ``worker-log-pump``
reads the pipe and appends to ``<dir>/worker.log`` (its layout, rotation and time index:
nimbus/state/worker_logs.py):

* a file is rotated before it would pass ``max_bytes``, at the end of the last line
  that fits (a line longer than a whole file is cut): ``worker.log`` becomes
  ``worker.log.1``, ``.1`` becomes ``.2``, and so on, ``backups`` of them kept;
* each write is dated in the file's time index;
* a write that fails (a full disk) is dropped, never waited on: a worker whose output
  cannot be written must not stop. The loss is said in the file when it can be written
  again.

The thread never logs (its own output would come back to it through the pipe): what it
has to say goes into the file. A warm worker (nimbus/worker/warm.py) pumps into its warm
directory and, once taken, into its slot's directory (:meth:`LogPump.move_to`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import struct
import sys
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path

from nimbus.state.worker_logs import (
    INDEX_MAX_RECORDS,
    INDEX_MIN_BYTES,
    INDEX_MIN_GAP_S,
    INDEX_RECORD,
    INDEX_SPAN_S,
    LOG_FILE,
    LogSettings,
    generation_name,
    generations,
    index_name,
    read_record,
    record_count,
)

READ_BYTES = 64 * 1024
FILE_MODE = 0o640
#: How long :meth:`LogPump.stop` waits for the rest of what the worker's children wrote.
DRAIN_S = 1.0
_OPEN_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC

_running: LogPump | None = None


def flush(timeout_s: float = 0.05) -> None:
    """Give this process's pump up to ``timeout_s`` to write what is in its pipe (before
    the process freezes: a frozen pump writes nothing, and the freeze may end in a kill).
    Nothing when no pump runs."""
    pump = _running
    if pump is not None:
        pump.flush(timeout_s)


def before_kill(timeout_s: float = 0.05) -> None:
    """This process is about to be killed with its group (its lease ran out): give the
    pump up to ``timeout_s`` to write what is in its pipe, then point descriptors 1 and 2
    at the log file itself, so that the last words (why it is killed) are not lost with
    the pump. Nothing when no pump runs."""
    pump = _running
    if pump is not None:
        pump.flush(timeout_s)
        pump.bypass(timeout_s)


def current_log_file() -> Path | None:
    """The file this process's pump writes now (None: no pump runs): where a helper
    that writes on its own, such as a frozen worker's reaper, should append."""
    pump = _running
    return pump.path if pump is not None else None


class LogPump:
    """Writes what descriptors 1 and 2 of this process get to ``<directory>/worker.log``;
    see the module docstring. :meth:`start`, then :meth:`stop` before the process exits.
    ``clock`` gives the time recorded in the index (epoch seconds)."""

    def __init__(self, directory: Path, settings: LogSettings,
                 clock: Callable[[], float] = time.time):
        self.directory = Path(directory)
        self.settings = settings
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._drain_until: float | None = None
        self._read_fd = -1
        self._log_fd = -1
        self._index_fd = -1
        self._size = 0
        self._records = 0
        self._last_record: tuple[int, float] | None = None
        self._dropped = 0
        self._drop_reason = ""
        self._thread = threading.Thread(target=self._run, name="worker-log-pump", daemon=True)

    @property
    def path(self) -> Path:
        return self.directory / LOG_FILE

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> LogPump:
        """Open the log (OSError if its directory cannot be made or written), then put a
        pipe to this pump in place of descriptors 1 and 2 and start the thread."""
        global _running
        self.directory.mkdir(parents=True, exist_ok=True)
        self._open()
        read_fd, write_fd = os.pipe()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        # Inherited by every child from now on (not close-on-exec): 1 and 2 themselves.
        os.dup2(write_fd, 1)
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._read_fd = read_fd
        self._thread.start()
        _running = self
        return self

    def move_to(self, directory: Path) -> None:
        """Write to ``<directory>/worker.log`` from now on, what was written so far
        included (a warm worker taken for a slot: its output before the take is the
        slot's too, dated now). OSError if the new directory cannot be used; the pump
        then writes where it did."""
        directory = Path(directory)
        self.flush(0.2)  # what was said before the take is the warm log's
        with self._lock:
            old_path = self.path
            old = (self._log_fd, self._index_fd, self.directory)
            self.directory = directory
            try:
                directory.mkdir(parents=True, exist_ok=True)
                self._open()
            except OSError:
                self._log_fd, self._index_fd, self.directory = old
                raise
            for fd in old[:2]:
                with contextlib.suppress(OSError):
                    os.close(fd)
            with contextlib.suppress(OSError), open(old_path, "rb") as earlier:
                while chunk := earlier.read(READ_BYTES):
                    self._write(chunk)

    def flush(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` until everything written into the pipe so far is in
        the file (True), or not (False)."""
        end = time.monotonic() + timeout_s
        while True:
            try:
                waiting = struct.unpack(
                    "i", fcntl.ioctl(self._read_fd, termios.FIONREAD, b"\0\0\0\0"))[0]
            except OSError:
                return False
            if waiting == 0 and not self._lock.locked():
                return True
            if time.monotonic() >= end:
                return False
            time.sleep(0.002)

    def bypass(self, timeout_s: float = 1.0) -> bool:
        """Point descriptors 1 and 2 of this process at the log file itself; False if
        the pump did not let go of the file within ``timeout_s`` (a write stuck on a
        dead disk: nothing may hold up a kill or a freeze)."""
        if not self._lock.acquire(timeout=timeout_s):
            return False
        try:
            if self._log_fd < 0:
                return False
            os.dup2(self._log_fd, 1, inheritable=True)
            os.dup2(self._log_fd, 2, inheritable=True)
            return True
        finally:
            self._lock.release()

    def stop(self, drain_s: float = DRAIN_S) -> None:
        """Point descriptors 1 and 2 at the log file itself (what the process prints
        while it ends lands there), take what its children still write for up to
        ``drain_s``, then stop the thread and close everything."""
        global _running
        if not self._thread.is_alive():
            return
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        self.bypass()
        self._drain_until = time.monotonic() + drain_s
        self._thread.join(drain_s + 5)
        self._stop.set()
        self._thread.join()
        _running = None if _running is self else _running
        with self._lock:
            for fd in (self._read_fd, self._log_fd, self._index_fd):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            self._read_fd = self._log_fd = self._index_fd = -1

    # -- the thread -----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            draining = self._drain_until is not None
            if draining and time.monotonic() >= self._drain_until:
                return
            try:
                ready, _, _ = select.select([self._read_fd], [], [], 0.1 if draining else 0.5)
            except (OSError, ValueError):
                return
            if not ready:
                if draining:
                    return  # nothing more came: the children are quiet or gone
                continue
            # Read and written under the lock: while it is free and the pipe is empty,
            # nothing is on its way (flush).
            with self._lock:
                try:
                    chunk = os.read(self._read_fd, READ_BYTES)
                except OSError:
                    return
                if not chunk:
                    return  # every writer is gone
                self._write(chunk)

    # -- files (under the lock) -----------------------------------------------------------
    def _open(self) -> None:
        """Open ``worker.log`` and its index for appending (OSError: neither is)."""
        log_fd = os.open(self.path, _OPEN_FLAGS, FILE_MODE)
        try:
            index_fd = os.open(self.directory / index_name(LOG_FILE), _OPEN_FLAGS, FILE_MODE)
        except OSError:
            os.close(log_fd)
            raise
        self._log_fd, self._index_fd = log_fd, index_fd
        self._size = os.fstat(log_fd).st_size
        # A torn last record (the worker was killed mid-write) would shift every later
        # one: the index goes on from a record boundary.
        extra = os.fstat(index_fd).st_size % INDEX_RECORD.size
        if extra:
            with contextlib.suppress(OSError):
                os.ftruncate(index_fd, os.fstat(index_fd).st_size - extra)
        self._records = record_count(index_fd)
        self._last_record = None
        if self._records:
            with contextlib.suppress(OSError):
                self._last_record = read_record(index_fd, self._records - 1)

    def _write(self, data: bytes) -> None:
        """Append ``data``, rotating at line ends so that no file passes ``max_bytes``."""
        if self._log_fd < 0:  # a rotation failed: try again
            try:
                self._open()
            except OSError as exc:
                self._drop(len(data), f"the log could not be opened: {exc}")
                return
        if self._dropped:
            note = (f"\n[nimbus-ha: {self._dropped} bytes of output were lost here: "
                    f"{self._drop_reason}]\n").encode()
            self._dropped = 0
            data = note + data
        limit = self.settings.max_bytes
        while data:
            room = limit - self._size
            if room <= 0 or self._records >= INDEX_MAX_RECORDS:
                self._rotate()
                continue
            if len(data) <= room:
                self._append(data)
                return
            cut = data.rfind(b"\n", 0, room) + 1
            if cut == 0:
                if self._size > 0:  # the line begins a new file
                    self._rotate()
                    continue
                cut = room  # a line longer than a whole file: cut at the limit
            self._append(data[:cut])
            data = data[cut:]
            self._rotate()

    def _append(self, data: bytes) -> None:
        if self._log_fd < 0:
            self._drop(len(data), "the log could not be opened")
            return
        self._date()
        view = memoryview(data)
        try:
            while view:
                written = os.write(self._log_fd, view)
                self._size += written
                view = view[written:]
        except OSError as exc:
            self._drop(len(view), os.strerror(exc.errno or errno.EIO))

    def _date(self) -> None:
        """Add an index record for a write at the file's end now, if one is due
        (nimbus/state/worker_logs.py)."""
        now = self._clock()
        last = self._last_record
        if last is not None:
            now = max(now, last[1])  # a clock set back must not unsort the index
            since = now - last[1]
            if since < INDEX_MIN_GAP_S or (self._size - last[0] < INDEX_MIN_BYTES
                                           and since < INDEX_SPAN_S):
                return
        record = (self._size, now)
        try:
            os.write(self._index_fd, INDEX_RECORD.pack(*record))
        except OSError:
            return  # the bytes are written all the same; they count as the last record's
        self._last_record = record
        self._records += 1

    def _drop(self, length: int, reason: str) -> None:
        self._dropped += length
        self._drop_reason = reason

    def _rotate(self) -> None:
        """worker.log becomes worker.log.1 (and so on), a new worker.log is begun."""
        for fd in (self._log_fd, self._index_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._log_fd = self._index_fd = -1
        backups = self.settings.backups
        try:
            for generation in generations(self.directory):  # oldest first
                source = generation_name(generation)
                if generation >= backups:
                    self._remove(source)
                else:
                    self._rename(source, generation_name(generation + 1))
            self._open()
        except OSError as exc:
            # The next write tries again; what cannot be written is dropped, and said.
            self._drop(0, f"the log could not be rotated: {exc}")
            self._size = self._records = 0  # so that this write ends (dropped)

    def _remove(self, name: str) -> None:
        for path in (self.directory / name, self.directory / index_name(name)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def _rename(self, source: str, target: str) -> None:
        os.replace(self.directory / source, self.directory / target)
        try:
            os.replace(self.directory / index_name(source), self.directory / index_name(target))
        except FileNotFoundError:  # a file without an index (written before it had one)
            with contextlib.suppress(FileNotFoundError):
                (self.directory / index_name(target)).unlink()


def start_pump(directory: Path, settings: LogSettings) -> LogPump | None:
    """A started pump into ``directory``, or None when it cannot be (its directory
    cannot be made or written): the worker then runs on, its output going where its
    supervisor sent it. Said on standard error, which is still that place then."""
    try:
        return LogPump(directory, settings).start()
    except OSError as exc:
        print(f"nimbus-ha: worker logs not rotated: cannot write {directory}: {exc}",
              file=sys.stderr, flush=True)
        return None
