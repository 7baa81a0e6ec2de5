"""Taking over the workers an earlier process of this supervisor left running.

A supervisor killed with kill -9 leaves its workers running to the end of the leases it
granted (at most 2/3 of its session timeout), each listening on
``<worker-dir>/supervisor.sock`` (:mod:`nimbus.worker.takeover`). At start, the next
process connects to every such socket and reads what the worker says of itself
(:func:`find_orphans`); its first reconcile pass takes over each one that the assignment
still places on the same slot with the same share of its topology, and ends the others.
A taken-over worker is renewed like any other: only by a round trip of this process's own
session that shows its assignment.

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
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nimbus.supervisor.memory import group_pids
from nimbus.worker.takeover import SOCKET_NAME, peer_credentials, socket_path

log = logging.getLogger(__name__)

MAX_HELLO = 4096
KINDS = ("pipeline", "process")


@dataclass
class Orphan:
    """A worker left running by an earlier process of this supervisor, connected."""

    sock: socket.socket
    pid: int
    topology_id: str
    port: int
    worker_index: int
    num_workers: int
    restarts: int
    kind: str
    worker_dir: Path

    @property
    def name(self) -> str:
        return f"{self.topology_id}:{self.port} (pid {self.pid})"

    def working_dirs(self) -> set[Path]:
        """The working directories of its processes (a worker that was warm keeps its
        JVM in the warm directory it started in)."""
        found = set()
        for pid in group_pids(self.pid):
            with contextlib.suppress(OSError):
                found.add(Path(os.readlink(f"/proc/{pid}/cwd")))
        return found

    def kill(self) -> None:
        """SIGKILL its process group and close the connection (its cgroup, if any, is
        emptied when the slot starts a worker again)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        self.sock.close()


class TakenOverProcess:
    """What a :class:`~nimbus.supervisor.worker_handle.WorkerHandle` needs of a
    ``Popen`` (``pid``, ``poll``, ``wait``) for a worker this process did not start.

    Its exit is seen through a pidfd (immune to pid reuse). The exit code is what the
    worker said last (``{"exit": code}``), or -SIGKILL if it said none: it was killed, by
    its lease or from outside."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.reported_exit: int | None = None
        self.returncode: int | None = None
        self._pidfd = os.pidfd_open(pid)

    def poll(self) -> int | None:
        # The monitor and the status reader both poll; the pidfd stays open until close().
        if self.returncode is None and self._pidfd >= 0:
            ready, _, _ = select.select([self._pidfd], [], [], 0)
            if ready:
                self._ended()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.poll() is None and self._pidfd >= 0:
            ready, _, _ = select.select([self._pidfd], [], [], timeout)
            if not ready:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            self._ended()
        assert self.returncode is not None
        return self.returncode

    def _ended(self) -> None:
        reported = self.reported_exit
        self.returncode = reported if reported is not None else -signal.SIGKILL

    def close(self) -> None:
        """Close the pidfd (after the last poll or wait; the handle's release)."""
        fd, self._pidfd = self._pidfd, -1
        if fd >= 0:
            os.close(fd)


def find_orphans(workers_dir: Path, ports: list[int],
                 timeout_s: float = 2.0) -> dict[int, Orphan]:
    """The workers under ``workers_dir`` that answer on their take-over sockets, by port
    (one per port at most); a socket nobody answers on is removed."""
    found: dict[int, Orphan] = {}
    if not workers_dir.is_dir():
        return found
    for directory in sorted(workers_dir.iterdir()):
        if not (directory / SOCKET_NAME).exists():
            continue
        orphan = _connect(directory, timeout_s)
        if orphan is None:
            continue
        if orphan.port not in ports or orphan.port in found:
            log.warning("worker %s in %s is on no slot of this supervisor: killed",
                        orphan.name, directory)
            orphan.kill()
            continue
        found[orphan.port] = orphan
        log.info("found worker %s left running by an earlier process of this supervisor",
                 orphan.name)
    return found


def _connect(directory: Path, timeout_s: float) -> Orphan | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        with socket_path(directory) as address:
            sock.connect(address)
        pid, _uid, _gid = peer_credentials(sock)
        hello = _read_hello(sock)
        orphan = _orphan(sock, pid, hello, directory)
    except (ConnectionRefusedError, FileNotFoundError):
        sock.close()
        with contextlib.suppress(OSError):  # its worker is gone
            (directory / SOCKET_NAME).unlink()
        return None
    except (OSError, ValueError) as exc:
        sock.close()
        log.warning("cannot take over the worker in %s: %s", directory, exc)
        return None
    sock.settimeout(None)
    return orphan


def _read_hello(sock: socket.socket) -> dict[str, Any]:
    line = b""
    while not line.endswith(b"\n"):
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


def _orphan(sock: socket.socket, peer_pid: int, hello: dict[str, Any],
            directory: Path) -> Orphan:
    def integer(key: str) -> int:
        value = hello.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"its {key} is not a count: {value!r:.50}")
        return value

    topology_id, kind = hello.get("topology_id"), hello.get("kind")
    if not isinstance(topology_id, str) or kind not in KINDS:
        raise ValueError("its take-over line names no topology or kind")
    pid, port = integer("pid"), integer("port")
    index, count = integer("worker_index"), integer("num_workers")
    if pid != peer_pid:
        raise ValueError(f"it claims pid {pid}, but the socket's owner is pid {peer_pid}")
    if os.getpgid(pid) != pid:
        raise ValueError(f"pid {pid} leads no process group of its own")
    if directory.name != f"{topology_id}-{port}":
        raise ValueError(f"it claims slot {topology_id}:{port}, not this directory's")
    if not index < count:
        raise ValueError(f"worker {index} of {count} is no place in a topology")
    return Orphan(sock, pid, topology_id, port, index, count, integer("restarts"),
                  kind, directory)
