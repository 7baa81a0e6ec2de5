"""The master's parts, built, started and stopped in order; no transport, no screens.

:class:`Master` builds the ZooKeeper sessions, the cluster state and its in-memory view,
the local code store and the code distributor, the code sync, the elector, the
topologies' lifecycle and their upgrades (:mod:`nimbus.master.upgrades`), the scheduler,
the cluster summary, the sweeper, the watchdog and the cycle (:mod:`nimbus.master.cycle`)
that drives them. The process around it
(:mod:`nimbus.daemons.nimbus`) adds Storm's Thrift service, the UI and the metrics.

Start-up order matters: the caller serves Thrift first (peers download code from it),
then :meth:`Master.start` registers this nimbus, loads the view, starts the code sync and
the cycle, which queues for the lock once this host holds the code of every topology.
:meth:`Master.stop_leading` leaves the election *first*, so that a planned restart fails
over at once instead of after a session timeout.

ZooKeeper unreachable: the elector already reports "not leader" (SUSPENDED/LOST) and
every leader write is fenced, so the rule is simply to do nothing until reconnected.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from nimbus.config import Config
from nimbus.distribution.distributors import CodeDistributor
from nimbus.distribution.hookspecs import DistributorContext
from nimbus.distribution.local_code import LocalCodeStore
from nimbus.master.assignment_index import AssignmentIndex
from nimbus.master.code_sync import CodeSync
from nimbus.master.cycle import Bell, NimbusCycle
from nimbus.master.duties import LeaderDuties
from nimbus.master.elector import LeaderElector
from nimbus.master.leader_watchdog import LeaderWatchdog
from nimbus.master.lifecycle import CONF_FILE, TopologyLifecycle
from nimbus.master.registration import NimbusRegistration
from nimbus.master.scheduler import Scheduler
from nimbus.master.summary_cache import ClusterSummaryCache
from nimbus.master.sweepers import LeaderSweeper
from nimbus.master.upgrades import Upgrades
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.cluster_view import ClusterView
from nimbus.state.zk_auth import check_layout_acl, zk_security
from nimbus.state.zk_client import make_zk_client
from nimbus.timing import WORKER_LEASE_FRACTION

log = logging.getLogger("nimbus.master.daemon")


class MasterObserver(Protocol):
    """What the master tells whoever watches it (the metrics, :mod:`nimbus.metrics`)."""

    def on_queued(self) -> None: ...

    def on_leadership(self, leader: bool) -> None: ...

    def on_stale_view(self, directory: str, path: str) -> None: ...

    def on_code_fetch(self, topology_id: str, seconds: float,
                      code_dir: Path | None) -> None: ...


class Master:
    """One nimbus's master: build with the configuration, :meth:`start`, then
    :meth:`stop_leading`, :meth:`stop` and :meth:`close` (see the module doc).

    ``distributor`` is the configured code distributor, not yet prepared (the master
    prepares and closes it); ``fetch_file`` is how it downloads a file from a peer
    nimbus (Thrift's, handed in by the process); ``observer`` hears what the metrics
    count.
    """

    def __init__(self, conf: Config, distributor: CodeDistributor,
                 fetch_file: Callable[[str, str, Path], object],
                 observer: MasterObserver | None = None):
        self.conf = conf
        self.address = str(conf.nimbus_address)
        self.started_at = time.time()
        self._observer = observer
        self.distributor = distributor
        self.zk = make_zk_client(conf, "nimbus")
        self._prepared = False
        self.view_zk = None
        self.elector: LeaderElector | None = None
        try:
            self._build(conf, fetch_file)
        except BaseException:
            # A failed start (say, a wiped ZooKeeper root) releases everything it took,
            # so the process can exit with the reason instead of lingering.
            self.release()
            raise

    def _build(self, conf: Config, fetch_file: Callable[[str, str, Path], object]) -> None:
        self.state = StormClusterState(
            self.zk, conf.zk_root,
            audit_writer=self.address if conf["nimbus.audit.leader.writes"] else "")
        security = zk_security(conf)
        if security is not None:
            # Before anything is written: a root someone else made is not adopted.
            check_layout_acl(self.zk, [self.state.root, *(
                self.state.path(sub) for sub in StormClusterState.SUBTREES)], security.acl)
        cluster_id = self.state.setup()
        self.store = LocalCodeStore(conf.local_dir)
        foreign = self.store.claim(cluster_id)
        cleanup_blocked = ""
        if foreign is not None:
            cleanup_blocked = (
                f"{self.store.root} holds code of cluster {foreign}, but ZooKeeper "
                f"{conf.zk_hosts}{conf.zk_root} is cluster {cluster_id} (a wrong "
                "storm.zookeeper.root, or a wiped ZooKeeper?); move that directory away "
                "to start this nimbus afresh")
            log.error("local code will not be cleaned up: %s", cleanup_blocked)
        # Set first: a prepare that fails half-way (a session started, then an error)
        # must be closed too.
        self._prepared = True
        self.distributor.prepare(conf, DistributorContext(
            zk=self.zk, zk_root=conf.zk_root, address=self.address,
            local_dir=conf.local_dir / "code-distributor" / self.distributor.name,
            code_dir=self.store.root, fetch_file=fetch_file))
        # What the summary, the scheduler, the code sync and submit read: in memory,
        # kept current by watches (loaded in start()). On a session of its own: when a
        # nimbus dies, thousands of its replica registrations vanish at once, and that
        # flood of events must not queue ahead of the elector's lock-node event.
        self.view_zk = make_zk_client(conf, "nimbus-view")
        observer = self._observer
        self.view = ClusterView(StormClusterState(self.view_zk, conf.zk_root), name="nimbus",
                                audit_nodes_per_s=conf["nimbus.view.audit.nodes.per.sec"],
                                on_stale=observer.on_stale_view if observer else None)
        # Everyone with news for the cycle rings its bell; the cycle attaches to it last.
        self.bell = Bell()
        self.elector = LeaderElector(self.zk, self.state, self.address, wake=self.bell.ring)
        self.lifecycle = TopologyLifecycle(conf, self.state, self.store, self.distributor,
                                           self.elector, self.address,
                                           code_lost=self._code_lost, view=self.view)
        # Upgrades of running topologies (new code versions, switches, rollbacks): its
        # uploads in flight count among the lifecycle's pending code from here on.
        self.upgrades = Upgrades(self.lifecycle, self.view)
        self.sync = CodeSync(self.state, self.store, self.distributor, view=self.view,
                             period_s=conf["nimbus.code.sync.freq.secs"],
                             protected=self.lifecycle.pending_ids,
                             on_synced=self.bell.ring,
                             cleanup_blocked=cleanup_blocked, cluster_id=cluster_id,
                             on_fetch=observer.on_code_fetch if observer else None,
                             lost_grace_s=None if conf["nimbus.code.lost.grace.secs"] < 0
                             else conf["nimbus.code.lost.grace.secs"])
        self.scheduler = Scheduler(conf, self.state, self.view,
                                   quarantine_s=self.longest_worker_lease_s)
        self.cache = ClusterSummaryCache(self.state, self.distributor, self.view)
        self.registration = NimbusRegistration(
            self.zk, self.state, self.elector, conf["nimbus.host"],
            conf["nimbus.thrift.port"], self.started_at)
        self.watchdog = LeaderWatchdog(
            float(conf["nimbus.leader.watchdog.secs"]), self.elector.is_leader,
            give_up=self.elector.remove_from_leader_lock_queue)
        self.sweeper = LeaderSweeper(
            self.state, self.view, self.distributor, pending=self.lifecycle.pending_ids,
            period_s=float(conf["nimbus.sweep.freq.secs"]),
            orphan_grace_s=float(conf["nimbus.code.orphan.grace.secs"]))
        self.duties = LeaderDuties(self.elector, self.lifecycle, self.scheduler, self.cache,
                                   period_s=conf["nimbus.monitor.freq.secs"],
                                   sweeper=self.sweeper,
                                   index=AssignmentIndex(self.state, self.view),
                                   upgrades=self.upgrades)
        self.cycle = NimbusCycle(self.bell, self.registration, self.view, self.sync,
                                 self.elector, self.duties, self.cache, observer,
                                 completed=self.watchdog.cycle_completed)
        # A new rebalance deadline: the cycle computes its wait again.
        self.lifecycle.add_timer_listener(self.cycle.wake)
        # A switch begun by a call: the duties apply it at once.
        self.upgrades.add_wake_listener(self.cycle.wake_duties)

    def _code_lost(self) -> frozenset[str]:
        # Submit refuses while a topology's code is lost (the sync knows which).
        return self.sync.lost_topologies()

    def longest_worker_lease_s(self) -> float:
        """The longest lease a supervisor grants a worker: WORKER_LEASE_FRACTION of its
        session timeout. Supervisors are asked to use the nimbuses'
        storm.zookeeper.session.timeout or less (docs/runtime.md)."""
        return WORKER_LEASE_FRACTION * max(self.conf.session_timeout_s,
                                           self.zk.session_timeout.seconds)

    def topology_conf_path(self, topology_id: str) -> Path:
        """Where this host keeps the conf ``topology_id`` runs with (its running code
        version's: :meth:`Upgrades.running_key`), once its code is here."""
        return self.store.path(self.upgrades.running_key(topology_id)) / CONF_FILE

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Register, load the view, start the sync and the cycle, and queue for the lock
        (the caller serves Thrift first)."""
        self.registration.remove_dead_predecessor()
        self.registration.ensure()
        self.zk.add_listener(self._on_connection_state)
        self.view.start()
        self.cache.start()
        self.sync.start()
        self.cycle.start()
        self.watchdog.start()
        if self._observer is not None:
            self._observer.on_queued()
        self.elector.add_to_leader_lock_queue()

    def stop_leading(self) -> None:
        """Leave the election first (fast failover; after the cycle in progress, and the
        leases of work it just released): the cycle and the watchdog stop, then the
        elector gives up its place."""
        self.watchdog.stop()
        self.cycle.stop(join_timeout=10)  # no duty may release work from here on
        self._wait_out_releases()
        try:
            self.elector.stop()
        except Exception as exc:
            log.warning("leaving the election failed: %s", exc)

    def stop(self) -> None:
        """Stop the code sync, the summary and the view (after :meth:`stop_leading`)."""
        self.sync.stop()
        self.cache.stop()
        self.view.close()
        self.view_zk.stop()
        self.view_zk.close()

    def close(self) -> None:
        """Close the distributor, then the session (last of all)."""
        try:
            self.distributor.close(self.conf)
        finally:
            self.zk.remove_listener(self._on_connection_state)
            self.zk.stop()
            self.zk.close()

    def release(self) -> None:
        """Give back what a failed construction (or a failed start of the process around
        it) took: the distributor, the elector, then ZooKeeper. ``close`` is called on a
        distributor whose ``prepare`` failed, too (docs/hooks.md asks plugins to allow
        that)."""
        if self._prepared:
            try:
                self.distributor.close(self.conf)
            except Exception as exc:
                log.warning("closing code distributor %s failed: %s",
                            self.distributor.name, exc)
        if self.elector is not None:
            self.elector.stop()
        if self.view_zk is not None:
            self.view_zk.stop()
            self.view_zk.close()
        self.zk.stop()
        self.zk.close()

    def _wait_out_releases(self) -> None:
        """A leader that took workers off live supervisors' slots moments ago keeps the
        lock until their leases have run out, so that its successor may place that work
        at once (nimbus.master.scheduler, release quarantine). At most 2/3 of a session."""
        pending = self.scheduler.last_release_s()
        if not pending or not self.elector.is_leader():
            return
        log.info("leaving the election in %.1fs: workers taken off live supervisors' "
                 "slots may run until then", pending)
        threading.Event().wait(pending)

    def _on_connection_state(self, state: str) -> None:
        # kazoo's event thread: only signal; views of the cluster may have changed.
        self.cache.wake()
        self.sync.wake()

    # -- for the process and its tools -----------------------------------------------------------
    def run_cycle(self) -> None:
        """One cycle now, on the caller's thread, with the leader's duties whether or not
        they are due (:meth:`NimbusCycle.run_cycle`)."""
        self.cycle.run_cycle(duties=True)

    @property
    def cycles(self) -> int:
        """Cycles completed (tests wait on it)."""
        return self.cycle.cycles

    def wake_duties(self) -> None:
        """Run the leader's duties now (or right after the cycle under way)."""
        self.cycle.wake_duties()

    def duty_cycle_age_s(self) -> float | None:
        """Seconds since this nimbus's last completed cycle while it leads (what the UI
        shows for the leader), None while it does not."""
        return self.watchdog.age_s() if self.elector.is_leader() else None
