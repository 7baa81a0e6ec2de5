"""What a supervisor keeps of topologies no assignment here needs any more: the last step
of its reconcile pass (:meth:`LocalCleanup.clean_up`).

Kept: the topologies assigned here, those whose nodes this release cannot read (frozen),
and those a worker still runs. Code is kept by code key (nimbus.state.code_versions):
the version each slot assigned here wants, and the one each running worker runs, so
during a rolling switch both versions of a topology stay. Of the others:

* code stays for ``supervisor.code.cleanup.grace.secs`` (a rebalance that shrinks then
  grows a topology does not fetch it again, a rollback finds the version it switches
  back to), then goes; the topology's own account under
  ``supervisor.run.worker.as.user`` goes with its last code key;
* the checkpoints of a killed topology go with its code, when
  ``topology.spark.checkpoint.cleanup`` says so (:mod:`nimbus.supervisor.checkpoint_sweep`);
* slot records, the reporter's state and worker directories go at once.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from nimbus.state.cluster_state import StormClusterState
from nimbus.state.code_versions import topology_of
from nimbus.supervisor.checkpoint_sweep import sweep_checkpoints
from nimbus.supervisor.code_cache import CodeCache
from nimbus.supervisor.code_fetcher import CodeFetcher
from nimbus.supervisor.policy import DesiredWorker
from nimbus.supervisor.reporting import Reporter
from nimbus.supervisor.run_as_user import account_for, remove_account
from nimbus.supervisor.slots import WorkerTable
from nimbus.supervisor.starting import WorkerStarter


class LocalCleanup:
    """See the module doc. ``fetcher()`` is the code fetcher once started, else None."""

    def __init__(self, zk: KazooClient, state: StormClusterState, code: CodeCache,
                 table: WorkerTable, reporting: Reporter, starter: WorkerStarter,
                 fetcher: Callable[[], CodeFetcher | None], workers_dir: Path,
                 grace_s: float, run_as_user: bool):
        self._zk = zk
        self._state = state
        self._code = code
        self._table = table
        self._reporting = reporting
        self._starter = starter
        self._fetcher = fetcher
        self._workers_dir = workers_dir
        self._grace_s = grace_s
        self._run_as_user = run_as_user

    def clean_up(self, desired: dict[int, DesiredWorker], frozen: set[str]) -> None:
        """Drop what no topology in ``desired``, ``frozen`` or running here needs: the
        code of every code key that none of them wants or runs (past its grace)."""
        running = self._table.running()
        keep = {w.topology_id for w in desired.values()} | frozen
        keep |= {h.topology_id for h in running}
        keys = {w.code_key for w in desired.values()} | {h.code_key for h in running}
        # Every version of a topology whose assignment cannot be read: what it wants is
        # not known.
        keys |= {key for key in self._code.held() if topology_of(key) in frozen}
        fetcher = self._fetcher()
        if fetcher is not None:
            fetcher.forget_except(keys)
        expired = self._code.expired(keys, self._grace_s,
                                     gone=lambda k: not self.topology_exists(topology_of(k)))
        for code_key in expired:
            if self._code.has(code_key):  # checkpoints are the topology's, not a version's
                sweep_checkpoints(topology_of(code_key), self._worker_conf(code_key),
                                  self.topology_exists)
        removed = self._code.remove_except(keys | self._code.retained)
        for code_key in removed:
            self._starter.owned_code.discard(code_key)
        if self._run_as_user and removed:
            left = {topology_of(key) for key in self._code.held()}
            for topology_id in sorted({topology_of(k) for k in removed} - keep - left):
                remove_account(account_for(topology_id))
        for slot in list(self._table.slots):
            if slot[0] not in keep:
                del self._table.slots[slot]
        self._reporting.forget_except(keep)
        if self._workers_dir.is_dir():
            for worker_dir in self._workers_dir.iterdir():
                if worker_dir.name.rsplit("-", 1)[0] not in keep:
                    shutil.rmtree(worker_dir, ignore_errors=True)

    def topology_exists(self, topology_id: str) -> bool:
        """True unless ZooKeeper says the topology is gone (an error counts as there)."""
        try:
            return self._zk.exists(self._state.storm_path(topology_id)) is not None
        except KazooException:
            return True

    def _worker_conf(self, code_key: str) -> dict[str, Any]:
        return self._starter.worker_conf(self._code.path(code_key))
