"""One nimbus process: wiring and orderly shutdown.

Start-up order matters: the Thrift server comes first (peers download code from it), then
the nimbus registers itself, the code sync starts, and the elector queues for the lock
once this host holds the code of every topology. SIGTERM leaves the election *first*, so
a planned restart fails over at once instead of after a session timeout.

The leader's duties are one cycle (:mod:`nimbus.master.duty_cycle`). The other loops
only wake one another: the code sync wakes the elector (this host may now hold all
code), the elector wakes the duty cycle and the summary (leadership changed).

ZooKeeper unreachable: the elector already reports "not leader" (SUSPENDED/LOST) and
every leader write is fenced, so the rule is simply to do nothing until reconnected.
"""

from __future__ import annotations

import json
import logging
import threading
import time

from kazoo.exceptions import KazooException

from nimbus import __version__
from nimbus.config import Config, ConfigError
from nimbus.distribution.distributors import CodeDistributor
from nimbus.distribution.file_transfer import FileTransfers
from nimbus.distribution.hookspecs import DistributorContext
from nimbus.distribution.local_code import LocalCodeStore
from nimbus.master.assignment_index import AssignmentIndex
from nimbus.master.code_sync import CodeSync
from nimbus.master.duty_cycle import LeaderDutyCycle
from nimbus.master.elector import LeaderElector
from nimbus.master.leader_watchdog import LeaderWatchdog
from nimbus.master.lifecycle import CONF_FILE, TopologyLifecycle
from nimbus.master.scheduler import Scheduler
from nimbus.master.summary_cache import ClusterSummaryCache
from nimbus.master.sweepers import LeaderSweeper
from nimbus.metrics import NimbusMetrics, min_replication_reader, serve_metrics
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.cluster_view import ClusterView
from nimbus.state.incarnation import Incarnation
from nimbus.state.records import NimbusInfo
from nimbus.state.session_renewal import SessionRenewal
from nimbus.state.zk_auth import check_layout_acl, zk_security
from nimbus.state.zk_client import make_zk_client
from nimbus.thrift.authorizer import authorizer_from_conf, supervisors_refused
from nimbus.thrift.client import fetch_file
from nimbus.thrift.handler import NimbusHandler
from nimbus.thrift.server import ThriftServer
from nimbus.thrift.tls import configure_clients, server_context
from nimbus.timing import WORKER_LEASE_FRACTION, check_timing

log = logging.getLogger(__name__)


