"""A worker's log directory, made by its supervisor before the worker starts, and the
record beside it that says who may read it (docs/logs.md).

``<root>/<topology-id>/<port>/`` holds the worker's ``worker.log`` and its rotated files
(nimbus/state/worker_logs.py; the worker writes them itself: nimbus/worker/log_pump.py).
``<root>/<topology-id>/log-meta.json`` is the supervisor's :class:`LogMeta`: the
topology's submitter, ``topology.users`` and ``topology.readonly.users``, which the
logviewer's read rule needs after the topology's code has left the host (its logs stay
for ``logviewer.cleanup.age.mins``), and which of the topology's workers wrote in each
slot (``nimbus-ha logs --worker N``).

With ``supervisor.run.worker.as.user`` the root and each topology's directory belong to
the supervisor (0711: traversable, not listable), a slot's directory to the topology's
account (0700), and the record to the supervisor alone (0600): a tenant writes its own
logs and nothing else, and reads no other tenant's.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nimbus.state.worker_logs import LOG_FILE, META_FILE, port_dir
from nimbus.topology_acl import READONLY_USERS_KEY, SUBMITTER_KEY, USERS_KEY, topology_users

log = logging.getLogger(__name__)

MAX_META_BYTES = 1024 * 1024


@dataclass
class LogMeta:
    """What a supervisor records of a topology whose workers wrote logs here."""

    topology_id: str
    submitter: str = ""
    users: list[str] = field(default_factory=list)
    readonly_users: list[str] = field(default_factory=list)
    # "<port>" -> the worker indices (worker-<i>) that ran in that slot, in order.
    ports: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> LogMeta | None:
        """The record at ``path``; None when there is none or it cannot be used (the
        logviewer then lets only admins read: it does not guess)."""
        try:
            with open(path, "rb") as handle:
                data = json.loads(handle.read(MAX_META_BYTES + 1).decode("utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            return None
        if not isinstance(data, dict) or not isinstance(data.get("topology_id"), str):
            return None
        ports = data.get("ports")
        return cls(topology_id=data["topology_id"],
                   submitter=str(data.get("submitter") or ""),
                   users=_strings(data.get("users")),
                   readonly_users=_strings(data.get("readonly_users")),
                   ports={str(port): [i for i in indices if isinstance(i, int)
                                      and not isinstance(i, bool)]
                          for port, indices in (ports.items() if isinstance(ports, dict)
                                                else ()) if isinstance(indices, list)})

    def save(self, path: Path) -> None:
        """Write atomically, readable by this process's account only."""
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(asdict(self), out, sort_keys=True)
        os.replace(tmp, path)


def _strings(value: Any) -> list[str]:
    return [str(item) for item in value] if isinstance(value, list) else []


class LogDirs:
    """The log directories of this supervisor's workers under ``root``."""

    def __init__(self, root: Path, run_as_user: bool = False):
        self.root = root
        self._run_as_user = run_as_user
        # Held while a directory is made here or swept (nimbus/supervisor/log_sweep.py).
        self.lock = threading.Lock()

    def prepare(self, topology_id: str, port: int, worker_index: int,
                topology_conf: dict[str, Any],
                owner: tuple[int, int] | None = None) -> Path:
        """Make the slot's log directory (``owner``'s, uid and gid, when its worker runs
        as the topology's account), record the topology's readers and that
        ``worker-<worker_index>`` writes there; returns the log file the worker's first
        words go to. OSError if the directory cannot be made."""
        with self.lock:
            return self._prepare(topology_id, port, worker_index, topology_conf, owner)

    def _prepare(self, topology_id: str, port: int, worker_index: int,
                 topology_conf: dict[str, Any], owner: tuple[int, int] | None) -> Path:
        directory = port_dir(self.root, topology_id, port)
        topology_dir = directory.parent
        for made in (self.root, topology_dir):
            made.mkdir(exist_ok=True, parents=made is self.root)
            if self._run_as_user:
                os.chmod(made, 0o711)
        directory.mkdir(exist_ok=True)
        if owner is not None:
            os.chown(directory, *owner)
            os.chmod(directory, 0o700)
        self._record(topology_dir / META_FILE, topology_id, port, worker_index, topology_conf)
        # Its log's time starts now, not at its last write: the sweep counts from here.
        os.utime(directory)
        return directory / LOG_FILE

    def _record(self, path: Path, topology_id: str, port: int, worker_index: int,
                topology_conf: dict[str, Any]) -> None:
        meta = LogMeta.load(path) or LogMeta(topology_id)
        wanted = LogMeta(
            topology_id=topology_id,
            submitter=str(topology_conf.get(SUBMITTER_KEY) or ""),
            users=[str(u) for u in topology_users(topology_conf, USERS_KEY)],
            readonly_users=[str(u) for u in topology_users(topology_conf,
                                                           READONLY_USERS_KEY)],
            ports={k: list(v) for k, v in meta.ports.items()})
        indices = wanted.ports.setdefault(str(port), [])
        if worker_index not in indices:
            indices.append(worker_index)
        if wanted != meta:
            try:
                wanted.save(path)
            except OSError as exc:  # the logs are written all the same; the rule is stale
                log.warning("cannot record who may read the logs of %s (%s): %s",
                            topology_id, path, exc)
