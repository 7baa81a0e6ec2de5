"""An audit trail of leader writes, to prove afterwards that no deposed leader wrote.

With ``nimbus.audit.leader.writes: true`` every fenced leader write (one multi-op that
first checks the leader's lock node) also creates ``<root>/audit/w-<seq>`` in the same
multi-op, holding the lock node the write was fenced on. ZooKeeper numbers the audit nodes
in commit order, and a write either commits with its audit node or not at all.

Leadership passes along the lock queue in increasing sequence order: a leader's node is
the lowest one, a node can only disappear, and every node created later gets a higher
sequence number. So if fencing holds, the fence sequence numbers read in commit order
never decrease. A write whose fence is lower than that of an earlier write is a write by
a leader that had already been deposed: :func:`deposed_writes` lists them.

The trail grows by one node per leader write and is never trimmed: it is meant for soak
tests and investigations, not for production clusters (the default is off).
"""

from __future__ import annotations

import json
import posixpath
import time
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient

AUDIT_DIR = "audit"
PREFIX = "w-"


def add_audit(txn: Any, root: str, lock_path: str, writer: str) -> None:
    """Add the audit node of one fenced write to multi-op ``txn``."""
    txn.create(posixpath.join(root, AUDIT_DIR, PREFIX), json.dumps(
        {"lock": lock_path, "by": writer, "time": time.time()}).encode(), sequence=True)


@dataclass(frozen=True)
class AuditedWrite:
    """One committed leader write: its commit order, fence and writer."""

    order: int
    lock: str
    by: str
    time: float

    @property
    def fence_seq(self) -> int:
        return int(self.lock.rsplit("-", 1)[-1])


def read_trail(zk: KazooClient, root: str) -> list[AuditedWrite]:
    """Every audited write under ``root``, in commit order."""
    base = posixpath.join(root, AUDIT_DIR)
    writes = []
    for name in zk.get_children(base):
        data, _ = zk.get(posixpath.join(base, name))
        entry = json.loads(data)
        writes.append(AuditedWrite(int(name[len(PREFIX):]), entry["lock"], entry["by"],
                                   entry["time"]))
    return sorted(writes, key=lambda w: w.order)


def deposed_writes(trail: list[AuditedWrite]) -> list[AuditedWrite]:
    """Writes committed after a write fenced on a later lock node: by a deposed leader."""
    out, highest = [], -1
    for write in trail:
        if write.fence_seq < highest:
            out.append(write)
        highest = max(highest, write.fence_seq)
    return out
