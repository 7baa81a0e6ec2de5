"""Starting a slot's worker: its code (fetched on its own thread, never waited for), its
configuration, its account and cgroup, then a warm worker taken for it or a new process.

The code is the version the slot's executor runs (``DesiredWorker.code_key``:
nimbus.state.code_versions): fetched, verified, cached and owned by that key, while the
account and the checkpoints stay the topology's, whatever the version. A slot that
switches versions keeps its worker until the new version's code is here
(:meth:`WorkerStarter.code_ready`).

A start that fails (code that cannot be fetched or used, a worker command that cannot
run) is tried again later, 5 s doubling to 5 minutes, and said as the slot's error
(:meth:`nimbus.supervisor.reporting.Reporter.failed_start`).
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nimbus.config import Config
from nimbus.redaction import is_secret_key
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.worker_logs import ARTIFACTS_KEY, BACKUPS_KEY, MAX_MB_KEY
from nimbus.supervisor.adoption import Adoption
from nimbus.supervisor.cgroups import WorkerCgroups
from nimbus.supervisor.class_archive import ClassArchive
from nimbus.supervisor.code_cache import (
    CONF_FILE,
    CodeCache,
    CodeUnavailableError,
    CodeVerificationError,
)
from nimbus.supervisor.code_fetcher import CodeFetcher
from nimbus.supervisor.lease import LeaseKeeper
from nimbus.supervisor.lease_record import record_path
from nimbus.supervisor.log_dirs import LogDirs
from nimbus.supervisor.policy import DesiredWorker
from nimbus.supervisor.reporting import Reporter
from nimbus.supervisor.run_as_user import account_for, ensure_account, own_tree
from nimbus.supervisor.slots import SlotRecord, WorkerTable
from nimbus.supervisor.warm_pool import WAIT as WARM_WAIT
from nimbus.supervisor.warm_pool import WarmPool
from nimbus.supervisor.worker_env import worker_env
from nimbus.supervisor.worker_handle import WorkerHandle
from nimbus.topology_paths import checkpoint_root_of
from nimbus.worker_protocol.spec import SPEC_FILE, WorkerSpec

log = logging.getLogger(__name__)

#: What a worker gets of its supervisor's configuration: keys under these prefixes...
WORKER_KEY_PREFIXES = ("topology.", "worker.")
#: ... and these (docs/runtime.md, "Configuration of a worker").
WORKER_KEYS = ("storm.local.dir", "supervisor.worker.start.timeout.secs",
               "supervisor.worker.orphan.timeout.secs", "java.library.path",
               "supervisor.worker.shutdown.sleep.secs")
#: Where and how a worker writes its log (nimbus/worker/log_pump.py): this supervisor's
#: values, whatever a topology's configuration says, since the supervisor serves and
#: sweeps what they make.
LOG_KEYS = (ARTIFACTS_KEY, MAX_MB_KEY, BACKUPS_KEY)

# A topology whose code could not be fetched is tried again after this long, doubling
# with each failure in a row up to the maximum.
CODE_RETRY_S = 5.0
CODE_RETRY_MAX_S = 300.0


def cluster_worker_conf(conf: Config, local_dir: Path) -> dict[str, Any]:
    """What every worker gets of this supervisor's configuration, before its
    topology's own keys (see :meth:`WorkerStarter.worker_conf`)."""
    # Only what a worker needs of this supervisor's configuration, and never a
    # credential of the cluster's (ZooKeeper digests, TLS keys, store secrets): the
    # worker runs a tenant's code (docs/security.md).
    out = {key: value for key, value in conf.as_dict().items()
           if (key.startswith(WORKER_KEY_PREFIXES) or key in WORKER_KEYS)
           and not is_secret_key(key)}
    return {**out, **own_keys(conf, local_dir)}


def own_keys(conf: Config, local_dir: Path) -> dict[str, Any]:
    """The keys a worker gets from this supervisor over any its topology sets: its
    directory, and where and how its log is written."""
    return {"storm.local.dir": str(local_dir), **{key: conf[key] for key in LOG_KEYS}}


def peers(state: StormClusterState, code_key: str) -> list[str]:
    """Nimbuses to fetch a code key's code from over Thrift (a topology id, or a
    version's ``<id>.v<N>``): those registered as holding a replica of it
    (``/code-distributor/<key>``) first, then every other live one (each serves
    ``<key>/<file>`` from its own copy), each group in a random order, so that a fleet
    spreads over the nimbuses instead of all asking the first one listed."""
    live = [f"{n.host}:{n.port}" for n in state.nimbuses()]
    replicas = [h for h in state.replica_hosts(code_key) if h in live]
    others = [n for n in live if n not in replicas]
    random.shuffle(replicas)
    random.shuffle(others)
    return replicas + others


