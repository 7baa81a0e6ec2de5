"""Taking over the workers an earlier process of this supervisor left running.

A supervisor killed with kill -9 leaves its workers running to the end of the leases it
granted (at most 2/3 of its session timeout), each listening on
``<worker-dir>/supervisor.sock`` (:mod:`nimbus.worker_protocol.takeover`). At start, the next
process connects to every such socket and reads what the worker says of itself
(:func:`find_orphans`); its first reconcile pass takes over each one that the assignment
still places on the same slot with the same share of its topology, and ends the others.
A taken-over worker is renewed like any other: only by a round trip of this process's own
session that shows its assignment.

A worker whose lease ran out before this process came froze in its cgroup and cannot
answer. It is identified by what the earlier process wrote down
(:mod:`nimbus.supervisor.lease_record`) and by facts the kernel gives: the socket's owner
is the recorded pid, leads its process group and is frozen in the recorded cgroup. It is
taken over frozen, with the ``mzxid`` its last renewal read, so a renewal thaws it only
if its assignment was not rewritten since (:meth:`WorkerHandle.renew`); its take-over
line is read after the thaw, with its status.

What a worker says is untrusted (a tenant's code runs in it): the socket's peer must be a
process-group leader whose pid is the one it claims, in the directory of the slot it
claims.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import socket
import stat
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nimbus.state.code_versions import version_key
from nimbus.supervisor.cgroups import is_frozen, kill_cgroup
from nimbus.supervisor.lease_record import LeaseRecord, load_record
from nimbus.supervisor.memory import group_pids
from nimbus.worker_protocol.takeover import SOCKET_NAME, peer_credentials

log = logging.getLogger(__name__)

MAX_HELLO = 4096
MAX_RESTARTS = 1_000_000_000
MAX_CODE_VERSION = 999_999   # as a code key spells it (nimbus.state.code_versions)
KINDS = ("pipeline", "process")
# Once a worker is seen dead, how long its status stream may still hold its exit line.
EXIT_LINE_GRACE_S = 2.0


def pidfd_alive(pidfd: int) -> bool:
    """Whether the process of ``pidfd`` has not exited (the pidfd is readable once it has)."""
    ready, _, _ = select.select([pidfd], [], [], 0)
    return not ready


def kill_by_pidfd(pidfd: int, pid: int) -> None:
    """SIGKILL the process of ``pidfd`` and, while it lives, the group it leads (so a
    reused pid is never signalled)."""
    if not pidfd_alive(pidfd):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)  # alive: the pid and its group are still its own
    with contextlib.suppress(ProcessLookupError, PermissionError):
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)


def cgroup_of(pid: int, root: Path) -> Path | None:
    """The cgroup v2 directory of ``pid`` under the hierarchy mounted at ``root``."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            return root / line[3:].lstrip("/")
    return None


@dataclass
class Orphan:
    """A worker left running by an earlier process of this supervisor, connected."""

    sock: socket.socket
    pid: int
    pidfd: int   # opened while the connection proved the process alive: immune to reuse
    topology_id: str
    port: int
    worker_index: int
    num_workers: int
    restarts: int
    kind: str
    worker_dir: Path
    # A warm worker's lease and status descriptors, as its own process numbers them.
    child_fds: tuple[int, int] = (-1, -1)
    # The mzxid of its assignment read by its last recorded renewal (None: unknown).
    assignment_version: int | None = None
    frozen: bool = False  # found frozen: it said nothing yet
    code_version: int = 1  # the code version it runs (1: a worker of an earlier release)

    @property
    def name(self) -> str:
        return f"{self.topology_id}:{self.port} (pid {self.pid})"

    @property
    def code_key(self) -> str:
        """Where the code of its version is kept (nimbus.state.code_versions)."""
        return version_key(self.topology_id, self.code_version)

    def working_dirs(self) -> set[Path]:
        """The working directories of its processes (a worker that was warm keeps its
        JVM in the warm directory it started in)."""
        found = set()
        for pid in group_pids(self.pid):
            with contextlib.suppress(OSError):
                found.add(Path(os.readlink(f"/proc/{pid}/cwd")))
        return found

    def kill(self) -> None:
        """SIGKILL its process group and close the connection and the pidfd (the caller
        ends its cgroup)."""
        kill_by_pidfd(self.pidfd, self.pid)
        self.sock.close()
        os.close(self.pidfd)
        self.pidfd = -1


