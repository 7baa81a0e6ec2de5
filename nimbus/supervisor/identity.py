"""Who this supervisor is and whether it may run: its configuration's checks, its id
(kept across restarts), the host it advertises, and the lock on its directory (one
supervisor per ``storm.local.dir``).

Everything here runs once, in :class:`~nimbus.supervisor.daemon.Supervisor`'s
constructor, before anything is taken.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import uuid
from pathlib import Path
from typing import IO

import nimbus
from nimbus.config import Config, ConfigError
from nimbus.state.worker_logs import BACKUPS_KEY, MAX_BACKUPS, MAX_MB_KEY, MIN_MAX_BYTES
from nimbus.supervisor.log_sweep import RETENTION_KEY
from nimbus.supervisor.run_as_user import RUN_AS_USER_KEY, check_reachable
from nimbus.supervisor.warm_pool import WARM_KEY
from nimbus.timing import check_timing
from nimbus.worker_protocol.frozen_cgroup import ORPHAN_TIMEOUT_KEY

ID_FILE = "id"
LOCK_FILE = "supervisor.lock"


class SupervisorDirInUseError(OSError):
    """Another supervisor runs with the same ``storm.local.dir``."""


def check_supervisor_conf(conf: Config) -> None:
    """Raise ConfigError for supervisor keys the loop cannot work with."""
    for key in ("supervisor.heartbeat.frequency.secs", "supervisor.worker.timeout.secs",
                "supervisor.worker.start.timeout.secs", "supervisor.monitor.frequency.secs",
                "supervisor.code.fetch.timeout.secs", ORPHAN_TIMEOUT_KEY):
        if conf[key] <= 0:
            raise ConfigError(f"key {key!r} must be positive, got {conf[key]}")
    if conf["supervisor.worker.shutdown.sleep.secs"] < 0:
        raise ConfigError("key 'supervisor.worker.shutdown.sleep.secs' must be >= 0")
    if conf[WARM_KEY] < 0:
        raise ConfigError(f"key {WARM_KEY!r} must be >= 0 (0: no warm workers), "
                          f"got {conf[WARM_KEY]}")
    check_log_conf(conf)
    check_timing(conf)
    ports = conf["supervisor.slots.ports"]
    if not ports or not all(isinstance(p, int) and not isinstance(p, bool) and 0 < p < 65536
                            for p in ports):
        raise ConfigError(f"key 'supervisor.slots.ports' must list ports (1-65535), got {ports}")


def check_log_conf(conf: Config) -> None:
    """ConfigError for worker log settings a worker could not rotate by (docs/logs.md)."""
    min_mb = MIN_MAX_BYTES / (1024 * 1024)
    if conf[MAX_MB_KEY] < min_mb:
        raise ConfigError(f"key {MAX_MB_KEY!r} must be at least {min_mb:g} (a file holds "
                          f"a few lines), got {conf[MAX_MB_KEY]}")
    if not 0 <= conf[BACKUPS_KEY] <= MAX_BACKUPS:
        raise ConfigError(f"key {BACKUPS_KEY!r} must be 0 to {MAX_BACKUPS}, got "
                          f"{conf[BACKUPS_KEY]}")
    if conf[RETENTION_KEY] < 0:
        raise ConfigError(f"key {RETENTION_KEY!r} must be >= 0 (0: removed as soon as no "
                          f"worker writes them), got {conf[RETENTION_KEY]}")


def load_supervisor_id(path: Path) -> str:
    """The id kept in ``path``, or a new uuid written there (so a restart keeps it)."""
    try:
        text = path.read_text(encoding="utf-8").strip()
        if text:
            return text
    except FileNotFoundError:
        pass
    made = str(uuid.uuid4())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(made + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return made


def advertised_host(conf: Config) -> str:
    """``storm.local.hostname``, or the machine's own name when that is empty (Storm's rule)."""
    return conf["storm.local.hostname"] or socket.gethostname()


def check_hosts(host: str) -> list[str]:
    """Where slot ports are checked: loopback, and the advertised host if it is an
    IPv4 address of this machine."""
    hosts = ["127.0.0.1"]
    try:
        socket.inet_aton(host)
    except OSError:
        return hosts
    if host not in hosts and not host.startswith("0."):
        hosts.append(host)
    return hosts


def lock_dir(supervisor_dir: Path, local_dir: Path) -> IO[str]:
    """Lock ``supervisor_dir`` for this process (held until the returned file is
    closed); SupervisorDirInUseError if another supervisor holds it."""
    handle = open(supervisor_dir / LOCK_FILE, "a")  # held until stop()
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise SupervisorDirInUseError(
            f"another supervisor runs with storm.local.dir {local_dir}") from None
    return handle


def prepare_run_as_user(local_dir: Path, supervisor_dir: Path, workers_dir: Path,
                        code_root: Path) -> None:
    """Checks and modes for workers that run as accounts of their own: this
    supervisor's directories traversable, not listable; its files its own only.
    ConfigError if this process cannot do that (not root, the code out of reach)."""
    if os.geteuid() != 0:
        raise ConfigError(f"{RUN_AS_USER_KEY} needs the supervisor to run as root: it "
                          "makes the accounts and starts workers as them")
    check_reachable([Path(sys.executable), Path(nimbus.__file__).parent])
    for directory in (local_dir, supervisor_dir, workers_dir, code_root):
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o711)
    for child in supervisor_dir.iterdir():
        if child.is_file():
            os.chmod(child, 0o600)
