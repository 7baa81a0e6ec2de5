"""The supervisor's record in ZooKeeper: ``/supervisors/<id>``, an ephemeral node of its
session that says which slots it has and what it says of the worker of each
(:class:`~nimbus.state.records.SupervisorInfo`).

* :meth:`Registration.register` creates the node for a new session. The reconcile pass
  calls it (:meth:`nimbus.supervisor.daemon.Supervisor.reconcile`), first thing after a
  new session, so that the supervisor is registered before anything starts under that
  session.
* ``supervisor-heartbeat`` (a :class:`~nimbus.background_loop.BackgroundLoop`) rewrites
  the node every ``supervisor.heartbeat.frequency.secs``, and early, at most every
  :data:`EARLY_HEARTBEAT_GAP_S`, when a worker's state changed (:meth:`beat_now`):
  readers judge workers by what this node says and by when ZooKeeper wrote it
  (:mod:`nimbus.state.worker_state`). It writes only for the registered session; a node
  found gone makes the next reconcile pass register again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    OperationTimeoutError,
    RolledBackError,
)

from nimbus import __version__
from nimbus.background_loop import BackgroundLoop
from nimbus.state import worker_state
from nimbus.state.cluster_state import LayoutMissingError, StormClusterState
from nimbus.state.records import SupervisorInfo
from nimbus.supervisor.lease import session_id
from nimbus.supervisor.policy import DesiredWorker
from nimbus.supervisor.slots import WorkerTable
from nimbus.supervisor.warm_pool import WarmSummary

log = logging.getLogger(__name__)

# The shortest time between two heartbeats written early because a worker's state
# changed (a crash loop must not rewrite the node at its own pace).
EARLY_HEARTBEAT_GAP_S = 0.25
# Reads and transactions tried to register this supervisor's node while it keeps changing
# under them (an earlier session's node expiring meanwhile, a connection lost mid-commit).
REGISTER_ATTEMPTS = 5


def hex_session(session: int | None) -> str:
    return f"0x{session:x}" if session is not None else "(none)"


class Registration:
    """This supervisor's node and the heartbeat that rewrites it; see the module doc.

    ``warm_summary()`` tells the warm workers (None: none are kept); ``wake_monitor()``
    asks for a reconcile pass (to register again); ``stopping()`` is true once the
    supervisor stops, after which no heartbeat is written.
    """

    def __init__(self, zk: KazooClient, state: StormClusterState, supervisor_id: str,
                 host: str, ports: list[int], node_path: str, table: WorkerTable, *,
                 heartbeat_s: float, task_timeout_s: float,
                 warm_summary: Callable[[], WarmSummary | None],
                 wake_monitor: Callable[[], None], stopping: Callable[[], bool]):
        self._zk = zk
        self._state = state
        self._id = supervisor_id
        self._host = host
        self._ports = ports
        self.node_path = node_path
        self._table = table
        # How old a worker's last beat may be for it to count as running (the readers'
        # rule, nimbus/state/worker_state.py; here on this host's monotonic clock).
        self._task_timeout_s = task_timeout_s
        self._warm_summary = warm_summary
        self._wake_monitor = wake_monitor
        self._stopping = stopping
        self.started_at = time.time()
        self.session: int | None = None   # the session the node was made by
        # Where its logviewer serves (0: none), and whether over HTTPS: set at start,
        # before the first registration (nimbus-ha logs finds it there).
        self.logviewer_port = 0
        self.logviewer_https = False
        # The slots the last pass found assigned here (replaced whole by the monitor
        # thread, read by the heartbeat and metrics threads): what SupervisorInfo.workers
        # speaks of.
        self.desired: dict[int, DesiredWorker] = {}
        self.loop = BackgroundLoop("supervisor-heartbeat", self._beat, heartbeat_s,
                                   wait_first=True)

    def start(self) -> None:
        self.loop.start()

    def stop(self) -> None:
        self.loop.stop(join_timeout=10)

    def beat_now(self) -> None:
        """A worker's state changed: say so now (at most every EARLY_HEARTBEAT_GAP_S)."""
        self.loop.wake()

    def set_desired(self, desired: dict[int, DesiredWorker]) -> None:
        """The slots this reconcile pass found assigned here (monitor thread)."""
        if desired != self.desired:
            self.desired = desired
            self.beat_now()

    # -- the record -----------------------------------------------------------------------
    def info(self) -> SupervisorInfo:
        warm = self._warm_summary()
        return SupervisorInfo(time_secs=int(time.time()), hostname=self._host,
                              assignment_id=self._id, used_ports=self._table.ports(),
                              meta=list(self._ports),
                              uptime_secs=int(time.time() - self.started_at),
                              version=__version__,
                              warm_ready=warm.ready if warm else 0,
                              warm_starting=warm.starting if warm else 0,
                              warm_memory_bytes=warm.memory_bytes if warm else 0,
                              workers={str(port): said.as_record()
                                       for port, said, _ in self.statements()},
                              logviewer_port=self.logviewer_port,
                              logviewer_https=self.logviewer_https)

    def statements(self) -> list[tuple[int, worker_state.Statement, float | None]]:
        """(port, what this supervisor says of its worker, when its beat was last
        written (time.monotonic(); None: never)) of every slot the last pass found
        assigned here. Called from the heartbeat and metrics threads: it reads the
        monitor's records without a lock, each field whole."""
        handles = {h.port: h for h in self._table.running()}
        out = []
        for port, want in sorted(self.desired.items()):
            record = self._table.slots.get((want.topology_id, port))
            handle = handles.get(port)
            beat_at = None
            restarts = record.restarts if record is not None else 0
            # The version of the worker spoken of (the running one's, else the one the
            # slot starts next), whether it proved it, and the slot's failures on it.
            version = record.version if record is not None and record.version \
                else want.version
            committed = False
            # Only the slot's own executor speaks for it: a worker of another executor
            # of the topology (the slot reassigned, the worker not stopped yet) proves
            # nothing of this one's.
            if handle is not None and handle.topology_id == want.topology_id and \
                    handle.worker_index == want.worker_index and not handle.ended_by:
                version, committed = handle.code_version, handle.version_committed
                beat_at = handle.last_beat_at
                state = worker_state.FROZEN if handle.is_frozen() else (
                    worker_state.STARTING if beat_at is None else worker_state.RUNNING)
                # A new process of a crash loop: the error that ended the last one, also
                # while this version has failures to its name (what a leader rolling an
                # upgrade back records as the reason).
                failed_here = record is not None and record.failures and \
                    record.version == version and not committed
                error = handle.last_error or (record.last_error if record and (
                    state == worker_state.STARTING or failed_here) else "")
                backoff = 0
            elif record is not None and record.failed:
                state, error = worker_state.RESTARTING, record.last_error
                backoff = int(round(record.backoff_s))
            else:  # fetching its code, waiting for a warm worker or its turn to start
                state, backoff = worker_state.STARTING, 0
                error = record.last_error if record is not None else ""
            failures = record.failures if record is not None and \
                record.version == version else 0
            out.append((port, worker_state.Statement(
                want.topology_id, state, restarts, backoff, worker_state.first_line(error),
                version, committed, failures), beat_at))
        return out

    def slot_states(self) -> dict[tuple[str, int], str]:
        """(topology, port) -> the state of the worker of every slot assigned here, by
        the readers' rule (nimbus/state/worker_state.py) on this host's clock: what
        ``supervisor_worker_state`` exports. A worker whose beat is older than
        ``nimbus.task.timeout.secs`` is not running but dead, as the readers show it."""
        now = time.monotonic()
        out = {}
        for port, said, beat_at in self.statements():
            state = said.state
            if state == worker_state.RUNNING and (
                    beat_at is None or now - beat_at > self._task_timeout_s):
                state = worker_state.DEAD
            out[(said.topology_id, port)] = state
        return out

    # -- registering ----------------------------------------------------------------------
    def register(self, session: int) -> None:
        """Create this session's ephemeral ``/supervisors/<id>``; a node left by an earlier
        session (this supervisor restarted before it expired) is replaced, since it would
        vanish when that session ends.

        The replacement is one transaction (delete, create). The leader moves the work
        of a supervisor whose node is gone at once, on the grounds that its session has
        ended and its leases with it; an earlier session that still lives would break
        those grounds for as long as the node were missing between two separate calls.
        """
        zk = self._zk
        parent = self._state.path("supervisors")
        if zk.retry(zk.exists, parent) is None:
            # Not created here: an absent layout may be a wrong root as well as a cluster
            # no nimbus has started yet, and only a nimbus sets a cluster up.
            raise LayoutMissingError(
                f"no nimbus has set the cluster up under {self._state.root} yet (there is "
                f"no {parent}): waiting for one to start (or check storm.zookeeper.root)")
        data = self.info().encode()
        for _attempt in range(REGISTER_ATTEMPTS):
            stat = zk.retry(zk.exists, self.node_path)
            if stat is None:
                try:
                    zk.retry(zk.create, self.node_path, data, ephemeral=True)
                    break
                except NodeExistsError:
                    continue  # an earlier session's node, created meanwhile: read again
            if stat.ephemeralOwner == session:
                zk.retry(zk.set, self.node_path, data)
                break
            txn = zk.transaction()
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
                         hex_session(stat.ephemeralOwner))
                break
            if not isinstance(failed[0], (NoNodeError, BadVersionError, NodeExistsError)):
                raise failed[0]
            # The node changed between the read and the transaction: read it again.
        else:
            raise KazooException(f"could not register {self.node_path}: it kept changing "
                                 f"under {REGISTER_ATTEMPTS} attempts")
        self.session = session
        log.info("registered supervisor %s (session %s)", self._id, hex_session(session))

    def _beat(self) -> None:
        """One heartbeat (the ``supervisor-heartbeat`` loop's step)."""
        if self._stopping():
            return
        session = session_id(self._zk)
        if session is None or session != self.session:
            return  # the monitor registers a new session first
        try:
            self._zk.set(self.node_path, self.info().encode())
        except NoNodeError:
            self.session = None
            self._wake_monitor()
        except KazooException as exc:
            log.debug("supervisor heartbeat failed: %s", exc)
        self.loop.sleep(EARLY_HEARTBEAT_GAP_S)
