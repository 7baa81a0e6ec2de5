"""What ``nimbus-ha dev-cluster`` does while it runs: report daemons that exit, and
optionally start them again, so that a failover can be watched (and caused) from it.

A nimbus or supervisor that exits is reported once, with its pid and how it ended, and
the rest of the cluster goes on; with ``--restart`` it is started again (with what is
left of its storm.local.dir). Only ZooKeeper's death ends the dev cluster with an error:
without it nothing can lead.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Sequence
from typing import Any


def how_it_ended(returncode: int) -> str:
    """``exited with code 3`` or ``killed by SIGKILL (signal 9)``."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name} (signal {-returncode})"
    return f"exited with code {returncode}"


def describe(daemon: Any) -> str:
    address = getattr(daemon, "address", None)
    where = f" {address}" if address else ""
    return f"{daemon.DAEMON} {daemon.index}{where}"


class DaemonWatch:
    """One look at a time (:meth:`look`): report (and restart) daemons that exited."""

    def __init__(self, daemons: Callable[[], Sequence[Any]], zookeeper: Any,
                 echo: Callable[[str], None], restart: bool):
        self._daemons = daemons
        self._zookeeper = zookeeper
        self._echo = echo
        self._restart = restart
        self._reported: set[int] = set()   # pids already reported as gone
        self.restarts = 0

    def look(self) -> bool:
        """Report what exited since the last look; False once ZooKeeper is gone."""
        alive = getattr(self._zookeeper, "alive", True)   # a property, or a method
        if not (alive() if callable(alive) else alive):
            process = getattr(self._zookeeper, "process", None)
            code = process.returncode if process is not None else None
            self._echo(f"ZooKeeper {how_it_ended(code) if code is not None else 'is gone'}"
                       ": the dev cluster cannot go on")
            return False
        for daemon in self._daemons():
            process = daemon.process
            if process is None or process.poll() is None or process.pid in self._reported:
                continue
            self._reported.add(process.pid)
            self._echo(f"{describe(daemon)} (pid {process.pid}) "
                       f"{how_it_ended(process.returncode)}; its log: {daemon.log_file}")
            if self._restart:
                daemon.start()
                self.restarts += 1
                self._echo(f"restarted {describe(daemon)} (pid {daemon.process.pid})")
            else:
                self._echo("the rest of the cluster goes on (--restart starts daemons "
                           "that exit again)")
        return True

    def run(self, stop: threading.Event, period_s: float = 0.5) -> bool:
        """Look every ``period_s`` until ``stop`` is set (True) or ZooKeeper dies (False)."""
        while not stop.wait(period_s):
            if not self.look():
                return False
        return True
