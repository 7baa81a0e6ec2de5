"""A killed topology's checkpoints, removed where they are: on the supervisor.

With ``topology.spark.checkpoint.cleanup: true`` (a topology's own key, or the cluster's
default), a supervisor that drops a topology's code because the topology no longer
exists (killed, not moved) also deletes ``<checkpoint root>/<topology-id>``: the
streaming checkpoints of its queries and the state of a process topology. The default
checkpoint root is ``<storm.local.dir>/checkpoints``, on each supervisor's own disk, which
is why this sweep runs on supervisors and not on the leader. A root given as a URI
(``hdfs://``, ``s3a://``) is not touched: the supervisor has no client for it.

The default is false because a checkpoint is a pipeline's only state: an operator who
kills a topology by mistake, or wants to resume it under a new submission, inspect its
offsets or audit what it wrote, needs it, and its deletion cannot be undone.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nimbus.distribution.local_code import check_topology_id
from nimbus.topology_paths import checkpoint_root_of

log = logging.getLogger(__name__)

CLEANUP_KEY = "topology.spark.checkpoint.cleanup"


def sweep_checkpoints(topology_id: str, conf: dict[str, Any],
                      topology_exists: Callable[[str], bool]) -> Path | None:
    """Delete the topology's checkpoint directory if ``conf`` asks for it, the root is a
    local path and ``topology_exists(topology_id)`` is False; returns what was deleted."""
    if conf.get(CLEANUP_KEY) is not True:
        return None
    root = checkpoint_root_of(conf)
    if "://" in str(conf.get("topology.spark.checkpoint.dir") or ""):
        log.info("not removing the checkpoints of %s: %s is not a local path", topology_id,
                 conf.get("topology.spark.checkpoint.dir"))
        return None
    target = root / check_topology_id(topology_id)
    if target.is_symlink() or not target.is_dir():
        return None
    if topology_exists(topology_id):
        return None   # it moved away from this host: its checkpoints are still its state
    shutil.rmtree(target, ignore_errors=True)
    log.info("removed the checkpoints of killed topology %s (%s)", topology_id, target)
    return target