class NimbusDaemon:
    """A running nimbus; :meth:`start`, then :meth:`stop` (in a process of its own:
    :class:`nimbus.foreground.Foreground`)."""

    def __init__(self, conf: Config):
        self.conf = conf
        self.address = str(conf.nimbus_address)
        self.started_at = time.time()
        self._stop = threading.Event()
        self._stopping = False
        self._stopping_lock = threading.Lock()

        check_timing(conf)  # unsafe timing settings: refused before anything starts
        # Fail fast on bad security settings, before anything is started.
        configure_clients(conf)  # peer code downloads present this nimbus's certificate
        self._tls = server_context(conf)
        authorizer_from_conf(conf)
        refused = supervisors_refused(conf)
        if refused:
            log.warning("%s", refused)
        self.distributor = CodeDistributor.from_conf(conf)  # fail fast on a bad name
        self.metrics = NimbusMetrics(
            self.distributor.name, is_leader=lambda: self.elector.is_leader(),
            snapshot=lambda: self.cache.snapshot,
            min_replication=min_replication_reader(
                lambda topology_id: self.store.path(topology_id) / CONF_FILE,
                conf["topology.min.replication.count"]),
            served_bytes=lambda: self.transfers.served_bytes
            if getattr(self, "transfers", None) is not None else 0,
            code_missing=lambda: self.sync.missing_count
            if getattr(self, "sync", None) is not None else 0)
        self.metrics_server = None  # bound in _wire when nimbus.metrics.port is set
        self.zk = make_zk_client(conf, "nimbus")
        self._prepared = False
        try:
            self._wire(conf)
        except BaseException:
            # A failed start (say, the Thrift port is taken) releases everything it took,
            # so the process can exit with the reason instead of lingering.
            self._release()
            raise

    def _wire(self, conf: Config) -> None:
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
        self.view = ClusterView(StormClusterState(self.view_zk, conf.zk_root), name="nimbus",
                                audit_nodes_per_s=conf["nimbus.view.audit.nodes.per.sec"],
                                on_stale=self.metrics.on_stale_view)
        self.sync = CodeSync(self.state, self.store, self.distributor, view=self.view,
                             period_s=conf["nimbus.code.sync.freq.secs"],
                             protected=lambda: self.lifecycle.pending_ids(),
                             on_synced=lambda: self.elector.wake(),
                             cleanup_blocked=cleanup_blocked, cluster_id=cluster_id,
                             on_fetch=self.metrics.on_code_fetch,
                             lost_grace_s=None if conf["nimbus.code.lost.grace.secs"] < 0
                             else conf["nimbus.code.lost.grace.secs"])
        self.elector = LeaderElector(
            self.zk, self.state, self.address,
            has_all_code=self.sync.check_code, check_layout=self.sync.check_cluster,
            request_sync=self.sync.wake, on_change=self._on_leadership)
        self.lifecycle = TopologyLifecycle(conf, self.state, self.store, self.distributor,
                                           self.elector, self.address,
                                           code_lost=self.sync.lost_topologies,
                                           view=self.view)
        # A worker's lease is WORKER_LEASE_FRACTION of its supervisor's session timeout:
        # supervisors are asked to use the nimbuses' storm.zookeeper.session.timeout or
        # less (docs/runtime.md).
        self.scheduler = Scheduler(
            conf, self.state, self.view,
            quarantine_s=lambda: WORKER_LEASE_FRACTION * max(
                conf.session_timeout_s, self.zk.session_timeout.seconds))
        self.cache = ClusterSummaryCache(self.state, self.distributor, self.view)
        self.transfers = FileTransfers(conf.local_dir, self.store,
                                       conf["nimbus.max.topology.bytes"])
        self.handler = handler = NimbusHandler(conf, self.elector, self.lifecycle, self.cache,
                                self.transfers, self.store, self.started_at,
                                reads=self.view.state)
        # Bound before the Thrift port, and closed by _release if that one is taken.
        self.metrics_server = serve_metrics(
            self.metrics.registry, conf["nimbus.metrics.bind.address"],
            conf["nimbus.metrics.port"], "nimbus-metrics", conf=conf)
        try:
            self.server = ThriftServer(
                self.metrics.instrument(handler), conf["nimbus.thrift.bind.address"],
                conf["nimbus.thrift.port"],
                max_frame_bytes=conf["nimbus.thrift.max_buffer_size"],
                max_connections=conf["nimbus.thrift.threads"],
                handshake_timeout_s=float(conf["nimbus.thrift.handshake.timeout.secs"]),
                advertised_host=conf["nimbus.host"], ssl_context=self._tls,
                downloads=self.transfers)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot serve Thrift on {conf['nimbus.thrift.bind.address']}:"
                          f"{conf['nimbus.thrift.port']}: {exc.strerror} (is another "
                          "nimbus using nimbus.thrift.port?)") from None
        self.watchdog = LeaderWatchdog(
            float(conf["nimbus.leader.watchdog.secs"]), self.elector.is_leader,
            give_up=self.elector.remove_from_leader_lock_queue)
        self.metrics.duty_cycle_age.set_function(self.watchdog.age_s)
        self.sweeper = LeaderSweeper(
            self.state, self.view, self.distributor, pending=self.lifecycle.pending_ids,
            period_s=float(conf["nimbus.sweep.freq.secs"]),
            orphan_grace_s=float(conf["nimbus.code.orphan.grace.secs"]))
        self.duties = LeaderDutyCycle(self.elector, self.lifecycle, self.scheduler,
                                      self.cache, period_s=conf["nimbus.monitor.freq.secs"],
                                      completed=self.watchdog.cycle_completed,
                                      sweeper=self.sweeper,
                                      index=AssignmentIndex(self.state, self.view))

    def _release(self) -> None:
        """Give back what a failed construction took: the distributor, then ZooKeeper.

        ``close`` is called on a distributor whose ``prepare`` failed, too (docs/hooks.md
        asks plugins to allow that)."""
        if self._prepared:
            try:
                self.distributor.close(self.conf)
            except Exception as exc:
                log.warning("closing code distributor %s failed: %s",
                            self.distributor.name, exc)
        elector = getattr(self, "elector", None)
        if elector is not None:
            elector.stop()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        view_zk = getattr(self, "view_zk", None)
        if view_zk is not None:
            view_zk.stop()
            view_zk.close()
        self.zk.stop()
        self.zk.close()

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        self._start_ui()
        self.server.start()
        if self.metrics_server is not None:
            self.metrics_server.start()
        self._remove_dead_predecessor()
        self._register()
        self._renewal = SessionRenewal(self.zk, "nimbus-registration", self._reregister)
        self.zk.add_listener(self._on_connection_state)
        self.view.start()
        self.cache.start()
        self.sync.start()
        self.duties.start()
        self.watchdog.start()
        self.metrics.on_queued()
        self.elector.add_to_leader_lock_queue()
        log.info("nimbus %s started (distributor %s)", self.address, self.distributor.name)
        log.info("nimbus %s configuration, keys that differ from the defaults (secrets "
                 "redacted): %s", self.address,
                 json.dumps(self.conf.redacted_changes(), sort_keys=True, default=str))

    def _start_ui(self) -> None:
        """With ``nimbus.ui.enabled``, serve the web UI from this nimbus (``ui.host``,
        ``ui.port``); a port that is taken fails the start, with everything released."""
        self.ui = None
        if not self.conf["nimbus.ui.enabled"]:
            return
        from nimbus.ui.local_nimbus import LocalNimbus
        from nimbus.ui.server import UIServer

        try:
            # The view's session: the UI's reads stay off the elector's.
            ui = UIServer(self.conf, zk=self.view_zk, local_nimbus=LocalNimbus(
                self.address, self._duty_cycle_age_s))
        except ConfigError:  # unusable HTTPS settings: nothing of the UI started yet
            self._release()
            raise
        try:
            self.ui = ui.start()
        except ConfigError:
            ui.stop()
            self._release()
            raise
        except OSError as exc:
            ui.stop()
            self._release()
            raise OSError(exc.errno, f"cannot serve the UI on {self.conf['ui.host']}:"
                          f"{self.conf['ui.port']}: {exc.strerror} (nimbus.ui.enabled; "
                          "is ui.port taken?)") from None

    def stop(self) -> None:
        """Leave the election first (fast failover; after the duty cycle in progress, and
        the leases of work it just released), then stop every thread and close."""
        with self._stopping_lock:
            if self._stopping:
                return
            self._stopping = True
        self.watchdog.stop()
        self._stop.set()
        self.duties.stop(join_timeout=10)  # no duty cycle may release work from here on
        self._wait_out_releases()
        try:
            self.elector.stop()
        except Exception as exc:
            log.warning("leaving the election failed: %s", exc)
        self._renewal.close()
        self.sync.stop()
        self.cache.stop()
        self.view.close()
        self.view_zk.stop()
        self.view_zk.close()
        self.server.stop()
        self.handler.close()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        if getattr(self, "ui", None) is not None:
            self.ui.stop()
        self.transfers.close()
        try:
            self.distributor.close(self.conf)
        finally:
            self.zk.remove_listener(self._on_connection_state)
            self.zk.stop()
            self.zk.close()
        log.info("nimbus %s stopped", self.address)

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

    @property
    def stopping(self) -> threading.Event:
        """Set once :meth:`stop` has begun (what a foreground run waits for)."""
        return self._stop

    # -- membership ----------------------------------------------------------------------------
    def _register(self) -> None:
        me = Incarnation.of_process()
        self.state.register_nimbus(NimbusInfo(
            host=self.conf["nimbus.host"], port=self.conf["nimbus.thrift.port"],
            start_time_secs=int(self.started_at), version=__version__,
            boot_id=me.boot_id, pid_namespace=me.pid_namespace, pid=me.pid,
            pid_started_ticks=me.started_ticks, lock_token=self.elector.token))

    def _remove_dead_predecessor(self) -> None:
        """This nimbus, started again after a kill -9 (or a crash), removes the lock node
        its previous process left, when that process is certainly dead
        (:mod:`nimbus.state.incarnation`). Otherwise a node at the head of the queue
        keeps every nimbus from leading until the dead session expires."""
        host, port = self.conf["nimbus.host"], self.conf["nimbus.thrift.port"]
        try:
            previous = [n for n in self.state.nimbuses() if (n.host, n.port) == (host, port)]
            if not previous or not previous[0].lock_token:
                return
            before = previous[0]
            dead = Incarnation(before.boot_id, before.pid_namespace, before.pid,
                               before.pid_started_ticks)
            if not dead.is_dead():
                if dead.known:
                    log.info("the previous registration of %s (pid %d) is not known to "
                             "be dead here: its lock node is left to expire with its "
                             "session", self.address, before.pid)
                return
            removed = self.elector.remove_nodes_of(before.lock_token)
        except KazooException as exc:
            log.warning("could not look for the lock node of %s's previous process: %s; "
                        "it expires with that process's session", self.address, exc)
            return
        if removed:
            log.warning("removed leader-lock node %s of %s's previous process (pid %d, no "
                        "longer running) instead of waiting for its session to expire",
                        ", ".join(removed), self.address, before.pid)

    def _reregister(self) -> None:
        self._register()
        log.info("re-registered %s after session expiry", self.address)

    def _on_connection_state(self, state: str) -> None:
        # kazoo's event thread: only signal; views of the cluster may have changed.
        self.cache.wake()
        self.sync.wake()

    # -- the leader's duties ------------------------------------------------------------------
    def _on_leadership(self, leader: bool) -> None:
        # Under the elector's lock: signals only. The duty cycle resets the scheduler on
        # the first cycle of a new leadership.
        self.metrics.on_leadership(leader)
        self.cache.wake()
        if leader:
            self.duties.wake()

    def run_cycle(self) -> None:
        """One pass of leader duties now, on the caller's thread; a no-op on followers
        (:meth:`LeaderDutyCycle.run_cycle`)."""
        self.duties.run_cycle()

    @property
    def cycles(self) -> int:
        """Duty cycles completed (tests wait on it)."""
        return self.duties.cycles

    def wake_duties(self) -> None:
        """Run a duty cycle now (or right after the one under way)."""
        self.duties.wake()

    def _duty_cycle_age_s(self) -> float | None:
        """Seconds since this nimbus's last completed duty cycle while it leads (what
        the UI shows for the leader), None while it does not."""
        return self.watchdog.age_s() if self.elector.is_leader() else None
