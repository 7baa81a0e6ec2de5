"""The UI reading ZooKeeper with a client of its own (``nimbus-ha ui``, ``ui.source:
zookeeper``).

:class:`ZooKeeperReader` builds its :class:`~nimbus.state.cluster_snapshot.ClusterSnapshot`
from nimbuses, the leader queue, topologies, assignments, replica registrations,
supervisors and the running code versions (``/code-versions``), read with pipelined
calls (:mod:`nimbus.ui.zk_reads`). ZooKeeper watches
wake it (so a new leader is seen within milliseconds of its lock), and a safety reload
runs every few seconds. Replication counts are those the nimbuses report
(getClusterInfo, asked every :data:`REPLICAS_EVERY_S`): the only count of store-backed
distributors (s3, hdfs), which register no replicas in ZooKeeper.

While the dashboard is open it polls heartbeats and errors from ZooKeeper
(:mod:`nimbus.ui.live_poll`); one topology's page is
:func:`nimbus.state.runtime_view.topology_info`, read when asked.
"""

from __future__ import annotations

import logging
import posixpath
import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.protocol.states import KazooState

from nimbus.config import Config
from nimbus.state import runtime_view, worker_state
from nimbus.state.cluster_snapshot import ClusterSnapshot
from nimbus.state.cluster_state import LayoutMissingError, StormClusterState
from nimbus.state.code_versions import CodeVersions
from nimbus.state.records import Assignment, NimbusInfo, StormBase, SupervisorInfo
from nimbus.ui.live_poll import poll_errors, poll_workers
from nimbus.ui.reader import Live, UIReader
from nimbus.ui.zk_reads import children_all, decode, get_all

log = logging.getLogger(__name__)

REPLICAS_EVERY_S = 5.0   # the nimbuses' replication counts (one getClusterInfo)


