"""Client of the Nimbus Thrift service that finds the leader through ``nimbus.seeds``.

Leader-only calls go to the leader; if a nimbus answers "not a leader, current leader is
X" (it lost the lock since we looked) the call is retried on X, and if a nimbus is down
the leader is looked up again, until a deadline.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import logging
import socket
import ssl
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.rpc import make_client
from thriftpy2.thrift import TApplicationException
from thriftpy2.transport import TFramedTransportFactory, TTransportException

from nimbus.cluster_security import ClusterSecurity
from nimbus.config import SUBMISSION_TOKEN_KEY, UPLOAD_CHUNK_BYTES, Config, HostPort
from nimbus.distribution import code_stream
from nimbus.distribution.archive import PieceReader, bundle_pieces
from nimbus.thrift import NOT_LEADER_PREFIX, nimbus_ha, storm
from nimbus.thrift.collector_pause import QuietDecoding
from nimbus.topology_paths import resolve_path_keys

CHUNK_BYTES = UPLOAD_CHUNK_BYTES
# How long a submit with topology.max.replication.wait.time.sec = -1 may wait for replies.
REPLICATION_FOREVER_S = 24 * 3600.0
log = logging.getLogger(__name__)

CONNECTION_ERRORS = (TTransportException, ConnectionError, OSError, EOFError)


def _one_line(problem: object) -> str:
    """A connection problem in a few words: thriftpy2's transport errors print their
    type code and repr; their message says it."""
    if isinstance(problem, TTransportException) and problem.message:
        return str(problem.message)
    if isinstance(problem, TApplicationException) and problem.message:
        return str(problem.message)
    text = str(problem) or type(problem).__name__
    return " ".join(text.split())


class NimbusUnavailableError(RuntimeError):
    """No nimbus could be reached, or no leader was found before the deadline.

    ``not_up``: every seed failed in a way that waiting may cure (nothing listens there
    yet, or no leader is elected yet), not because of what was said (a TLS handshake
    refused, a connection dropped mid-call by a server that speaks something else)."""

    def __init__(self, message: str, not_up: bool = False):
        super().__init__(message)
        self.not_up = not_up


def _not_up(exc: BaseException) -> bool:
    """Whether a connection failed because nothing listens at the address (yet): a
    refused or timed-out connect, an unreachable host. thriftpy2 reports every failed
    connect, a TLS handshake's too, as NOT_OPEN; what it caught tells them apart."""
    if isinstance(exc, TTransportException):
        if exc.type != TTransportException.NOT_OPEN:
            return False
        exc = exc.__cause__ or exc.__context__ or exc
    if isinstance(exc, ssl.SSLError):
        return False
    return isinstance(exc, ConnectionRefusedError | TimeoutError) or (
        isinstance(exc, OSError) and exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH))


class TransferRefusedError(ValueError):
    """The nimbus refused an upload (too large, an unsafe bundle, no such session)."""


@contextlib.contextmanager
def connect(address: HostPort | str, timeout_s: float = 30.0,
            security: ClusterSecurity | None = None) -> Iterator[Any]:
    """A Thrift client of the NimbusHa service (Storm's Nimbus and nimbus-ha's own
    reads: nimbus/thrift/nimbus_ha.thrift) at ``address``, closed on exit: over TLS with
    ``security``'s client certificate when it has one, plain TCP without (None)."""
    hp = address if isinstance(address, HostPort) else HostPort.parse(str(address), 6627)
    context = security.client_context if security is not None else None
    client = make_client(nimbus_ha.NimbusHa, hp.host, hp.port,
                         proto_factory=TBinaryProtocolFactory(),
                         trans_factory=TFramedTransportFactory(),
                         timeout=int(timeout_s * 1000),
                         **({"ssl_context": context} if context is not None else {}))
    # A large reply (getClusterInfo at fleet size) decodes without the collector's
    # futile runs: nimbus/thrift/collector_pause.py.
    client._iprot = client._oprot = QuietDecoding(client._iprot)
    try:
        yield client
    finally:
        client.close()


def set_read_timeout(client: Any, timeout_s: float) -> None:
    """Change the read timeout of a client made by :func:`connect`, for its next calls.

    thriftpy2 has no public call for it: its framed transport holds the socket.
    """
    client._iprot.trans.sock.settimeout(timeout_s)


def not_leader_redirect(exc: Exception) -> str | None:
    """The leader named in a "not a leader" refusal ("" when it names none), or None for
    any other error."""
    message = getattr(exc, "message", None) or ""
    if isinstance(exc, TApplicationException) and message.startswith(NOT_LEADER_PREFIX):
        named = exc.message[len(NOT_LEADER_PREFIX):].strip()
        return named if named and " " not in named else ""
    return None


