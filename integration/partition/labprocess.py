"""The processes of the partition lab: a daemon, probe or workload started inside a node's
namespace with ``ip netns exec``, in its own process group, its output in a log file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from netlab import Node

T = TypeVar("T")
THRIFT_PORT = 6627


class LabError(RuntimeError):
    """The lab could not be brought up, or a daemon died; the message holds its log."""


def wait_until(condition: Callable[[], T], timeout_s: float, what: str,
               interval_s: float = 0.1) -> T:
    """Poll ``condition`` until truthy; TimeoutError naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)  # polling files and /proc: there is nothing to wait on


class LabProcess:
    """One long-running process inside ``node``'s namespace, in a process group of its
    own, its stdout and stderr appended to ``log_file``."""

    def __init__(self, name: str, node: Node, command: Sequence[str], log_file: Path,
                 env: dict[str, str]):
        self.name = name
        self.node = node
        self.command = list(command)
        self.log_file = log_file
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> LabProcess:
        with open(self.log_file, "ab") as log:
            # ip netns exec execs the command: the pid is the daemon's own.
            # Run from the log's directory, never from a checkout: ``python -m`` puts the
            # working directory first on sys.path, ahead of PYTHONPATH.
            self.process = subprocess.Popen(
                self.node.argv(self.command), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, env=self.env,
                cwd=self.log_file.parent)
        return self

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.process.pid, sig)

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM, then SIGKILL to its group after ``timeout_s``."""
        if self.process is None:
            return
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait(timeout=10)

    def log_text(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def check_alive(self) -> None:
        if self.process is not None and not self.alive():
            raise LabError(f"{self.name} exited with {self.process.returncode}; log tail:\n"
                           f"{self.log_text()[-3000:]}")


class LabNimbus(LabProcess):
    """A ``nimbus-ha nimbus`` of the lab."""

    @property
    def address(self) -> str:
        return f"{self.node.address}:{THRIFT_PORT}"


class LabSupervisor(LabProcess):
    """A ``nimbus-ha supervisor`` of the lab."""

    def __init__(self, name: str, node: Node, command: Sequence[str], log_file: Path,
                 env: dict[str, str], local_dir: Path, ports: list[int]):
        super().__init__(name, node, command, log_file, env)
        self.local_dir = local_dir
        self.ports = ports

    @property
    def id(self) -> str | None:
        try:
            return (self.local_dir / "supervisor" / "id").read_text().strip() or None
        except FileNotFoundError:
            return None

    def registered(self) -> bool:
        """Its log says it registered (the supervisor id is written before that)."""
        return self.id is not None and f"registered supervisor {self.id}" in self.log_text()


class Workload:
    """A running :mod:`workload` process: ``go()`` releases its triggered operators,
    ``stop()`` ends it, ``history()`` reads what it recorded."""

    def __init__(self, process: LabProcess, history_file: Path, go_file: Path):
        self.process = process
        self.history_file = history_file
        self.go_file = go_file

    def start(self) -> Workload:
        self.process.start()
        wait_until(lambda: self._started(), 60, "the workload to start")
        return self

    def _started(self) -> bool:
        self.process.check_alive()
        return "workload started" in self.process.log_text()

    def go(self) -> float:
        """Release the operators that wait for the trigger; returns the wall time."""
        self.go_file.write_text("go\n")
        return time.time()

    def stop(self) -> None:
        self.process.stop(timeout_s=90)

    def history(self) -> list[dict[str, Any]]:
        if not self.history_file.exists():
            return []
        out = []
        for line in self.history_file.read_text().splitlines():
            if line.strip():
                out.append(json.loads(line))
        return out