class ZooKeeperReader(UIReader):
    """A :class:`~nimbus.ui.reader.UIReader` fed by ZooKeeper (module docstring).
    ``fetch_replicas()``: {topology id: replication count} as a nimbus reports it."""

    SOURCE_ERRORS: tuple[type[BaseException], ...] = (KazooException,)
    UNREACHABLE = "ZooKeeper is unreachable from the UI process"

    def __init__(self, conf: Config, zk: KazooClient,
                 fetch_conf: Callable[[str], str] | None = None,
                 fetch_replicas: Callable[[], dict[str, int]] | None = None):
        super().__init__(conf, fetch_conf)
        self.zk = zk
        self.state = StormClusterState(zk, conf.zk_root)
        self._fetch_replicas = fetch_replicas
        self._reported: dict[str, int] = {}
        self._next_replicas = 0.0

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        self.zk.add_listener(self._on_state)
        super().start()

    def stop(self) -> None:
        """Stop both loops and wait for them (the ZooKeeper client stays open)."""
        self.zk.remove_listener(self._on_state)
        super().stop()

    def _on_state(self, state: str) -> None:
        if state == KazooState.CONNECTED:
            self._loop.wake()  # watches may have been lost with the session: reload

    # -- reads -------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        return self.zk.state == KazooState.CONNECTED

    def storm_base(self, topology_id: str) -> StormBase | None:
        """Read now (an action's checks must not act on a stale one); RecordError if
        this release cannot read it."""
        return self.state.storm_base(topology_id)

    def topology_info(self, topology_id: str, timeout_s: float) -> dict[str, Any] | None:
        return runtime_view.topology_info(self.state, topology_id, timeout_s=timeout_s)

    # -- the snapshot ------------------------------------------------------------------
    def _layout_gone(self, path: str) -> None:
        # The root holds an id, so a nimbus set it up: a directory gone since is a wiped
        # or partly restored ZooKeeper, never an empty cluster.
        self.zk.exists(path, watch=self._changed)  # wakes the loop if it comes back
        raise LayoutMissingError(
            f"{path} does not exist: ZooKeeper was wiped or partly restored, or "
            f"storm.zookeeper.root ({self.state.root}) is wrong")

    def _load(self) -> ClusterSnapshot:
        st, zk, watch = self.state, self.zk, self._changed
        if st.set_up_id(watch=watch) is None:
            raise LayoutMissingError(
                f"{st.not_set_up_message()}: the UI is waiting for one")
        top_paths = [st.path("nimbuses"), st.path("leader-lock"), st.path("storms"),
                     st.path("supervisors"), st.path("code-distributor")]
        top = children_all(zk, top_paths, watch, missing=self._layout_gone)
        nimbus_names, lock_nodes, storm_ids, supervisor_ids, _code = top
        nimbus_data = get_all(zk, [st.path("nimbuses", n) for n in nimbus_names])
        queue = sorted(lock_nodes, key=lambda n: n.rsplit("-", 1)[-1])
        leader_data = get_all(zk, [posixpath.join(st.leader_lock_path, queue[0])]) \
            if queue else []
        bases = get_all(zk, [st.storm_path(t) for t in storm_ids], watch)
        assigned = get_all(zk, [st.path("assignments", t) for t in storm_ids], watch)
        replicas = children_all(zk, [st.code_path(t) for t in storm_ids], watch)
        sups = get_all(zk, [st.path("supervisors", s) for s in supervisor_ids])
        # The version each upgraded topology runs (the UI caches a topology's conf by
        # it): /code-versions is missing only in a layout of an earlier release.
        (listed,) = children_all(zk, [st.path("code-versions")], watch)
        live = set(storm_ids)
        upgraded = [t for t in listed if t in live]
        versions = get_all(zk, [st.code_versions_path(t) for t in upgraded], watch)

        storms: dict[str, StormBase] = {}
        assignments: dict[str, Assignment] = {}
        replica_hosts: dict[str, list[str]] = {}
        for topology_id, raw, assignment, hosts in zip(storm_ids, bases, assigned, replicas,
                                                       strict=True):
            base = decode(StormBase, raw)
            if base is None:
                continue
            storms[topology_id] = base
            found = decode(Assignment, assignment)
            if found is not None:
                assignments[topology_id] = found
            replica_hosts[topology_id] = hosts
        running_versions = {}
        for topology_id, raw in zip(upgraded, versions, strict=True):
            found_versions = decode(CodeVersions, raw)
            if found_versions is not None and topology_id in storms:
                running_versions[topology_id] = found_versions.running
        leader = leader_data[0].decode("utf-8", "replace") if leader_data and \
            leader_data[0] else None
        version = (self._snapshot.version if self._snapshot else 0) + 1
        return ClusterSnapshot(
            nimbuses=[n for n in (decode(NimbusInfo, d) for d in nimbus_data) if n],
            leader=leader, storms=storms, assignments=assignments,
            supervisors={sid: info for sid, info in zip(
                supervisor_ids, (decode(SupervisorInfo, d) for d in sups), strict=True)
                if info is not None},
            replication=dict(self._reported), replica_hosts=replica_hosts,
            running_versions=running_versions, taken_at=time.monotonic(), version=version)

    # -- heartbeats and errors (while the dashboard is open) --------------------------
    def _poll_live(self, with_errors: bool) -> None:
        snap = self._snapshot
        if snap is None:
            return
        numbers = poll_workers(self.zk, self.state, snap,
                               float(self.conf["nimbus.task.timeout.secs"]))
        newest = poll_errors(self.zk, self.state, list(snap.storms)) \
            if with_errors else None
        with self._lock:
            for gone in set(self._live) - set(snap.storms):
                del self._live[gone]
            for topology_id in snap.storms:
                live = self._live.setdefault(topology_id, Live())
                live.records_per_second = round(numbers.rates.get(topology_id, 0.0), 3)
                live.history.append(live.records_per_second)
                live.restarts = numbers.restarts.get(topology_id, 0)
                live.worker_states = worker_state.count_states(
                    numbers.states.get(topology_id, []))
                live.alive_workers = live.worker_states[worker_state.RUNNING]
                if newest is not None:
                    live.newest_error, live.error_count = newest.get(topology_id, (None, 0))
            self._live_version += 1

    # -- the nimbuses' replication counts ------------------------------------------------
    def _fetch_confs(self) -> None:
        """One step of ``ui-topology-conf``: the nimbuses' replication counts every
        REPLICAS_EVERY_S, and up to ten configurations not fetched yet."""
        if self._fetch_replicas is not None and time.monotonic() >= self._next_replicas:
            self._next_replicas = time.monotonic() + REPLICAS_EVERY_S
            self._refresh_reported_replicas()
        super()._fetch_confs()

    def _refresh_reported_replicas(self) -> None:
        try:
            reported = self._fetch_replicas()  # type: ignore[misc]
        except Exception as exc:  # no nimbus answers now: keep the last counts
            log.debug("replication counts unavailable: %s", exc)
            return
        if reported != self._reported:
            self._reported = reported
            self._changed()  # a reload puts them into the next snapshot
