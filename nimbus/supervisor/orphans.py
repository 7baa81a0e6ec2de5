"""Frozen workers on this host that no supervisor holds: counted, and ended when overdue.

Every supervisor's workers run in ``<cgroup2>/nimbus-ha/<supervisor-id>/<name>``
(:mod:`nimbus.supervisor.cgroups`). A worker frozen on its lapsed lease carries a mark
with its deadline, and a reaper ends it then (:mod:`nimbus.worker.frozen`). Any
supervisor process of the host also looks at every supervisor's cgroups, its own and
others' (a host may run several supervisors, and one that died may never come back):

* :func:`end_overdue` ends each frozen worker whose mark's deadline has passed: what
  its reaper would have done had it run (it could not be started, or was killed). The
  deadline was set by the worker from its own supervisor's
  ``supervisor.worker.orphan.timeout.secs``, so no supervisor applies its own timeout to
  another's workers. A frozen worker without a mark (frozen by an earlier release) is
  left alone: nothing says for how long it has been frozen;
* :func:`count_orphans` counts the frozen workers whose supervisor process is certainly
  gone: each supervisor writes who it is (its
  :class:`~nimbus.state.incarnation.Incarnation`: boot id, pid namespace, pid and the
  pid's start time) on its cgroup directory at start (:func:`claim`), and a process
  that is not running any more cannot hold its workers. The metric
  ``supervisor_frozen_orphans`` exports it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from nimbus.state.incarnation import Incarnation
from nimbus.worker_protocol.frozen_cgroup import (
    REAPERS_CGROUP,
    clock,
    end_cgroup,
    is_frozen,
    read_mark,
)

log = logging.getLogger(__name__)

OWNER_XATTR = "user.nimbus_ha.supervisor"
TREE = "nimbus-ha"   # under the cgroup v2 root: one directory per supervisor id


def claim(base: Path) -> None:
    """Write this process on ``base`` (its workers' cgroup directory) as their owner; a
    failure is logged (its frozen orphans are then not counted, nothing else)."""
    try:
        os.setxattr(base, OWNER_XATTR, json.dumps(asdict(Incarnation.of_process()),
                                                  sort_keys=True).encode())
    except OSError as exc:
        log.warning("cannot mark %s as this supervisor's (%s): frozen workers it leaves "
                    "are not counted as orphans", base, exc)


def owner(base: Path) -> Incarnation | None:
    """The supervisor process that last claimed ``base``; None if none of this release
    did (or what it wrote cannot be read)."""
    try:
        obj = json.loads(os.getxattr(base, OWNER_XATTR).decode("utf-8"))
        return Incarnation(boot_id=str(obj["boot_id"]),
                           pid_namespace=str(obj["pid_namespace"]), pid=int(obj["pid"]),
                           started_ticks=int(obj["started_ticks"]))
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError):
        return None


def _worker_cgroups(root: Path) -> list[tuple[Path, Path]]:
    """(supervisor directory, worker cgroup) of every worker cgroup on the host."""
    out = []
    with contextlib.suppress(OSError):
        for base in sorted(p for p in (root / TREE).iterdir() if p.is_dir()):
            with contextlib.suppress(OSError):
                out.extend((base, cgroup) for cgroup in sorted(base.iterdir())
                           if cgroup.is_dir() and cgroup.name != REAPERS_CGROUP
                           and not cgroup.name.startswith("."))
    return out


def end_overdue(root: Path, now: Callable[[], float] = clock) -> list[Path]:
    """End every frozen worker cgroup of the host whose mark's deadline has passed (see
    the module docstring); the cgroups ended."""
    ended = []
    for _base, cgroup in _worker_cgroups(root):
        if not is_frozen(cgroup):
            continue
        mark = read_mark(cgroup)
        if mark is None or mark.deadline > now():
            continue
        if end_cgroup(cgroup):
            log.warning("ended frozen worker cgroup %s: frozen %.0f s, past its end "
                        "(supervisor.worker.orphan.timeout.secs), and nothing thawed it",
                        cgroup, now() - mark.frozen_at)
            ended.append(cgroup)
    return ended


def count_orphans(root: Path, own_base: Path | None = None) -> int:
    """Frozen worker cgroups of the host whose supervisor process is certainly gone (not
    ``own_base``'s: this process's)."""
    count = 0
    dead: dict[Path, bool] = {}
    for base, cgroup in _worker_cgroups(root):
        if base == own_base or not is_frozen(cgroup):
            continue
        if base not in dead:
            found = owner(base)
            dead[base] = found is not None and found.is_dead()
        count += dead[base]
    return count