class TakenOverProcess:
    """What a :class:`~nimbus.supervisor.worker_handle.WorkerHandle` needs of a
    ``Popen`` (``pid``, ``poll``, ``wait``) for a worker this process did not start.

    Its exit is seen through the orphan's pidfd (immune to pid reuse). The exit code is
    what the worker said last (``{"exit": code}``), looked for until its status stream
    ends (``status_done``, at most :data:`EXIT_LINE_GRACE_S`), or -SIGKILL if it said
    none: it was killed, by its lease or from outside."""

    def __init__(self, pid: int, pidfd: int, status_done: threading.Event) -> None:
        self.pid = pid
        self.reported_exit: int | None = None
        self.returncode: int | None = None
        self._pidfd = pidfd
        self._status_done = status_done
        self._dead_since: float | None = None

    def poll(self) -> int | None:
        # The monitor and the status reader both poll; the pidfd stays open until close().
        if self.returncode is None and self._pidfd >= 0 and not pidfd_alive(self._pidfd):
            now = time.monotonic()
            if self._dead_since is None:
                self._dead_since = now
            if self.reported_exit is not None or self._status_done.is_set() or \
                    now - self._dead_since >= EXIT_LINE_GRACE_S:
                reported = self.reported_exit
                self.returncode = reported if reported is not None else -signal.SIGKILL
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None and self._pidfd >= 0:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            if pidfd_alive(self._pidfd):
                select.select([self._pidfd], [], [], left)
            else:  # dead: its exit line may still be on its way
                self._status_done.wait(0.05 if left is None else min(0.05, left))
        if self.returncode is None:  # closed: nothing more can be known
            self.returncode = -signal.SIGKILL
        return self.returncode

    def close(self) -> None:
        """Close the pidfd (after the last poll or wait; the handle's release)."""
        fd, self._pidfd = self._pidfd, -1
        if fd >= 0:
            os.close(fd)


@dataclass
class Found:
    """What :func:`find_orphans` found: workers to take over, and the ports of slots with
    a worker that could not be identified (nothing may start there while it may live)."""

    orphans: dict[int, Orphan]
    unidentified: set[int]


def find_orphans(workers_dir: Path, ports: list[int], cgroup_root: Path | None,
                 records_dir: Path | None = None, timeout_s: float = 2.0) -> Found:
    """Connect to every take-over socket under ``workers_dir``. A worker that answers
    and passes every check is an orphan to take over (one per port). One that answers
    but fails a check, or is on no slot of ``ports``, is killed with its group (and its
    cgroup under ``cgroup_root``). A socket nobody listens on is removed. A slot whose
    socket could not be reached otherwise (a full backlog, not a socket) is unidentified.
    Each worker gets ``timeout_s`` in all to answer: a tenant's code cannot stall this.
    A frozen worker is identified by its lease record under ``records_dir`` instead
    (none: it is killed)."""
    found = Found({}, set())
    if not workers_dir.is_dir():
        return found
    for directory in sorted(workers_dir.iterdir()):
        if not os.path.lexists(directory / SOCKET_NAME):
            continue
        port = _port_of(directory.name)
        try:
            orphan = _connect(directory, timeout_s, cgroup_root, records_dir)
        except _Unreachable as exc:
            log.warning("worker in %s not reachable (%s): nothing starts on its slot "
                        "until its lease has surely ended", directory, exc)
            if port is not None:
                found.unidentified.add(port)
            continue
        if orphan is None:
            continue
        if orphan.port not in ports or orphan.port in found.orphans:
            log.warning("worker %s in %s is on no slot of this supervisor: killed",
                        orphan.name, directory)
            _kill_with_cgroup(orphan.pidfd, orphan.pid, cgroup_root)
            orphan.kill()
            continue
        found.orphans[orphan.port] = orphan
        log.info("found worker %s left running by an earlier process of this supervisor",
                 orphan.name)
    return found


class _Unreachable(Exception):
    """A take-over socket that could not be reached: who listens is unknown."""


def _port_of(name: str) -> int | None:
    _, _, port = name.rpartition("-")
    return int(port) if port.isdigit() else None


def _kill_with_cgroup(pidfd: int, pid: int, cgroup_root: Path | None) -> None:
    """Kill the worker's group and, if it runs in a worker cgroup
    (``nimbus-ha/<supervisor-id>/<name>``), everything in that cgroup: what left its
    process group goes too."""
    cgroup = cgroup_of(pid, cgroup_root) if cgroup_root is not None else None
    kill_by_pidfd(pidfd, pid)
    if cgroup is not None and cgroup_root is not None:
        parts = cgroup.relative_to(cgroup_root).parts
        if len(parts) == 3 and parts[0] == "nimbus-ha":
            kill_cgroup(cgroup)


