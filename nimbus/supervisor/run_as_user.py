"""Workers as accounts of their own: ``supervisor.run.worker.as.user`` (Storm's key).

Without it every worker runs as the supervisor's account, so a tenant's code can read
whatever the supervisor can: its configuration, key files, other tenants' code and
worker directories. With it, the supervisor (which must run as root) gives each topology
an account of its own, ``nhw-<10 hex digits of the topology id's sha256>``, made with
``useradd --system`` when first needed and removed with the topology's code, and:

* starts the topology's workers as that account (``setpriv``: real and effective ids,
  no supplementary groups);
* makes the topology's code readable by that account's group only (0750/0640), and its
  worker directories and checkpoint directory owned by it (0700);
* keeps its own directories traversable but not listable (0711), its files 0600.

So a worker reads its own code and writes its own directories, and nothing of the
supervisor's or of other topologies'. The Python interpreter and nimbus-ha itself must
be readable by every account (``check_reachable`` refuses to start otherwise).
"""

from __future__ import annotations

import grp
import hashlib
import logging
import os
import pwd
import shutil
import stat
import subprocess
from pathlib import Path

from nimbus.config import ConfigError

log = logging.getLogger(__name__)

RUN_AS_USER_KEY = "supervisor.run.worker.as.user"
ACCOUNT_PREFIX = "nhw-"


def account_for(topology_id: str) -> str:
    """The local account a topology's workers run as (at most 14 characters)."""
    return ACCOUNT_PREFIX + hashlib.sha256(topology_id.encode()).hexdigest()[:10]


def ensure_account(name: str) -> tuple[int, int]:
    """(uid, gid) of ``name``, made first if it does not exist: a system account with a
    group of its own, no home, no login shell."""
    try:
        entry = pwd.getpwnam(name)
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        pass
    shell = "/usr/sbin/nologin" if Path("/usr/sbin/nologin").exists() else "/bin/false"
    done = subprocess.run(["useradd", "--system", "--user-group", "--no-create-home",
                           "--home-dir", "/nonexistent", "--shell", shell, name],
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0 and "already exists" not in done.stderr:
        raise OSError(f"useradd {name} failed: {done.stderr.strip()}")
    entry = pwd.getpwnam(name)
    log.info("made account %s (uid %d) for a topology's workers", name, entry.pw_uid)
    return entry.pw_uid, entry.pw_gid


def remove_account(name: str) -> None:
    """Remove an account this module made (best effort: one still running keeps it)."""
    if not name.startswith(ACCOUNT_PREFIX):
        return
    try:
        pwd.getpwnam(name)
    except KeyError:
        return
    done = subprocess.run(["userdel", name], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        log.warning("userdel %s failed: %s", name, done.stderr.strip())
        return
    try:
        grp.getgrnam(name)
        subprocess.run(["groupdel", name], capture_output=True, timeout=60)
    except KeyError:
        pass


def as_account(command: list[str], uid: int, gid: int) -> list[str]:
    """``command`` run with ``uid``/``gid`` as its real and effective ids and no
    supplementary groups (util-linux's ``setpriv``)."""
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", *command]


def check_reachable(paths: list[Path]) -> None:
    """Raise ConfigError unless every path (and each directory above it) can be reached
    by any account: the interpreter and nimbus-ha must be, for workers to start."""
    if shutil.which("setpriv") is None:
        raise ConfigError(f"{RUN_AS_USER_KEY} needs setpriv (util-linux) on PATH")
    for path in paths:
        resolved = path.resolve()
        for part in [resolved, *resolved.parents]:
            mode = part.stat().st_mode
            needed = stat.S_IXOTH if part.is_dir() else stat.S_IROTH
            if not mode & needed:
                raise ConfigError(
                    f"{RUN_AS_USER_KEY}: workers, running as accounts of their own, cannot "
                    f"reach {resolved}: {part} is mode {stat.filemode(mode)}. Install "
                    "Python and nimbus-ha where every account can read them (say /opt), or "
                    f"chmod o+x {part}")


def own_tree(path: Path, uid: int, gid: int, dir_mode: int, file_mode: int) -> None:
    """chown ``path`` and everything below it; set the modes given (files that were
    executable by their owner stay executable by owner and group)."""
    for root, dirs, files in os.walk(path):
        os.chown(root, uid, gid)
        os.chmod(root, dir_mode)
        for name in files:
            file = os.path.join(root, name)
            os.chown(file, uid, gid, follow_symlinks=False)
            if not os.path.islink(file):
                # Executables (a bundle's run.sh) stay executable, for the group.
                executable = os.stat(file).st_mode & stat.S_IXUSR
                os.chmod(file, file_mode | (stat.S_IXUSR | stat.S_IXGRP if executable else 0))
        for name in dirs:
            if os.path.islink(os.path.join(root, name)):
                os.chown(os.path.join(root, name), uid, gid, follow_symlinks=False)
