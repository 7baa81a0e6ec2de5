"""The supervisor's pure decisions: which slots it must run, when to restart, free ports.

Nothing here touches ZooKeeper or processes, so each rule is tested on its own.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from nimbus.state.code_versions import version_key
from nimbus.state.records import WORKER_PREFIX, Assignment

# Restart backoff (docs/runtime.md): a worker that had done its work (a pipeline that
# committed a batch, a command that ran past its start timeout) is restarted at once and
# its backoff starts afresh; only a crash loop (dying before that) backs off: the first
# restart at once, then 1 s doubling to 60 s, reset after 5 minutes of good running.
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 60.0
BACKOFF_RESET_AFTER_S = 300.0


class SlotPortInUseError(OSError):
    """A port of ``supervisor.slots.ports`` is already bound by another process."""


@dataclass(frozen=True)
class DesiredWorker:
    """One worker the leader assigned to a slot of this supervisor, and the code it runs
    (``Assignment.code_for`` its executor: nimbus.state.code_versions).

    ``code_key`` is where that code is fetched, verified, cached and cleaned up: the
    topology id for version 1, ``<topology-id>.v<N>`` for version N (given, or made from
    ``version``). Checkpoints stay the topology's, whatever the version.
    """

    topology_id: str
    port: int
    executor: str        # "worker-<i>"
    worker_index: int
    version: int = 1
    code_key: str = ""
    # file name -> sha256 of that version's code (compared, never hashed)
    code_sha256: dict[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not self.code_key:
            object.__setattr__(self, "code_key", version_key(self.topology_id, self.version))


def worker_index(executor: str) -> int:
    """``i`` of an executor key ``worker-<i>``; ValueError for any other key."""
    if not executor.startswith(WORKER_PREFIX) or not executor[len(WORKER_PREFIX):].isdigit():
        raise ValueError(f"not a worker executor key: {executor!r}")
    return int(executor[len(WORKER_PREFIX):])


def desired_workers(assignments: Mapping[str, Assignment], supervisor_id: str,
                    ports: Iterable[int]) -> dict[int, DesiredWorker]:
    """port -> the worker this supervisor must run there, from every assignment, with the
    code version its executor runs (``Assignment.code_for``: during a rolling switch
    each executor may run another).

    Entries naming another supervisor, a port this supervisor does not offer, or a
    malformed executor key are ignored. Should two topologies name the same slot (a
    leader never writes that), the one whose id sorts first keeps it, so every pass of
    every supervisor decides the same way.
    """
    offered = set(ports)
    out: dict[int, DesiredWorker] = {}
    for topology_id in sorted(assignments):
        for executor, node_port in sorted(assignments[topology_id].executor_node_port.items()):
            try:
                node, port = node_port
                port, index = int(port), worker_index(executor)
            except (TypeError, ValueError):
                continue
            if node != supervisor_id or port not in offered or port in out:
                continue
            version, sha256 = assignments[topology_id].code_for(executor)
            try:
                key = version_key(topology_id, version)
            except ValueError:  # a record that decoded is never so; skipped all the same
                continue
            out[port] = DesiredWorker(topology_id, port, executor, index, version, key,
                                      dict(sha256))
    return out


class RestartBackoff:
    """The delay before restarting a worker that exited; see the module constants."""

    def __init__(self, first_s: float = BACKOFF_FIRST_S, max_s: float = BACKOFF_MAX_S,
                 reset_after_s: float = BACKOFF_RESET_AFTER_S):
        self.first_s = first_s
        self.max_s = max_s
        self.reset_after_s = reset_after_s
        self._next_s = 0.0

    def delay_after_exit(self, ran_for_s: float, healthy: bool = False) -> float:
        """The delay before the next start of a worker that ran ``ran_for_s`` seconds;
        ``healthy``: it had done its work before it died (not a crash loop)."""
        if healthy or ran_for_s >= self.reset_after_s:
            self._next_s = 0.0  # it ran well: start afresh
        delay = self._next_s
        self._next_s = min(max(self._next_s * 2, self.first_s), self.max_s)
        return delay


def check_ports_free(ports: Iterable[int], hosts: Iterable[str] = ("127.0.0.1",)) -> None:
    """Raise SlotPortInUseError for the first port that cannot be bound on a host.

    Each socket is bound (never listened on) and closed at once: the supervisor does not
    hold the slot ports, its workers (or their commands) may bind them.
    """
    for port in ports:
        for host in hosts:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                # As a listener would: connections of an earlier worker in TIME_WAIT do
                # not make the port taken, a socket bound or listening there does.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind((host, int(port)))
                except OSError as exc:
                    if exc.errno == errno.EADDRINUSE:
                        raise SlotPortInUseError(
                            f"supervisor slot port {port} is in use (supervisor.slots.ports)"
                        ) from None
                    if exc.errno == errno.EADDRNOTAVAIL:
                        continue  # not an address of this machine: nothing to check there
                    raise SlotPortInUseError(
                        f"cannot bind supervisor slot port {port} on {host}: {exc.strerror} "
                        "(supervisor.slots.ports)") from None