def find_warm_orphans(warm_root: Path, cgroup_root: Path | None,
                      timeout_s: float = 2.0) -> list[Orphan]:
    """The warm workers an earlier process of this supervisor left waiting (not yet
    taken, so holding no lease: nimbus/worker/warm.py), connected through their
    ``<warm-dir>/supervisor.sock``; each checked as :func:`find_orphans` checks a slot's
    worker, and killed if a check fails. Their ``kind`` is ``"warm"`` and their ``port``
    the number of their ``warm-<n>`` directory."""
    found: list[Orphan] = []
    if not warm_root.is_dir():
        return found
    for directory in sorted(warm_root.iterdir()):
        if not directory.name.startswith("warm-") or \
                not os.path.lexists(directory / SOCKET_NAME):
            continue
        try:
            orphan = _connect(directory, timeout_s, cgroup_root, warm=True)
        except _Unreachable as exc:
            # Nothing to hold: a warm worker touches no slot and no checkpoint.
            log.warning("warm worker in %s not reachable (%s): left to exit on its own",
                        directory, exc)
            continue
        if orphan is not None:
            log.info("found warm worker %s left waiting by an earlier process of this "
                     "supervisor", orphan.name)
            found.append(orphan)
    return found


def _connect(directory: Path, timeout_s: float, cgroup_root: Path | None,
             records_dir: Path | None = None, warm: bool = False) -> Orphan | None:
    deadline = time.monotonic() + timeout_s
    path = directory / SOCKET_NAME
    try:
        # The socket file itself, never what a symlink there points to.
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _Unreachable(f"cannot open {path}: {exc.strerror}") from None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    pidfd = -1
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise _Unreachable(f"{path} is not a socket")
        sock.settimeout(timeout_s)
        try:
            sock.connect(f"/proc/self/fd/{fd}")
        except (ConnectionRefusedError, FileNotFoundError):
            with contextlib.suppress(OSError):  # nobody listens: its worker is gone
                path.unlink()
            sock.close()
            return None
        except OSError as exc:
            raise _Unreachable(str(exc)) from None
        pid, _uid, _gid = peer_credentials(sock)
        pidfd = os.pidfd_open(pid)  # the listener is alive while it is connected
        try:
            record = None if warm or records_dir is None else \
                load_record(records_dir / f"{directory.name}.json")
            orphan = _identify(sock, pid, pidfd, directory, deadline, cgroup_root, record,
                               warm)
        except Exception as exc:  # whatever a tenant's code may send or cause
            log.warning("cannot take over the worker in %s (pid %d): %s; killed",
                        directory, pid, exc)
            _kill_with_cgroup(pidfd, pid, cgroup_root)
            sock.close()
            os.close(pidfd)
            return None
    except BaseException:
        sock.close()
        if pidfd >= 0:
            os.close(pidfd)
        raise
    finally:
        os.close(fd)
    sock.settimeout(None)
    return orphan


def _identify(sock: socket.socket, pid: int, pidfd: int, directory: Path, deadline: float,
              cgroup_root: Path | None, record: LeaseRecord | None, warm: bool) -> Orphan:
    """The orphan at the other end of ``sock`` (owned by ``pid``): from its take-over
    line, or, frozen, from its lease record; ValueError if it cannot be trusted."""
    cgroup = cgroup_of(pid, cgroup_root) if cgroup_root is not None else None
    if warm:
        _refuse_frozen(cgroup)
        return _warm_orphan(sock, pid, pidfd, _read_hello(sock, deadline), directory)
    if cgroup is None or not is_frozen(cgroup):
        try:
            hello = _read_hello(sock, deadline)
        except ValueError:
            if cgroup is None or not is_frozen(cgroup):
                raise
            # It froze after it was connected: its line comes after the thaw.
        else:
            orphan = _orphan(sock, pid, pidfd, hello, directory)
            if record is not None and record.pid == pid and record.cgroup == str(cgroup):
                orphan.assignment_version = record.assignment_version
            return orphan
    assert cgroup is not None
    return _frozen_orphan(sock, pid, pidfd, directory, cgroup, record)


def _refuse_frozen(cgroup: Path | None) -> None:
    """A warm worker holds no lease and never freezes; frozen, it is no warm worker."""
    if cgroup is not None and is_frozen(cgroup):
        raise ValueError("a warm worker is frozen")


