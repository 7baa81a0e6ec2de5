"""Serving the logviewer: cheroot behind nimbus-ha's gate (nimbus/web/gate.py), in
threads of the supervisor's own.

The socket is bound when :class:`Logviewer` is made (a taken port fails the
supervisor's start there, before anything is registered); :meth:`Logviewer.start` starts
``supervisor-logviewer-worker-<i>`` and the serving thread ``supervisor-logviewer``,
:meth:`Logviewer.stop` stops and joins them all.

It binds ``logviewer.bind.address``, by default the address the supervisor advertises
(``storm.local.hostname``, or the machine's name), where ``nimbus-ha logs`` and the UI
find it (``SupervisorInfo.logviewer_port``). With ``storm.thrift.transport: tls`` it
serves HTTPS only, with the supervisor's ``storm.thrift.tls.cert.file``, and requires a
client certificate of the cluster's CA, as the Thrift port, the UI and /metrics do. Its
server context and read rule are those of the supervisor's process
(:class:`~nimbus.cluster_security.ClusterSecurity`), which it is given.
"""

from __future__ import annotations

import logging
import ssl
import threading
from pathlib import Path

from nimbus.cluster_security import ClusterSecurity
from nimbus.cluster_tls import FILE_KEYS, server_context, tls_enabled
from nimbus.config import Config, ConfigError
from nimbus.supervisor.logviewer.access import LogAccess
from nimbus.supervisor.logviewer.app import LogviewerApp
from nimbus.supervisor.logviewer.files import LogRoot
from nimbus.topology_acl import authorizer_from_conf
from nimbus.web.client_cert import ClientCertAdapter
from nimbus.web.gate import GatedServer, HeadLimits

log = logging.getLogger(__name__)

PORT_KEY = "logviewer.port"
BIND_KEY = "logviewer.bind.address"
THREADS = 4
# A request names a file (at most 512 characters) and a search string (at most 1024
# bytes, three times that escaped): its head fits in 16 KiB, within 5 s.
LIMITS = HeadLimits(line_bytes=8192, head_bytes=16384, timeout_s=5.0)
STOP_JOIN_S = 15.0


class Logviewer:
    """This supervisor's logviewer over the worker logs under ``root``, on ``host``
    (bound) and ``port``; ``advertised_host`` is the name its links give. ``security``:
    the supervisor's (its server context and authorizer); without it, both are made of
    ``conf`` for this logviewer alone."""

    def __init__(self, conf: Config, root: Path, host: str, port: int, advertised_host: str,
                 security: ClusterSecurity | None = None):
        context = None
        if security.tls if security is not None else tls_enabled(conf):
            try:
                context = security.server_context() if security is not None else \
                    server_context(conf)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"the TLS files of the logviewer ({', '.join(FILE_KEYS)}): "
                                  f"{exc}") from None
        self.https = context is not None
        self.advertised_host = advertised_host
        log_root = LogRoot(root)
        authorizer = security.authorizer if security is not None else \
            authorizer_from_conf(conf)
        app = LogviewerApp(log_root, LogAccess(conf, log_root, authorizer),
                           base_url=lambda: self.url)
        self._http = GatedServer(
            (host, port), app, name="supervisor-logviewer", threads=THREADS, limits=LIMITS,
            server_name="nimbus-ha-logviewer",
            ssl_adapter=ClientCertAdapter(context) if context is not None else None)
        try:
            self._http.bind_now()
        except OSError as exc:
            raise OSError(exc.errno, f"cannot serve the logviewer on {host}:{port}: "
                          f"{exc.strerror} (is another daemon using {PORT_KEY}?)") from None
        self.port: int = int(self._http.bind_addr[1])
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http(s)://<advertised host>:<port>``: where clients reach it."""
        return f"{'https' if self.https else 'http'}://{self.advertised_host}:{self.port}"

    def start(self) -> Logviewer:
        self._http.prepare()
        self._thread = threading.Thread(target=self._http.serve, name="supervisor-logviewer",
                                        daemon=True)
        self._thread.start()
        log.info("logviewer serving the worker logs on %s", self.url)
        return self

    def stop(self) -> None:
        self._http.stop()
        if self._thread is not None:
            self._thread.join(STOP_JOIN_S)
            if self._thread.is_alive():
                log.warning("the logviewer's thread did not stop within %.0f s", STOP_JOIN_S)


def make_logviewer(conf: Config, root: Path, advertised_host: str,
                   security: ClusterSecurity | None = None) -> Logviewer | None:
    """The logviewer ``conf`` asks for, with the supervisor's ``security``, bound, not
    started; None when ``logviewer.port`` is 0 (none). ConfigError for unusable TLS files
    or authorizer, OSError for a port that is taken."""
    port = int(conf[PORT_KEY])
    if port == 0:
        return None
    host = conf[BIND_KEY] or advertised_host
    return Logviewer(conf, root, host, port, advertised_host, security)
