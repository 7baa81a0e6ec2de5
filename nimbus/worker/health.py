"""A process topology's own health check (``health:`` in ``topology.yaml``).

A command can be alive and useless: stuck on a lock, looping on an error, waiting on a
peer that went away. Its pid says nothing about that, so a topology may say how to tell::

    health:
      command: [./check.sh]   # run every `every` seconds; healthy while it exits 0
      every: 10               # seconds between two checks (default 10)
      timeout: 30             # seconds a check may take (default 30)
      grace: 60               # seconds after the command starts before checks count (60)

or::

    health:
      file: heartbeat         # healthy while this file's modification time advances;
      timeout: 30             # at most this many seconds apart (default 30)
      grace: 60

A relative ``file`` is under ``$NIMBUS_HA_STATE_DIR``; a ``command`` runs in the bundle
root with the command's environment. An unhealthy command is stopped and reported (its
worker exits with code 3), and its supervisor restarts it.

The check has *passed* (:attr:`HealthCheck.passed`) once it found the command healthy
since it started: a ``command`` check exited 0, or the ``file`` was written after the
command started (an older file, left by an earlier run in the state directory, is no
proof). The worker says so in its beats, and its supervisor counts a worker of a new code
version as upgraded only from then (nimbus/supervisor/status_input.py).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nimbus.worker_protocol.exits import InvalidTopology

KEYS = ("command", "file", "every", "timeout", "grace")


@dataclass(frozen=True)
class HealthSpec:
    """A validated ``health:`` mapping."""

    command: list[str] | None = None
    file: str | None = None
    every_s: float = 10.0
    timeout_s: float = 30.0
    grace_s: float = 60.0

    @classmethod
    def parse(cls, raw: Any, where: str) -> HealthSpec:
        """From the ``health`` value of ``where`` (a file name, for messages)."""
        if not isinstance(raw, dict):
            raise InvalidTopology(f"{where}: 'health' must be a mapping with 'command' or "
                                  "'file'")
        unknown = sorted(str(k) for k in raw if k not in KEYS)
        if unknown:
            raise InvalidTopology(f"{where}: unknown keys {unknown} in 'health' (allowed: "
                                  f"{', '.join(KEYS)})")
        command, file = raw.get("command"), raw.get("file")
        if (command is None) == (file is None):
            raise InvalidTopology(f"{where}: 'health' needs exactly one of 'command' "
                                  "(argv) and 'file' (a path whose modification time "
                                  "advances)")
        if command is not None and (not isinstance(command, list) or not command or not all(
                isinstance(a, str) and a for a in command)):
            raise InvalidTopology(f"{where}: 'health.command' must be a non-empty list of "
                                  f"strings (argv); got {command!r:.100}")
        if file is not None and (not isinstance(file, str) or not file):
            raise InvalidTopology(f"{where}: 'health.file' must be a path")
        numbers = {}
        for key, default in (("every", 10.0), ("timeout", 30.0), ("grace", 60.0)):
            value = raw.get(key, default)
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not number or value < 0 or (value == 0 and key != "grace"):
                least = "0 or more" if key == "grace" else "a positive number of"
                raise InvalidTopology(f"{where}: 'health.{key}' must be {least} seconds, "
                                      f"got {value!r}")
            numbers[key] = float(value)
        return cls(command=list(command) if command else None, file=file,
                   every_s=numbers["every"], timeout_s=numbers["timeout"],
                   grace_s=numbers["grace"])


class HealthCheck:
    """Runs a :class:`HealthSpec` against a running command; :meth:`poll` never blocks.

    ``cwd`` and ``env`` are the command's; ``state_dir`` anchors a relative ``file``.
    """

    def __init__(self, spec: HealthSpec, cwd: Path, env: dict[str, Any], state_dir: Path,
                 clock: Callable[[], float] = time.monotonic):
        self.spec = spec
        self._cwd = cwd
        self._env = env
        self._file = (state_dir / spec.file) if spec.file else None
        self._clock = clock
        self._started = clock()
        self._next = self._started + spec.grace_s
        self._running: subprocess.Popen[bytes] | None = None
        self._running_since = 0.0
        self._file_seen: tuple[float | None, float] = (None, self._started)
        self._file_looked = False   # the file's first look is a baseline, not a change
        self._started_wall = time.time()   # what a file's mtime is compared with
        self.passed = False   # found healthy since the command started (module doc)

    def poll(self) -> str | None:
        """The reason the command is unhealthy, or None (healthy, or not judged yet)."""
        now = self._clock()
        if self._file is not None:
            return self._poll_file(now)
        return self._poll_command(now)

    def _poll_file(self, now: float) -> str | None:
        try:
            mtime: float | None = self._file.stat().st_mtime  # type: ignore[union-attr]
        except OSError:
            mtime = None
        seen, since = self._file_seen
        first, self._file_looked = not self._file_looked, True
        if mtime is not None and (mtime >= self._started_wall or
                                  (mtime != seen and not first)):
            self.passed = True   # written since the command started
        if mtime != seen:
            self._file_seen = (mtime, now)
            return None
        if now < self._started + self.spec.grace_s or now - since < self.spec.timeout_s:
            return None
        what = "does not exist" if mtime is None else "has not changed"
        return (f"health check failed: {self._file} {what} for {now - since:.0f}s "
                f"(health.timeout {self.spec.timeout_s:g}s)")

    def _poll_command(self, now: float) -> str | None:
        if self._running is not None:
            code = self._running.poll()
            if code is None:
                if now - self._running_since < self.spec.timeout_s:
                    return None
                self._running.kill()
                self._running.wait()
                self._running = None
                return (f"health check failed: {self.spec.command} took more than "
                        f"{self.spec.timeout_s:g}s (health.timeout)")
            output = self._running.stdout.read() if self._running.stdout else b""
            self._running = None
            if code != 0:
                tail = output.decode("utf-8", "replace").strip()[-500:]
                return (f"health check failed: {self.spec.command} exited with code {code}"
                        + (f": {tail}" if tail else ""))
            self.passed = True
            return None
        if now >= self._next:
            self._next = now + self.spec.every_s
            self._running_since = now
            try:
                self._running = subprocess.Popen(
                    self.spec.command or [], cwd=self._cwd, env=self._env,
                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT)
            except OSError as exc:
                return (f"health check failed: cannot run {self.spec.command}: "
                        f"{exc.strerror or exc}")
        return None

    def close(self) -> None:
        """Stop a check still running (the command is being stopped)."""
        if self._running is not None and self._running.poll() is None:
            self._running.kill()
            self._running.wait()
        self._running = None