def fetch_file(peer: str, remote_path: str, dest: Path, timeout_s: float = 30.0,
               security: ClusterSecurity | None = None) -> str:
    """Copy one file of topology code from a nimbus; returns the sha256 of the bytes
    written, computed while they arrive so that callers can verify the copy without
    reading it again. ``security``: as :func:`connect` (a root binds its own with
    :func:`file_fetcher`).

    The download session is opened over Thrift (``beginFileDownload``, so the port's
    authentication applies) and drained over the code stream beside it
    (:mod:`nimbus.distribution.code_stream`); a nimbus without the code stream is read
    with Storm's ``downloadChunk`` instead.
    """
    context = security.client_context if security is not None else None
    with connect(peer, timeout_s, security) as client:
        session = client.beginFileDownload(remote_path)
        try:
            with _stream_socket(peer, timeout_s, context) as sock:
                return code_stream.receive(sock, session, dest)
        except code_stream.StreamUnsupportedError:
            pass
        digest = hashlib.sha256()
        with open(dest, "wb") as out:
            while True:
                chunk = client.downloadChunk(session)
                if not chunk:
                    return digest.hexdigest()
                out.write(chunk)
                digest.update(chunk)


def file_fetcher(security: ClusterSecurity) -> Callable[..., str]:
    """:func:`fetch_file` with ``security``: what a process's root gives the master,
    the supervisor and the code distributors (``DistributorContext.fetch_file``)."""
    return functools.partial(fetch_file, security=security)


@contextlib.contextmanager
def _stream_socket(peer: str, timeout_s: float, context: ssl.SSLContext | None
                   ) -> Iterator[socket.socket]:
    """A connection to ``peer``'s Thrift port for a code stream, over TLS with
    ``context`` when there is one (the same certificate as the Thrift calls)."""
    hp = HostPort.parse(str(peer), 6627)
    with _stream_socket_to(hp.host, hp.port, timeout_s, context) as sock:
        yield sock


@contextlib.contextmanager
def _stream_socket_to(host: str, port: int, timeout_s: float,
                      context: ssl.SSLContext | None) -> Iterator[socket.socket]:
    sock = socket.create_connection((host, port), timeout=timeout_s)
    try:
        if context is not None:
            sock = context.wrap_socket(sock, server_hostname=host)
        yield sock
    finally:
        sock.close()


def _peer_of(client: Any) -> tuple[str, int]:
    """(host, port) of the nimbus a client made by :func:`connect` talks to. thriftpy2
    has no public call for it: its framed transport holds the socket."""
    host, port = client._iprot.trans.sock.getpeername()[:2]
    return str(host), int(port)


