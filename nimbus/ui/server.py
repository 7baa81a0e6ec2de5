"""Serving the UI: cheroot (CherryPy's production WSGI server) in a named thread.

:class:`UIServer` owns everything the UI runs: its ZooKeeper client, the
:class:`ClusterView` threads, the leader client and the HTTP server; ``stop`` ends and
joins them all. It binds only ``ui.host`` (default 127.0.0.1).

With ``storm.thrift.transport: tls`` it serves HTTPS and requires client certificates
of the cluster's CA (nimbus/ui/https.py); plain HTTP then needs ``ui.insecure.allow``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from cheroot import wsgi
from kazoo.client import KazooClient

from nimbus.config import Config
from nimbus.thrift.authorizer import authorizer_from_conf
from nimbus.thrift.client import NimbusClient, connect
from nimbus.thrift.tls import tls_enabled
from nimbus.ui.app import MAX_BODY_BYTES, UIApp
from nimbus.ui.https import ClientCertAdapter, own_identity, server_context, ui_transport
from nimbus.ui.view import ClusterView

log = logging.getLogger(__name__)

HTTP_THREADS = 8
CONF_FETCH_TIMEOUT_S = 3.0


def ui_client(conf: Config) -> NimbusClient:
    """The leader client of the UI's actions: it retries across a failover for about
    two session timeouts, then the request gets 503."""
    return NimbusClient(conf, deadline_s=max(15.0, 2 * conf.session_timeout_s))


def topology_conf_fetcher(conf: Config) -> Any:
    """A function id -> getTopologyConf JSON, asking each seed in turn (a follower may
    not hold the code yet; any nimbus that does answers the same)."""
    def fetch(topology_id: str) -> str:
        errors = []
        for seed in conf.seeds:
            try:
                with connect(seed, CONF_FETCH_TIMEOUT_S) as client:
                    return client.getTopologyConf(topology_id)
            except Exception as exc:  # down, no code yet, not alive: try the next one
                errors.append(f"{seed}: {getattr(exc, 'msg', None) or exc!r}")
        raise RuntimeError("; ".join(errors) or "no nimbus.seeds")
    return fetch


def replica_count_fetcher(conf: Config) -> Any:
    """A function returning {topology id: replication count} as a nimbus reports it in
    getClusterInfo (any seed answers from its cache)."""
    def fetch() -> dict[str, int]:
        errors = []
        for seed in conf.seeds:
            try:
                with connect(seed, CONF_FETCH_TIMEOUT_S) as client:
                    return {t.id: int(t.replication_count or 0)
                            for t in client.getClusterInfo().topologies}
            except Exception as exc:  # down or starting: try the next one
                errors.append(f"{seed}: {getattr(exc, 'msg', None) or exc!r}")
        raise RuntimeError("; ".join(errors) or "no nimbus.seeds")
    return fetch


class UIServer:
    """The REST API and dashboard on ``ui.host``:``ui.port`` (``port`` overrides; 0 picks
    a free one, see :attr:`port` after :meth:`start`)."""

    def __init__(self, conf: Config, zk: KazooClient | None = None, port: int | None = None,
                 host: str | None = None):
        self.conf = conf
        self.host = host if host is not None else str(conf["ui.host"])
        self._port = int(conf["ui.port"]) if port is None else port
        self._own_zk = zk is None
        self.zk = zk
        self.view: ClusterView | None = None
        self._http: wsgi.Server | None = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
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
        """Check the security settings (ConfigError before anything starts), connect to
        ZooKeeper, read the cluster once, then listen."""
        self.scheme = ui_transport(self.conf)
        context = server_context(self.conf) if self.scheme == "https" else None
        authorizer = authorizer_from_conf(self.conf)
        me = own_identity(self.conf)
        self._warn_about(authorizer, me)
        if self.zk is None:
            from nimbus.master.daemon import make_zk_client

            self.zk = make_zk_client(self.conf)
        self.view = ClusterView(self.conf, self.zk, topology_conf_fetcher(self.conf),
                                replica_count_fetcher(self.conf))
        self.view.start()
        self.view.wait_ready(wait_ready_s)
        app = UIApp(self.conf, self.view, ui_client(self.conf), own_identity=me)
        self._http = wsgi.Server((self.host, self._port), app, numthreads=HTTP_THREADS,
                                 server_name="nimbus-ha-ui", shutdown_timeout=2)
        if context is not None:
            self._http.ssl_adapter = ClientCertAdapter(context)
        # The app answers 413 (in JSON) past MAX_BODY_BYTES without reading the body;
        # this larger cap only bounds what cheroot itself would buffer.
        self._http.max_request_body_size = 16 * MAX_BODY_BYTES
        self._http.prepare()  # binds now, so a taken port fails here, not in the thread
        self._thread = threading.Thread(target=self._http.serve, name="ui-http",
                                        daemon=True)
        self._thread.start()
        log.info("UI serving on %s", self.url)
        return self

    def _warn_about(self, authorizer: object, me: str | None) -> None:
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
        """Stop serving, stop the view's threads and join every thread started here."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self._http is not None:
            self._http.stop()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.view is not None:
            self.view.stop()
        if self._own_zk and self.zk is not None:
            self.zk.stop()
            self.zk.close()

    def wait(self) -> None:
        """Block until :meth:`stop` (from a signal handler)."""
        while not self._stopped.wait(1.0):
            pass

    def __enter__(self) -> UIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
