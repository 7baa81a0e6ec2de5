"""Which process a nimbus registration belongs to, and whether that process is dead.

A nimbus killed with kill -9 leaves its ZooKeeper session behind: its leader-lock node
lives until the session expires, a whole session timeout, and if that node headed the
queue no nimbus may lead meanwhile. When the same nimbus (the same ``host:port``) is
started again within that time, it can end the wait, but only if it *knows* that the
process that owns the node is dead: deleting a live leader's node would let a second
nimbus lead while the first still believes it does.

An address alone proves nothing (two processes may be configured with the same one).
What does is the process itself: the registration of every nimbus records the kernel's
boot id, its pid namespace, its pid and the pid's start time (in clock ticks since boot).
A later process on the same kernel and in the same pid namespace can tell for certain
that the recorded process is gone: its pid no longer exists, or it belongs to a process
started at another time (the pid was reused). Anywhere else (another host, another
container's pid namespace, a system without ``/proc``) nothing is known, and the old
node is left to expire with its session, as before.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class Incarnation:
    """One process, named so that a later process on the same host can tell whether it
    still runs. Empty strings and zeros mean "unknown" (nothing is then ever judged
    dead)."""

    boot_id: str
    pid_namespace: str
    pid: int
    started_ticks: int

    @classmethod
    def of_process(cls, pid: int | None = None, proc: Path = PROC) -> Incarnation:
        """This process (or ``pid``, seen from this process); fields it cannot read are
        left unknown."""
        pid = os.getpid() if pid is None else pid
        if _link(proc / "self") != str(os.getpid()):
            # A /proc of another pid namespace (unshare -p without a remount): its pids
            # are not ours, so nothing read there can be trusted.
            return cls("", "", pid, 0)
        return cls(boot_id=_read(proc / "sys/kernel/random/boot_id"),
                   pid_namespace=_link(proc / "self/ns/pid"),
                   pid=pid, started_ticks=_ticks_or_zero(proc, pid))

    @property
    def known(self) -> bool:
        return bool(self.boot_id and self.pid_namespace and self.pid > 0
                    and self.started_ticks > 0)

    def is_dead(self, proc: Path = PROC) -> bool:
        """True only when this process has certainly ended: it ran on this kernel boot,
        in this pid namespace, and its pid is gone or now names a process started at
        another time. False whenever that cannot be known."""
        if not self.known:
            return False
        here = Incarnation.of_process(proc=proc)
        if not here.known or (here.boot_id, here.pid_namespace) != \
                (self.boot_id, self.pid_namespace):
            return False
        if self.pid == here.pid:
            return self.started_ticks != here.started_ticks
        try:
            now = _started_ticks(proc, self.pid)
        except (OSError, ValueError):
            return False   # unreadable (hidepid, say): not known to be dead
        return now is None or now != self.started_ticks


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _link(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def _started_ticks(proc: Path, pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat`` (the start time, in clock ticks after boot), or
    None when no such process runs (none, or a zombie). Raises OSError or ValueError
    when that cannot be told (no ``/proc``, a pid hidden from this user, a bad line)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except FileNotFoundError:
        if not (proc / "self").exists():
            raise   # no /proc at all: nothing is known
        if proc == PROC:
            # /proc mounted with hidepid hides other users' processes as if gone: only
            # the kernel's "no such process" is proof (PermissionError: it exists).
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return None
            raise ValueError(f"pid {pid} runs but {proc}/{pid} cannot be read") from None
        return None
    except ProcessLookupError:   # the process ended while being read
        return None
    # The command name (field 2) is in parentheses and may itself hold spaces or ')'.
    fields = stat[stat.rfind(")") + 2:].split()
    if len(fields) < 20:
        raise ValueError(f"{proc}/{pid}/stat: too few fields")
    if fields[0] in ("Z", "X", "x"):
        return None   # a zombie has ended (closed its sockets); only its parent waits
    return int(fields[19])   # field 22 counted from 1; fields[0] is field 3


def _ticks_or_zero(proc: Path, pid: int) -> int:
    try:
        return _started_ticks(proc, pid) or 0
    except (OSError, ValueError):
        return 0
