"""The cluster summary every nimbus serves from memory, kept current by ZooKeeper watches.

A named thread re-reads nimbuses, the leader queue, storms, supervisors and replica
registrations whenever a watch on any of them fires (and every few seconds as a safety
net, which also refreshes replication counts of stores without watches, like S3).
getClusterInfo then never touches ZooKeeper.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace

from kazoo.exceptions import KazooException

from nimbus.distribution.distributors import CodeDistributor
from nimbus.state.cluster_state import LayoutMissingError, StormClusterState
from nimbus.state.records import NimbusInfo, StormBase, SupervisorInfo

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClusterSnapshot:
    """What getClusterInfo reports, as of ``taken_at``."""

    nimbuses: list[NimbusInfo] = field(default_factory=list)
    leader: str | None = None
    storms: dict[str, StormBase] = field(default_factory=dict)
    replication: dict[str, int] = field(default_factory=dict)
    supervisors: dict[str, SupervisorInfo] = field(default_factory=dict)
    taken_at: float = 0.0


class ClusterSummaryCache:
    """Holds the latest :class:`ClusterSnapshot`; see the module docstring."""

    SAFETY_INTERVAL_S = 5.0

    def __init__(self, state: StormClusterState, distributor: CodeDistributor):
        self._state = state
        self._distributor = distributor
        self._snapshot = ClusterSnapshot()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._fresh = threading.Condition()
        self._requested = 0  # reload requests made by refresh_now
        self._loaded = 0     # the newest request a finished reload has covered
        self._thread = threading.Thread(target=self._run, name="cluster-summary", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def wake(self, _event: object = None) -> None:
        self._wake.set()

    @property
    def snapshot(self) -> ClusterSnapshot:
        return self._snapshot

    def refresh_now(self, timeout_s: float = 5.0) -> ClusterSnapshot:
        """Wait (bounded) for a reload that *started* after this call, so that a nimbus
        answers with its own writes included (read-your-writes)."""
        with self._fresh:
            self._requested += 1
            wanted = self._requested
        self._wake.set()
        deadline = time.monotonic() + timeout_s
        with self._fresh:
            while self._loaded < wanted and time.monotonic() < deadline:
                self._fresh.wait(deadline - time.monotonic())
        return self._snapshot

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._fresh:
                generation = self._requested
            try:
                snapshot = self._load()
                with self._fresh:
                    self._snapshot = snapshot
                    self._loaded = generation
                    self._fresh.notify_all()
            except LayoutMissingError as exc:
                # Serve no leader rather than a stale one; the code sync logs the cause.
                log.debug("cluster summary unavailable: %s", exc)
                with self._fresh:
                    self._snapshot = replace(self._snapshot, leader=None)
                self._stop.wait(0.5)
                self._wake.set()
            except KazooException as exc:
                log.debug("cluster summary reload failed: %s", exc)
                self._stop.wait(0.5)
                self._wake.set()
            except Exception:
                log.exception("cluster summary reload failed")
            self._wake.wait(self.SAFETY_INTERVAL_S)
            self._wake.clear()

    def _load(self) -> ClusterSnapshot:
        state, watch = self._state, self.wake
        nimbuses = state.nimbuses(watch=watch)
        queue = state.leader_queue(watch=watch)
        storms: dict[str, StormBase] = {}
        replication: dict[str, int] = {}
        for topology_id in state.active_storms(watch=watch):
            base = state.storm_base(topology_id, watch=watch)
            if base is None:
                continue
            storms[topology_id] = base
            state.replica_hosts(topology_id, watch=watch)
            try:
                replication[topology_id] = self._distributor.get_replication_count(topology_id)
            except Exception as exc:
                log.debug("replication count of %s unavailable: %s", topology_id, exc)
                replication[topology_id] = 0
        supervisors = {}
        for sid in state.supervisors(watch=watch):
            info = state.supervisor_info(sid)
            if info is not None:
                supervisors[sid] = info
        return ClusterSnapshot(nimbuses=nimbuses, leader=queue[0][1] if queue else None,
                               storms=storms, replication=replication,
                               supervisors=supervisors, taken_at=time.monotonic())