def _frozen_orphan(sock: socket.socket, pid: int, pidfd: int, directory: Path,
                   cgroup: Path, record: LeaseRecord | None) -> Orphan:
    """A slot's worker frozen when its lease ran out (nimbus/worker/lease.py), known by
    its record: the socket's owner must be the recorded pid, lead its group and be
    frozen in the recorded cgroup, in the recorded slot's directory."""
    if record is None:
        raise ValueError("it is frozen, and no record says what it runs")
    if record.pid != pid:
        raise ValueError(f"it is frozen, and its record names pid {record.pid}, not the "
                         f"socket's owner {pid}")
    if record.cgroup != str(cgroup):
        raise ValueError(f"it is frozen in {cgroup}, not in its recorded cgroup")
    if directory.name != f"{record.topology_id}-{record.port}":
        raise ValueError(f"its record names slot {record.topology_id}:{record.port}, "
                         "not this directory's")
    if os.getpgid(pid) != pid:
        raise ValueError(f"pid {pid} leads no process group of its own")
    if not record.worker_index < record.num_workers:
        raise ValueError("its record names no place in a topology")
    # Its kind is read from its topology's code when it is taken over.
    return Orphan(sock, pid, pidfd, record.topology_id, record.port, record.worker_index,
                  record.num_workers, record.restarts, "pipeline", directory,
                  assignment_version=record.assignment_version, frozen=True,
                  code_version=record.code_version)


def _read_hello(sock: socket.socket, deadline: float) -> dict[str, Any]:
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise ValueError("no take-over line in time")
        sock.settimeout(left)
        chunk = sock.recv(1)  # one byte at a time: what follows is the status stream's
        if not chunk:
            raise ValueError("it closed the connection without a word (its supervisor "
                             "lives, or its lease ran out)")
        line += chunk
        if len(line) > MAX_HELLO:
            raise ValueError("its first line is overlong")
    message = json.loads(line.decode("utf-8"))
    hello = message.get("takeover") if isinstance(message, dict) else None
    if not isinstance(hello, dict):
        raise ValueError("its first line is not a take-over line")
    return hello


def _integer(hello: dict[str, Any], key: str, most: int = 1 << 31) -> int:
    value = hello.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= most:
        raise ValueError(f"its {key} is not a count: {value!r:.50}")
    return value


def _check_peer(hello: dict[str, Any], peer_pid: int) -> int:
    """The pid the worker claims, once shown to be the socket's owner and a group leader."""
    pid = _integer(hello, "pid")
    if pid != peer_pid:
        raise ValueError(f"it claims pid {pid}, but the socket's owner is pid {peer_pid}")
    if os.getpgid(pid) != pid:
        raise ValueError(f"pid {pid} leads no process group of its own")
    return pid


def _warm_orphan(sock: socket.socket, peer_pid: int, pidfd: int, hello: dict[str, Any],
                 directory: Path) -> Orphan:
    if hello.get("kind") != "warm":
        raise ValueError("a worker that is not warm, in a warm worker's directory")
    pid = _check_peer(hello, peer_pid)
    number = directory.name.removeprefix("warm-")
    if not number.isdigit():
        raise ValueError(f"{directory.name} is no warm worker's directory")
    # Its descriptors, as its worker.json must name them once a slot takes it.
    fds = (_integer(hello, "lease_fd", 1 << 20), _integer(hello, "status_fd", 1 << 20))
    return Orphan(sock, pid, pidfd, "warm", int(number), 0, 1, 0, "warm", directory,
                  child_fds=fds)


def _orphan(sock: socket.socket, peer_pid: int, pidfd: int, hello: dict[str, Any],
            directory: Path) -> Orphan:
    def integer(key: str, most: int = 1 << 31) -> int:
        return _integer(hello, key, most)

    topology_id, kind = hello.get("topology_id"), hello.get("kind")
    if not isinstance(topology_id, str) or kind not in KINDS:
        raise ValueError("its take-over line names no topology or kind")
    pid = _check_peer(hello, peer_pid)
    port = integer("port", 65535)
    index, count = integer("worker_index"), integer("num_workers")
    if directory.name != f"{topology_id}-{port}":
        raise ValueError(f"it claims slot {topology_id}:{port}, not this directory's")
    if not index < count:
        raise ValueError(f"worker {index} of {count} is no place in a topology")
    # A worker of an earlier release names no version: it runs version 1.
    version = integer("code_version", MAX_CODE_VERSION) if "code_version" in hello else 1
    if version < 1:
        raise ValueError(f"version {version} is no code version")
    return Orphan(sock, pid, pidfd, topology_id, port, index, count,
                  integer("restarts", MAX_RESTARTS), kind, directory,
                  code_version=version)
