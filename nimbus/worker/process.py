"""Process topologies: ``topology.yaml`` names a command the worker runs as its child.

``topology.yaml``::

    command: [python3, tailer.py]     # argv, required, a non-empty list of strings
    env: {TAILER_INPUT: /data/in.log}  # optional extra environment
    health: {file: heartbeat, timeout: 30}  # optional: see nimbus.worker.health

Each beat says what the health check says (``health``: none declared, pending, passed),
beating at once when it first passes: a worker of a new code version counts as upgraded
from then (with none declared, from its first beat, once the command started).

The command runs in the bundle root with the worker's environment, ``env``, and
``NIMBUS_HA_TOPOLOGY_ID``, ``NIMBUS_HA_WORKER_PORT`` and ``NIMBUS_HA_STATE_DIR``
(``<checkpoint root>/<topology-id>/state``, created). It stays in the worker's process
group, so a lease kill takes it down too. Its stdout goes to ``worker.log``; its stderr
is copied there as well, and its last lines go into the error when it exits.
"""

from __future__ import annotations

import collections
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from nimbus.worker.health import HealthCheck, HealthSpec
from nimbus.worker.lease import Lease
from nimbus.worker.status import StatusWriter
from nimbus.worker_protocol import health as healthy
from nimbus.worker_protocol.exits import (
    EXIT_FAILED,
    EXIT_INVALID_TOPOLOGY,
    EXIT_OK,
    InvalidTopology,
    worker_component,
)
from nimbus.worker_protocol.spec import WorkerSpec

log = logging.getLogger(__name__)

TOPOLOGY_YAML = "topology.yaml"
COMPONENT = "main"
# After SIGTERM, how long the command may take to exit before it gets SIGKILL. The
# supervisor kills the whole group after supervisor.worker.shutdown.sleep.secs anyway.
CHILD_STOP_SECS = 30.0
# Lines of the command's stderr quoted in the error when it exits.
STDERR_TAIL_LINES = 20


@dataclass(frozen=True)
class ProcessTopology:
    """A validated ``topology.yaml``."""

    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    health: HealthSpec | None = None

    @classmethod
    def load(cls, path: Path) -> ProcessTopology:
        """Read and validate ``path``; raises :class:`InvalidTopology` saying what is wrong."""
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise InvalidTopology(f"{path.name}: cannot read: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise InvalidTopology(f"{path.name}: malformed YAML: {exc}") from None
        if not isinstance(data, dict):
            raise InvalidTopology(f"{path.name}: expected a mapping with 'command', "
                                  f"got {type(data).__name__}")
        unknown = sorted(str(k) for k in data if k not in ("command", "env", "health"))
        if unknown:
            raise InvalidTopology(f"{path.name}: unknown keys {unknown} "
                                  f"(allowed: 'command', 'env', 'health')")
        command = data.get("command")
        if (not isinstance(command, list) or not command
                or not all(isinstance(arg, str) for arg in command) or not command[0]):
            raise InvalidTopology(f"{path.name}: 'command' must be a non-empty list of "
                                  f"strings (argv), e.g. [python3, main.py]; got {command!r:.200}")
        env = data.get("env") or {}
        if not isinstance(env, dict):
            raise InvalidTopology(f"{path.name}: 'env' must be a mapping of NAME: value")
        clean: dict[str, str] = {}
        for name, value in env.items():
            if not isinstance(name, str) or not name or "=" in name:
                raise InvalidTopology(f"{path.name}: env name {name!r} is not a valid name")
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise InvalidTopology(f"{path.name}: env {name} must be a string or a "
                                      f"number, got {type(value).__name__}")
            clean[name] = str(value)
        health = HealthSpec.parse(data["health"], path.name) if "health" in data else None
        return cls(command=list(command), env=clean, health=health)


class StderrTee:
    """Copies the child's stderr to ours (``worker.log``) and keeps its last lines.

    Thread ``command-stderr``; ends at EOF of the pipe or when stopped.
    """

    def __init__(self, pipe: IO[bytes]) -> None:
        self._pipe = pipe
        self._tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="command-stderr", daemon=True)

    def start(self) -> StderrTee:
        self._thread.start()
        return self

    def stop(self, drain_secs: float = 1.0) -> None:
        """Wait up to ``drain_secs`` for EOF (the child's last words), then stop and join."""
        self._thread.join(timeout=drain_secs)
        self._stop.set()
        self._thread.join()
        self._pipe.close()

    def tail(self) -> str:
        with self._lock:
            return "".join(self._tail)

    def _run(self) -> None:
        fd = self._pipe.fileno()
        pending = b""
        out = sys.stderr.buffer
        while not self._stop.is_set():
            ready, _, _ = select.select([fd], [], [], 0.2)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            out.write(chunk)
            out.flush()
            pending += chunk
            *lines, pending = pending.split(b"\n")
            with self._lock:
                self._tail.extend(line.decode("utf-8", "replace") + "\n" for line in lines)
        if pending:
            with self._lock:
                self._tail.append(pending.decode("utf-8", "replace") + "\n")


