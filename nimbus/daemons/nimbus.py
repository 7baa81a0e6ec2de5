"""One nimbus process: the master (:mod:`nimbus.master.master`) with Storm's Thrift
service, the metrics and, with ``nimbus.ui.enabled``, the UI around it.

Start-up order matters: security settings are checked before anything starts (the
process's one :class:`~nimbus.cluster_security.ClusterSecurity`, passed to the master's
downloads, the Thrift server and handler, /metrics and the UI); the
metrics port is bound before the Thrift port (a taken port fails the start with
everything released); the UI and the Thrift server serve before the master registers,
since peers download code over Thrift. SIGTERM (:meth:`NimbusDaemon.stop`) has the
master leave the election *first*, so a planned restart fails over at once, then stops
everything else.
"""

from __future__ import annotations

import json
import logging
import threading

from nimbus.cluster_security import ClusterSecurity
from nimbus.config import Config, ConfigError
from nimbus.daemon_base import StopOnce
from nimbus.distribution.distributors import CodeDistributor
from nimbus.distribution.file_transfer import FileTransfers
from nimbus.heap_freeze import FreezeSettings, freezer
from nimbus.master.master import Master
from nimbus.metrics import NimbusMetrics, min_replication_reader, serve_metrics
from nimbus.state.cluster_snapshot import ClusterSnapshot
from nimbus.thrift.authorizer import supervisors_refused
from nimbus.thrift.client import file_fetcher
from nimbus.thrift.handler import NimbusHandler
from nimbus.thrift.server import ThriftServer
from nimbus.timing import check_timing

log = logging.getLogger("nimbus.master.daemon")


class NimbusDaemon:
    """A running nimbus; :meth:`start`, then :meth:`stop` (in a process of its own:
    :class:`nimbus.foreground.Foreground`). ``master`` holds the master's parts.
    ``security``: this process's (by default made of ``conf``, checked at once)."""

    def __init__(self, conf: Config, security: ClusterSecurity | None = None):
        self.conf = conf
        self.address = str(conf.nimbus_address)
        self._stop_once = StopOnce()
        self.ui = None
        self.metrics_server = None
        self._heap_freeze = None

        check_timing(conf)  # unsafe timing settings: refused before anything starts
        # Fail fast on bad security settings, before anything is started: the client
        # context (peer code downloads), the server context, then the authorizer.
        self.security = security if security is not None else \
            ClusterSecurity.for_daemon(conf, serves=True)
        refused = supervisors_refused(conf)
        if refused:
            log.warning("%s", refused)
        distributor = CodeDistributor.from_conf(conf)  # fail fast on a bad name
        self._freeze_settings = FreezeSettings(float(conf["nimbus.gc.freeze.secs"]),
                                               float(conf["nimbus.gc.thaw.secs"]))
        self.metrics = NimbusMetrics(distributor.name)
        self.master = Master(conf, distributor, file_fetcher(self.security),
                             observer=self.metrics)
        try:
            self._serve(conf)
        except BaseException:
            self._release()
            raise

    def _serve(self, conf: Config) -> None:
        master = self.master
        self.transfers = FileTransfers(conf.local_dir, master.store,
                                       conf["nimbus.max.topology.bytes"])
        self.metrics.watch(
            is_leader=master.elector.is_leader, snapshot=self._snapshot,
            min_replication=min_replication_reader(master.topology_conf_path,
                                                   conf["topology.min.replication.count"]),
            served_bytes=self._served_bytes, code_missing=self._code_missing)
        self.metrics.duty_cycle_age.set_function(master.watchdog.age_s)
        self.handler = NimbusHandler(conf, master.elector, master.lifecycle, master.cache,
                                     self.transfers, master.store, master.started_at,
                                     reads=master.view.state,
                                     authorizer=self.security.authorizer)
        # Bound before the Thrift port, and closed by _release if that one is taken.
        self.metrics_server = serve_metrics(
            self.metrics.registry, conf["nimbus.metrics.bind.address"],
            conf["nimbus.metrics.port"], "nimbus-metrics", conf=conf, security=self.security)
        try:
            self.server = ThriftServer(
                self.metrics.instrument(self.handler), conf["nimbus.thrift.bind.address"],
                conf["nimbus.thrift.port"],
                max_frame_bytes=conf["nimbus.thrift.max_buffer_size"],
                max_connections=conf["nimbus.thrift.threads"],
                handshake_timeout_s=float(conf["nimbus.thrift.handshake.timeout.secs"]),
                advertised_host=conf["nimbus.host"],
                ssl_context=self.security.server_context(),
                downloads=self.transfers)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot serve Thrift on {conf['nimbus.thrift.bind.address']}:"
                          f"{conf['nimbus.thrift.port']}: {exc.strerror} (is another "
                          "nimbus using nimbus.thrift.port?)") from None

    # -- what the metrics read at each scrape ----------------------------------------------
    def _snapshot(self) -> ClusterSnapshot:
        return self.master.cache.snapshot

    def _served_bytes(self) -> int:
        return self.transfers.served_bytes

    def _code_missing(self) -> int:
        return self.master.sync.missing_count

    def _release(self) -> None:
        """Give back what a failed construction or start took."""
        if self.metrics_server is not None:
            self.metrics_server.stop()
        self.master.release()

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        self._start_ui()
        self.server.start()
        if self.metrics_server is not None:
            self.metrics_server.start()
        self.master.start()
        # The cluster model just loaded is what the freezes keep out of full collections.
        self._heap_freeze = freezer(self._freeze_settings)
        log.info("nimbus %s started (distributor %s)", self.address,
                 self.master.distributor.name)
        log.info("nimbus %s configuration, keys that differ from the defaults (secrets "
                 "redacted): %s", self.address,
                 json.dumps(self.conf.redacted_changes(), sort_keys=True, default=str))

    def _start_ui(self) -> None:
        """With ``nimbus.ui.enabled``, serve the web UI from this nimbus (``ui.host``,
        ``ui.port``); a port that is taken fails the start, with everything released."""
        if not self.conf["nimbus.ui.enabled"]:
            return
        from nimbus.ui.local_nimbus import LocalNimbus
        from nimbus.ui.server import UIServer

        try:
            # The master's summary (one read model: no second reader of the cluster),
            # and the view's session for the rest: the UI's reads stay off the elector's.
            ui = UIServer(self.conf, zk=self.master.view_zk, summary=self.master.cache,
                          local_nimbus=LocalNimbus(self.address,
                                                   self.master.duty_cycle_age_s),
                          security=self.security)
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
        """Leave the election first (fast failover), then stop every thread and close."""
        if not self._stop_once.begin():
            return
        try:
            self.master.stop_leading()
            self.master.stop()
            self.server.stop()
            self.handler.close()
            if self.metrics_server is not None:
                self.metrics_server.stop()
            if self.ui is not None:
                self.ui.stop()
            self.transfers.close()
            self.master.close()
        finally:
            if self._heap_freeze is not None:
                self._heap_freeze.release()
        log.info("nimbus %s stopped", self.address)

    @property
    def stopping(self) -> threading.Event:
        """Set once :meth:`stop` has begun (what a foreground run waits for)."""
        return self._stop_once.stopping
