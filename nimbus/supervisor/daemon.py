"""One supervisor process: registration, the reconcile loop, leases, orderly shutdown.

Threads (each named, each stopped by ``_stop`` and joined by :meth:`Supervisor.stop`):

* ``supervisor-monitor``: the reconcile loop. Woken by ZooKeeper watches on this
  supervisor's own assignments (:mod:`nimbus.supervisor.own_assignments`), by connection
  changes and by worker exits, and at least every ``supervisor.monitor.frequency.secs``
  as a safety net. One pass reaps exited workers, (re)registers after a new session,
  reads its assignments (from memory), stops the workers whose slot
  is no longer theirs, kills silent ones, and starts the missing ones whose code is here
  (asking the fetch thread for the others).
* ``supervisor-lease``: :class:`nimbus.supervisor.lease.LeaseKeeper`.
* ``supervisor-code-fetch``: :class:`nimbus.supervisor.code_fetcher.CodeFetcher`, so that
  no fetch (a nimbus far away or cut off, a large bundle to unpack) ever holds up the
  reconcile loop, which is also what stops unassigned workers.
* ``supervisor-heartbeat``: rewrites ``/supervisors/<id>`` every
  ``supervisor.heartbeat.frequency.secs``.
* ``supervisor-class-archive``: builds the Spark class archive once, when a Spark session
  is first wanted here and the host has none yet (:mod:`nimbus.supervisor.class_archive`);
  killed and joined by stop.
* ``worker-status-<topology>:<port>``: one per worker, reading its status pipe; beats go
  to ``/workerbeats``, errors to ``/errors``. Warm workers (``supervisor.warm.workers``,
  :mod:`nimbus.supervisor.warm_pool`) have one each too, from the moment they start.

A suspended connection (kazoo SUSPENDED: a ZooKeeper server restarting, an ensemble
electing a leader, a network blip) stops nothing: the workers run on their leases, which
are renewed again as soon as the session is back, and which end on their own, before the
leader may move the work, if it is not. A worker in a cgroup ends its lease by freezing
itself; the first renewal after the session is back thaws it, and the pipeline goes on
where it stood. A worker frozen longer than ``supervisor.worker.timeout.secs`` is killed
(whether or not the connection is back), and so is every frozen worker when the session
is lost. Nothing starts while it is suspended. A lost
session (LOST) kills every worker at once, on kazoo's event thread (signals only,
nothing blocks there): that is not a crash, so no restart is counted and no backoff
applies. After a new session the supervisor registers again and re-reads the
assignments first, so work the leader moved meanwhile is never started here.

Slot ports are checked at start (bound and released at once) and not held afterwards:
the workers, or their commands, may bind them.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import logging
import os
import random
import shutil
import signal
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    OperationTimeoutError,
    RolledBackError,
)
from kazoo.protocol.states import KazooState

import nimbus
from nimbus import __version__
from nimbus.config import Config, ConfigError
from nimbus.master import worker_state
from nimbus.metrics import MetricsServer, SupervisorMetrics, serve_metrics
from nimbus.redaction import is_secret_key
from nimbus.state.cluster_state import LayoutMissingError, StormClusterState
from nimbus.state.cluster_view import ClusterView, ViewNotLoadedError
from nimbus.state.records import Assignment, ErrorInfo, RecordError, SupervisorInfo, WorkerBeat
from nimbus.state.zk_client import make_zk_client
from nimbus.supervisor.cgroups import (
    WorkerCgroups,
    kill_cgroup,
    unified_root,
    worker_cgroups,
)
from nimbus.supervisor.checkpoint_sweep import sweep_checkpoints
from nimbus.supervisor.class_archive import ARCHIVE_KEY, ClassArchive
from nimbus.supervisor.code_cache import (
    CONF_FILE,
    CodeCache,
    CodeUnavailableError,
    CodeVerificationError,
)
from nimbus.supervisor.code_fetcher import CodeFetcher
from nimbus.supervisor.distributor_source import DistributorSource
from nimbus.supervisor.lease import LeaseKeeper, session_id
from nimbus.supervisor.lease_record import RECORDS_DIR, clear_records, record_path
from nimbus.supervisor.orphans import claim, count_orphans, end_overdue
from nimbus.supervisor.own_assignments import OwnAssignments, assignment_reader
from nimbus.supervisor.policy import (
    DesiredWorker,
    RestartBackoff,
    check_ports_free,
    desired_workers,
)
from nimbus.supervisor.run_as_user import (
    RUN_AS_USER_KEY,
    account_for,
    check_reachable,
    ensure_account,
    own_tree,
    remove_account,
)
from nimbus.supervisor.status_input import (
    ERRORS_PER_MINUTE,
    checked_component_list,
    checked_components,
    checked_error,
)
from nimbus.supervisor.takeover import Orphan, cgroup_of, find_orphans, find_warm_orphans
from nimbus.supervisor.warm_pool import WAIT as WARM_WAIT
from nimbus.supervisor.warm_pool import WARM_KEY, WarmPool, move_log
from nimbus.supervisor.worker_env import worker_env
from nimbus.supervisor.worker_handle import (
    LOG_FILE,
    WORKER_COMMAND,
    WorkerHandle,
    stop_all,
    tidy_warm_dir,
)
from nimbus.thrift.tls import configure_clients
from nimbus.timing import WORKER_LEASE_FRACTION, check_timing
from nimbus.worker.exits import EXIT_WARM_REFUSED
from nimbus.worker.frozen import ORPHAN_TIMEOUT_KEY, REAPERS_CGROUP
from nimbus.worker.pipeline import assigned
from nimbus.worker.spec import SPEC_FILE, WorkerSpec, checkpoint_root_of

log = logging.getLogger(__name__)

#: What a worker gets of its supervisor's configuration: keys under these prefixes...
WORKER_KEY_PREFIXES = ("topology.", "worker.")
#: ... and these (docs/runtime.md, "Configuration of a worker").
WORKER_KEYS = ("storm.local.dir", "supervisor.worker.start.timeout.secs",
               "supervisor.worker.orphan.timeout.secs", "java.library.path")

ID_FILE = "id"
LOCK_FILE = "supervisor.lock"
# A topology whose code could not be fetched is tried again after this long, doubling
# with each failure in a row up to the maximum.
CODE_RETRY_S = 5.0
# Reads and transactions tried to register this supervisor's node while it keeps changing
# under them (an earlier session's node expiring meanwhile, a connection lost mid-commit).
_REGISTER_ATTEMPTS = 5
CODE_RETRY_MAX_S = 300.0
# The supervisor records an error of a slot's worker in /errors once; the same error of
# that slot again (a crash loop's, a refused fetch retried) only after this long. The
# slot's state (SupervisorInfo.workers) says meanwhile that it is restarting, and why.
ERROR_REPEAT_S = 600.0
RECORDED_KEYS = 16   # errors remembered per slot for that (a worker's two, alternating)
# Bytes of a worker's log read for the lines quoted when it exits without saying why.
LOG_TAIL_BYTES = 4096
LOG_TAIL_LINES = 3
# The shortest time between two heartbeats written early because a worker's state
# changed (a crash loop must not rewrite the node at its own pace).
EARLY_HEARTBEAT_GAP_S = 0.25
# How often a supervisor ends the frozen workers of this host that are past their end
# (nimbus/supervisor/orphans.py): their reapers' fallback.
FROZEN_SWEEP_S = 60.0


class SupervisorDirInUseError(OSError):
    """Another supervisor runs with the same ``storm.local.dir``."""


@dataclass
class _SlotRecord:
    """What outlives one worker process on a slot: its restarts and their backoff."""

    restarts: int = 0
    backoff: RestartBackoff = field(default_factory=RestartBackoff)
    not_before: float = 0.0       # time.monotonic() of the earliest next start
    code_failures: int = 0        # fetches of its code that failed in a row
    code_error: str = ""          # the last one's message, recorded once
    cold_reason: str = ""         # why its next start must be cold (a warm one refused)
    waiting_for_warm: bool = False  # its start waits for a warm worker to be ready
    start_failures: int = 0       # starts in a row whose worker command could not run
    # Set when its worker exited as a crash or could not be started, until the next
    # start: it is restarting, after backoff_s, because of last_error.
    failed: bool = False
    backoff_s: float = 0.0
    last_error: str = ""


def check_supervisor_conf(conf: Config) -> None:
    """Raise ConfigError for supervisor keys the loop cannot work with."""
    for key in ("supervisor.heartbeat.frequency.secs", "supervisor.worker.timeout.secs",
                "supervisor.worker.start.timeout.secs", "supervisor.monitor.frequency.secs",
                "supervisor.code.fetch.timeout.secs", ORPHAN_TIMEOUT_KEY):
        if conf[key] <= 0:
            raise ConfigError(f"key {key!r} must be positive, got {conf[key]}")
    if conf["supervisor.worker.shutdown.sleep.secs"] < 0:
        raise ConfigError("key 'supervisor.worker.shutdown.sleep.secs' must be >= 0")
    if conf[WARM_KEY] < 0:
        raise ConfigError(f"key {WARM_KEY!r} must be >= 0 (0: no warm workers), "
                          f"got {conf[WARM_KEY]}")
    check_timing(conf)
    ports = conf["supervisor.slots.ports"]
    if not ports or not all(isinstance(p, int) and not isinstance(p, bool) and 0 < p < 65536
                            for p in ports):
        raise ConfigError(f"key 'supervisor.slots.ports' must list ports (1-65535), got {ports}")


def load_supervisor_id(path: Path) -> str:
    """The id kept in ``path``, or a new uuid written there (so a restart keeps it)."""
    try:
        text = path.read_text(encoding="utf-8").strip()
        if text:
            return text
    except FileNotFoundError:
        pass
    made = str(uuid.uuid4())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(made + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return made


def advertised_host(conf: Config) -> str:
    """``storm.local.hostname``, or the machine's own name when that is empty (Storm's rule)."""
    return conf["storm.local.hostname"] or socket.gethostname()


def _check_hosts(host: str) -> list[str]:
    """Where slot ports are checked: loopback, and the advertised host if it is an
    IPv4 address of this machine."""
    hosts = ["127.0.0.1"]
    try:
        socket.inet_aton(host)
    except OSError:
        return hosts
    if host not in hosts and not host.startswith("0."):
        hosts.append(host)
    return hosts


class Supervisor:
    """A running supervisor; :meth:`start`, then :meth:`stop` (in a process of its own:
    :class:`nimbus.foreground.Foreground`).

    ``worker_command`` is the argv that runs one worker (the worker directory is appended);
    tests may point it at a stand-in that follows the same protocol. ``warm_command`` runs
    a warm worker; by default ``worker_command`` with ``--warm`` when that is the real
    worker, else none (a stand-in has no warm mode).
    """

    def __init__(self, conf: Config, worker_command: tuple[str, ...] = WORKER_COMMAND,
                 warm_command: tuple[str, ...] | None = None):
        check_supervisor_conf(conf)
        self.conf = conf
        self.ports = sorted({int(p) for p in conf["supervisor.slots.ports"]})
        self.host = advertised_host(conf)
        # Checked before anything is taken, so a failure leaves nothing to release.
        check_ports_free(self.ports, _check_hosts(self.host))
        self.local_dir = conf.local_dir
        self.supervisor_dir = self.local_dir / "supervisor"
        self.supervisor_dir.mkdir(parents=True, exist_ok=True)
        self._dir_lock = self._lock_dir()
        self.id = load_supervisor_id(self.supervisor_dir / ID_FILE)
        self.workers_dir = self.local_dir / "workers"
        self.code = CodeCache(self.supervisor_dir / "stormdist",
                              conf["nimbus.max.topology.bytes"])
        self._run_as_user = bool(conf[RUN_AS_USER_KEY])
        if self._run_as_user:
            self._prepare_run_as_user()
        self._worker_command = tuple(worker_command)
        self._warm_command = warm_command if warm_command is not None else (
            (*WORKER_COMMAND, "--warm") if tuple(worker_command) == WORKER_COMMAND else None)
        self.warm: WarmPool | None = None   # made by start(), see _make_warm_pool
        self._grace_s = float(conf["supervisor.worker.shutdown.sleep.secs"])
        self._timeout_s = float(conf["supervisor.worker.timeout.secs"])
        self._start_timeout_s = float(conf["supervisor.worker.start.timeout.secs"])
        self._monitor_s = float(conf["supervisor.monitor.frequency.secs"])
        self._heartbeat_s = float(conf["supervisor.heartbeat.frequency.secs"])
        # How old a worker's last beat may be for it to count as running (the readers'
        # rule, nimbus/master/worker_state.py; here on this host's monotonic clock).
        self._task_timeout_s = float(conf["nimbus.task.timeout.secs"])
        self.started_at = time.time()

        self._lock = threading.Lock()           # guards _workers; never held while blocking
        self._workers: dict[int, WorkerHandle] = {}
        self._slots: dict[tuple[str, int], _SlotRecord] = {}   # monitor thread only
        # The slots the last pass found assigned here (replaced whole by the monitor
        # thread, read by the heartbeat and metrics threads): what SupervisorInfo.workers
        # speaks of.
        self._desired: dict[int, DesiredWorker] = {}
        # (topology, port) -> {what was recorded in /errors for the slot's worker: when}
        # (see ERROR_REPEAT_S; at most RECORDED_KEYS each). Written by the monitor and
        # the status reader threads.
        self._recorded: dict[tuple[str, int], dict[str, float]] = {}
        self._recorded_lock = threading.Lock()
        self._heartbeat_now = threading.Event()  # a worker's state changed: say so now
        self._registered_session: int | None = None
        self._connected = threading.Event()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.passes = 0  # reconcile passes completed (tests wait on it)
        self._stopping = False
        self._stopping_lock = threading.Lock()

        configure_clients(conf)  # code fetches present this supervisor's certificate
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
                private_copies=self._run_as_user)
        if self.zk.connected:
            self._connected.set()
        # This supervisor's assignments, in memory and kept current by watches on its own
        # index node and the assignments it names (made at the first pass: the layout may
        # not be there yet; nimbus/supervisor/own_assignments.py).
        self.view: OwnAssignments | ClusterView | None = None
        self._view_started = False
        self._layout_problem = ""   # the LayoutMissingError last logged, if any
        self.fetcher: CodeFetcher | None = None   # made by start()
        self._owned_code: set[str] = set()   # code already given to its own account
        self.cgroups: WorkerCgroups | None = None  # found by start()
        self._warm_waiters = 0   # see reconcile
        # Workers an earlier process of this supervisor left running, by port: taken over
        # or ended by the first complete reconcile pass (nimbus/supervisor/takeover.py).
        self._orphans: dict[int, Orphan] = {}
        # Slots where a worker of the earlier process could not be identified: nothing
        # starts there before this time.monotonic(), when its lease has surely ended.
        self._held_until: dict[int, float] = {}
        self.class_archive: ClassArchive | None = None  # started by start()
        self._lease = LeaseKeeper(
            self.zk, lambda: self.node_path, lambda: self.zk.session_timeout.seconds,
            self._running_handles,
            assignment_path=lambda topology_id: self.state.path("assignments", topology_id),
            holds=self._assignment_holds, may_renew=self._connected.is_set,
            on_unassigned=self._on_unassigned)
        self._monitor = threading.Thread(target=self._monitor_loop, name="supervisor-monitor",
                                         daemon=True)
        self._heartbeat = threading.Thread(target=self._heartbeat_loop,
                                           name="supervisor-heartbeat", daemon=True)
        # list() copies in one step under the GIL: the monitor thread owns _slots.
        self.metrics = SupervisorMetrics(
            self._running_handles,
            lambda: {key: r.restarts for key, r in list(self._slots.items())},
            warm=lambda: self.warm.summary() if self.warm is not None else None,
            code_fetches=lambda: dict(self.code.fetched_from),
            states=self.slot_states, frozen_orphans=self._frozen_orphans)
        self._next_frozen_sweep = 0.0   # time.monotonic(); monitor thread only
        self.metrics_server: MetricsServer | None = None

    def _make_warm_pool(self) -> WarmPool | None:
        """The warm workers (``supervisor.warm.workers``), or None, saying why not."""
        size = int(self.conf[WARM_KEY])
        if size == 0:
            return None
        why = ""
        if self._run_as_user:
            why = (f"workers run as their topology's account ({RUN_AS_USER_KEY}), and a warm "
                   "worker is started before it knows which")
        elif self._warm_command is None:
            why = "this supervisor's worker command has no warm mode"
        elif importlib.util.find_spec("pyspark") is None:
            why = "pyspark is not installed for this Python"
        if why:
            log.warning("%s %d ignored: %s", WARM_KEY, size, why)
            return None
        assert self._warm_command is not None
        pool = WarmPool(
            size, self.supervisor_dir / "warm", self._warm_command, self._warm_spec,
            lambda: worker_env(self.conf), self.cgroups, self._start_timeout_s,
            wake=self._wake.set)
        cgroup_root = unified_root() if self.cgroups is not None else None
        kept = pool.adopt(find_warm_orphans(pool.root, cgroup_root), cgroup_root)
        pool.clear_leftovers({d for orphan in self._orphans.values()
                              for d in orphan.working_dirs()} | set(kept))
        log.info("keeping %d warm workers ready (%s)", size, WARM_KEY)
        return pool

    def _warm_spec(self, n: int, lease_fd: int, status_fd: int) -> WorkerSpec:
        # The cluster's defaults for topologies, as every worker gets them, and no
        # topology's own keys: the session is made before any topology is known.
        return WorkerSpec(topology_id=f"warm-{n}", port=0, supervisor_id=self.id,
                          host=self.host, code_dir="", lease_fd=lease_fd,
                          status_fd=status_fd, conf=self._cluster_worker_conf(),
                          class_archive=self._class_archive_path())

    def _class_archive_path(self) -> str:
        """The archive for a Spark worker starting now (building it if need be)."""
        if self.class_archive is None:
            return ""
        self.class_archive.needed()
        return self.class_archive.path

    def _prepare_run_as_user(self) -> None:
        """Checks and modes for workers that run as accounts of their own: this
        supervisor's directories traversable, not listable; its files its own only."""
        if os.geteuid() != 0:
            self._dir_lock.close()
            raise ConfigError(f"{RUN_AS_USER_KEY} needs the supervisor to run as root: it "
                              "makes the accounts and starts workers as them")
        try:
            check_reachable([Path(sys.executable), Path(nimbus.__file__).parent])
        except ConfigError:
            self._dir_lock.close()
            raise
        for directory in (self.local_dir, self.supervisor_dir, self.workers_dir,
                          self.code.root):
            directory.mkdir(parents=True, exist_ok=True)
            os.chmod(directory, 0o711)
        for child in self.supervisor_dir.iterdir():
            if child.is_file():
                os.chmod(child, 0o600)

    def _lock_dir(self) -> Any:
        handle = open(self.supervisor_dir / LOCK_FILE, "a")  # held until stop()
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            raise SupervisorDirInUseError(
                f"another supervisor runs with storm.local.dir {self.local_dir}") from None
        return handle

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Register, then start the threads; raises if ZooKeeper refuses the registration."""
        # First: a taken metrics port fails the start before anything is registered.
        self.metrics_server = serve_metrics(
            self.metrics.registry, self.conf["supervisor.metrics.bind.address"],
            self.conf["supervisor.metrics.port"], "supervisor-metrics", conf=self.conf)
        if self.metrics_server is not None:
            self.metrics_server.start()
        self.zk.add_listener(self._on_connection_state)
        session = session_id(self.zk)
        if session is not None:
            try:
                self._register(session)
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
            self._sweep_frozen()
        else:
            log.warning("workers run without cgroups (%s): a command that leaves its "
                        "process group (setsid, a daemon) can outlive its worker; see "
                        "docs/runtime.md", why)
        # Made here, not in __init__: it fetches into whatever self.code is by now.
        self.fetcher = CodeFetcher(self.code, lambda topology_id: self._peers(topology_id),
                                   on_done=self._wake.set,
                                   timeout_s=float(self.conf["supervisor.code.fetch.timeout.secs"]))
        self.fetcher.start()
        if self.conf[ARCHIVE_KEY]:
            self.class_archive = ClassArchive(self.supervisor_dir / "class-archive")
            self.class_archive.start()
        # First: a warm worker taken for a slot works in its warm directory, which the
        # warm pool would otherwise clear as an earlier run's.
        found = find_orphans(self.workers_dir, self.ports,
                             unified_root() if self.cgroups is not None else None,
                             records_dir=self.supervisor_dir / RECORDS_DIR)
        self._orphans = found.orphans
        clear_records(self.supervisor_dir / RECORDS_DIR,
                      keep={f"{o.topology_id}-{o.port}" for o in found.orphans.values()})
        if found.unidentified:
            # The longest lease the earlier process may have granted: 2/3 of its session
            # timeout, which ZooKeeper may have raised above the configured one.
            hold_s = WORKER_LEASE_FRACTION * max(
                float(self.conf["storm.zookeeper.session.timeout"]) / 1000,
                self.zk.session_timeout.seconds if self.zk.connected else 0.0)
            self._held_until = dict.fromkeys(found.unidentified, time.monotonic() + hold_s)
        self.warm = self._make_warm_pool()
        self._lease.start()
        self._heartbeat.start()
        self._monitor.start()
        log.info("supervisor %s started on %s with slots %s", self.id, self.host,
                 ",".join(map(str, self.ports)))

    def stop(self) -> None:
        """Stop every worker gracefully (their leases still renewed meanwhile), then the
        threads, then the ZooKeeper session (which removes this supervisor's node)."""
        with self._stopping_lock:
            if self._stopping:
                return
            self._stopping = True
        self._stop.set()
        self._wake.set()
        if self._monitor.is_alive():
            self._monitor.join(timeout=60)
        with self._lock:
            handles = list(self._workers.values())
            self._workers.clear()
        if handles:
            log.info("stopping %d workers", len(handles))
            stop_all(handles, self._grace_s)
        self._end_orphans("this supervisor stops")
        if self.warm is not None:
            self.warm.stop(self._grace_s)
        if self.class_archive is not None:
            self.class_archive.stop()
        if self.fetcher is not None:
            self.fetcher.stop()
        if self.code.distributor is not None:
            self.code.distributor.close()
        self._lease.stop()
        self._heartbeat_now.set()
        if self._heartbeat.is_alive():
            self._heartbeat.join(timeout=10)
        if self.view is not None:
            self.view.close()
        if self.cgroups is not None:
            with contextlib.suppress(OSError):  # empty by now; left if not (a reaper
                (self.cgroups.base / REAPERS_CGROUP).rmdir()  # of a frozen worker waits)
            with contextlib.suppress(OSError):
                self.cgroups.base.rmdir()
        if self.metrics_server is not None:
            self.metrics_server.stop()
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
            killed, kept = self._end_with_session()
            log.warning("ZooKeeper session lost: killed %d workers, kept %d frozen (a "
                        "renewal of the next session thaws each whose assignment is "
                        "unchanged)", killed, kept)
        elif state == KazooState.CONNECTED:
            self._connected.set()
            log.info("ZooKeeper connection back (session %s)", _hex(session_id(self.zk)))
        self._wake.set()

    def _end_with_session(self) -> tuple[int, int]:
        """At a lost session: kill every worker but those frozen on a lapsed lease with
        a known assignment version, which act no more than dead ones and are kept for
        the next session (:meth:`_adopt_frozen`); (killed, kept)."""
        with self._lock:
            handles = [h for h in self._workers.values() if not h.ended_by]
        killed = kept = 0
        for handle in handles:
            if handle.assignment_version is not None and handle.run_as is None and \
                    handle.is_frozen():
                kept += 1
                continue
            killed += handle.exit_code() is None   # one may have died of its lease already
            handle.kill("lost")
        return killed, kept

    def _adopt_frozen(self, session: int) -> None:
        """Make the workers kept frozen through a lost session (:meth:`_end_with_session`)
        this ``session``'s: its renewals thaw each whose assignment's mzxid is the one its
        last renewal read. Its work cannot have moved away and back meanwhile, since every
        move rewrites the assignment; one whose assignment was rewritten is killed
        (:meth:`WorkerHandle.renew`)."""
        adopted = 0
        for handle in self._running_handles():
            if not handle.ended_by and handle.session_id != session and handle.is_frozen():
                handle.session_id = session
                adopted += 1
        if adopted:
            log.info("%d workers kept frozen through the lost session wait for a renewal "
                     "of session %s", adopted, _hex(session))
            self._lease.wake()

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
        self._wake.set()

    def _running_handles(self) -> list[WorkerHandle]:
        with self._lock:
            return list(self._workers.values())

    # -- registration ---------------------------------------------------------------------
    def _info(self) -> SupervisorInfo:
        with self._lock:
            used = sorted(self._workers)
        warm = self.warm.summary() if self.warm is not None else None
        return SupervisorInfo(time_secs=int(time.time()), hostname=self.host,
                              assignment_id=self.id, used_ports=used, meta=list(self.ports),
                              uptime_secs=int(time.time() - self.started_at),
                              version=__version__,
                              warm_ready=warm.ready if warm else 0,
                              warm_starting=warm.starting if warm else 0,
                              warm_memory_bytes=warm.memory_bytes if warm else 0,
                              workers={str(port): said.as_record()
                                       for port, said, _ in self._statements()})

    def _statements(self) -> list[tuple[int, worker_state.Statement, float | None]]:
        """(port, what this supervisor says of its worker, when its beat was last
        written (time.monotonic(); None: never)) of every slot the last pass found
        assigned here. Called from the heartbeat and metrics threads: it reads the
        monitor's records without a lock, each field whole."""
        handles = {h.port: h for h in self._running_handles()}
        out = []
        for port, want in sorted(self._desired.items()):
            record = self._slots.get((want.topology_id, port))
            handle = handles.get(port)
            beat_at = None
            restarts = record.restarts if record is not None else 0
            if handle is not None and handle.topology_id == want.topology_id and \
                    not handle.ended_by:
                beat_at = handle.last_beat_at
                state = worker_state.FROZEN if handle.is_frozen() else (
                    worker_state.STARTING if beat_at is None else worker_state.RUNNING)
                # A new process of a crash loop: the error that ended the last one.
                error = handle.last_error or (record.last_error if record and
                                              state == worker_state.STARTING else "")
                backoff = 0
            elif record is not None and record.failed:
                state, error = worker_state.RESTARTING, record.last_error
                backoff = int(round(record.backoff_s))
            else:  # fetching its code, waiting for a warm worker or its turn to start
                state, backoff = worker_state.STARTING, 0
                error = record.last_error if record is not None else ""
            out.append((port, worker_state.Statement(
                want.topology_id, state, restarts, backoff, worker_state.first_line(error)),
                beat_at))
        return out

    def slot_states(self) -> dict[tuple[str, int], str]:
        """(topology, port) -> the state of the worker of every slot assigned here, by
        the readers' rule (nimbus/master/worker_state.py) on this host's clock: what
        ``supervisor_worker_state`` exports. A worker whose beat is older than
        ``nimbus.task.timeout.secs`` is not running but dead, as the readers show it."""
        now = time.monotonic()
        out = {}
        for port, said, beat_at in self._statements():
            state = said.state
            if state == worker_state.RUNNING and (
                    beat_at is None or now - beat_at > self._task_timeout_s):
                state = worker_state.DEAD
            out[(said.topology_id, port)] = state
        return out

    def _register(self, session: int) -> None:
        """Create this session's ephemeral ``/supervisors/<id>``; a node left by an earlier
        session (this supervisor restarted before it expired) is replaced, since it would
        vanish when that session ends.

        The replacement is one transaction (delete, create). The leader moves the work
        of a supervisor whose node is gone at once, on the grounds that its session has
        ended and its leases with it; an earlier session that still lives would break
        those grounds for as long as the node were missing between two separate calls.
        """
        parent = self.state.path("supervisors")
        if self.zk.retry(self.zk.exists, parent) is None:
            # Not created here: an absent layout may be a wrong root as well as a cluster
            # no nimbus has started yet, and only a nimbus sets a cluster up.
            raise LayoutMissingError(
                f"no nimbus has set the cluster up under {self.state.root} yet (there is no "
                f"{parent}): waiting for one to start (or check storm.zookeeper.root)")
        data = self._info().encode()
        for _attempt in range(_REGISTER_ATTEMPTS):
            stat = self.zk.retry(self.zk.exists, self.node_path)
            if stat is None:
                try:
                    self.zk.retry(self.zk.create, self.node_path, data, ephemeral=True)
                    break
                except NodeExistsError:
                    continue  # an earlier session's node, created meanwhile: read again
            if stat.ephemeralOwner == session:
                self.zk.retry(self.zk.set, self.node_path, data)
                break
            txn = self.zk.transaction()
            txn.delete(self.node_path, version=stat.version)
            txn.create(self.node_path, data, ephemeral=True)
            try:
                results = txn.commit()
            except (ConnectionLoss, OperationTimeoutError):
                continue  # committed or not: what the node is now tells
            failed = [r for r in results if isinstance(r, Exception)
                      and not isinstance(r, RolledBackError)]
            if not failed:
                log.info("replaced the node of this supervisor's earlier session %s",
                         _hex(stat.ephemeralOwner))
                break
            if not isinstance(failed[0], (NoNodeError, BadVersionError, NodeExistsError)):
                raise failed[0]
            # The node changed between the read and the transaction: read it again.
        else:
            raise KazooException(f"could not register {self.node_path}: it kept changing "
                                 f"under {_REGISTER_ATTEMPTS} attempts")
        self._registered_session = session
        log.info("registered supervisor %s (session %s)", self.id, _hex(session))

    def _heartbeat_loop(self) -> None:
        # Every supervisor.heartbeat.frequency.secs, and early (at most every
        # EARLY_HEARTBEAT_GAP_S) when a worker's state changed: readers judge workers by
        # what this node says and by when ZooKeeper wrote it (nimbus/master/worker_state).
        while not self._stop.is_set():
            self._heartbeat_now.wait(self._heartbeat_s)
            self._heartbeat_now.clear()
            if self._stop.is_set():
                return
            session = session_id(self.zk)
            if session is None or session != self._registered_session:
                continue  # the monitor registers a new session first
            try:
                self.zk.set(self.node_path, self._info().encode())
            except NoNodeError:
                self._registered_session = None
                self._wake.set()
            except KazooException as exc:
                log.debug("supervisor heartbeat failed: %s", exc)
            self._stop.wait(EARLY_HEARTBEAT_GAP_S)

    # -- the reconcile loop ---------------------------------------------------------------
    def _monitor_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconcile()
                if self._layout_problem:
                    log.info("the cluster's layout is there: reconciling")
                    self._layout_problem = ""
                self._fill_warm()
                self._sweep_frozen()
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
            self._wake.wait(self._next_wait())
            self._wake.clear()

    def _sweep_frozen(self) -> None:
        """End the frozen workers of this host past their end (any supervisor's: the
        deadline is each worker's own), every FROZEN_SWEEP_S; see nimbus/supervisor/
        orphans.py. Monitor thread (and start)."""
        root = unified_root() if self.cgroups is not None else None
        if root is None or time.monotonic() < self._next_frozen_sweep:
            return
        self._next_frozen_sweep = time.monotonic() + FROZEN_SWEEP_S
        end_overdue(root)

    def _frozen_orphans(self) -> int:
        """Frozen workers of this host whose supervisor process is gone (metrics)."""
        root = unified_root() if self.cgroups is not None else None
        if root is None or self.cgroups is None:
            return 0
        return count_orphans(root, self.cgroups.base)

    def _fill_warm(self) -> None:
        if self.warm is None or self._stop.is_set():
            return
        now = time.monotonic()
        # A worker still on its way to its first batch (or first status) gets the CPU
        # before a new JVM does.
        busy = any(not h.ended_by and h.exit_code() is None and (
            h.last_status_at is None or (h.kind == "pipeline" and not h.committed
                                         and now - h.started_at < self._start_timeout_s))
            for h in self._running_handles())
        self.warm.fill(busy)

    def _next_wait(self) -> float:
        now = time.monotonic()
        pending = [r.not_before - now for r in self._slots.values() if r.not_before > now]
        return max(0.05, min([self._monitor_s, *pending]))

    def reconcile(self) -> None:
        """One pass; see the module docstring. Runs on the monitor thread."""
        self._reap()
        self._end_frozen()
        if self._stop.is_set() or not self._connected.is_set():
            return
        session = session_id(self.zk)
        if session is None:
            return
        if self._registered_session != session:
            self._register(session)   # a new session: registered before anything starts
            self._adopt_frozen(session)
        # Topologies whose assignment or StormBase this release cannot read (a newer
        # release's, or damaged; the state logs the node): their workers here are neither
        # started nor stopped and their code is kept, until the node is readable again.
        frozen: set[str] = set()
        self._warm_waiters = 0  # slots of this pass that wait for a starting warm worker
        assignments = self._read_assignments(frozen)
        desired = desired_workers(assignments, self.id, self.ports)
        if desired != self._desired:
            self._desired = desired
            self._heartbeat_now.set()
        num_workers = self._num_workers({w.topology_id for w in desired.values()}, frozen)
        self._stop_unwanted(desired, num_workers, frozen)
        self._kill_silent()
        for _port, want in sorted(desired.items()):
            if self._stop.is_set() or not self._may_start(session):
                return
            if want.topology_id in frozen:
                continue
            self._ensure_running(want, assignments[want.topology_id],
                                 num_workers.get(want.topology_id, 1), session)
        for port, orphan in list(self._orphans.items()):
            if orphan.topology_id in frozen:  # unreadable here: kept, as its workers are
                del self._orphans[port]
                self._take_over(orphan, None, session)
        self._end_orphans("the assignment does not place it on its slot")
        self._clean_up(desired, frozen)

    def _read_assignments(self, frozen: set[str]) -> dict[str, Assignment]:
        """Every readable assignment (from the view); adds the ids of unreadable ones to
        ``frozen``. LayoutMissingError until a nimbus has made the layout."""
        if not self._view_started:
            # LayoutMissingError if a nimbus has not made the layout yet.
            view = assignment_reader(self.state, self.id,
                                     self.conf["supervisor.view.audit.nodes.per.sec"])
            view.listen(lambda _directory, _topology: self._wake.set())
            try:
                view.start()
            except BaseException:
                view.close()
                raise
            self.view, self._view_started = view, True
        assert self.view is not None
        out = {}
        for topology_id in self.view.assignment_ids():
            try:
                found = self.view.assignment(topology_id)
                assignment = found[0] if found is not None else None
            except RecordError:
                frozen.add(topology_id)
                continue
            if assignment is not None:
                out[topology_id] = assignment
        return out

    def _num_workers(self, topology_ids: set[str], frozen: set[str]) -> dict[str, int]:
        out = {}
        for topology_id in topology_ids:
            try:
                base = self.state.storm_base(topology_id)
            except RecordError:
                frozen.add(topology_id)
                continue
            out[topology_id] = max(1, base.num_workers) if base is not None else 1
        return out

    def _may_start(self, session: int) -> bool:
        return self._connected.is_set() and session_id(self.zk) == session

    def _reap(self) -> None:
        """Release every worker that has exited; schedule restarts of crashed ones."""
        with self._lock:
            exited = {p: h for p, h in self._workers.items() if h.exit_code() is not None}
            for port in exited:
                del self._workers[port]
        now = time.monotonic()
        for handle in exited.values():
            code = handle.exit_code()
            handle.release()
            ran_out = now >= handle.lease_deadline if handle.lease_deadline is not None \
                else handle.is_taken_over  # on a lease granted by the earlier process
            if not handle.ended_by and code == -signal.SIGKILL and ran_out:
                # It killed its own group because no renewal came (this process was
                # frozen, or cut off): the lease rule at work, not a crash.
                handle.ended_by = "lease"
                log.warning("worker %s killed itself: its lease ran out", handle.name)
            if handle.ended_by in ("lost", "stop", "lease"):
                continue  # the supervisor or its lease ended it: not a crash
            record = self._slots.setdefault((handle.topology_id, handle.port), _SlotRecord())
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
            if handle.ended_by != "timeout" and handle.errors_reported == 0:
                message = f"worker exited with code {code}"
                tail = _log_tail(handle.worker_dir / LOG_FILE, handle.log_offset) \
                    if code and code > 0 and handle.log_offset is not None else ""
                self._report(handle, handle_executor(handle),
                             f"{message}: {tail}" if tail else message)
            record.failed, record.backoff_s = True, delay
            record.last_error = handle.last_error or f"worker exited with code {code}"
            self._heartbeat_now.set()
            log.warning("worker %s exited with code %s; restart in %.0fs", handle.name, code,
                        delay)

    def _stop_unwanted(self, desired: dict[int, DesiredWorker],
                       num_workers: dict[str, int], frozen: set[str]) -> None:
        doomed = []
        with self._lock:
            for port, handle in list(self._workers.items()):
                if handle.topology_id in frozen:
                    continue
                want = desired.get(port)
                if want is None or want.topology_id != handle.topology_id:
                    why = "no longer assigned here"
                elif (want.worker_index != handle.worker_index
                      or num_workers.get(want.topology_id) != handle.num_workers):
                    if self._keeps_its_share(handle, want.worker_index,
                                             num_workers.get(want.topology_id, 1)):
                        continue
                    why = "its place in the topology changed"
                else:
                    continue
                doomed.append(self._workers.pop(port))
                log.info("stopping worker %s: %s", handle.name, why)
        if doomed:
            stop_all(doomed, self._grace_s)
        for handle in doomed:
            want = desired.get(handle.port)
            if want is None or want.topology_id != handle.topology_id:
                self._slots.pop((handle.topology_id, handle.port), None)

    @staticmethod
    def _keeps_its_share(handle: WorkerHandle, worker_index: int, num_workers: int) -> bool:
        """Whether a worker runs the same components as ``worker-<index>`` of
        ``num_workers`` as it does now (a process topology's workers all run the same
        command; a pipeline's share depends on both); if so it is told its new place and
        kept."""
        if handle.ended_by:
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

    def _end_frozen(self) -> None:
        """Kill every worker frozen (its lease ran out, nimbus/worker/lease.py) for longer
        than ``supervisor.worker.timeout.secs``: the connection is not coming back soon,
        and the leader may give up on its work. Not a crash: the lease rule at work."""
        now = time.monotonic()
        for handle in self._running_handles():
            if handle.ended_by or handle.lease_deadline is None:
                continue
            frozen_s = now - handle.lease_deadline
            if frozen_s > self._timeout_s and handle.is_frozen():
                log.warning("worker %s: frozen %.0fs since its lease ran out "
                            "(supervisor.worker.timeout.secs %.0f); killed", handle.name,
                            frozen_s, self._timeout_s)
                handle.kill("lease")

    def _kill_silent(self) -> None:
        now = time.monotonic()
        for handle in self._running_handles():
            if handle.ended_by or handle.is_frozen():  # _end_frozen's to judge
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
                self._report(handle, handle_executor(handle), message,
                             key=f"silent:{key}")

    def _ensure_running(self, want: DesiredWorker, assignment: Assignment, num_workers: int,
                        session: int) -> None:
        with self._lock:
            if want.port in self._workers:
                return
        orphan = self._orphans.pop(want.port, None)
        if orphan is not None and self._take_over(orphan, (want, num_workers), session):
            return
        held = self._held_until.get(want.port)
        if held is not None:
            if time.monotonic() < held:
                return
            del self._held_until[want.port]
        record = self._slots.setdefault((want.topology_id, want.port), _SlotRecord())
        if record.not_before > time.monotonic():
            return
        try:
            # Never waits: the fetch runs on its own thread and wakes this loop when done.
            assert self.fetcher is not None, "start() makes the fetcher"
            code_dir = self.fetcher.request(want.topology_id, assignment.code_sha256)
        except CodeUnavailableError as exc:
            # Tried again later, ever later (5 s doubling to 5 minutes): a bundle that
            # fails its checks (a lie about its size, an unsafe entry) fails every time.
            record.code_failures += 1
            delay = min(CODE_RETRY_MAX_S, CODE_RETRY_S * 2 ** (record.code_failures - 1))
            record.not_before = time.monotonic() + delay
            log.warning("cannot start worker %s:%d: %s (next try in %.1fs)",
                        want.topology_id, want.port, exc, delay)
            # The topology's owner must hear of it (issue 29: a refused download was a
            # supervisor's WARNING only), once per kind of failure and ERROR_REPEAT_S:
            # the text names nimbuses in a random order, so it is no key.
            corrupt = isinstance(exc, CodeVerificationError)
            text = (f"its code cannot be used here: {exc}" if corrupt else
                    f"its code cannot be fetched: {exc}")
            record.code_error = str(exc)
            self._failed_start(want, record, delay, text,
                               key="code:corrupt" if corrupt else "code:unavailable")
            return
        if code_dir is None:
            return
        record.code_failures, record.code_error = 0, ""
        conf = self.worker_conf(code_dir)
        worker_dir = self.workers_dir / f"{want.topology_id}-{want.port}"
        kind = "process" if (
            self.code.resources(want.topology_id) / "topology.yaml").exists() else "pipeline"
        if not self._may_start(session):
            return
        # What worker.json says, either way; the descriptors are the worker's own.
        spec = WorkerSpec(
            topology_id=want.topology_id, port=want.port, supervisor_id=self.id,
            host=self.host, code_dir=str(self.code.resources(want.topology_id)), conf=conf,
            restarts=record.restarts, worker_index=want.worker_index,
            num_workers=num_workers, lease_fd=-1, status_fd=-1,
            class_archive=self._class_archive_path() if kind == "pipeline" else "")
        if self._start_warm(want, record, spec, session, worker_dir, kind):
            return
        handle = WorkerHandle(want.topology_id, want.port, worker_dir, session,
                              record.restarts, self._on_status, self._on_closed,
                              command=self._worker_command)
        handle.record_path = record_path(self.supervisor_dir, want.topology_id, want.port)
        handle.worker_index = want.worker_index
        handle.num_workers = num_workers
        handle.kind = kind
        if self._run_as_user:
            handle.run_as = self._account(want.topology_id, code_dir, conf)
        if self.cgroups is not None:
            handle.cgroups = self.cgroups
            handle.cgroup = self.cgroups.make(f"{want.topology_id}-{want.port}")

        def write_spec(lease_fd: int, status_fd: int) -> None:
            if handle.run_as is not None:  # its own directory, its own only
                os.chown(worker_dir, *handle.run_as)
                os.chmod(worker_dir, 0o700)
            spec.lease_fd, spec.status_fd = lease_fd, status_fd
            spec.dump(worker_dir / SPEC_FILE)  # mode 0600: the configuration may hold secrets
            if handle.run_as is not None:
                os.chown(worker_dir / SPEC_FILE, *handle.run_as)

        log.info("starting worker %s:%d (restart %d)", want.topology_id, want.port,
                 record.restarts)
        env = worker_env(self.conf)
        if handle.run_as is not None:
            account = account_for(want.topology_id)
            env.update(HOME=str(worker_dir), USER=account, LOGNAME=account)
            if handle.cgroup is not None:  # it kills its own cgroup on lease loss
                os.chown(handle.cgroup / "cgroup.kill", *handle.run_as)
        try:
            handle.start(write_spec, env=env)
        except OSError as exc:
            # The worker command cannot be run at all (a missing interpreter, a full
            # process table): retried as a fetch is, and said, not a reconcile failure.
            if handle.cgroup is not None and self.cgroups is not None:
                self.cgroups.remove(handle.cgroup)
            record.start_failures += 1
            delay = min(CODE_RETRY_MAX_S, CODE_RETRY_S * 2 ** (record.start_failures - 1))
            record.not_before = time.monotonic() + delay
            log.warning("cannot start worker %s:%d: %s (next try in %.1fs)",
                        want.topology_id, want.port, exc, delay)
            self._failed_start(want, record, delay,
                               f"cannot run the worker command {self._worker_command[0]}: "
                               f"{exc}", key="spawn")
            return
        record.start_failures, record.failed = 0, False
        with self._lock:
            self._workers[want.port] = handle
        self._heartbeat_now.set()
        # Its first lease from a round trip that shows its assignment: asked for now.
        self._lease.wake()
        if not self._connected.is_set():
            handle.kill("lost")  # the connection went while it was being started

    def _take_over(self, orphan: Orphan, wanted: tuple[DesiredWorker, int] | None,
                   session: int) -> bool:
        """Make ``orphan`` the slot's worker if it runs what the assignment wants there,
        ``wanted`` = (the slot's desired worker, the topology's worker count), or None
        for a topology whose assignment cannot be read (True); else end it (False: the
        slot starts a worker as usual)."""
        if wanted is not None:
            want, num_workers = wanted
            if (orphan.topology_id, orphan.worker_index, orphan.num_workers) != \
                    (want.topology_id, want.worker_index, num_workers):
                self._end_orphan(orphan, "the assignment wants another worker on its slot")
                return False
        # What it runs is read from the code here, not taken from what it says.
        resources = self.code.resources(orphan.topology_id)
        if not resources.is_dir():
            self._end_orphan(orphan, "its topology's code is not on this host")
            return False
        cgroup = self._orphan_cgroup(orphan)
        working_dirs = orphan.working_dirs()
        handle = WorkerHandle.taken_over(orphan, session, self._on_status, self._on_closed)
        handle.kind = "process" if (resources / "topology.yaml").exists() else "pipeline"
        handle.record_path = record_path(self.supervisor_dir, orphan.topology_id, orphan.port)
        if orphan.frozen:
            # Ended by _end_frozen unless a renewal thaws it within the worker timeout.
            handle.lease_deadline = time.monotonic()
        if self.warm is not None:  # tidied when it is gone, as a taken warm worker's is
            handle.warm_dir = next((d for d in working_dirs if d.parent == self.warm.root),
                                   None)
        if cgroup is not None:
            handle.cgroups, handle.cgroup = self.cgroups, cgroup
        if handle.exit_code() is not None:
            handle.release()
            log.info("worker %s ended before it could be taken over", orphan.name)
            return False
        record = self._slots.setdefault((orphan.topology_id, orphan.port), _SlotRecord())
        record.restarts = orphan.restarts
        with self._lock:
            self._workers[orphan.port] = handle
        # Said at once: a statement written before the take-over (this process's first)
        # counted no restarts for the slot, and readers believe the supervisor's count.
        self._heartbeat_now.set()
        # Renewed by the next round trip that shows its assignment, if its lease lasts.
        self._lease.wake()
        log.info("took over worker %s, left %s by this supervisor's earlier process",
                 orphan.name, "frozen" if orphan.frozen else "running")
        if not self._connected.is_set():
            handle.kill("lost")
        return True

    def _orphan_cgroup(self, orphan: Orphan) -> Path | None:
        """The worker cgroup an orphan runs in (``<topology>-<port>``, or ``warm-<n>``
        for one that was warm), if it is one of this supervisor's."""
        if self.cgroups is None:
            return None
        root = unified_root()
        cgroup = cgroup_of(orphan.pid, root) if root is not None else None
        return cgroup if cgroup is not None and cgroup.parent == self.cgroups.base else None

    def _end_orphan(self, orphan: Orphan, why: str) -> None:
        log.info("ending worker %s, left running by this supervisor's earlier process: %s",
                 orphan.name, why)
        cgroup = self._orphan_cgroup(orphan)
        warm_dirs = [d for d in orphan.working_dirs()
                     if self.warm is not None and d.parent == self.warm.root]
        orphan.kill()
        if cgroup is not None:  # what left its process group too
            kill_cgroup(cgroup)
        for directory in warm_dirs:
            tidy_warm_dir(directory)

    def _end_orphans(self, why: str) -> None:
        orphans, self._orphans = self._orphans, {}
        for orphan in orphans.values():
            self._end_orphan(orphan, why)

    def _start_warm(self, want: DesiredWorker, record: _SlotRecord, spec: WorkerSpec,
                    session: int, worker_dir: Path, kind: str) -> bool:
        """Run ``want`` on a warm worker if one can take it, or leave it to wait for one
        that is starting (True); else log why not (False: start it cold)."""
        if self.warm is None or kind != "pipeline":
            return False
        if record.cold_reason:
            handle, why = None, record.cold_reason
            record.cold_reason = ""
        else:
            handle, why = self.warm.take(spec, waiting_ahead=self._warm_waiters)
        if handle is None and why == WARM_WAIT:
            self._warm_waiters += 1
            if not record.waiting_for_warm:  # said once per wait
                record.waiting_for_warm = True
                log.info("worker %s:%d waits for the warm worker that is starting",
                         want.topology_id, want.port)
            return True  # taken on the pass its readiness (or its exit) wakes
        record.waiting_for_warm = False
        if handle is None:
            log.info("worker %s:%d starts cold: %s", want.topology_id, want.port, why)
            return False
        warm_dir = handle.worker_dir
        spec.lease_fd, spec.status_fd = handle.child_fds
        try:
            worker_dir.mkdir(parents=True, exist_ok=True)
            spec.dump(worker_dir / SPEC_FILE)
            move_log(warm_dir, worker_dir)
        except OSError as exc:
            log.warning("worker %s:%d starts cold: cannot hand it to warm worker %s: %s",
                        want.topology_id, want.port, warm_dir, exc)
            handle.stop(self._grace_s)
            return False
        handle.warm_dir = warm_dir
        handle.topology_id, handle.port, handle.worker_dir = (
            want.topology_id, want.port, worker_dir)
        handle.session_id, handle.restarts = session, record.restarts
        handle.worker_index, handle.num_workers = want.worker_index, spec.num_workers
        handle.kind = "pipeline"
        handle.started_at, handle.last_status_at = time.monotonic(), None
        handle.last_beat_at, handle.last_error = None, ""
        handle.rebind(self._on_status, self._on_closed)
        if not handle.take(worker_dir):
            log.warning("worker %s:%d starts cold: warm worker %s is gone",
                        want.topology_id, want.port, warm_dir)
            handle.release()
            return False
        handle.record_path = record_path(self.supervisor_dir, want.topology_id, want.port)
        log.info("starting worker %s:%d (restart %d) on warm worker %s (pid %s)",
                 want.topology_id, want.port, record.restarts, warm_dir.name, handle.pid)
        record.start_failures, record.failed = 0, False
        with self._lock:
            self._workers[want.port] = handle
        self._heartbeat_now.set()
        self._lease.wake()
        if not self._connected.is_set():
            handle.kill("lost")
        return True

    def _account(self, topology_id: str, code_dir: Path,
                 conf: dict[str, Any]) -> tuple[int, int]:
        """(uid, gid) of the topology's own account, made if needed, with its code
        readable by its group only and its checkpoint directory its own."""
        uid, gid = ensure_account(account_for(topology_id))
        if topology_id not in self._owned_code:
            own_tree(code_dir, 0, gid, 0o750, 0o640)
            self._owned_code.add(topology_id)
        checkpoints = checkpoint_root_of(conf) / topology_id
        if "://" not in str(checkpoints):  # a local path: a store's URI has its own rights
            checkpoints.mkdir(parents=True, exist_ok=True)
            os.chown(checkpoints, uid, gid)
            os.chmod(checkpoints, 0o700)
        return uid, gid

    def worker_conf(self, code_dir: Path) -> dict[str, Any]:
        """A worker's configuration: this supervisor's ``topology.*`` and ``worker.*``
        keys (the cluster's defaults for topologies) and the few others a worker reads
        (:data:`WORKER_KEYS`), without any credential; then every key of the topology's
        ``stormconf.json`` (Storm merges a topology's configuration over the cluster's
        the same way; a pipeline's own keys, such as its input directory, reach its
        ``build(spark, conf)`` like this). ``storm.local.dir`` stays this supervisor's,
        made absolute, since the worker runs in its own directory."""
        conf = self._cluster_worker_conf()
        try:
            topology_conf = json.loads((code_dir / CONF_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            log.warning("%s: unreadable, the topology's own keys are ignored: %s",
                        code_dir / CONF_FILE, exc)
            topology_conf = {}
        if isinstance(topology_conf, dict):
            conf.update({k: v for k, v in topology_conf.items() if isinstance(k, str)})
        conf["storm.local.dir"] = str(self.local_dir)
        return conf

    def _cluster_worker_conf(self) -> dict[str, Any]:
        """What every worker gets of this supervisor's configuration, before its
        topology's own keys (see :meth:`worker_conf`)."""
        # Only what a worker needs of this supervisor's configuration, and never a
        # credential of the cluster's (ZooKeeper digests, TLS keys, store secrets): the
        # worker runs a tenant's code (docs/security.md).
        conf = {key: value for key, value in self.conf.as_dict().items()
                if (key.startswith(WORKER_KEY_PREFIXES) or key in WORKER_KEYS)
                and not is_secret_key(key)}
        conf["storm.local.dir"] = str(self.local_dir)
        return conf

    def _peers(self, topology_id: str) -> list[str]:
        """Nimbuses to fetch code from over Thrift: those registered as holding a replica
        first, then every other live one (each serves ``<id>/<file>`` from its own copy),
        each group in a random order, so that a fleet spreads over the nimbuses instead
        of all asking the first one listed."""
        live = [f"{n.host}:{n.port}" for n in self.state.nimbuses()]
        replicas = [h for h in self.state.replica_hosts(topology_id) if h in live]
        others = [n for n in live if n not in replicas]
        random.shuffle(replicas)
        random.shuffle(others)
        return replicas + others

    def _clean_up(self, desired: dict[int, DesiredWorker], frozen: set[str]) -> None:
        keep = {w.topology_id for w in desired.values()} | frozen
        keep |= {h.topology_id for h in self._running_handles()}
        if self.fetcher is not None:
            self.fetcher.forget_except(keep)
        # Unneeded code stays for supervisor.code.cleanup.grace.secs (see defaults.yaml).
        expired = self.code.expired(keep, float(self.conf["supervisor.code.cleanup.grace.secs"]),
                                    gone=lambda t: not self._topology_exists(t))
        for topology_id in expired:
            if self.code.has(topology_id):
                sweep_checkpoints(topology_id, self.worker_conf(self.code.path(topology_id)),
                                  self._topology_exists)
        for topology_id in self.code.remove_except(keep | self.code.retained):
            self._owned_code.discard(topology_id)
            if self._run_as_user:
                remove_account(account_for(topology_id))
        for topology_id in list(self._slots):
            if topology_id[0] not in keep:
                del self._slots[topology_id]
        with self._recorded_lock:
            for slot in [s for s in self._recorded if s[0] not in keep]:
                del self._recorded[slot]
        if self.workers_dir.is_dir():
            for worker_dir in self.workers_dir.iterdir():
                if worker_dir.name.rsplit("-", 1)[0] not in keep:
                    shutil.rmtree(worker_dir, ignore_errors=True)

    def _topology_exists(self, topology_id: str) -> bool:
        """True unless ZooKeeper says the topology is gone (an error counts as there)."""
        try:
            return self.zk.exists(self.state.storm_path(topology_id)) is not None
        except KazooException:
            return True

    # -- worker status (reader threads) ----------------------------------------------------
    def _on_status(self, handle: WorkerHandle, status: dict[str, Any]) -> None:
        warm = status.get("warm")
        if isinstance(warm, dict) and handle.warm == "taken" and not handle.committed \
                and isinstance(warm.get("refused"), str):
            handle.warm_refused = warm["refused"][:500]
        declared = status.get("components")
        if isinstance(declared, dict) and handle.kind == "pipeline":
            # Untrusted, but it decides only whether this topology's own worker is kept.
            handle.topology_components = checked_component_list(declared.get("all"))
        beat = status.get("beat")
        if isinstance(beat, dict):
            components = checked_components(beat.get("components"))
            self.metrics.progress.observe(handle, components)
            if any(isinstance(b := c.get("batch_id"), int) and not isinstance(b, bool)
                   and b >= 0 for c in components.values()):
                handle.committed = True  # a batch went through: it works
            self._write_beat(handle, beat)
        if "error" in status:
            handle.errors_reported += 1
            # Untrusted: only a valid component id becomes a node (status_input).
            error = checked_error(status["error"], handle_executor(handle))
            if not handle.error_budget.take():
                if handle.error_budget.dropped == 1:
                    log.warning("worker %s reports more than %d errors a minute: the "
                                "excess is dropped", handle.name, ERRORS_PER_MINUTE)
                return
            first = error.text.splitlines()[0] if error.text else error.text
            log.warning("worker %s: %s: %s", handle.name, error.component,
                        first if len(first) <= 300 else first[:297] + "...")
            self._report(handle, error.component, error.text)

    def _on_closed(self, _handle: WorkerHandle) -> None:
        self._wake.set()   # the worker has exited: reap it now

    def _write_beat(self, handle: WorkerHandle, beat: dict[str, Any]) -> None:
        # A worker of an earlier session, or one being killed, speaks for nobody.
        if handle.ended_by or session_id(self.zk) != handle.session_id \
                or not self._connected.is_set():
            return
        # Only what WorkerBeat holds, bounded: a worker's odd entry must neither make the
        # whole beat unreadable nor grow the node without limit.
        components = checked_components(beat.get("components"))
        record = WorkerBeat(
            time_secs=int(time.time()), topology_id=handle.topology_id, supervisor_id=self.id,
            host=self.host, port=handle.port,
            uptime_secs=int(time.monotonic() - handle.started_at), restarts=handle.restarts,
            components=components, memory_bytes=handle.memory_bytes(),
            warm_start=handle.warm == "taken")
        try:
            self.state.worker_heartbeat(handle.topology_id, self.id, handle.port,
                                        record.encode())
        except NoNodeError:
            return  # the topology was removed: its beats directory is gone for good
        except KazooException as exc:
            log.debug("beat of %s not written: %s", handle.name, exc)
            return
        first = handle.last_beat_at is None
        handle.last_beat_at = time.monotonic()
        if first:  # it runs now: said at once, not a heartbeat later
            self._heartbeat_now.set()

    def _failed_start(self, want: DesiredWorker, record: _SlotRecord, delay: float,
                      text: str, key: str) -> None:
        """A worker that could not be started (its code, its command): its slot is
        restarting after ``delay`` because of ``text``, recorded as its error (its
        ``worker-<i>``; once per ``key`` and ERROR_REPEAT_S)."""
        record.failed, record.backoff_s = True, delay
        record.last_error = worker_state.first_line(text)
        self._record_error(want.topology_id, want.port, want.executor, text, key)
        self._heartbeat_now.set()

    def _report(self, handle: WorkerHandle, component: str, text: str,
                key: str | None = None) -> None:
        """Record an error of ``handle``'s worker (see :meth:`_record_error`)."""
        handle.last_error = worker_state.first_line(text)
        self._record_error(handle.topology_id, handle.port, component, text, key)

    def _record_error(self, topology_id: str, port: int, component: str, text: str,
                      key: str | None = None) -> bool:
        """Record an error of the worker of slot ``port`` in /errors (what ``nimbus-ha
        errors`` and the UI show), unless the slot's last recorded error had the same
        ``key`` (default: the component and the text) less than ERROR_REPEAT_S ago: a
        crash loop, or a fetch retried, records one error, not one per try. True if
        recorded. Called from the monitor and the status reader threads."""
        key = key if key is not None else f"{component}\n{text}"
        slot = (topology_id, port)
        now = time.monotonic()
        with self._recorded_lock:
            seen = self._recorded.setdefault(slot, {})
            if now - seen.get(key, -ERROR_REPEAT_S) < ERROR_REPEAT_S:
                log.debug("error of %s:%d not recorded again: %s", topology_id, port,
                          worker_state.first_line(text))
                return False
            seen[key] = now
            while len(seen) > RECORDED_KEYS:
                del seen[min(seen, key=seen.__getitem__)]
        try:
            self.state.report_error(topology_id, component, ErrorInfo(
                error=text, error_time_secs=int(time.time()), host=self.host, port=port))
            return True
        except KazooException as exc:
            with self._recorded_lock:  # not recorded: the next one may be
                if self._recorded.get(slot, {}).get(key) == now:
                    del self._recorded[slot][key]
            log.warning("error of %s:%d not recorded in ZooKeeper: %s", topology_id, port,
                        exc)
            return False


def handle_executor(handle: WorkerHandle) -> str:
    """The executor key (``worker-<i>``) of a worker: the component its own errors use."""
    return f"worker-{handle.worker_index}"


def _log_tail(path: Path, offset: int, max_bytes: int = LOG_TAIL_BYTES,
              lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` non-empty lines a worker wrote to its log from ``offset`` on
    (of its last ``max_bytes``), joined by " | ": what a worker that exited without
    saying why last printed (a shell that could not exec its command, an interpreter
    that failed before the worker's code ran). "" if there is none."""
    try:
        with open(path, "rb") as log_file:
            log_file.seek(max(offset, os.fstat(log_file.fileno()).st_size - max_bytes))
            text = log_file.read(max_bytes).decode("utf-8", "replace")
    except OSError:
        return ""
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept)


def _hex(session: int | None) -> str:
    return f"0x{session:x}" if session is not None else "(none)"
