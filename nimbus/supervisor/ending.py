"""How a worker's run ends, seen from the reconcile pass: reaped once it exited (a crash
scheduled for a restart, with its backoff), stopped when its slot is no longer its, or
killed when it went silent.

A worker that the supervisor or its lease ended (a lost session, a stop, a lease that
ran out) did not crash: no restart is counted and no backoff applies. A worker whose
place in its topology changed at a rebalance is kept when it runs the same components
as before (:meth:`WorkerEnder.keeps_its_share`).

A worker whose slot now wants another code version (an upgrade or a rollback:
nimbus.state.code_versions) is stopped gracefully (a pipeline finishes the batch under
way first: nimbus/worker/pipeline.py) and its slot started again on the wanted version,
in the same pass: the slot is one process at a time, so two versions never run there
together. It runs on until the wanted version's code is here (its fetch asked for), so
that the switch costs no fetch. The components its pipeline worker declared are
remembered for the slot's next worker (``SlotRecord.components``), which refuses to run
if its code's differ and it is one of several: its share could hold a component that
another slot's worker still runs on the old code. A crash of a worker before it
committed on its version counts as one of its slot's ``failures``
(:class:`~nimbus.supervisor.slots.SlotRecord`), which the leader reads to roll an upgrade
back.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable

from nimbus.supervisor.policy import DesiredWorker
from nimbus.supervisor.reporting import Reporter, handle_executor
from nimbus.supervisor.slots import WorkerTable
from nimbus.supervisor.worker_handle import WorkerHandle, stop_all
from nimbus.worker_protocol.component_share import assigned
from nimbus.worker_protocol.exits import EXIT_WARM_REFUSED

log = logging.getLogger(__name__)


class WorkerEnder:
    """Reaps, stops and kills this supervisor's workers (monitor thread).

    ``beat_now()`` asks for an early heartbeat: a slot's state changed.
    """

    def __init__(self, table: WorkerTable, reporter: Reporter, beat_now: Callable[[], None],
                 *, grace_s: float, timeout_s: float, start_timeout_s: float,
                 code_ready: Callable[[DesiredWorker], bool] = lambda _want: True):
        self._table = table
        self._reporter = reporter
        self._beat_now = beat_now
        # Whether the code ``want`` runs is here, verified (else its fetch is asked for):
        # a worker switching versions runs on until then, so the slot is not left empty
        # for as long as a fetch takes.
        self._code_ready = code_ready
        self._grace_s = grace_s
        self._timeout_s = timeout_s
        self._start_timeout_s = start_timeout_s

    def reap(self) -> None:
        """Release every worker that has exited; schedule restarts of crashed ones."""
        exited = self._table.pop_exited()
        now = time.monotonic()
        for handle in exited:
            code = handle.exit_code()
            handle.release()
            self._table.note_components(handle)   # for the slot's next worker
            ran_out = now >= handle.lease_deadline if handle.lease_deadline is not None \
                else handle.is_taken_over  # on a lease granted by the earlier process
            if not handle.ended_by and code == -signal.SIGKILL and ran_out:
                # It killed its own group because no renewal came (this process was
                # frozen, or cut off): the lease rule at work, not a crash.
                handle.ended_by = "lease"
                log.warning("worker %s killed itself: its lease ran out", handle.name)
            if handle.ended_by in ("lost", "stop", "lease"):
                continue  # the supervisor or its lease ended it: not a crash
            record = self._table.record(handle.topology_id, handle.port)
            if handle.warm == "taken" and code == EXIT_WARM_REFUSED:
                # No failure of the topology's: its Spark settings differ from the warm
                # session's in a way only Spark could tell. Started cold at once.
                record.cold_reason = handle.warm_refused or "the warm worker refused it"
                record.not_before = now
                log.warning("worker %s: the warm worker could not take it (%s); starting "
                            "it cold", handle.name, record.cold_reason)
                continue
            record.restarts += 1
            ran_s = now - handle.started_at
            # Not a crash loop: a pipeline that committed, a command that got past its
            # start (issue 20): restarted at once, its backoff afresh.
            healthy = handle.committed or (handle.kind == "process"
                                           and ran_s >= self._start_timeout_s)
            delay = record.backoff.delay_after_exit(ran_s, healthy=healthy)
            record.not_before = now + delay
            self._reporter.exited(handle, code)
            # The error before the failure count: the heartbeat thread may write the
            # entry between any two of these lines, and a leader that sees the failure
            # must see its error with it (it records it in the version's history).
            record.last_error = handle.last_error or f"worker exited with code {code}"
            record.failed, record.backoff_s = True, delay
            if not record.version:
                record.version = handle.code_version
            if not handle.version_committed and record.version == handle.code_version:
                record.failures += 1
                log.warning("worker %s exited before it committed on version %d (failure "
                            "%d of that version on its slot)", handle.name,
                            handle.code_version, record.failures)
            self._beat_now()
            log.warning("worker %s exited with code %s; restart in %.0fs", handle.name, code,
                        delay)

    def stop_unwanted(self, desired: dict[int, DesiredWorker],
                      num_workers: dict[str, int], frozen: set[str]) -> None:
        """Stop the workers whose slot the assignments no longer give them (but those of
        ``frozen`` topologies, whose assignment cannot be read)."""
        doomed = []
        with self._table.lock:
            workers = self._table.workers
            for port, handle in list(workers.items()):
                if handle.topology_id in frozen:
                    continue
                want = desired.get(port)
                if want is None or want.topology_id != handle.topology_id:
                    why = "no longer assigned here"
                elif want.version != handle.code_version:
                    if not self._code_ready(want):
                        continue  # it runs on until the new version's code is here
                    # The slot record stays (same topology, same port): started again on
                    # the new version in this pass, a warm worker if one matches.
                    why = (f"switching from version {handle.code_version} to version "
                           f"{want.version}")
                elif (want.worker_index != handle.worker_index
                      or num_workers.get(want.topology_id) != handle.num_workers):
                    if self.keeps_its_share(handle, want.worker_index,
                                            num_workers.get(want.topology_id, 1),
                                            want.version):
                        continue
                    why = "its place in the topology changed"
                else:
                    continue
                doomed.append(workers.pop(port))
                log.info("stopping worker %s: %s", handle.name, why)
        if doomed:
            stop_all(doomed, self._grace_s)
        for handle in doomed:
            self._table.note_components(handle)   # what the slot's next worker is told
            want = desired.get(handle.port)
            if want is None or want.topology_id != handle.topology_id:
                self._table.slots.pop((handle.topology_id, handle.port), None)

    @staticmethod
    def keeps_its_share(handle: WorkerHandle, worker_index: int, num_workers: int,
                        version: int | None = None) -> bool:
        """Whether a worker runs the same components as ``worker-<index>`` of
        ``num_workers`` as it does now (a process topology's workers all run the same
        command; a pipeline's share depends on both), on the code ``version`` its slot
        wants (None: the one it runs); if so it is told its new place and kept. A worker
        is never kept across a change of version: its code is not what is wanted."""
        if handle.ended_by:
            return False
        if version is not None and version != handle.code_version:
            return False
        if handle.kind == "process":
            before = ["main"]
        else:
            every = handle.topology_components
            if every is None:  # not built yet, or it said nothing believable
                return False
            before = assigned(list(every), handle.worker_index, handle.num_workers)
            if assigned(list(every), worker_index, num_workers) != before:
                return False
        old = f"worker {handle.worker_index} of {handle.num_workers}"
        if not handle.reassign(worker_index, num_workers):
            return False
        log.info("worker %s keeps running through the rebalance: as worker %d of %d it "
                 "runs %s, as it did as %s", handle.name, worker_index, num_workers,
                 before, old)
        return True

    def kill_silent(self) -> None:
        """Kill every worker that said nothing for too long (its start timeout before
        its first status, the worker timeout after)."""
        now = time.monotonic()
        for handle in self._table.running():
            if handle.ended_by or handle.is_frozen():  # end_frozen's to judge
                continue
            if handle.last_status_at is None:
                quiet, limit, key = (now - handle.started_at, self._start_timeout_s,
                                     "supervisor.worker.start.timeout.secs")
            else:
                quiet, limit, key = (now - handle.last_status_at, self._timeout_s,
                                     "supervisor.worker.timeout.secs")
            if quiet > limit:
                message = f"worker sent no status for {quiet:.0f}s ({key} {limit:.0f}); killed"
                log.warning("worker %s: %s", handle.name, message)
                handle.kill("timeout")
                # The same text for the next silent process of a crash loop: one record.
                self._reporter.report(handle, handle_executor(handle), message,
                                      key=f"silent:{key}")
