"""Take-over point: a supervisor started again may take over this worker within its lease.

A supervisor that is killed (kill -9, a crash, an upgrade gone wrong) closes both pipes of
its workers. Each worker then runs on only to the end of the lease it already holds (at
most 2/3 of the supervisor's session timeout), as the lease rule allows, and listens on
``<worker-dir>/supervisor.sock`` meanwhile. The supervisor's next process connects there
at start; the worker answers with one ``{"takeover": {...}}`` line naming itself, then
reads its lease lines from that connection and writes its status lines to it, exactly as
it did on the pipes. The worker never outlives its lease for this: a renewal still comes
only from a round trip that shows its assignment (docs/runtime.md, "A supervisor started
again").

Only a process of this worker's own user or root may connect (``SO_PEERCRED``), and only
once the lease pipe has reached EOF: while its supervisor lives, a worker has one.

A worker in a cgroup of its own does not die at the end of that lease but freezes
(nimbus/worker/lease.py); a supervisor started later may still connect, write a renewal
and thaw it. The connection waits in the listener's queue meanwhile, and is answered
after the thaw as any other.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from nimbus.worker.lease import Lease
from nimbus.worker.status import StatusWriter
from nimbus.worker_protocol.takeover import SOCKET_NAME, peer_credentials

log = logging.getLogger(__name__)

_POLL_SECS = 0.5


@contextlib.contextmanager
def socket_path(directory: Path) -> Iterator[str]:
    """A short path to ``<directory>/supervisor.sock`` (through ``/proc/self/fd``): a Unix
    socket's address holds at most 107 bytes, and a worker directory's path may be
    longer."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{SOCKET_NAME}"
    finally:
        os.close(fd)


def listen_at(directory: Path) -> socket.socket:
    """A socket listening at ``<directory>/supervisor.sock`` (mode 0600), in place of a
    stale socket file an earlier process left; OSError if it cannot be made."""
    path = directory / SOCKET_NAME
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with socket_path(directory) as address:
            listener.bind(address)
        os.chmod(path, 0o600)
        listener.listen(1)
    except BaseException:
        listener.close()
        raise
    return listener


def supervisor_peer(conn: socket.socket) -> int | None:
    """The pid at the other end of ``conn`` if it runs as root or as this process's user
    (a supervisor may); otherwise None, with ``conn`` closed and the refusal logged."""
    pid, uid, _gid = peer_credentials(conn)
    if uid not in (0, os.getuid()):
        log.warning("refused a take-over by pid %d (uid %d): not this worker's user or "
                    "root", pid, uid)
        conn.close()
        return None
    return pid


class TakeoverPoint:
    """Listens on ``<worker_dir>/supervisor.sock`` from :meth:`start` to :meth:`stop`
    (thread ``worker-takeover``); ``hello()`` is what the worker says of itself."""

    def __init__(self, worker_dir: Path, lease: Lease, status: StatusWriter,
                 hello: Callable[[], dict[str, Any]]) -> None:
        self.directory = Path(worker_dir)
        self.path = self.directory / SOCKET_NAME
        self._lease = lease
        self._status = status
        self._hello = hello
        self._listener: socket.socket | None = None
        self._offering = False  # a connection is out of the queue but not yet attached
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="worker-takeover",
                                        daemon=True)

    def start(self) -> TakeoverPoint:
        """Listen (a stale socket file of an earlier worker is replaced); an error is
        logged and leaves the worker without a take-over point, as before this release."""
        try:
            listener = listen_at(self.directory)
        except OSError as exc:
            log.warning("no take-over point at %s (%s): this worker ends with its "
                        "supervisor's lease", self.path, exc)
            return self
        self._listener = listener
        self._lease.attach_pending = self.pending
        self._thread.start()
        return self

    def pending(self) -> bool:
        """Whether a connection waits to be accepted or is being offered the worker: a
        frozen orphan thawed by its supervisor's next process finds one (the queue
        first, the mark after: the mark is set before the queue is emptied)."""
        listener = self._listener
        if listener is None:
            return False
        try:
            ready, _, _ = select.select([listener], [], [], 0)
        except (OSError, ValueError):
            ready = []
        return bool(ready) or self._offering

    def stop(self) -> None:
        """Stop listening, remove the socket file and join the thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * _POLL_SECS + 1)
        if self._listener is not None:
            self._listener.close()
            with contextlib.suppress(OSError):
                self.path.unlink()

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            ready, _, _ = select.select([self._listener], [], [], _POLL_SECS)
            if not ready:
                continue
            self._offering = True
            try:
                conn, _ = self._listener.accept()
                with contextlib.suppress(OSError):
                    self._offer(conn)
            except OSError:
                continue
            finally:
                self._offering = False

    def _offer(self, conn: socket.socket) -> None:
        pid = supervisor_peer(conn)
        if pid is None:
            return
        if not self._lease.orphaned:
            log.warning("refused a take-over by pid %d: this worker's supervisor lives",
                        pid)
            conn.close()
            return
        conn.setblocking(True)
        conn.sendall((json.dumps({"takeover": self._hello()}, sort_keys=True) + "\n").encode())
        lease_fd = conn.detach()
        status_fd = os.dup(lease_fd)  # each side closes its own
        self._status.redirect(status_fd)
        if not self._lease.attach(lease_fd):
            os.close(lease_fd)  # it ran out meanwhile: the process group is being killed
            return
        log.warning("taken over by supervisor process %d", pid)