def child_environment(spec: WorkerSpec, topology: ProcessTopology,
                      state_dir: Path) -> dict[str, Any]:
    """The command's environment: ours, then ``env``, then the contract's variables
    (last, so a bundle cannot set them to something else)."""
    return {**os.environ, **topology.env,
            "NIMBUS_HA_TOPOLOGY_ID": spec.topology_id,
            "NIMBUS_HA_WORKER_PORT": str(spec.port),
            "NIMBUS_HA_STATE_DIR": str(state_dir)}


def _describe_exit(code: int) -> str:
    text = f"command exited with code {code}"
    if code < 0:
        try:
            text += f" (killed by {signal.Signals(-code).name})"
        except ValueError:
            pass
    return text


def run_process(spec: WorkerSpec, status: StatusWriter, stop: threading.Event,
                lease: Lease | None = None) -> int:
    """Run the process topology of ``spec`` until ``stop`` is set or the command exits.

    Every worker of a process topology runs the same command, so a rebalance keeps it
    running: ``lease`` brings its new place (``assign`` lines).

    Returns the worker's exit code: 0 when stopped, 2 when the topology is invalid or the
    command cannot be started, 3 when the command exited by itself (any code).
    """
    code_dir = Path(spec.code_dir)
    whole = worker_component(spec.worker_index)  # errors about the topology as a whole
    try:
        topology = ProcessTopology.load(code_dir / TOPOLOGY_YAML)
    except InvalidTopology as exc:
        status.error(whole, str(exc))
        return EXIT_INVALID_TOPOLOGY
    state_dir = spec.topology_checkpoint_dir / "state"
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        status.error(whole, f"cannot create state directory {state_dir}: {exc}")
        return EXIT_FAILED

    env = child_environment(spec, topology, state_dir)
    try:
        # Same process group as the worker (no start_new_session): the lease kill of the
        # group must reach the command and everything it starts.
        child = subprocess.Popen(topology.command, cwd=code_dir, stdin=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, env=env)
    except OSError as exc:
        status.error(COMPONENT, f"cannot start command {topology.command}: "
                                f"{type(exc).__name__}: {exc.strerror or exc}")
        return EXIT_INVALID_TOPOLOGY
    assert child.stderr is not None
    tee = StderrTee(child.stderr).start()
    log.info("command %s started as pid %d (state dir %s)", topology.command, child.pid,
             state_dir)
    if lease is not None:
        lease.on_assign = lambda index, count: _reassigned(spec, index, count)
    # Judged on the worker's running time: a freeze (nimbus/worker/lease.py) is not the
    # command's fault.
    clock = lease.running_clock if lease is not None else time.monotonic
    health = None if topology.health is None else HealthCheck(topology.health, code_dir,
                                                              env, state_dir, clock=clock)
    try:
        return _watch(child, tee, spec, status, stop, health)
    finally:
        if health is not None:
            health.close()
        if child.poll() is None:  # only on an unexpected exception in _watch
            child.kill()
            child.wait()
        tee.stop()


def _watch(child: subprocess.Popen[bytes], tee: StderrTee, spec: WorkerSpec,
           status: StatusWriter, stop: threading.Event,
           health: HealthCheck | None = None) -> int:
    interval = spec.heartbeat_secs
    next_beat = time.monotonic()
    last_said = ""
    while True:
        code = child.poll()
        if code is not None and not stop.is_set():
            # A SIGTERM to the whole group reaches the command and the worker together;
            # give the worker's handler a moment so that this counts as a stop, not a crash.
            stop.wait(0.3)
        if stop.is_set():
            return _stop_child(child)
        if code is not None:
            tee.stop()
            message = _describe_exit(code)
            tail = tee.tail().rstrip()
            if tail:
                message += "\nlast lines of its stderr:\n" + tail[-1500:]
            status.error(COMPONENT, message)
            return EXIT_FAILED
        unhealthy = health.poll() if health is not None else None
        if unhealthy is not None:
            status.error(COMPONENT, unhealthy)
            _stop_child(child)
            return EXIT_FAILED
        now = time.monotonic()
        said = healthy.NONE if health is None else (
            healthy.PASSED if health.passed else healthy.PENDING)
        if now >= next_beat or said != last_said:
            # At once when its check first passes: its supervisor counts it upgraded then.
            status.beat({COMPONENT: {"pid": child.pid}}, health=said)
            last_said = said
            next_beat = now + interval
        # Short waits: a child's exit is noticed within 0.1 s, not a beat later.
        stop.wait(min(0.1, max(0.0, next_beat - now)))


def _reassigned(spec: WorkerSpec, worker_index: int, num_workers: int) -> None:
    log.info("rebalanced: now worker %d of %d; the command runs on", worker_index,
             num_workers)
    spec.worker_index, spec.num_workers = worker_index, num_workers


def _stop_child(child: subprocess.Popen[bytes]) -> int:
    if child.poll() is None:
        log.info("stopping: SIGTERM to command pid %d", child.pid)
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=CHILD_STOP_SECS)
        except subprocess.TimeoutExpired:
            log.warning("command pid %d ignored SIGTERM for %.0f s: SIGKILL", child.pid,
                        CHILD_STOP_SECS)
            child.kill()
            child.wait()
    log.info("command stopped with code %s", child.returncode)
    return EXIT_OK
