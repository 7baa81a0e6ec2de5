"""``worker.json``: what a supervisor tells the worker it starts (see docs/runtime.md).

The supervisor builds a :class:`WorkerSpec`, calls :meth:`WorkerSpec.dump` into the
worker directory, and starts ``python -m nimbus.worker <worker-dir>`` with the two pipe
ends named here passed as inherited file descriptors (``pass_fds``). The worker reads it
back with :meth:`WorkerSpec.load`.
"""

from __future__ import annotations

import json
import os
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from nimbus.topology_paths import checkpoint_root_of
from nimbus.worker_protocol.frozen_cgroup import ORPHAN_TIMEOUT_KEY

SPEC_FILE = "worker.json"
#: Most names ``previous_components`` may hold, and the longest name (as many as a
#: worker may declare; a component id is at most 64 characters: nimbus.state.component_ids).
MAX_PREVIOUS_COMPONENTS = 10_000
MAX_COMPONENT_CHARS = 64


class SpecError(ValueError):
    """``worker.json`` is missing, not JSON, or has a missing or mistyped field."""


@dataclass
class WorkerSpec:
    """One worker's assignment, as written by its supervisor into ``<worker-dir>/worker.json``.

    Fields:

    * ``topology_id``: the topology's id (``<name>-<counter>-<launch-secs>``).
    * ``port``: the slot port this worker occupies (from ``supervisor.slots.ports``).
    * ``supervisor_id``: the id of the supervisor that started the worker.
    * ``host``: the supervisor's advertised host name (goes into the beats).
    * ``code_dir``: absolute path of the extracted bundle root: it holds ``topology.py``
      (a pipeline topology) or ``topology.yaml`` (a process topology).
    * ``lease_fd``: the read end of the lease pipe (supervisor -> worker), inherited.
      Lines ``lease <deadline>\\n``, deadline a ``time.monotonic()`` value.
    * ``status_fd``: the write end of the status pipe (worker -> supervisor), inherited.
      One JSON object per line: ``{"beat": {...}}`` or ``{"error": {...}}``.
    * ``conf``: the merged configuration with Storm key names (cluster defaults, the
      supervisor's file, then the topology's own ``topology.*`` keys). Paths in it, such
      as ``storm.local.dir``, should be absolute: the worker resolves relative ones
      against its own working directory.
    * ``restarts``: how many times the supervisor has restarted this worker (0 at first).
    * ``worker_index``, ``num_workers``: this is ``worker-<worker_index>`` of
      ``num_workers`` (``topology.workers``); a pipeline worker runs the components whose
      index in sorted name order is ``worker_index`` modulo ``num_workers``.
    * ``class_archive``: the supervisor's Spark class archive for the driver's JVM, or ""
      (nimbus.worker.class_archive).
    * ``code_version``: the version of the topology's code in ``code_dir``
      (nimbus.state.code_versions; 1, the submitted code, in specs of earlier
      releases). Checkpoints are the topology's whatever the version.
    * ``previous_components``: every component (sorted) that the slot's previous worker
      of this topology declared, the code it ran having built them ([]: unknown, or none
      ran here). A pipeline worker of more than one whose own code's components differ
      refuses to run (:func:`nimbus.worker_protocol.component_share.changed_components`):
      its share would overlap another worker's that may still run the old code.

    The file can hold secrets (the configuration), so :meth:`dump` writes it with mode 0600.
    """

    topology_id: str
    port: int
    supervisor_id: str
    host: str
    code_dir: str
    lease_fd: int
    status_fd: int
    conf: dict[str, Any] = field(default_factory=dict)
    restarts: int = 0
    worker_index: int = 0
    num_workers: int = 1
    class_archive: str = ""
    code_version: int = 1
    previous_components: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._check()

    def _check(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            # Annotations are strings here (postponed evaluation): "str", "int", "dict[...]".
            expected = {"str": str, "int": int, "list[str]": list}.get(str(f.type), dict)
            if not isinstance(value, expected) or isinstance(value, bool):
                raise SpecError(f"worker spec field {f.name!r} must be {expected.__name__}, "
                                f"got {type(value).__name__} {value!r:.80}")
        if not self.topology_id:
            raise SpecError("worker spec field 'topology_id' is empty")
        if self.code_version < 1:
            raise SpecError(f"worker spec field 'code_version' must be 1 or more, got "
                            f"{self.code_version}")
        if len(self.previous_components) > MAX_PREVIOUS_COMPONENTS or not all(
                isinstance(name, str) and 0 < len(name) <= MAX_COMPONENT_CHARS
                for name in self.previous_components):
            raise SpecError(f"worker spec field 'previous_components' must be a list of at "
                            f"most {MAX_PREVIOUS_COMPONENTS} component names, got "
                            f"{self.previous_components!r:.80}")
        if self.num_workers < 1 or not 0 <= self.worker_index < self.num_workers:
            raise SpecError(f"worker spec: worker_index {self.worker_index} is not in "
                            f"[0, num_workers={self.num_workers})")

    @classmethod
    def load(cls, path: str | Path) -> WorkerSpec:
        """Read ``path`` (``worker.json`` or the worker directory holding it).

        Raises :class:`SpecError` naming the problem; unknown fields are refused too, so a
        misspelt field is noticed rather than silently defaulted.
        """
        p = Path(path)
        if p.is_dir():
            p = p / SPEC_FILE
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except OSError as exc:
            raise SpecError(f"{p}: cannot read: {exc.strerror}") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SpecError(f"{p}: not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise SpecError(f"{p}: expected a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(f"{p}: unknown fields {unknown}")
        required = {f.name for f in fields(cls)
                    if f.default is MISSING and f.default_factory is MISSING}
        missing = sorted(required - set(data))
        if missing:
            raise SpecError(f"{p}: missing fields {missing}")
        try:
            return cls(**data)
        except SpecError as exc:
            raise SpecError(f"{p}: {exc}") from None

    def dump(self, path: str | Path) -> Path:
        """Write the spec atomically to ``path`` (a file, or a directory to hold
        ``worker.json``), readable by the owner only; returns the file's path."""
        self._check()
        p = Path(path)
        if p.is_dir():
            p = p / SPEC_FILE
        tmp = p.with_name(f".{p.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(asdict(self), out, indent=2, sort_keys=True)
            out.write("\n")
        os.replace(tmp, p)
        return p

    # Typed values the worker reads of its configuration. The supervisor writes every key
    # a worker reads into ``conf``, with the cluster's default where nobody set it, so the
    # worker copies no default: a key that is missing or ill-typed is a SpecError.

    def _number(self, key: str, positive: bool = True) -> float:
        if key not in self.conf:
            raise SpecError(f"worker spec: conf has no {key!r} (its supervisor writes every "
                            "key a worker reads: one of another release?)")
        value = self.conf[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or (positive and value <= 0):
            kind = "a positive number" if positive else "a number"
            raise SpecError(f"key {key!r} must be {kind}, got {value!r:.80}")
        return float(value)

    def check_settings(self) -> None:
        """Raise SpecError unless every typed value below can be read."""
        for name in ("heartbeat_secs", "first_lease_wait_s", "stall_timeout_s",
                     "orphan_timeout_s", "stop_grace_s", "spark_master"):
            getattr(self, name)

    @property
    def heartbeat_secs(self) -> float:
        """``worker.heartbeat.frequency.secs``."""
        return self._number("worker.heartbeat.frequency.secs")

    @property
    def first_lease_wait_s(self) -> float:
        """``supervisor.worker.start.timeout.secs``: how long a worker waits for its first
        lease (a worker silent that long is killed by its supervisor anyway)."""
        return self._number("supervisor.worker.start.timeout.secs")

    @property
    def stall_timeout_s(self) -> float:
        """``topology.stall.timeout.secs`` (negative: no stall watch)."""
        return self._number("topology.stall.timeout.secs", positive=False)

    @property
    def orphan_timeout_s(self) -> float:
        """``supervisor.worker.orphan.timeout.secs``: how long a frozen worker whose
        supervisor is gone waits before it ends itself."""
        return self._number(ORPHAN_TIMEOUT_KEY)

    @property
    def stop_grace_s(self) -> float:
        """``supervisor.worker.shutdown.sleep.secs``: how long after its SIGTERM the
        supervisor kills this worker's group; what a stop may take (0 or more)."""
        value = self._number("supervisor.worker.shutdown.sleep.secs", positive=False)
        if value < 0:
            raise SpecError(f"key 'supervisor.worker.shutdown.sleep.secs' must be 0 or "
                            f"more, got {value:g}")
        return value

    @property
    def spark_master(self) -> str:
        """``topology.spark.master``."""
        value = self.conf.get("topology.spark.master")
        if not isinstance(value, str) or not value:
            raise SpecError(f"key 'topology.spark.master' must be a non-empty string, "
                            f"got {value!r:.80}")
        return value

    @property
    def checkpoint_root(self) -> Path:
        """``topology.spark.checkpoint.dir``, or ``<storm.local.dir>/checkpoints``."""
        return checkpoint_root_of(self.conf)

    @property
    def topology_checkpoint_dir(self) -> Path:
        """``<checkpoint root>/<topology-id>``: this topology's checkpoints and state."""
        return self.checkpoint_root / self.topology_id
