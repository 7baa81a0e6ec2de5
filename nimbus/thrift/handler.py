"""The Nimbus Thrift service's methods, mapped onto the lifecycle and the summary cache.

Errors keep Storm's contract: unknown topology -> NotAliveException, duplicate name ->
AlreadyAliveException, bad submission -> InvalidTopologyException, a path outside the
served code -> AuthorizationException. A leader-only call on a follower raises a
TApplicationException "not a leader, current leader is host:port", as Storm 1.x does;
nimbus-ha's own clients follow that redirect.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import KazooException
from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.thrift import TApplicationException
from thriftpy2.utils import deserialize, serialize

from nimbus import __version__
from nimbus.config import Config
from nimbus.distribution.file_transfer import FileTransfers, TransferError
from nimbus.distribution.local_code import TOPOLOGY_ID_RE, LocalCodeStore, UnsafePathError
from nimbus.master.elector import LeaderElector, NoLeaderError
from nimbus.master.lifecycle import (
    CONF_FILE,
    TOPOLOGY_FILE,
    InvalidTopologyError,
    TopologyExistsError,
    TopologyLifecycle,
    TopologyNotFoundError,
)
from nimbus.master.log_sources import log_sources
from nimbus.master.summary_cache import ClusterSummaryCache
from nimbus.master.topology_rows import topology_rows
from nimbus.master.upgrades import Upgrades
from nimbus.redaction import redact
from nimbus.state import runtime_view
from nimbus.state.cluster_state import (
    ConcurrentChangeError,
    NotLeaderError,
    StormClusterState,
)
from nimbus.state.cluster_view import ViewNotLoadedError
from nimbus.state.code_versions import ALL, topology_of
from nimbus.state.records import ACTIVE, INACTIVE, RecordError
from nimbus.thrift import NOT_LEADER_PREFIX, page_info, storm
from nimbus.thrift.authorizer import (
    READONLY_USERS_KEY,
    SimpleAclAuthorizer,
    read_refusal,
    topology_users,
)
from nimbus.thrift.cluster_info import ClusterInfoReplies
from nimbus.thrift.numbers import i32
from nimbus.thrift.server import EncodedResult, call_context, client_gone, current_client
from nimbus.thrift.tls import caller

log = logging.getLogger(__name__)
_PROTO = TBinaryProtocolFactory()
# Storm's per-worker system component; stands for a worker that reports no component yet.
SYSTEM_COMPONENT = "__system"


def _check_id(topology_id: str) -> None:
    """NotAliveException for an id no topology can have (never a ZooKeeper path)."""
    if not TOPOLOGY_ID_RE.fullmatch(topology_id) or ".." in topology_id:
        raise storm.NotAliveException(msg=f"no live topology with id {topology_id[:200]!r}")


def _readable(read: Callable[[], Any]) -> Any:
    """``read()``, with a node this release cannot read reported to the client as a
    TApplicationException naming the node (the state has logged it)."""
    try:
        return read()
    except RecordError as exc:
        raise TApplicationException(TApplicationException.INTERNAL_ERROR, str(exc)) from None


#: How long a refusal may spend asking ZooKeeper that has not answered lately.
LEADER_LOOKUP_S = 1.0
#: How often a leader call that waits looks whether this nimbus still leads.
LEADERSHIP_POLL_S = 0.1


class NimbusHandler:
    """Implements ``nimbus_ha.NimbusHa``: Storm's ``Nimbus`` and nimbus-ha's own reads
    (nimbus/thrift/nimbus_ha.thrift); one instance per nimbus process."""

    def __init__(self, conf: Config, elector: LeaderElector, lifecycle: TopologyLifecycle,
                 cache: ClusterSummaryCache, transfers: FileTransfers, store: LocalCodeStore,
                 started_at: float, reads: StormClusterState | None = None, *,
                 authorizer: SimpleAclAuthorizer | None, upgrades: Upgrades | None = None):
        """``reads`` is the state that client reads go to (getTopologyInfo): a session
        other than the elector's, so that a client's traffic neither queues behind nor
        disguises the elector's (docs/ha.md); by default the lifecycle's. ``authorizer``:
        the process's (``ClusterSecurity.authorizer``, which its root made of
        ``nimbus.authorizer``), None for none. ``upgrades``: the master's
        (:mod:`nimbus.master.upgrades`); by default the ones built on ``lifecycle``."""
        self.conf = conf
        self.upgrades: Upgrades | None = upgrades if upgrades is not None else getattr(
            lifecycle, "upgrades", None)
        self._calls = concurrent.futures.ThreadPoolExecutor(
            max_workers=int(conf["nimbus.thrift.threads"]), thread_name_prefix="leader-call")
        self.reads = reads if reads is not None else getattr(lifecycle, "state", None)
        self.elector = elector
        self.lifecycle = lifecycle
        self.cache = cache
        self.transfers = transfers
        self.store = store
        self.started_at = started_at
        self._replies = ClusterInfoReplies()  # guarded by _cluster_info_lock
        self._cluster_info_lock = threading.Lock()
        # (snapshot, second, leading, its encoded reply) of the last getClusterInfo
        self._cluster_info: tuple[Any, int, bool, EncodedResult] | None = None
        self.address = str(conf.nimbus_address)
        self.authorizer = authorizer

    # -- guards -------------------------------------------------------------------------------
    def _while_leading(self, action: Callable[[], Any]) -> Any:
        """``action()``, on a thread of its own, abandoned as soon as this nimbus stops
        leading: over a silent partition ZooKeeper calls wait until it heals, while the
        lease ends leadership within a session, and the client must then hear "not a
        leader" (docs/ha.md). An abandoned action finishes by itself later; its writes
        are fenced, and every leader call is idempotent for a client that retries (a
        submit by its token)."""
        install = call_context()

        def run() -> Any:
            install()
            return action()

        future = self._calls.submit(run)
        while True:
            try:
                return future.result(timeout=LEADERSHIP_POLL_S)
            except concurrent.futures.TimeoutError:
                if not self.elector.is_leader():
                    log.info("a leader call was abandoned: this nimbus stopped leading "
                             "while it waited for ZooKeeper")
                    raise NotLeaderError("stopped leading during the call") from None

    def close(self) -> None:
        """Stop the threads of leader calls (those still waiting end with ZooKeeper)."""
        self._calls.shutdown(wait=False, cancel_futures=True)

    def _require_leader(self) -> None:
        """Refuse at once unless this nimbus leads, naming the leader it knows of.

        Never waits for an unreachable ZooKeeper: the leader is read there only while
        ZooKeeper answers; otherwise the refusal names the last leader this nimbus saw
        (its cluster summary), or none."""
        if self.elector.is_leader():
            return
        raise TApplicationException(TApplicationException.INTERNAL_ERROR,
                                    f"{NOT_LEADER_PREFIX}{self._other_leader()}")

    def _other_leader(self) -> str:
        """The leader's host:port, or a sentence (with spaces, so clients do not take it
        for an address) when none is known."""
        if self.elector.zookeeper_answering():
            try:
                return self.elector.get_leader_address()
            except Exception:
                return "unknown (no nimbus holds the lock)"
        try:  # perhaps it answers again (a thawed process): asked briefly, never waited on
            named = self.elector.leader_address_within(LEADER_LOOKUP_S)
            if named != self.address:
                return named
        except Exception:
            pass
        last = self.cache.snapshot.leader
        if last and last != self.address:
            return last
        return ("unknown (this nimbus gets no answer from ZooKeeper and knows of no "
                "other leader)")

    def _leader_call(self, action: Callable[[], Any]) -> Any:
        self._require_leader()
        try:
            return self._while_leading(action)
        except (NotLeaderError, NoLeaderError, KazooException, ViewNotLoadedError):
            # Lost the lead mid-call, or ZooKeeper failed under it (a lost connection, an
            # expired session): redirect the client to whoever leads now.
            self._require_leader()
            # Leader again already (a brief suspension): redirect to ourselves, so the
            # client retries here (a retried submit is recognised by its token).
            raise TApplicationException(TApplicationException.INTERNAL_ERROR,
                                        f"{NOT_LEADER_PREFIX}{self.address}") from None
        except TopologyNotFoundError as exc:
            raise storm.NotAliveException(msg=str(exc)) from None
        except TopologyExistsError as exc:
            raise storm.AlreadyAliveException(msg=str(exc)) from None
        except (InvalidTopologyError, TransferError, UnsafePathError) as exc:
            raise storm.InvalidTopologyException(msg=str(exc)) from None
        except (ConcurrentChangeError, RecordError) as exc:
            raise TApplicationException(TApplicationException.INTERNAL_ERROR, str(exc)) from None
        finally:
            self.cache.wake()

    def _authorize(self, operation: str, name: str) -> None:
        """Raise AuthorizationException unless the caller may ``operation`` topology
        ``name`` (nimbus.authorizer; a no-op without one). Called inside _leader_call,
        so an unknown name is NotAliveException."""
        if self.authorizer is None:
            return
        topology_id, base = self.lifecycle.find(name)
        try:
            topo_conf = json.loads((self.store.path(self._running_key(topology_id))
                                    / CONF_FILE).read_text())
        except (OSError, ValueError):
            topo_conf = {}
        users = topo_conf.get("topology.users") or []
        who = caller()
        if not self.authorizer.permit(who, base.owner, users if isinstance(users, list)
                                      else []):
            raise storm.AuthorizationException(
                msg=f"{who or 'an unauthenticated client'} may not {operation} {name}: "
                    "not its submitter, not in its topology.users, not in nimbus.admins")

    # -- submit, kill, activate, deactivate ---------------------------------------------------
    def submitTopology(self, name: str, uploadedJarLocation: str, jsonConf: str,
                       topology: Any) -> None:
        self.submitTopologyWithOpts(name, uploadedJarLocation, jsonConf, topology, None)

    def submitTopologyWithOpts(self, name: str, uploadedJarLocation: str, jsonConf: str,
                               topology: Any, options: Any) -> None:
        status = ACTIVE
        if options is not None and options.initial_status == storm.TopologyInitialStatus.INACTIVE:
            status = INACTIVE
        topology_bytes = serialize(topology, _PROTO) if topology is not None else b""
        who = caller()
        if who:  # the authenticated submitter owns it, whatever the conf claims
            try:
                submitted = json.loads(jsonConf or "{}")
                if isinstance(submitted, dict):
                    submitted["topology.submitter.user"] = who
                    jsonConf = json.dumps(submitted)
            except json.JSONDecodeError:
                pass  # lifecycle.submit refuses it with a clear message

        def submit() -> None:
            bundle = self.transfers.take_upload(uploadedJarLocation)
            try:
                self.lifecycle.submit(name, bundle, jsonConf, topology_bytes, status,
                                      client_gone=client_gone)
            finally:
                bundle.unlink(missing_ok=True)

        self._leader_call(submit)
        self.cache.refresh_now()

    def killTopology(self, name: str) -> None:
        self.killTopologyWithOpts(name, None)

    def killTopologyWithOpts(self, name: str, options: Any) -> None:
        wait = options.wait_secs if options is not None else None
        self._leader_call(lambda: (self._authorize("kill", name),
                                   self.lifecycle.kill(name, wait)))
        self.cache.refresh_now()

    def activate(self, name: str) -> None:
        self._leader_call(lambda: (self._authorize("activate", name),
                                   self.lifecycle.activate(name)))
        self.cache.refresh_now()

    def deactivate(self, name: str) -> None:
        self._leader_call(lambda: (self._authorize("deactivate", name),
                                   self.lifecycle.deactivate(name)))
        self.cache.refresh_now()

    def rebalance(self, name: str, options: Any) -> None:
        """Storm's rebalance: ``num_workers`` and ``wait_secs`` (see lifecycle.rebalance).
        Without a wait the leader's scheduler grows or shrinks the assignment on its
        next pass; with one the topology is REBALANCING (deactivated) until it ends."""
        wait = options.wait_secs if options is not None else None
        workers = options.num_workers if options is not None else None
        executors = options.num_executors if options is not None else None
        self._leader_call(lambda: (self._authorize("rebalance", name),
                                   self.lifecycle.rebalance(name, wait, workers, executors)))
        self.cache.refresh_now()

    # -- upgrades: nimbus-ha's extension (nimbus_ha.thrift; nimbus/master/upgrades.py) ----
    def _the_upgrades(self) -> Upgrades:
        if self.upgrades is None:
            raise TApplicationException(TApplicationException.INTERNAL_ERROR,
                                        "this nimbus serves no upgrades")
        return self.upgrades

    def _running_key(self, topology_id: str) -> str:
        """The code key of the version ``topology_id`` runs (its id when never upgraded):
        where its current conf and code are held."""
        return self.upgrades.running_key(topology_id) if self.upgrades is not None \
            else topology_id

    def upgradeTopology(self, name: str, uploadedJarLocation: str, jsonConf: str,
                        strategy: str) -> str:
        """Run the uploaded bundle as the next code version of live topology ``name``
        (Upgrades.upgrade): answered once it is replicated and its switch has begun,
        with ``{"topology_id", "version"}``. The owner actions' rule (as kill); the
        authenticated caller is recorded as who asked."""
        upgrades = self._the_upgrades()
        who = caller()

        def upgrade() -> str:
            bundle = self.transfers.take_upload(uploadedJarLocation)
            try:
                self._authorize("upgrade", name)
                topology_id, version = upgrades.upgrade(
                    name, bundle, jsonConf or "{}", strategy or ALL, by=who or "",
                    client_gone=client_gone)
            finally:
                bundle.unlink(missing_ok=True)
            return json.dumps({"topology_id": topology_id, "version": version},
                              sort_keys=True)

        answer = self._leader_call(upgrade)
        self.cache.refresh_now()
        return str(answer)

    def rollbackTopology(self, name: str, version: int) -> str:
        """Switch live topology ``name`` to its kept code version ``version`` (0: the
        default target, Upgrades.rollback), every worker at once; answers
        ``{"topology_id", "version"}``. The owner actions' rule (as kill)."""
        upgrades = self._the_upgrades()
        who = caller()

        def rollback() -> str:
            self._authorize("rollback", name)
            topology_id, target = upgrades.rollback(name, version or None, by=who or "")
            return json.dumps({"topology_id": topology_id, "version": target},
                              sort_keys=True)

        answer = self._leader_call(rollback)
        self.cache.refresh_now()
        return str(answer)

    def getTopologyHistory(self, name: str) -> str:
        """The code versions of live topology ``name`` as JSON (Upgrades.history): any
        nimbus answers, from its view. The read rule of getTopologyInfo applies;
        NotAliveException for an unknown name."""
        upgrades = self._the_upgrades()
        try:
            topology_id, _base = self.lifecycle.find(name)
            self._authorize_read(topology_id)
            history = _readable(lambda: upgrades.history(name))
        except TopologyNotFoundError as exc:
            raise storm.NotAliveException(msg=str(exc)) from None
        except (ViewNotLoadedError, KazooException) as exc:
            raise TApplicationException(
                TApplicationException.INTERNAL_ERROR,
                f"this nimbus cannot read the cluster state now ({exc}); try again") from None
        return json.dumps(history, sort_keys=True)

    # -- file transfer -----------------------------------------------------------------------
    def beginFileUpload(self) -> str:
        self._require_leader()  # the submit that follows must reach the same nimbus
        try:
            return self.transfers.begin_upload(current_client())
        except TransferError as exc:
            raise storm.AuthorizationException(msg=str(exc)) from None

    def uploadChunk(self, location: str, chunk: bytes) -> None:
        try:
            self.transfers.upload_chunk(location, chunk)
        except TransferError as exc:
            raise storm.AuthorizationException(msg=str(exc)) from None

    def finishFileUpload(self, location: str) -> None:
        try:
            self.transfers.finish_upload(location)
        except TransferError as exc:
            raise storm.AuthorizationException(msg=str(exc)) from None

    def beginFileDownload(self, file: str) -> str:
        self._authorize_download(file)
        try:
            return self.transfers.begin_download(file, current_client())
        except (UnsafePathError, OSError, TransferError) as exc:  # OSError: name too long
            raise storm.AuthorizationException(msg=str(exc)) from None

    def downloadChunk(self, id: str) -> bytes:  # noqa: A002 - Storm's argument name
        try:
            return self.transfers.download_chunk(id)
        except TransferError as exc:
            raise storm.AuthorizationException(msg=str(exc)) from None

    # -- reads (any nimbus, from the cache) ---------------------------------------------------
    def getNimbusConf(self) -> str:
        return json.dumps(self.conf.redacted(), sort_keys=True)

    def _nimbus_summaries(self, snap: Any = None, now: float | None = None,
                          leading: bool | None = None) -> list[Any]:
        """The NimbusSummary list, from ``snap`` at ``now`` with this nimbus ``leading``
        or not (each read afresh when not given)."""
        snap = self.cache.snapshot if snap is None else snap
        now = time.time() if now is None else now
        # This nimbus's own leadership is known now; the cache's idea of the leader may
        # be one reload old (right after a failover it still names the dead leader).
        leading = self.elector.is_leader() if leading is None else leading
        out = []
        for info in snap.nimbuses:
            address = f"{info.host}:{info.port}"
            is_leader = leading if address == self.address else (
                not leading and address == snap.leader)
            out.append(storm.NimbusSummary(
                host=info.host, port=i32(info.port),
                uptime_secs=i32(now - info.start_time_secs),
                isLeader=is_leader, version=info.version))
        if leading and not any(s.isLeader for s in out):
            # A leader whose summary does not list it yet: a nimbus restarted moments
            # before it took the lock, whose first summary (every topology's replicas
            # counted) takes seconds at 10,000 topologies. It leads, and says so.
            host, _, port = self.address.rpartition(":")
            out.append(storm.NimbusSummary(
                host=host, port=i32(int(port)), uptime_secs=i32(now - self.started_at),
                isLeader=True, version=__version__))
        return out

    def getClusterInfo(self) -> Any:
        """The cluster summary, encoded once per snapshot, second (uptimes are whole
        seconds) and leadership, and shared by the calls in between: at 10,000
        topologies the encoding alone costs about 15 ms of Python, which each call
        would otherwise pay again. The topology list, most of it, is encoded once per
        second and change of the topologies (:mod:`nimbus.thrift.cluster_info`)."""
        snap = self.cache.snapshot  # memory only: no ZooKeeper round trip per call
        now = time.time()
        leading = self.elector.is_leader()
        hit = self._cluster_info_for(snap, now, leading)
        if hit is not None:
            return hit
        with self._cluster_info_lock:  # one build at a time: its structs are shared
            # Read again: a call that held the lock before this one may have built the
            # answer meanwhile, and a newer snapshot or second may have come.
            snap, now, leading = self.cache.snapshot, time.time(), self.elector.is_leader()
            hit = self._cluster_info_for(snap, now, leading)
            return hit if hit is not None else self._encode_cluster_info(snap, now, leading)

    def _cluster_info_for(self, snap: Any, now: float, leading: bool) -> EncodedResult | None:
        cached = self._cluster_info
        if cached is not None and cached[0] is snap and cached[1] == int(now) \
                and cached[2] == leading:
            return cached[3]
        return None

    def _encode_cluster_info(self, snap: Any, now: float, leading: bool) -> EncodedResult:
        supervisors = [storm.SupervisorSummary(
            host=row["host"], uptime_secs=i32(row["uptime_secs"]), num_workers=row["slots"],
            # Used slots are the leader's assignments; the supervisor's own used_ports
            # lags them by a heartbeat.
            num_used_workers=row["used_slots"],
            supervisor_id=row["id"], version=row["version"] or None)
            for row in runtime_view.supervisor_rows(snap)]
        encoded = EncodedResult(data=self._replies.encode(
            snap, now, supervisors, self._nimbus_summaries(snap, now, leading),
            int(now - self.started_at)))
        self._cluster_info = (snap, int(now), leading, encoded)
        return encoded

    def getLeader(self) -> Any:
        for summary in self._nimbus_summaries():
            if summary.isLeader:
                return summary
        unknown = TApplicationException(
            TApplicationException.INTERNAL_ERROR,
            "no leader known: this nimbus gets no answer from ZooKeeper; ask another")
        try:
            if self.elector.zookeeper_answering():
                leader = self.elector.get_leader_address()
            else:
                leader = self.elector.leader_address_within(LEADER_LOOKUP_S)
        except NoLeaderError:
            raise TApplicationException(TApplicationException.INTERNAL_ERROR,
                                        "no leader: no nimbus holds the leader lock") from None
        except Exception:
            raise unknown from None
        if leader == self.address:  # heads the queue, but its lease does not hold
            raise unknown
        host, _, port = leader.rpartition(":")
        if not port.isascii() or not port.isdigit():
            raise TApplicationException(TApplicationException.INTERNAL_ERROR,
                                        f"the leader lock's head holds {leader[:60]!r}, not "
                                        "host:port")
        return storm.NimbusSummary(host=host, port=int(port), uptime_secs=0, isLeader=True,
                                   version=__version__)

    def _known(self, topology_id: str) -> Any:
        _check_id(topology_id)
        base = self.cache.snapshot.storms.get(topology_id)
        if base is None:
            base = _readable(lambda: self.reads.storm_base(topology_id))
        if base is None:
            raise storm.NotAliveException(msg=f"no live topology with id {topology_id!r}")
        return base

    def _authorize_download(self, file: str) -> None:
        """Storm's rule for ``fileDownload``, with an authorizer: admins, the supervisors
        (``nimbus.supervisor.users``) and peer nimbuses (``nimbus.daemon.users``) may
        download any topology's code; anyone else only that of a topology they may read
        (its submitter, ``topology.users``, ``topology.readonly.users``)."""
        if self.authorizer is None:
            return
        who = caller()
        daemons = {str(u) for u in [*(self.conf["nimbus.supervisor.users"] or []),
                                    *(self.conf["nimbus.daemon.users"] or [])]}
        if self.authorizer.is_admin(who) or (who is not None and who in daemons):
            return
        # A version's code (<id>.v<N>/...) is read as its topology's.
        topology_id = topology_of(str(file).split("/", 1)[0])
        try:
            self._authorize_read(topology_id)
        except storm.NotAliveException:
            raise storm.AuthorizationException(
                msg=f"{who or 'an unauthenticated client'} may not download {file!r}: not "
                    "an admin, a supervisor or a nimbus, and no topology of theirs") from None
        except storm.AuthorizationException as exc:
            raise storm.AuthorizationException(
                msg=f"{exc.msg} (nor download its code: not in nimbus.supervisor.users or "
                    "nimbus.daemon.users)") from None

    def _authorize_read(self, topology_id: str) -> None:
        """Storm's read-only topology operations (its info, configuration and topology):
        with nimbus.authorizer, only whoever may change it and its
        ``topology.readonly.users`` may read them; and ``nimbus.ui.users`` and
        ``nimbus.daemon.users``, which read every topology."""
        if self.authorizer is None:
            return
        base = self._known(topology_id)
        if self._may_read_cluster():  # a UI (nimbus.ui.users) or a peer reads them all
            return
        try:
            topo_conf = json.loads(self._code_file(topology_id, CONF_FILE).decode())
        except (storm.NotAliveException, ValueError):
            topo_conf = {}
        if not isinstance(topo_conf, dict):
            topo_conf = {}
        who = caller()
        if not self.authorizer.permit_read(
                who, base.owner, topology_users(topo_conf),
                topology_users(topo_conf, READONLY_USERS_KEY)):
            raise storm.AuthorizationException(msg=read_refusal(who, base.storm_name))

    def getTopologyInfo(self, id: str) -> Any:  # noqa: A002
        """One ExecutorSummary per worker and component it reports (``task_start`` =
        ``task_end`` = worker index + 1), and each component's kept errors, newest first.

        A worker whose beat names no component yet (just placed, or not started) shows
        as Storm's ``__system`` component, so that its host and port are still listed.
        A worker that is not running (nimbus/state/worker_state.py: no fresh beat within
        ``nimbus.task.timeout.secs``) has an ``uptime_secs`` of 0, as ``topology-info``
        shows it.
        """
        self._authorize_read(id)
        # One topology: read fresh (cheap), unlike the cached cluster-wide summary.
        _check_id(id)
        timeout_s = float(self.conf["nimbus.task.timeout.secs"])
        info = _readable(lambda: runtime_view.topology_info(self.reads, id,
                                                            timeout_s=timeout_s))
        if info is None:
            raise storm.NotAliveException(msg=f"no live topology with id {id!r}")
        executors = []
        for worker in info["workers"]:
            task = worker["index"] + 1
            for component in sorted(worker["components"]) or [SYSTEM_COMPONENT]:
                executors.append(storm.ExecutorSummary(
                    executor_info=storm.ExecutorInfo(task_start=i32(task), task_end=i32(task)),
                    component_id=component, host=worker["host"], port=i32(worker["port"]),
                    uptime_secs=i32(worker["uptime_secs"])))
        errors = {component: [storm.ErrorInfo(error=e["error"],
                                              error_time_secs=i32(e["time_secs"]),
                                              host=e["host"] or None,
                                              port=i32(e["port"]) or None)
                              for e in kept]
                  for component, kept in info["errors"].items()}
        return storm.TopologyInfo(
            id=id, name=info["name"], uptime_secs=i32(info["uptime_secs"]), executors=executors,
            status=info["status"], errors=errors, owner=info["owner"] or None,
            replication_count=self.lifecycle.distributor.get_replication_count(
                self._running_key(id)))

    def _code_file(self, topology_id: str, name: str) -> bytes:
        """A file of the code ``topology_id`` runs (its running version's)."""
        self._known(topology_id)
        try:
            return (self.store.path(self._running_key(topology_id)) / name).read_bytes()
        except (OSError, UnsafePathError):
            raise storm.NotAliveException(
                msg=f"this nimbus holds no code of {topology_id!r} yet; ask the leader") from None

    def getTopologyConf(self, id: str) -> str:  # noqa: A002
        self._authorize_read(id)
        # A topology's own conf may carry credentials too: never hand them out.
        topo_conf = json.loads(self._code_file(id, CONF_FILE).decode())
        return json.dumps(redact(topo_conf), sort_keys=True)

    def getTopology(self, id: str) -> Any:  # noqa: A002
        self._authorize_read(id)
        data = self._code_file(id, TOPOLOGY_FILE)
        if not data:
            return storm.StormTopology(spouts={}, bolts={}, state_spouts={})
        return deserialize(storm.StormTopology(), data, _PROTO)

    getUserTopology = getTopology

    # -- Storm UI's pages (any nimbus, as getTopologyInfo; nimbus/thrift/page_info.py) ----
    def _fresh_topology_info(self, topology_id: str) -> dict[str, Any]:
        """runtime_view.topology_info of one topology, read fresh from ZooKeeper as
        getTopologyInfo reads it; NotAliveException for an unknown id."""
        _check_id(topology_id)
        timeout_s = float(self.conf["nimbus.task.timeout.secs"])
        info = _readable(lambda: runtime_view.topology_info(self.reads, topology_id,
                                                            timeout_s=timeout_s))
        if info is None:
            raise storm.NotAliveException(msg=f"no live topology with id {topology_id!r}")
        return info

    def _redacted_conf(self, topology_id: str) -> str | None:
        """What getTopologyConf answers (secrets redacted), or None when this nimbus holds
        no readable copy of the topology's code yet."""
        try:
            topo_conf = json.loads(self._code_file(topology_id, CONF_FILE).decode())
        except (storm.NotAliveException, ValueError):
            return None
        return json.dumps(redact(topo_conf), sort_keys=True)

    def getTopologyPageInfo(self, id: str, window: str | None,  # noqa: A002
                            is_include_sys: bool | None) -> Any:
        """Storm UI's topology page: the topology's summary, its redacted conf, one bolt
        per component with its last error, its workers, and the current numbers under
        ``window`` (default ``:all-time``; every window is answered alike: nimbus-ha
        keeps no windowed counters). The caller must be allowed to read the topology,
        as for getTopologyInfo; an unknown id is NotAliveException."""
        self._authorize_read(id)
        info = self._fresh_topology_info(id)
        return page_info.topology_page(
            info, window, bool(is_include_sys), topology_conf=self._redacted_conf(id),
            replication_count=self.lifecycle.distributor.get_replication_count(
                self._running_key(id)))

    def getComponentPageInfo(self, topology_id: str, component_id: str,
                             window: str | None, is_include_sys: bool | None) -> Any:
        """Storm UI's component page: one of the components getTopologyInfo names (a
        query, ``main``, ``__system``, or a component that only has errors), as a bolt,
        with one ExecutorAggregateStats per worker that runs it and its kept errors,
        newest first. NotAliveException for an unknown topology or component; the read
        rule of getTopologyInfo applies."""
        self._authorize_read(topology_id)
        info = self._fresh_topology_info(topology_id)
        return page_info.component_page(info, component_id, window, bool(is_include_sys))

    def _may_read(self, topology_id: str) -> bool:
        """Whether the caller passes getTopologyInfo's read rule for the topology."""
        try:
            self._authorize_read(topology_id)
        except storm.AuthorizationException:
            return False
        return True

    def getSupervisorPageInfo(self, id: str | None, host: str | None,  # noqa: A002
                              is_include_sys: bool | None) -> Any:
        """Storm UI's supervisor page: the supervisor ``id``, or with ``id`` unset (or
        empty) every supervisor on ``host``, each as getClusterInfo summarises it, and
        the workers the leader placed on them, sorted by supervisor and port.

        Open to every client, as getClusterInfo is (Storm's rule). As in Storm, a worker
        of a topology the caller may not read (the read rule of getTopologyInfo) is
        listed without its ``component_to_num_tasks``. NotAliveException when no live
        supervisor has that id, or none runs on that host."""
        snap = self.cache.snapshot  # the supervisors getClusterInfo lists
        if id:
            if id not in snap.supervisors:
                raise storm.NotAliveException(msg=f"no live supervisor with id {id[:200]!r}")
            chosen = [id]
        elif host:
            chosen = sorted(sid for sid, info in snap.supervisors.items()
                            if info.hostname == host)
            if not chosen:
                raise storm.NotAliveException(msg=f"no live supervisor on host {host[:200]!r}")
        else:
            raise storm.NotAliveException(msg="getSupervisorPageInfo: give a supervisor id "
                                              "or a host")
        used = snap.used_ports()
        summaries = [page_info.supervisor_summary(sid, snap.supervisors[sid],
                                                  used.get(sid, []))
                     for sid in chosen]
        topologies = sorted(topology_id for topology_id, assignment in snap.assignments.items()
                            if any(str(slot[0]) in chosen
                                   for slot in assignment.executor_node_port.values()))
        workers = []
        for topology_id in topologies:
            try:  # read fresh: where its workers are now, and how they run
                info = self._fresh_topology_info(topology_id)
                readable = self._may_read(topology_id)
            except storm.NotAliveException:
                continue  # killed since the snapshot
            workers += [(w["supervisor_id"], w["port"],
                         page_info.worker_summary(info, w, bool(is_include_sys), readable))
                        for w in info["workers"] if w["supervisor_id"] in chosen]
        workers.sort(key=lambda found: (chosen.index(found[0]), found[1]))
        return storm.SupervisorPageInfo(supervisor_summaries=summaries,
                                        worker_summaries=[w for _s, _p, w in workers])

    # -- nimbus-ha's own reads (nimbus/thrift/nimbus_ha.thrift): any nimbus answers ------
    def getTopologyView(self, id: str) -> str:  # noqa: A002
        """``runtime_view.topology_info`` of the topology as JSON: what ``nimbus-ha
        topology-info --json`` prints, read fresh from ZooKeeper by this nimbus. The read
        rule of getTopologyInfo applies; NotAliveException for an unknown id."""
        self._authorize_read(id)
        return json.dumps(self._fresh_topology_info(id), sort_keys=True)

    def getTopologyRows(self) -> str:
        """``top``'s rows (nimbus/master/topology_rows.py) as a JSON list: every live
        topology the caller may read (getTopologyInfo's rule), sorted by name."""
        timeout_s = float(self.conf["nimbus.task.timeout.secs"])

        def may_read(topology_id: str) -> bool:
            try:
                return self._may_read(topology_id)
            except storm.NotAliveException:
                return False  # removed since the listing

        # A UI reading through this nimbus sees every topology (it applies its own
        # users' rights, as with getClusterRecords).
        every = self.authorizer is None or self._may_read_cluster()
        rows = _readable(lambda: topology_rows(self.reads, self.cache.snapshot,
                                               None if every else may_read, timeout_s))
        return json.dumps(rows, sort_keys=True)

    def getLogSources(self, id: str) -> str:  # noqa: A002
        """The logviewers that may hold the topology's worker logs
        (nimbus/master/log_sources.py) as JSON. The read rule of getTopologyInfo
        applies (the logviewers apply it again); NotAliveException for an unknown id."""
        self._authorize_read(id)
        self._known(id)
        return json.dumps(_readable(lambda: log_sources(self.reads, id)), sort_keys=True)

    def _may_read_cluster(self) -> bool:
        """Whether the caller may read every topology's records (getClusterRecords):
        ``nimbus.admins``, ``nimbus.ui.users`` and ``nimbus.daemon.users``."""
        who = caller()
        allowed = {str(u) for u in [*(self.conf["nimbus.ui.users"] or []),
                                    *(self.conf["nimbus.daemon.users"] or [])]}
        return self.authorizer is None or self.authorizer.is_admin(who) or (
            who is not None and who in allowed)

    def getClusterRecords(self) -> str:
        """This nimbus's cluster summary (what getClusterInfo is built from) as JSON, the
        records as they are in ZooKeeper: ``{"nimbuses": [NimbusInfo], "leader": str |
        None, "storms": {id: StormBase}, "assignments": {id: Assignment},
        "supervisors": {id: SupervisorInfo}, "replication": {id: int},
        "running_versions": {id: int} (the code version each upgraded topology runs),
        "taken_at": float}``. For a UI with ``ui.source: thrift``
        (nimbus/ui/thrift_reader.py), which applies each of its users' rights itself:
        with an authorizer, only ``nimbus.admins``, ``nimbus.ui.users`` and
        ``nimbus.daemon.users`` may call it (the supervisors' records hold every
        topology's worker errors)."""
        if self.authorizer is not None and not self._may_read_cluster():
            who = caller()
            raise storm.AuthorizationException(
                msg=f"{who or 'an unauthenticated client'} may not read the cluster's "
                    "records: not in nimbus.admins, nimbus.ui.users or nimbus.daemon.users")
        snap = self.cache.snapshot

        def plain(record: Any) -> Any:
            return json.loads(record.encode())

        return json.dumps({
            "nimbuses": [plain(n) for n in snap.nimbuses], "leader": snap.leader,
            "storms": {t: plain(b) for t, b in snap.storms.items()},
            "assignments": {t: plain(a) for t, a in snap.assignments.items()},
            "supervisors": {s: plain(i) for s, i in snap.supervisors.items()},
            "replication": dict(snap.replication),
            "running_versions": dict(snap.running_versions), "taken_at": snap.taken_at},
            sort_keys=True)
