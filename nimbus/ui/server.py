"""Serving the UI: cheroot (CherryPy's production WSGI server) in a named thread.

:class:`UIServer` owns everything the UI runs: its ZooKeeper client, the threads of its
reader (:mod:`nimbus.ui.reader`), the leader client and the HTTP server; ``stop`` ends
and joins them all. It binds only ``ui.host`` (default 127.0.0.1). Which reader depends
on where it runs: inside a nimbus it shows that nimbus's summary
(:mod:`nimbus.ui.summary_reader`); a UI process of its own reads ZooKeeper
(:mod:`nimbus.ui.zk_reader`) or, with ``ui.source: thrift``, asks a nimbus
(:mod:`nimbus.ui.thrift_reader`).

With ``storm.thrift.transport: tls`` it serves HTTPS and requires client certificates
of the cluster's CA (nimbus/ui/https.py); plain HTTP then needs ``ui.insecure.allow``.

Hostile clients (issue 19): the server's gate (nimbus/web/gate.py) shakes hands and
reads each request's head before a worker thread sees it, within
``ui.max.request.line.bytes``, ``ui.max.header.bytes`` and ``ui.header.timeout.secs``;
a request whose Host header is not one of ``ui.allowed.hosts`` gets 421
(nimbus/ui/hosts.py).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from kazoo.client import KazooClient

from nimbus.cluster_security import ClusterSecurity
from nimbus.config import Config, ConfigError
from nimbus.daemon_base import StopOnce
from nimbus.thrift.client import NimbusClient, connect
from nimbus.thrift.tls import tls_enabled
from nimbus.ui.app import MAX_BODY_BYTES, UIApp
from nimbus.ui.hosts import ANY, KEY, WILDCARD_BINDS, HostCheck, accepted_hosts, allowed_entries
from nimbus.ui.https import ClientCertAdapter, own_identity, server_context, ui_transport
from nimbus.ui.local_nimbus import LocalNimbus
from nimbus.ui.reader import UIReader
from nimbus.ui.summary_reader import NimbusSummary, SummaryReader
from nimbus.ui.thrift_reader import ThriftReader
from nimbus.ui.zk_reader import ZooKeeperReader
from nimbus.web.gate import GatedServer, HeadLimits

log = logging.getLogger(__name__)

HTTP_THREADS = 8
CONF_FETCH_TIMEOUT_S = 3.0
MIN_LINE_BYTES = 256
MAX_HEAD_BYTES = 1024 * 1024


UI_SOURCES = ("zookeeper", "thrift")


def ui_source(conf: Config) -> str:
    """``ui.source``: where the UI reads the cluster; ConfigError for anything else."""
    source = conf["ui.source"]
    if source not in UI_SOURCES:
        raise ConfigError(f"ui.source must be one of {', '.join(UI_SOURCES)}, got "
                          f"{str(source)[:60]!r}")
    return str(source)


def head_limits(conf: Config) -> HeadLimits:
    """``ui.max.request.line.bytes``, ``ui.max.header.bytes`` and
    ``ui.header.timeout.secs``, checked (ConfigError)."""
    line = conf["ui.max.request.line.bytes"]
    head = conf["ui.max.header.bytes"]
    timeout = conf["ui.header.timeout.secs"]
    if line < MIN_LINE_BYTES:
        raise ConfigError(f"ui.max.request.line.bytes must be at least {MIN_LINE_BYTES} "
                          f"(got {line})")
    if head < line:
        raise ConfigError(f"ui.max.header.bytes ({head}) must be at least "
                          f"ui.max.request.line.bytes ({line})")
    if head > MAX_HEAD_BYTES:
        raise ConfigError(f"ui.max.header.bytes must be at most {MAX_HEAD_BYTES} "
                          f"(got {head})")
    if timeout < 1:
        raise ConfigError(f"ui.header.timeout.secs must be at least 1 (got {timeout})")
    return HeadLimits(line_bytes=line, head_bytes=head, timeout_s=float(timeout))


def ui_client(conf: Config, security: ClusterSecurity) -> NimbusClient:
    """The leader client of the UI's actions: it retries across a failover for about
    two session timeouts, then the request gets 503."""
    return NimbusClient(conf, deadline_s=max(15.0, 2 * conf.session_timeout_s),
                        security=security)


def topology_conf_fetcher(conf: Config, security: ClusterSecurity) -> Any:
    """A function id -> getTopologyConf JSON, asking each seed in turn (a follower may
    not hold the code yet; any nimbus that does answers the same)."""
    def fetch(topology_id: str) -> str:
        errors = []
        for seed in conf.seeds:
            try:
                with connect(seed, CONF_FETCH_TIMEOUT_S, security) as client:
                    return client.getTopologyConf(topology_id)
            except Exception as exc:  # down, no code yet, not alive: try the next one
                errors.append(f"{seed}: {getattr(exc, 'msg', None) or exc!r}")
        raise RuntimeError("; ".join(errors) or "no nimbus.seeds")
    return fetch


def replica_count_fetcher(conf: Config, security: ClusterSecurity) -> Any:
    """A function returning {topology id: replication count} as a nimbus reports it in
    getClusterInfo (any seed answers from its cache)."""
    def fetch() -> dict[str, int]:
        errors = []
        for seed in conf.seeds:
            try:
                with connect(seed, CONF_FETCH_TIMEOUT_S, security) as client:
                    return {t.id: int(t.replication_count or 0)
                            for t in client.getClusterInfo().topologies}
            except Exception as exc:  # down or starting: try the next one
                errors.append(f"{seed}: {getattr(exc, 'msg', None) or exc!r}")
        raise RuntimeError("; ".join(errors) or "no nimbus.seeds")
    return fetch


class UIServer:
    """The REST API and dashboard on ``ui.host``:``ui.port`` (``port`` overrides; 0 picks
    a free one, see :attr:`port` after :meth:`start`). ``zk``: a ZooKeeper client to read
    with (else the UI makes its own). Inside a nimbus (``nimbus.ui.enabled``):
    ``local_nimbus``, that nimbus, which the UI then shows the duty cycle of, and
    ``summary``, that nimbus's cluster summary, which the UI then shows instead of
    reading the cluster again (with ``zk``, the nimbus's session, for what the summary
    does not hold: heartbeats, errors, one topology's page). ``security``: that
    nimbus's (its authorizer and client certificate); a UI process of its own makes its
    own at :meth:`start` (:meth:`ClusterSecurity.for_daemon`)."""

    def __init__(self, conf: Config, zk: KazooClient | None = None, port: int | None = None,
                 host: str | None = None, local_nimbus: LocalNimbus | None = None,
                 summary: NimbusSummary | None = None,
                 security: ClusterSecurity | None = None):
        if summary is not None and zk is None:
            raise ValueError("a UI showing a nimbus's summary reads with that nimbus's "
                             "ZooKeeper client: give zk too")
        self.conf = conf
        self.local_nimbus = local_nimbus
        self.summary = summary
        self.security = security
        self.host = host if host is not None else str(conf["ui.host"])
        self._port = int(conf["ui.port"]) if port is None else port
        self._own_zk = zk is None
        self.zk = zk
        self.reader: UIReader | None = None
        self._http: GatedServer | None = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._stop_once = StopOnce(self._stopped)
        self.scheme = "http"

    @property
    def port(self) -> int:
        if self._http is not None:
            return int(self._http.bind_addr[1])
        return self._port

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def start(self, wait_ready_s: float = 15.0) -> UIServer:
        """Check the security settings (ConfigError before anything starts), start the
        reader and let it read the cluster once (a UI of its own), then listen."""
        limits = head_limits(self.conf)
        hosts = allowed_entries(self.conf, self.host)
        self.scheme = ui_transport(self.conf)
        context = server_context(self.conf) if self.scheme == "https" else None
        if self.security is None:  # a UI process of its own
            self.security = ClusterSecurity.for_daemon(self.conf)
        security = self.security
        authorizer = security.authorizer
        me = own_identity(self.conf)
        self._warn_about(authorizer, me, hosts)
        self.reader = self._reader(ui_source(self.conf), security)
        self.reader.start()
        self.reader.wait_ready(wait_ready_s)
        app = UIApp(self.conf, self.reader, ui_client(self.conf, security), own_identity=me,
                    local_nimbus=self.local_nimbus, security=security)
        self._http = GatedServer(
            (self.host, self._port), app, name="ui-http", threads=HTTP_THREADS,
            limits=limits, server_name="nimbus-ha-ui",
            ssl_adapter=ClientCertAdapter(context) if context is not None else None)
        # The app answers 413 (in JSON) past MAX_BODY_BYTES without reading the body;
        # this larger cap only bounds what cheroot itself would buffer.
        self._http.max_request_body_size = 16 * MAX_BODY_BYTES
        self._http.bind_now()  # a taken port fails here, before any thread of the server
        if hosts is not None:  # the port is known now (0 picks one)
            self._http.wsgi_app = HostCheck(app, accepted_hosts(hosts, self.port))
        self._http.prepare()
        self._thread = threading.Thread(target=self._http.serve, name="ui-http",
                                        daemon=True)
        self._thread.start()
        log.info("UI serving on %s", self.url)
        return self

    def _reader(self, source: str, security: ClusterSecurity) -> UIReader:
        """The reader of this UI (module docstring); ``source``: ``ui.source``."""
        fetch_conf = topology_conf_fetcher(self.conf, security)
        if self.summary is not None and self.zk is not None:  # inside a nimbus
            return SummaryReader(self.conf, self.zk, self.summary, fetch_conf)
        if source == "thrift" and self._own_zk:
            return ThriftReader(self.conf, fetch_conf,
                                NimbusClient(self.conf, deadline_s=0, security=security))
        if self.zk is None:
            from nimbus.state.zk_client import make_zk_client

            self.zk = make_zk_client(self.conf)
        return ZooKeeperReader(self.conf, self.zk, fetch_conf,
                               replica_count_fetcher(self.conf, security))

    def _warn_about(self, authorizer: object, me: str | None,
                    hosts: list[tuple[str, int | None]] | None) -> None:
        if hosts is None:
            log.warning("%s contains %r: the UI answers to every host name, so a hostile "
                        "web page can reach it through a browser by DNS rebinding "
                        "(docs/security.md)", KEY, ANY)
        elif self.host in WILDCARD_BINDS and all(
                name in ("localhost", "127.0.0.1", "[::1]") for name, _ in hosts):
            log.warning("ui.host is %r but %s names loopback only: requests for any other "
                        "host name get 421; add the names browsers use to reach the UI",
                        self.host, KEY)
        if self.scheme == "http" and tls_enabled(self.conf):  # ui.insecure.allow: true
            log.warning("ui.insecure.allow: the UI serves plain HTTP without client "
                        "certificates on %s:%s; %s", self.host, self._port,
                        "its callers have no identity, so they may read the summaries "
                        "only (no topology page, no action)" if authorizer is not None
                        else "anyone who reaches it may change every topology")
        if authorizer is not None and me is not None and me not in (
                self.conf["nimbus.admins"] or []):
            log.warning("the UI calls the leader as %r, which is not in nimbus.admins: the "
                        "leader will refuse its actions on topologies %r neither submitted "
                        "nor is in the topology.users of (docs/security.md)", me, me)

    def stop(self) -> None:
        """Stop serving, stop the reader's threads and join every thread started here."""
        if not self._stop_once.begin():
            return
        if self._http is not None:
            self._http.stop()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.reader is not None:
            self.reader.stop()
        if self._own_zk and self.zk is not None:
            self.zk.stop()
            self.zk.close()

    @property
    def stopping(self) -> threading.Event:
        """Set once :meth:`stop` has begun (what a foreground run waits for)."""
        return self._stopped

    def wait(self) -> None:
        """Block until :meth:`stop` (from a signal handler)."""
        while not self._stopped.wait(1.0):
            pass

    def __enter__(self) -> UIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