class NimbusClient:
    """Talk to the cluster: find the leader, send leader-only calls there, retry."""

    def __init__(self, conf: Config, deadline_s: float | None = None,
                 security: ClusterSecurity | None = None):
        """``deadline_s``: how long calls wait for the cluster (a nimbus, a leader);
        default ``nimbus.client.wait.secs``. Every call makes at least one attempt.
        ``security``: the process's, whose client certificate it presents; by default
        that of ``conf``'s TLS settings (:meth:`ClusterSecurity.for_client`)."""
        self.conf = conf
        self.security = security if security is not None else ClusterSecurity.for_client(conf)
        self.seeds = conf.seeds
        self.timeout_s = max(5.0, conf.session_timeout_s * 2)
        self.deadline_s = deadline_s if deadline_s is not None else conf.client_wait_s
        self._told_waiting = False

    def _waiting(self, what: str, problem: object) -> None:
        """Say once per client that it waits (a client started before any nimbus, or
        during a failover): a command that later succeeds has then said one line."""
        if self._told_waiting or self.deadline_s <= 0:
            return
        self._told_waiting = True
        log.warning("%s via nimbus.seeds (%s): waiting up to %.0fs (nimbus.client.wait.secs)",
                    what, ", ".join(map(str, self.seeds)), self.deadline_s)
        log.debug("the first attempt failed: %s", _one_line(problem))

    def find_leader(self) -> HostPort:
        """Ask each seed in turn who leads; raises NimbusUnavailableError if none knows."""
        errors = []
        not_up = True
        for seed in self.seeds:
            try:
                with connect(seed, self.timeout_s, self.security) as client:
                    leader = client.getLeader()
                return HostPort(leader.host, leader.port)
            except CONNECTION_ERRORS as exc:
                errors.append(f"{seed}: {_one_line(exc)}")
                not_up = not_up and _not_up(exc)
            except TApplicationException as exc:  # up, but no leader elected yet
                errors.append(f"{seed}: {exc.message}")
        raise NimbusUnavailableError(
            "no leader found via nimbus.seeds (" + "; ".join(errors) + ")", not_up)

    def _try_any(self, call: Callable[[Any], Any]) -> Any:
        errors = []
        not_up = True
        for seed in self.seeds:
            try:
                with connect(seed, self.timeout_s, self.security) as client:
                    return call(client)
            except CONNECTION_ERRORS as exc:
                errors.append(f"{seed}: {_one_line(exc)}")
                not_up = not_up and _not_up(exc)
        raise NimbusUnavailableError(
            "no nimbus reachable via nimbus.seeds (" + "; ".join(errors) + ")", not_up)

    def any_nimbus(self, call: Callable[[Any], Any]) -> Any:
        """Run ``call(client)`` on the first seed that answers (for read-only calls),
        waiting up to the client's deadline for one to answer."""
        return self._until_deadline(lambda: self._try_any(call), "no nimbus answers yet",
                                    "no nimbus answered")

    def _until_deadline(self, attempt: Callable[[], Any], waiting: str, gave_up: str) -> Any:
        """``attempt()`` until it does not raise NimbusUnavailableError or the deadline
        passes (at least once); then NimbusUnavailableError saying how long it waited.
        Only a cluster that is not up yet is waited for: a seed that answered with
        something else (a refused TLS handshake, another protocol) fails at once."""
        deadline = time.monotonic() + self.deadline_s
        pause = 0.1
        while True:
            try:
                return attempt()
            except NimbusUnavailableError as exc:
                if not exc.not_up:
                    raise
                if time.monotonic() + pause >= deadline:
                    if self.deadline_s <= 0:
                        raise
                    raise NimbusUnavailableError(
                        f"{gave_up} within {self.deadline_s:.0f}s "
                        f"(nimbus.client.wait.secs): {exc}") from None
                self._waiting(waiting, exc)
            time.sleep(pause)  # back off before asking the cluster again
            pause = min(2.0, pause * 2)

    def on_leader(self, call: Callable[[Any], Any], deadline_s: float | None = None) -> Any:
        """Run ``call(client)`` on the leader, following redirects and failovers.

        No new attempt starts after ``deadline_s`` (default: the client's); one that is
        under way is not cut short. At least one attempt is made.
        """
        deadline_s = self.deadline_s if deadline_s is None else deadline_s
        deadline = time.monotonic() + deadline_s
        target: HostPort | None = None
        last: Exception | None = None
        pause = 0.1
        while True:
            try:
                target = target or self.find_leader()
                with connect(target, self.timeout_s, self.security) as client:
                    return call(client)
            except TApplicationException as exc:
                redirect = not_leader_redirect(exc)
                if redirect is None:
                    raise
                try:
                    target = HostPort.parse(redirect, self.conf["nimbus.thrift.port"]) \
                        if redirect else None  # names none: ask the seeds again
                except ValueError:
                    target = None
                last = exc
            except (NimbusUnavailableError, *CONNECTION_ERRORS) as exc:
                target, last = None, exc
            if time.monotonic() + pause >= deadline:
                break
            self._waiting("no leader answers yet", last)
            time.sleep(pause)  # back off before asking the cluster again
            pause = min(2.0, pause * 2)
        raise NimbusUnavailableError(f"no leader answered within {deadline_s:.0f}s "
                                     f"(nimbus.client.wait.secs): {_one_line(last)}")

    def read(self, call: Callable[[Any], Any]) -> Any:
        """``call(client)`` for a read: on the leader (it sees its own writes at once, and
        holds every active topology's code, which the read rules consult) or, while
        there is no leader, on any nimbus; waits for one to answer."""
        def attempt() -> Any:
            try:
                with connect(self.find_leader(), self.timeout_s, self.security) as client:
                    return call(client)
            except (NimbusUnavailableError, *CONNECTION_ERRORS):
                return self._try_any(call)

        return self._until_deadline(attempt, "no nimbus answers yet", "no nimbus answered")

    # -- commands -------------------------------------------------------------------------
    def cluster_info(self) -> Any:
        """The ClusterSummary (:meth:`read`)."""
        return self.read(lambda c: c.getClusterInfo())

    # -- nimbus-ha's own reads: no ZooKeeper access needed (nimbus/thrift/nimbus_ha.thrift)
    def topology_id(self, name: str) -> str:
        """The id of the live topology named ``name`` (from getClusterInfo, as Storm's
        clients find it); NotAliveException "no topology named NAME" if there is none."""
        for summary in self.cluster_info().topologies or []:
            if summary.name == name and summary.status != "KILLED":
                return str(summary.id)
        raise storm.NotAliveException(msg=f"no topology named {name}")

    def topology_view(self, name: str) -> dict[str, Any]:
        """What ``topology-info --json`` shows of topology ``name``
        (nimbus/state/runtime_view.py topology_info): getTopologyView."""
        topology_id = self.topology_id(name)
        return json.loads(self._named(name, lambda c: c.getTopologyView(topology_id)))

    def topology_rows(self) -> list[dict[str, Any]]:
        """``top``'s rows (nimbus/master/topology_rows.py): every live topology this
        client may read."""
        return json.loads(self.read(lambda c: c.getTopologyRows()))

    def log_sources(self, name: str) -> dict[str, Any]:
        """The logviewers that may hold topology ``name``'s worker logs
        (nimbus/master/log_sources.py): getLogSources."""
        topology_id = self.topology_id(name)
        return json.loads(self._named(name, lambda c: c.getLogSources(topology_id)))

    def _named(self, name: str, call: Callable[[Any], Any]) -> Any:
        """A :meth:`read` about topology ``name``: one killed since its id was looked up
        is "no topology named NAME", not an id the user never typed."""
        try:
            return self.read(call)
        except storm.NotAliveException:
            raise storm.NotAliveException(msg=f"no topology named {name}") from None

    def leader(self) -> HostPort:
        return self._until_deadline(self.find_leader, "no leader is known yet",
                                    "no leader was found")

    def upload_bundle(self, data_source: Path | bytes, progress: Callable[[int], None],
                      client: Any) -> str:
        """Upload a bundle to the connected nimbus; returns the upload location, finished.

        ``data_source`` is a directory (packed while it is sent: a stored tar, see
        :func:`nimbus.distribution.archive.directory_pieces`), an archive file (sent as
        it is) or ``bytes`` (small bundles, such as those of tests). Memory use does not
        depend on its size. The bytes go over the upload stream beside this Thrift
        connection (:mod:`nimbus.distribution.code_stream`: ``sendfile`` from the page
        cache, the nimbus checking the bundle as it arrives); a nimbus without the
        stream gets them in CHUNK_BYTES ``uploadChunk`` calls on the same session.
        ``progress`` is called with each number of bytes sent.
        """
        location = client.beginFileUpload()
        host, port = _peer_of(client)
        try:
            with _stream_socket_to(host, port, self.timeout_s,
                                   self.security.client_context) as sock, \
                    contextlib.closing(bundle_pieces(data_source)) as pieces:
                code_stream.send_upload(sock, location, pieces, progress)
            return location
        except code_stream.StreamUnsupportedError:
            pass  # an older nimbus: nothing was sent, the session is as it was
        except code_stream.StreamRefusedError as exc:
            # Not a connection problem: a retry elsewhere would be refused the same way.
            raise TransferRefusedError(f"the nimbus refused the upload: {exc}") from None
        with PieceReader(bundle_pieces(data_source)) as reader:
            while chunk := reader.read(CHUNK_BYTES):
                client.uploadChunk(location, chunk)
                progress(len(chunk))
        client.finishFileUpload(location)
        return location

    def submit(self, name: str, bundle: Path | bytes, topology_conf: dict[str, Any],
               progress: Callable[[int], None] = lambda n: None, active: bool = True) -> str:
        """Upload a bundle (an archive file, or small ``bytes``) and submit it; returns the
        new topology's id. A retry on another leader uploads the bundle again."""
        initial = storm.TopologyInitialStatus
        status = initial.ACTIVE if active else initial.INACTIVE
        # One token for every attempt: a retry (after a timeout or a failover) of a submit
        # that did succeed is then answered with that topology, not "already alive".
        # Paths are resolved here, where they were typed: a worker runs elsewhere.
        topology_conf = {SUBMISSION_TOKEN_KEY: uuid.uuid4().hex,
                         **resolve_path_keys(topology_conf)}
        wait = topology_conf.get("topology.max.replication.wait.time.sec",
                                 self.conf["topology.max.replication.wait.time.sec"])

        # The leader answers only once the code is replicated (or the wait is over).
        wait_s = float(wait) if isinstance(wait, int) and wait >= 0 else REPLICATION_FOREVER_S

        def call(client: Any) -> str:
            location = self.upload_bundle(bundle, progress, client)
            set_read_timeout(client, self.timeout_s + wait_s)  # for this reply only
            client.submitTopologyWithOpts(
                name, location, json.dumps(topology_conf), storm.StormTopology(
                    spouts={}, bolts={}, state_spouts={}),
                storm.SubmitOptions(initial_status=status))
            set_read_timeout(client, self.timeout_s)
            info = client.getClusterInfo()
            for summary in info.topologies:
                if summary.name == name:
                    return summary.id
            raise RuntimeError(f"submitted {name!r} but the leader does not list it")

        # A retry may start as late as the bounded wait allows; finding a leader while
        # there is none still fails after the client's usual deadline.
        return self.on_leader(call, deadline_s=self.deadline_s + (
            wait_s if wait_s < REPLICATION_FOREVER_S else 0.0))

    # -- upgrades (nimbus_ha.thrift's extension; nimbus/master/upgrades.py) ---------------
    def upgrade(self, name: str, bundle: Path | bytes, topology_conf: dict[str, Any],
                strategy: str = "all") -> dict[str, Any]:
        """Upload a bundle (as :meth:`submit` does) and run it as the next code version
        of live topology ``name`` (upgradeTopology); returns the leader's answer,
        ``{"topology_id": str, "version": int}``, given once the version is replicated
        and its switch has begun (follow it with :meth:`history`).

        ``topology_conf`` is overlaid on the running version's conf: give only the keys
        to change (a change of topology.workers, of topology.spark.checkpoint.dir or of
        the bundle's kind is refused, InvalidTopologyException). Raises
        NotAliveException for an unknown name; InvalidTopologyException while a switch
        or a rebalance is under way. A retry on another leader uploads the bundle again
        and is recognised by its token.
        """
        topology_conf = {SUBMISSION_TOKEN_KEY: uuid.uuid4().hex,
                         **resolve_path_keys(topology_conf)}
        wait = topology_conf.get("topology.max.replication.wait.time.sec",
                                 self.conf["topology.max.replication.wait.time.sec"])
        wait_s = float(wait) if isinstance(wait, int) and wait >= 0 else REPLICATION_FOREVER_S

        def call(client: Any) -> dict[str, Any]:
            location = self.upload_bundle(bundle, lambda n: None, client)
            set_read_timeout(client, self.timeout_s + wait_s)  # for this reply only
            answer = client.upgradeTopology(name, location, json.dumps(topology_conf),
                                            strategy)
            set_read_timeout(client, self.timeout_s)
            return dict(json.loads(answer))

        return self.on_leader(call, deadline_s=self.deadline_s + (
            wait_s if wait_s < REPLICATION_FOREVER_S else 0.0))

    def rollback(self, name: str, version: int | None = None) -> dict[str, Any]:
        """Switch live topology ``name`` to its kept code ``version`` (None: the previous
        one; during a switch, the version it switches from), every worker at once
        (rollbackTopology); returns ``{"topology_id": str, "version": int}``. Raises
        NotAliveException for an unknown name, InvalidTopologyException for a version
        not kept or already running."""
        answer = self.on_leader(lambda c: c.rollbackTopology(name, version or 0))
        return dict(json.loads(answer))

    def history(self, name: str) -> dict[str, Any]:
        """The code versions of topology ``name`` (getTopologyHistory, a :meth:`read`):
        ``{"topology_id", "name", "running", "switch": {...} or None, "versions":
        [{"version", "sha256", "submitter", "created_secs", "state", "error"}, ...]}``,
        newest first. NotAliveException "no topology named NAME" if there is none."""
        return dict(json.loads(self._named(name, lambda c: c.getTopologyHistory(name))))

    def kill(self, name: str, wait_secs: int | None = None) -> None:
        opts = storm.KillOptions(wait_secs=wait_secs)
        self.on_leader(lambda c: c.killTopologyWithOpts(name, opts))

    def activate(self, name: str) -> None:
        self.on_leader(lambda c: c.activate(name))

    def deactivate(self, name: str) -> None:
        self.on_leader(lambda c: c.deactivate(name))

    def rebalance(self, name: str, num_workers: int, wait_secs: int | None = None) -> None:
        """Give topology ``name`` ``num_workers`` workers (Storm's ``rebalance -n -w``).

        Raises InvalidTopologyException for a bad value (or a topology being killed or
        already REBALANCING) and NotAliveException for an unknown name. Without
        ``wait_secs`` (or 0) the leader's scheduler resizes the assignment on its next
        pass; with it the topology is REBALANCING, its workers stopped, for that many
        seconds, and then resized and back to its previous status.
        """
        opts = storm.RebalanceOptions(wait_secs=wait_secs, num_workers=num_workers)
        self.on_leader(lambda c: c.rebalance(name, opts))
