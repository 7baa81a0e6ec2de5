"""One supervisor process: its lifecycle and its reconcile pass.

Built by its composition root (:func:`nimbus.daemons.supervisor.build_supervisor`),
which gives it the Thrift transport for code fetches
(:mod:`~nimbus.supervisor.code_transport`), its metrics
(:mod:`~nimbus.supervisor.telemetry`) and its process's security
(:class:`~nimbus.cluster_security.ClusterSecurity`: the logviewer's server context and
authorizer; the code fetches present its client certificate).

Threads (each named, each stopped and joined by :meth:`Supervisor.stop`):

* ``supervisor-monitor``: the reconcile loop, a
  :class:`~nimbus.background_loop.BackgroundLoop`. Woken by ZooKeeper watches on this
  supervisor's own assignments (:mod:`nimbus.supervisor.own_assignments`), by connection
  changes and by worker exits, and at least every ``supervisor.monitor.frequency.secs``
  as a safety net. One pass (:meth:`Supervisor.reconcile`) reaps exited workers,
  (re)registers after a new session, reads its assignments (from memory), stops the
  workers whose slot is no longer theirs or wants another code version (an upgrade:
  nimbus.state.code_versions), kills silent ones, starts the missing ones
  whose code is here (asking the fetch thread for the others), takes over or ends what
  an earlier process left, and cleans up code past its grace.
* ``supervisor-heartbeat``: rewrites ``/supervisors/<id>``, a
  :class:`~nimbus.background_loop.BackgroundLoop`
  (:mod:`nimbus.supervisor.registration`).
* ``supervisor-lease``: :class:`nimbus.supervisor.lease.LeaseKeeper`.
* ``supervisor-code-fetch``: :class:`nimbus.supervisor.code_fetcher.CodeFetcher`, so that
  no fetch (a nimbus far away or cut off, a large bundle to unpack) ever holds up the
  reconcile loop, which is also what stops unassigned workers.
* ``supervisor-class-archive``: builds the Spark class archive once, when a Spark session
  is first wanted here and the host has none yet (:mod:`nimbus.supervisor.class_archive`);
  killed and joined by stop.
* ``worker-status-<topology>:<port>``: one per worker (and per warm worker), reading its
  status pipe (:mod:`nimbus.supervisor.reporting`).
* ``supervisor-logviewer`` and ``supervisor-logviewer-worker-<i>``: the logviewer, its
  workers' logs over HTTP(S) on ``logviewer.port`` (:mod:`nimbus.supervisor.logviewer`).
* ``supervisor-log-sweep``: removes the logs no worker wrote to for
  ``logviewer.cleanup.age.mins`` (:mod:`nimbus.supervisor.log_sweep`).

The parts, each a module of one idea: :mod:`~nimbus.supervisor.identity` (configuration
checks, id, directory lock), :mod:`~nimbus.supervisor.slots` (the workers and their
slots' records), :mod:`~nimbus.supervisor.registration`,
:mod:`~nimbus.supervisor.reporting`, :mod:`~nimbus.supervisor.starting`,
:mod:`~nimbus.supervisor.ending` (reaped, stopped, killed),
:mod:`~nimbus.supervisor.adoption` (take-over and frozen workers) and
:mod:`~nimbus.supervisor.cleanup` (what no assignment needs any more); what it is
assigned is read by :mod:`~nimbus.supervisor.assigned_work`.

A suspended connection (kazoo SUSPENDED: a ZooKeeper server restarting, an ensemble
electing a leader, a network blip) stops nothing: the workers run on their leases, which
are renewed again as soon as the session is back, and which end on their own, before the
leader may move the work, if it is not. A worker in a cgroup ends its lease by freezing
itself; the first renewal after the session is back thaws it, and the pipeline goes on
where it stood. A worker frozen longer than ``supervisor.worker.timeout.secs`` is killed
(whether or not the connection is back), and so is every frozen worker when the session
is lost. Nothing starts while it is suspended. A lost session (LOST) kills every worker
at once, on kazoo's event thread (signals only, nothing blocks there): that is not a
crash, so no restart is counted and no backoff applies. After a new session the
supervisor registers again and re-reads the assignments first, in the reconcile pass
itself, so work the leader moved meanwhile is never started here.

Slot ports are checked at start (bound and released at once) and not held afterwards:
the workers, or their commands, may bind them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from kazoo.exceptions import KazooException
from kazoo.protocol.states import KazooState

from nimbus.background_loop import BackgroundLoop
from nimbus.cluster_security import ClusterSecurity
from nimbus.config import Config
from nimbus.daemon_base import StopOnce
from nimbus.state.cluster_state import LayoutMissingError, StormClusterState
from nimbus.state.cluster_view import ViewNotLoadedError
from nimbus.state.records import Assignment, RecordError
from nimbus.state.worker_logs import log_root
from nimbus.state.zk_client import make_zk_client
from nimbus.supervisor.adoption import Adoption
from nimbus.supervisor.assigned_work import AssignedWork
from nimbus.supervisor.cgroups import WorkerCgroups, worker_cgroups
from nimbus.supervisor.class_archive import ARCHIVE_KEY, ClassArchive
from nimbus.supervisor.cleanup import LocalCleanup
from nimbus.supervisor.code_cache import CodeCache
from nimbus.supervisor.code_fetcher import CodeFetcher
from nimbus.supervisor.code_transport import FetchFile
from nimbus.supervisor.distributor_source import DistributorSource
from nimbus.supervisor.ending import WorkerEnder
from nimbus.supervisor.identity import (
    ID_FILE,
    SupervisorDirInUseError,
    advertised_host,
    check_hosts,
    check_supervisor_conf,
    load_supervisor_id,
    lock_dir,
    prepare_run_as_user,
)
from nimbus.supervisor.lease import LeaseKeeper, session_id
from nimbus.supervisor.log_dirs import LogDirs
from nimbus.supervisor.log_sweep import RETENTION_KEY, LogSweeper
from nimbus.supervisor.logviewer.server import Logviewer, make_logviewer
from nimbus.supervisor.orphans import claim
from nimbus.supervisor.policy import check_ports_free, desired_workers
from nimbus.supervisor.registration import Registration, hex_session
from nimbus.supervisor.reporting import Reporter, handle_executor
from nimbus.supervisor.run_as_user import RUN_AS_USER_KEY
from nimbus.supervisor.slots import WorkerTable
from nimbus.supervisor.starting import WorkerStarter, peers
from nimbus.supervisor.telemetry import MetricsEndpoint, Readings, TelemetryFactory
from nimbus.supervisor.warm_pool import WARM_KEY, WarmPool, make_warm_pool
from nimbus.supervisor.worker_env import worker_env
from nimbus.supervisor.worker_handle import WORKER_COMMAND, WorkerHandle, stop_all
from nimbus.timing import WORKER_LEASE_FRACTION
from nimbus.worker_protocol.frozen_cgroup import REAPERS_CGROUP

# Names this module has always offered (the CLI and tests import them from here).
__all__ = ["Supervisor", "SupervisorDirInUseError", "advertised_host",
           "check_supervisor_conf", "handle_executor", "load_supervisor_id"]

log = logging.getLogger(__name__)


class Supervisor:
    """A running supervisor; :meth:`start`, then :meth:`stop` (in a process of its own:
    :class:`nimbus.foreground.Foreground`). Built by
    :func:`nimbus.daemons.supervisor.build_supervisor`.

    ``fetch_file`` copies a file of topology code from a nimbus (Thrift's, with
    ``security``'s client certificate); ``security`` is the process's; ``telemetry``
    makes this supervisor's metrics from what they read of it (its
    :class:`~nimbus.supervisor.telemetry.Readings`). ``worker_command`` is the argv that
    runs one worker (the worker directory is appended); tests may point it at a stand-in
    that follows the same protocol. ``warm_command`` runs a warm worker; by default
    ``worker_command`` with ``--warm`` when that is the real worker, else none (a
    stand-in has no warm mode).
    """

    def __init__(self, conf: Config, *, fetch_file: FetchFile, telemetry: TelemetryFactory,
                 security: ClusterSecurity,
                 worker_command: tuple[str, ...] = WORKER_COMMAND,
                 warm_command: tuple[str, ...] | None = None):
        check_supervisor_conf(conf)
        self.conf = conf
        self.security = security
        self.ports = sorted({int(p) for p in conf["supervisor.slots.ports"]})
        self.host = advertised_host(conf)
        # Checked before anything is taken, so a failure leaves nothing to release.
        check_ports_free(self.ports, check_hosts(self.host))
        self.local_dir = conf.local_dir
        self.supervisor_dir = self.local_dir / "supervisor"
        self.supervisor_dir.mkdir(parents=True, exist_ok=True)
        self._dir_lock = lock_dir(self.supervisor_dir, self.local_dir)
        self.id = load_supervisor_id(self.supervisor_dir / ID_FILE)
        self.workers_dir = self.local_dir / "workers"
        # The workers' logs, outside their directories (nimbus/state/worker_logs.py).
        self.log_root = log_root(conf)
        self.code = CodeCache(self.supervisor_dir / "stormdist",
                              conf["nimbus.max.topology.bytes"], fetch_file)
        self._run_as_user = bool(conf[RUN_AS_USER_KEY])
        if self._run_as_user:
            try:
                prepare_run_as_user(self.local_dir, self.supervisor_dir, self.workers_dir,
                                    self.code.root)
            except BaseException:
                self._dir_lock.close()
                raise
        self._worker_command = tuple(worker_command)
        self._warm_command = warm_command if warm_command is not None else (
            (*WORKER_COMMAND, "--warm") if tuple(worker_command) == WORKER_COMMAND else None)
        self._grace_s = float(conf["supervisor.worker.shutdown.sleep.secs"])
        self._start_timeout_s = float(conf["supervisor.worker.start.timeout.secs"])
        self._monitor_s = float(conf["supervisor.monitor.frequency.secs"])
        self._connected = threading.Event()
        self._stop = threading.Event()
        self.passes = 0  # reconcile passes completed (tests wait on it)
        self._stop_once = StopOnce(self._stop)

        try:
            self.zk = make_zk_client(conf, "supervisor")
        except BaseException:
            self._dir_lock.close()
            raise
        self.state = StormClusterState(self.zk, conf.zk_root)
        self.node_path = self.state.path("supervisors", self.id)
        if conf["supervisor.code.through.distributor"]:
            self.code.distributor = DistributorSource(
                conf, self.zk, conf.zk_root, self.id, self.supervisor_dir,
                fetch_file=fetch_file, private_copies=self._run_as_user)
        if self.zk.connected:
            self._connected.set()
        self._layout_problem = ""   # the LayoutMissingError last logged, if any
        # Made by start(): the others read them through callables.
        self.fetcher: CodeFetcher | None = None
        self.cgroups: WorkerCgroups | None = None
        self.warm: WarmPool | None = None
        self.class_archive: ClassArchive | None = None
        self.logviewer: Logviewer | None = None
        self.log_dirs = LogDirs(self.log_root, self._run_as_user)

        self.table = WorkerTable()
        self._monitor = BackgroundLoop("supervisor-monitor", self._monitor_step,
                                       self._next_wait)
        # This supervisor's assignments, in memory and kept current by watches on its own
        # index node and the assignments it names (nimbus/supervisor/assigned_work.py).
        self.assigned = AssignedWork(self.state, self.id,
                                     conf["supervisor.view.audit.nodes.per.sec"],
                                     wake=self._monitor.wake)
        self.registration = Registration(
            self.zk, self.state, self.id, self.host, self.ports, self.node_path, self.table,
            heartbeat_s=float(conf["supervisor.heartbeat.frequency.secs"]),
            task_timeout_s=float(conf["nimbus.task.timeout.secs"]),
            warm_summary=lambda: self.warm.summary() if self.warm is not None else None,
            wake_monitor=self._monitor.wake, stopping=self._stop.is_set)
        self.started_at = self.registration.started_at
        self._lease = LeaseKeeper(
            self.zk, lambda: self.node_path, lambda: self.zk.session_timeout.seconds,
            self.table.running,
            assignment_path=lambda topology_id: self.state.path("assignments", topology_id),
            holds=self._assignment_holds, may_renew=self._connected.is_set,
            on_unassigned=self._on_unassigned)
        self.telemetry = telemetry(Readings(
            self.table.running, self.table.restarts,
            warm=lambda: self.warm.summary() if self.warm is not None else None,
            code_fetches=lambda: dict(self.code.fetched_from),
            states=self.registration.slot_states,
            frozen_orphans=lambda: self.adoption.frozen_orphans()))
        self.reporting = Reporter(self.zk, self.state, self.id, self.host, self._connected,
                                  lambda h, c: self.telemetry.observe(h, c),
                                  beat_now=self.registration.beat_now,
                                  wake_monitor=self._monitor.wake)
        self.adoption = Adoption(
            self.table, self.reporting, self._lease, supervisor_dir=self.supervisor_dir,
            timeout_s=float(conf["supervisor.worker.timeout.secs"]),
            connected=self._connected, beat_now=self.registration.beat_now,
            code=lambda: self.code, cgroups=lambda: self.cgroups,
            warm_root=lambda: self.warm.root if self.warm is not None else None)
        self.starter = WorkerStarter(
            lambda: self.conf, self.id, self.host, self.table, self.reporting, self.adoption,
            self._lease, local_dir=self.local_dir, supervisor_dir=self.supervisor_dir,
            workers_dir=self.workers_dir, worker_command=self._worker_command,
            run_as_user=self._run_as_user, grace_s=self._grace_s, connected=self._connected,
            beat_now=self.registration.beat_now, may_start=self._may_start,
            code=lambda: self.code, fetcher=lambda: self.fetcher, warm=lambda: self.warm,
            cgroups=lambda: self.cgroups, class_archive=lambda: self.class_archive,
            log_dirs=self.log_dirs)
        self.ender = WorkerEnder(
            self.table, self.reporting, self.registration.beat_now, grace_s=self._grace_s,
            timeout_s=float(conf["supervisor.worker.timeout.secs"]),
            start_timeout_s=self._start_timeout_s, code_ready=self.starter.code_ready)
        self.cleanup = LocalCleanup(
            self.zk, self.state, self.code, self.table, self.reporting, self.starter,
            lambda: self.fetcher, self.workers_dir,
            grace_s=float(conf["supervisor.code.cleanup.grace.secs"]),
            run_as_user=self._run_as_user)
        self.metrics_server: MetricsEndpoint | None = None
        self.log_sweeper = LogSweeper(self.log_root, 60.0 * float(conf[RETENTION_KEY]),
                                      self._logs_in_use, lock=self.log_dirs.lock)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Register, then start the threads; raises if ZooKeeper refuses the registration."""
        # First: a taken metrics port fails the start before anything is registered.
        self.metrics_server = self.telemetry.bind(self.conf)
        try:  # so is a taken logviewer port (its port and scheme go into the record)
            self.logviewer = make_logviewer(self.conf, self.log_root, self.host,
                                            self.security)
        except BaseException:
            if self.metrics_server is not None:
                self.metrics_server.stop()
            raise
        if self.metrics_server is not None:
            self.metrics_server.start()
        if self.logviewer is not None:
            self.registration.logviewer_port = self.logviewer.port
            self.registration.logviewer_https = self.logviewer.https
            self.logviewer.start()
        self.zk.add_listener(self._on_connection_state)
        session = session_id(self.zk)
        if session is not None:
            try:
                self.registration.register(session)
            except LayoutMissingError as exc:
                # Started before any nimbus: the reconcile loop registers once it can.
                self._layout_problem = str(exc)
                log.warning("%s", exc)
        self.cgroups, why = worker_cgroups(self.id)
        if self.cgroups is not None:
            log.info("workers run in cgroups of their own under %s", self.cgroups.base)
            claim(self.cgroups.base)
            # Before anything is taken over: a worker frozen past its end is ended, not
            # thawed (supervisor.worker.orphan.timeout.secs).
            self.adoption.sweep_frozen()
        else:
            log.warning("workers run without cgroups (%s): a command that leaves its "
                        "process group (setsid, a daemon) can outlive its worker; see "
                        "docs/runtime.md", why)
        # Made here, not in __init__: it fetches into whatever self.code is by now.
        self.fetcher = CodeFetcher(self.code, lambda code_key: self._peers(code_key),
                                   on_done=self._monitor.wake,
                                   timeout_s=float(self.conf["supervisor.code.fetch.timeout.secs"]))
        self.fetcher.start()
        if self.conf[ARCHIVE_KEY]:
            self.class_archive = ClassArchive(self.supervisor_dir / "class-archive")
            self.class_archive.start()
        # First: a warm worker taken for a slot works in its warm directory, which the
        # warm pool would otherwise clear as an earlier run's. A slot whose worker cannot
        # be identified waits for the longest lease the earlier process may have granted:
        # 2/3 of its session timeout, which ZooKeeper may have raised above the configured.
        self.adoption.find(self.workers_dir, self.ports, WORKER_LEASE_FRACTION * max(
            float(self.conf["storm.zookeeper.session.timeout"]) / 1000,
            self.zk.session_timeout.seconds if self.zk.connected else 0.0))
        self.warm = make_warm_pool(
            int(self.conf[WARM_KEY]), self.supervisor_dir / "warm", self._warm_command,
            self.starter.warm_spec, lambda: worker_env(self.conf), self.cgroups,
            self._start_timeout_s, self._monitor.wake, run_as_user=self._run_as_user,
            in_use={d for orphan in self.adoption.orphans.values()
                    for d in orphan.working_dirs()})
        self._lease.start()
        self.registration.start()
        self._monitor.start()
        self.log_sweeper.start()
        log.info("supervisor %s started on %s with slots %s", self.id, self.host,
                 ",".join(map(str, self.ports)))

    def stop(self) -> None:
        """Stop every worker gracefully (their leases still renewed meanwhile), then the
        threads, then the ZooKeeper session (which removes this supervisor's node)."""
        # From here on no pass starts anything, no heartbeat is written.
        if not self._stop_once.begin():
            return
        self._monitor.stop(join_timeout=60)
        self.log_sweeper.stop()
        handles = self.table.pop_all()
        if handles:
            log.info("stopping %d workers", len(handles))
            stop_all(handles, self._grace_s)
        self.adoption.end_orphans("this supervisor stops")
        if self.warm is not None:
            self.warm.stop(self._grace_s)
        if self.class_archive is not None:
            self.class_archive.stop()
        if self.fetcher is not None:
            self.fetcher.stop()
        if self.code.distributor is not None:
            self.code.distributor.close()
        self._lease.stop()
        self.registration.stop()
        self.assigned.close()
        if self.cgroups is not None:
            with contextlib.suppress(OSError):  # empty by now; left if not (a reaper
                (self.cgroups.base / REAPERS_CGROUP).rmdir()  # of a frozen worker waits)
            with contextlib.suppress(OSError):
                self.cgroups.base.rmdir()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        if self.logviewer is not None:
            self.logviewer.stop()
        self.zk.remove_listener(self._on_connection_state)
        self.zk.stop()
        self.zk.close()
        self._dir_lock.close()
        log.info("supervisor %s stopped", self.id)

    @property
    def stopping(self) -> threading.Event:
        """Set once :meth:`stop` has begun (what a foreground run waits for)."""
        return self._stop

    # -- ZooKeeper events (kazoo's event thread: signal, never block) -----------------------
    def _on_connection_state(self, state: str) -> None:
        if state == KazooState.SUSPENDED:
            self._connected.clear()  # nothing starts, nothing is renewed meanwhile
            log.warning("ZooKeeper connection suspended: workers run on their leases "
                        "(at most %.1fs), then freeze until it is back",
                        self._lease.length_s)
        elif state == KazooState.LOST:
            self._connected.clear()
            killed, kept = self.adoption.end_with_session()
            log.warning("ZooKeeper session lost: killed %d workers, kept %d frozen (a "
                        "renewal of the next session thaws each whose assignment is "
                        "unchanged)", killed, kept)
        elif state == KazooState.CONNECTED:
            self._connected.set()
            log.info("ZooKeeper connection back (session %s)",
                     hex_session(session_id(self.zk)))
        self._monitor.wake()

    # -- the lease thread's questions -----------------------------------------------------
    def _assignment_holds(self, handle: WorkerHandle, data: bytes | None) -> bool:
        """Whether the assignment ``data`` (ZooKeeper's answer; None: no node) still places
        ``handle`` on this supervisor and port. An assignment this release cannot read is
        counted as holding: the leader cannot read it either, so it moves nothing (the
        reconcile loop leaves such topologies alone too)."""
        if data is None:
            return False
        try:
            assignment = Assignment.decode(data)
        except RecordError:
            return True
        placed = assignment.executor_node_port.get(handle_executor(handle))
        return placed is not None and list(placed) == [self.id, handle.port]

    def _on_unassigned(self, handle: WorkerHandle) -> None:
        # The lease thread: its lease is not renewed any more; the reconcile loop stops it
        # (and if it cannot, say its view lags, the lease ends it within 2/3 T).
        if not handle.unassigned_seen:
            handle.unassigned_seen = True
            log.info("worker %s is no longer assigned here: its lease is not renewed",
                     handle.name)
        self._monitor.wake()

    def _logs_in_use(self) -> set[tuple[str, int]]:
        """(topology, port) of every slot whose logs a worker of this supervisor may be
        writing: running, assigned here, or left by its earlier process (the log
        sweep's thread)."""
        used = {(h.topology_id, h.port) for h in self.table.running()}
        used |= {(w.topology_id, port) for port, w in self.registration.desired.items()}
        used |= {(o.topology_id, o.port) for o in list(self.adoption.orphans.values())}
        return used

    def _peers(self, code_key: str) -> list[str]:
        """Nimbuses to fetch a code key's code from (:func:`starting.peers`)."""
        return peers(self.state, code_key)

    # -- the reconcile loop ---------------------------------------------------------------
    def _monitor_step(self) -> None:
        """One turn of ``supervisor-monitor``: a pass, then the warm pool and the sweep."""
        try:
            self.reconcile()
            if self._layout_problem:
                log.info("the cluster's layout is there: reconciling")
                self._layout_problem = ""
            self._fill_warm()
            self.adoption.sweep_frozen()
        except LayoutMissingError as exc:
            if str(exc) != self._layout_problem:   # once, not at every pass
                log.error("nothing started or stopped: %s", exc)
                self._layout_problem = str(exc)
        except (KazooException, ViewNotLoadedError) as exc:
            log.warning("reconcile failed, retrying: %s", exc)
        except Exception:
            log.exception("reconcile failed")
        finally:
            self.passes += 1

    def _next_wait(self) -> float:
        """supervisor.monitor.frequency.secs, or less when a slot's backoff ends sooner."""
        now = time.monotonic()
        pending = [r.not_before - now for r in self.table.slots.values() if r.not_before > now]
        return max(0.05, min([self._monitor_s, *pending]))

    def reconcile(self) -> None:
        """One pass; see the module docstring. Runs on the monitor thread."""
        self.ender.reap()
        self.adoption.end_frozen()
        if self._stop.is_set() or not self._connected.is_set():
            return
        session = session_id(self.zk)
        if session is None:
            return
        if self.registration.session != session:
            # A new session: registered before anything starts under it.
            self.registration.register(session)
            self.adoption.adopt_frozen(session)
        # Topologies whose assignment or StormBase this release cannot read (a newer
        # release's, or damaged; the state logs the node): their workers here are neither
        # started nor stopped and their code is kept, until the node is readable again.
        frozen: set[str] = set()
        self.starter.warm_waiters = 0
        assignments = self.assigned.assignments(frozen)
        desired = desired_workers(assignments, self.id, self.ports)
        # A slot whose wanted code version changed counts its failures afresh (before the
        # heartbeat speaks of it); its worker on the other version is stopped next, and
        # the slot started again on the new one in this pass.
        self.table.note_versions(desired)
        self.table.forget_components(desired, frozen)
        self.registration.set_desired(desired)
        num_workers = self.assigned.num_workers({w.topology_id for w in desired.values()},
                                                frozen)
        self.ender.stop_unwanted(desired, num_workers, frozen)
        self.ender.kill_silent()
        for _port, want in sorted(desired.items()):
            if self._stop.is_set() or not self._may_start(session):
                return
            if want.topology_id in frozen:
                continue
            self.starter.ensure_running(want, num_workers.get(want.topology_id, 1), session)
        self.adoption.keep_unreadable(frozen, session)
        self.adoption.end_orphans("the assignment does not place it on its slot")
        self.cleanup.clean_up(desired, frozen)

    def _may_start(self, session: int) -> bool:
        return self._connected.is_set() and session_id(self.zk) == session

    def _fill_warm(self) -> None:
        if self.warm is None or self._stop.is_set():
            return
        now = time.monotonic()
        # A worker still on its way to its queries' first trigger (or first status) gets
        # the CPU before a new JVM does.
        busy = any(not h.ended_by and h.exit_code() is None and (
            h.last_status_at is None or (h.kind == "pipeline" and not h.triggered
                                         and now - h.started_at < self._start_timeout_s))
            for h in self.table.running())
        self.warm.fill(busy)