def _on_version(want: DesiredWorker) -> str:
    """How a start names the code version it runs: not at all for version 1."""
    return f" on version {want.version}" if want.version != 1 else ""


def _retry_delay(failures: int) -> float:
    return min(CODE_RETRY_MAX_S, CODE_RETRY_S * 2 ** (failures - 1))


class WorkerStarter:
    """Starts the workers of the slots assigned here (monitor thread); see the module doc.

    ``conf()``, ``code()``, ``fetcher()``, ``warm()``, ``cgroups()`` and
    ``class_archive()`` are read when needed: the supervisor makes the last four when it
    starts. ``may_start(session)`` tells
    whether ``session`` is still the connected one.
    """

    def __init__(self, conf: Callable[[], Config], supervisor_id: str, host: str,
                 table: WorkerTable,
                 reporter: Reporter, adoption: Adoption, lease: LeaseKeeper, *,
                 local_dir: Path, supervisor_dir: Path, workers_dir: Path,
                 worker_command: tuple[str, ...], run_as_user: bool, grace_s: float,
                 connected: threading.Event, beat_now: Callable[[], None],
                 may_start: Callable[[int], bool], code: Callable[[], CodeCache],
                 fetcher: Callable[[], CodeFetcher | None],
                 warm: Callable[[], WarmPool | None],
                 cgroups: Callable[[], WorkerCgroups | None],
                 class_archive: Callable[[], ClassArchive | None], log_dirs: LogDirs):
        self._conf = conf
        self._id = supervisor_id
        self._host = host
        self._table = table
        self._reporter = reporter
        self._adoption = adoption
        self._lease = lease
        self._local_dir = local_dir
        self._supervisor_dir = supervisor_dir
        self._workers_dir = workers_dir
        self._worker_command = worker_command
        self._run_as_user = run_as_user
        self._grace_s = grace_s
        self._connected = connected
        self._beat_now = beat_now
        self._may_start = may_start
        self._code = code
        self._fetcher = fetcher
        self._warm = warm
        self._cgroups = cgroups
        self._class_archive = class_archive
        self._log_dirs = log_dirs
        self.owned_code: set[str] = set()   # code keys already given to their account
        self.warm_waiters = 0   # slots of this pass that wait for a starting warm worker

    def ensure_running(self, want: DesiredWorker, num_workers: int, session: int) -> None:
        """Start ``want``'s worker unless it runs, its slot waits (an earlier process's
        worker, a backoff) or its code (of ``want.version``, verified against
        ``want.code_sha256``) is not here yet (asked for then)."""
        if self._table.has(want.port):
            return
        if self._adoption.take_over_for(want, num_workers, session):
            return
        if self._adoption.held(want.port):
            return
        record = self._table.record(want.topology_id, want.port)
        if record.not_before > time.monotonic():
            return
        code = self._code()
        try:
            # Never waits: the fetch runs on its own thread and wakes this loop when done.
            fetcher = self._fetcher()
            assert fetcher is not None, "start() makes the fetcher"
            code_dir = fetcher.request(want.code_key, want.code_sha256)
        except CodeUnavailableError as exc:
            # Tried again later, ever later (5 s doubling to 5 minutes): a bundle that
            # fails its checks (a lie about its size, an unsafe entry) fails every time.
            record.code_failures += 1
            delay = _retry_delay(record.code_failures)
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
            self._reporter.failed_start(want, record, delay, text,
                                        key="code:corrupt" if corrupt else "code:unavailable")
            return
        if code_dir is None:
            return
        record.code_failures, record.code_error = 0, ""
        conf = self.worker_conf(code_dir)
        worker_dir = self._workers_dir / f"{want.topology_id}-{want.port}"
        resources = code.resources(want.code_key)
        kind = "process" if (resources / "topology.yaml").exists() else "pipeline"
        if not self._may_start(session):
            return
        # What worker.json says, either way; the descriptors are the worker's own.
        spec = WorkerSpec(
            topology_id=want.topology_id, port=want.port, supervisor_id=self._id,
            host=self._host, code_dir=str(resources), conf=conf,
            restarts=record.restarts, worker_index=want.worker_index,
            num_workers=num_workers, lease_fd=-1, status_fd=-1,
            class_archive=self.class_archive_path() if kind == "pipeline" else "",
            code_version=want.version,
            # What the slot's last worker ran (an upgrade's guard: nimbus/worker/pipeline.py).
            previous_components=list(record.components) if kind == "pipeline" else [])
        if self.start_warm(want, record, spec, session, worker_dir, kind):
            return
        self._start_cold(want, record, spec, session, worker_dir, kind, code_dir)

    def code_ready(self, want: DesiredWorker) -> bool:
        """Whether the code of ``want``'s version is here (its fetch asked for if not):
        the monitor thread's question before it stops a worker to switch versions
        (:class:`~nimbus.supervisor.ending.WorkerEnder`). Code that cannot be had leaves
        the worker on the version it runs, and is said as its slot's error; an upgrade's
        leader rolls back when the switch does not come."""
        fetcher = self._fetcher()
        if fetcher is None:
            return False
        try:
            return fetcher.request(want.code_key, want.code_sha256) is not None
        except CodeUnavailableError as exc:
            text = (f"version {want.version} cannot be started: its code cannot be had "
                    f"({exc}); the slot's worker stays on the version it runs")
            log.warning("worker %s:%d: %s", want.topology_id, want.port, text)
            self._reporter.record_error(want.topology_id, want.port, want.executor, text,
                                        key="code:switch")
            return False

    def _start_cold(self, want: DesiredWorker, record: SlotRecord, spec: WorkerSpec,
                    session: int, worker_dir: Path, kind: str, code_dir: Path) -> None:
        """Start a new worker process for ``want``."""
        handle = WorkerHandle(want.topology_id, want.port, worker_dir, session,
                              record.restarts, self._reporter.on_status,
                              self._reporter.on_closed, command=self._worker_command)
        handle.record_path = record_path(self._supervisor_dir, want.topology_id, want.port)
        handle.worker_index = want.worker_index
        handle.num_workers = spec.num_workers
        handle.code_version, handle.code_key = want.version, want.code_key
        handle.kind = kind
        if self._run_as_user:
            handle.run_as = self.account(want.topology_id, code_dir, spec.conf,
                                         code_key=want.code_key)
        try:
            handle.log_file = self._log_dirs.prepare(want.topology_id, want.port,
                                                     want.worker_index, spec.conf,
                                                     owner=handle.run_as)
        except OSError as exc:  # it starts all the same, its log in its own directory
            log.warning("worker %s:%d: cannot make its log directory under %s (%s): its "
                        "output goes to its worker directory, neither rotated nor served",
                        want.topology_id, want.port, self._log_dirs.root, exc)
        cgroups = self._cgroups()
        if cgroups is not None:
            handle.cgroups = cgroups
            handle.cgroup = cgroups.make(f"{want.topology_id}-{want.port}")

        def write_spec(lease_fd: int, status_fd: int) -> None:
            if handle.run_as is not None:  # its own directory, its own only
                os.chown(worker_dir, *handle.run_as)
                os.chmod(worker_dir, 0o700)
            spec.lease_fd, spec.status_fd = lease_fd, status_fd
            spec.dump(worker_dir / SPEC_FILE)  # mode 0600: the configuration may hold secrets
            if handle.run_as is not None:
                os.chown(worker_dir / SPEC_FILE, *handle.run_as)

        log.info("starting worker %s:%d (restart %d)%s", want.topology_id, want.port,
                 record.restarts, _on_version(want))
        env = worker_env(self._conf())
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
            if handle.cgroup is not None and cgroups is not None:
                cgroups.remove(handle.cgroup)
            record.start_failures += 1
            delay = _retry_delay(record.start_failures)
            record.not_before = time.monotonic() + delay
            log.warning("cannot start worker %s:%d: %s (next try in %.1fs)",
                        want.topology_id, want.port, exc, delay)
            self._reporter.failed_start(
                want, record, delay,
                f"cannot run the worker command {self._worker_command[0]}: {exc}",
                key="spawn")
            return
        record.start_failures, record.failed = 0, False
        self._started(handle)

    def _started(self, handle: WorkerHandle) -> None:
        self._table.add(handle)
        self._beat_now()
        # Its first lease from a round trip that shows its assignment: asked for now.
        self._lease.wake()
        if not self._connected.is_set():
            handle.kill("lost")  # the connection went while it was being started

    def start_warm(self, want: DesiredWorker, record: SlotRecord, spec: WorkerSpec,
                   session: int, worker_dir: Path, kind: str) -> bool:
        """Run ``want`` on a warm worker if one can take it, or leave it to wait for one
        that is starting (True); else log why not (False: start it cold)."""
        warm = self._warm()
        if warm is None or kind != "pipeline":
            return False
        if record.cold_reason:
            handle, why = None, record.cold_reason
            record.cold_reason = ""
        else:
            handle, why = warm.take(spec, waiting_ahead=self.warm_waiters)
        if handle is None and why == WARM_WAIT:
            self.warm_waiters += 1
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
            # The worker moves its log there itself once taken (nimbus/worker/warm.py).
            log_file = self._log_dirs.prepare(want.topology_id, want.port,
                                              want.worker_index, spec.conf)
        except OSError as exc:
            log.warning("worker %s:%d starts cold: cannot hand it to warm worker %s: %s",
                        want.topology_id, want.port, warm_dir, exc)
            handle.stop(self._grace_s)
            return False
        handle.warm_dir = warm_dir
        handle.topology_id, handle.port, handle.worker_dir = (
            want.topology_id, want.port, worker_dir)
        handle.log_file = log_file
        try:
            handle.log_offset = log_file.stat().st_size
        except OSError:
            handle.log_offset = 0
        handle.session_id, handle.restarts = session, record.restarts
        handle.worker_index, handle.num_workers = want.worker_index, spec.num_workers
        handle.code_version, handle.code_key = want.version, want.code_key
        handle.triggered = handle.committed = handle.version_committed = False
        handle.batched_components = set()
        handle.topology_components = handle.own_components = None
        handle.kind = "pipeline"
        handle.started_at, handle.last_status_at = time.monotonic(), None
        handle.last_beat_at, handle.last_error = None, ""
        handle.rebind(self._reporter.on_status, self._reporter.on_closed)
        if not handle.take(worker_dir):
            log.warning("worker %s:%d starts cold: warm worker %s is gone",
                        want.topology_id, want.port, warm_dir)
            handle.release()
            return False
        handle.record_path = record_path(self._supervisor_dir, want.topology_id, want.port)
        log.info("starting worker %s:%d (restart %d)%s on warm worker %s (pid %s)",
                 want.topology_id, want.port, record.restarts, _on_version(want),
                 warm_dir.name, handle.pid)
        record.start_failures, record.failed = 0, False
        self._started(handle)
        return True

    def account(self, topology_id: str, code_dir: Path, conf: dict[str, Any],
                code_key: str | None = None) -> tuple[int, int]:
        """(uid, gid) of the topology's own account, made if needed, with its code (of
        ``code_key``: the topology id by default) readable by its group only and its
        checkpoint directory its own (one account and one checkpoint directory for all
        of a topology's versions)."""
        code_key = code_key or topology_id
        uid, gid = ensure_account(account_for(topology_id))
        if code_key not in self.owned_code:
            own_tree(code_dir, 0, gid, 0o750, 0o640)
            self.owned_code.add(code_key)
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
        made absolute, since the worker runs in its own directory, and so do its log
        keys (:func:`own_keys`)."""
        conf = cluster_worker_conf(self._conf(), self._local_dir)
        try:
            topology_conf = json.loads((code_dir / CONF_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            log.warning("%s: unreadable, the topology's own keys are ignored: %s",
                        code_dir / CONF_FILE, exc)
            topology_conf = {}
        if isinstance(topology_conf, dict):
            conf.update({k: v for k, v in topology_conf.items() if isinstance(k, str)})
        conf.update(own_keys(self._conf(), self._local_dir))
        return conf

    def warm_spec(self, n: int, lease_fd: int, status_fd: int) -> WorkerSpec:
        """The spec of warm worker ``n``: the cluster's defaults for topologies, as
        every worker gets them, and no topology's own keys (the session is made before
        any topology is known)."""
        return WorkerSpec(topology_id=f"warm-{n}", port=0, supervisor_id=self._id,
                          host=self._host, code_dir="", lease_fd=lease_fd,
                          status_fd=status_fd,
                          conf=cluster_worker_conf(self._conf(), self._local_dir),
                          class_archive=self.class_archive_path())

    def class_archive_path(self) -> str:
        """The archive for a Spark worker starting now (building it if need be)."""
        archive = self._class_archive()
        if archive is None:
            return ""
        archive.needed()
        return archive.path
