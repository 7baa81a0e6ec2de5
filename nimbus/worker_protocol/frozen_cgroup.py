"""A frozen worker's cgroup as every process of the host reads it: its mark and its end.

A worker whose lease runs out freezes its own cgroup; before it does, it marks the cgroup
with the extended attribute :data:`MARK_XATTR`, a :class:`Mark` saying when it froze and
until when it may stay frozen (``supervisor.worker.orphan.timeout.secs``), and starts a
reaper in :data:`REAPERS_CGROUP` beside it (:mod:`nimbus.worker.frozen`). Whoever thaws
it removes the mark (:func:`clear_mark`): the worker itself, or its supervisor
(:mod:`nimbus.supervisor.cgroups`). Whoever finds it frozen past the mark's deadline
ends it (:func:`end_cgroup`): its reaper, or any supervisor of the host
(:mod:`nimbus.supervisor.orphans`).

Times are on :func:`clock` (``CLOCK_BOOTTIME``): one clock for every process of the
host, which nobody sets.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

#: How long a frozen worker may wait for a thaw before it is ended.
ORPHAN_TIMEOUT_KEY = "supervisor.worker.orphan.timeout.secs"
#: The extended attribute on a frozen worker's cgroup that holds its :class:`Mark`.
MARK_XATTR = "user.nimbus_ha.frozen"
#: The leaf cgroup, beside the workers' own, that holds their reapers.
REAPERS_CGROUP = "frozen-reapers"
#: How long :func:`end_cgroup` waits for the cgroup it ended to empty before it removes it.
EMPTY_WAIT_S = 5.0


def clock() -> float:
    """Seconds since this host booted (``CLOCK_BOOTTIME``): what marks are written in."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@dataclass(frozen=True)
class Mark:
    """One freeze of a worker's cgroup: its token, when it began and its deadline
    (:func:`clock` seconds)."""

    token: str
    frozen_at: float
    deadline: float

    def encode(self) -> bytes:
        """The mark as :data:`MARK_XATTR` holds it (JSON)."""
        return json.dumps({"token": self.token, "frozen_at": self.frozen_at,
                           "deadline": self.deadline}, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> Mark | None:
        """The mark in ``data``; None for anything else (written by hand, damaged)."""
        try:
            obj = json.loads(data.decode("utf-8"))
            token, frozen_at, deadline = obj["token"], obj["frozen_at"], obj["deadline"]
        except (UnicodeDecodeError, ValueError, TypeError, KeyError):
            return None
        numbers = all(isinstance(v, int | float) and not isinstance(v, bool)
                      and math.isfinite(v) for v in (frozen_at, deadline))
        if not isinstance(token, str) or not token or not numbers:
            return None
        return cls(token, float(frozen_at), float(deadline))


def read_mark(cgroup: Path) -> Mark | None:
    """The mark of the cgroup at ``cgroup``; None if it has none (or is gone)."""
    try:
        return Mark.decode(os.getxattr(cgroup, MARK_XATTR))
    except OSError:
        return None


def clear_mark(cgroup: Path) -> None:
    """Remove the cgroup's mark, if any: it was thawed."""
    with contextlib.suppress(OSError):
        os.removexattr(cgroup, MARK_XATTR)


def is_frozen(cgroup: Path) -> bool:
    """Whether ``cgroup`` is asked to be frozen (``cgroup.freeze`` reads 1)."""
    try:
        return (cgroup / "cgroup.freeze").read_bytes().strip() == b"1"
    except OSError:
        return False


def end_cgroup(cgroup: Path, empty_wait_s: float = EMPTY_WAIT_S) -> bool:
    """SIGKILL every process in ``cgroup`` (``cgroup.kill``) and remove it once empty;
    False if it could not be killed."""
    try:
        (cgroup / "cgroup.kill").write_text("1")
    except OSError as exc:
        log.warning("cannot end cgroup %s: %s", cgroup, exc)
        return False
    deadline = time.monotonic() + empty_wait_s
    while time.monotonic() < deadline:
        try:
            cgroup.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:  # EBUSY until the kernel has seen every process go
            time.sleep(0.05)
    return True   # killed; the directory is left to its supervisor's next clean-up
