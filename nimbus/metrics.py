"""Prometheus metrics of the nimbus and supervisor daemons, served at ``GET /metrics``.

Each daemon owns a :class:`~prometheus_client.CollectorRegistry` of its own (never the
library's global one), so that several daemons in one process (the tests) do not clash,
and serves it with :class:`MetricsServer` when ``nimbus.metrics.port`` or
``supervisor.metrics.port`` is set (0, the default, serves nothing: several daemons of a
dev cluster share one host, and Storm has no such key to inherit a port from).

Metric names (see ``conf/grafana-dashboard.json`` and the README):

nimbus (``NimbusMetrics``)
    ``nimbus_is_leader``, ``nimbus_leader_changes_total{change="gained"|"lost"}``,
    ``nimbus_leadership_wait_seconds`` (histogram), ``nimbus_topologies{status}``,
    ``nimbus_topology_replication_count{topology_id,topology}``,
    ``nimbus_topology_min_replication_count{topology_id,topology}``,
    ``nimbus_code_sync_bytes_total{distributor}``,
    ``nimbus_code_sync_duration_seconds{distributor,outcome}`` (histogram),
    ``nimbus_thrift_calls_total{method,outcome}``,
    ``nimbus_thrift_call_duration_seconds{method}`` (histogram),
    ``nimbus_gc_pause_seconds{generation}`` (histogram, :mod:`nimbus.gc_pauses`).

supervisor (``SupervisorMetrics``)
    ``supervisor_workers``, ``supervisor_worker_restarts_total{topology_id,port}``,
    ``supervisor_worker_state{topology_id,port,state}``, ``supervisor_frozen_orphans``,
    ``supervisor_component_input_rows_per_second{topology_id,port,component}``,
    ``supervisor_component_processed_rows_per_second{...}``,
    ``supervisor_component_batch_id{...}``, ``supervisor_component_batch_age_seconds{...}``.

Worker progress is exported by supervisors only: each knows its own workers, while
every nimbus would export the same beats again.
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from nimbus.cluster_security import ClusterSecurity
from nimbus.config import Config, ConfigError
from nimbus.gc_pauses import GcPauseCollector, recorder
from nimbus.state.cluster_view import NIMBUS_DIRECTORIES
from nimbus.state.records import ACTIVE, INACTIVE, KILLED
from nimbus.state.worker_state import RUNNING
from nimbus.state.worker_state import STATES as WORKER_STATES
from nimbus.thrift.tls import FILE_KEYS, tls_enabled
from nimbus.thrift.tls import server_context as tls_server_context
from nimbus.web.client_cert import ClientCertAdapter
from nimbus.web.gate import GatedServer, HeadLimits

log = logging.getLogger(__name__)

# Every status a StormBase can have: each is reported, 0 when no topology has it, so a
# dashboard's series do not come and go.
TOPOLOGY_STATUSES = (ACTIVE, INACTIVE, KILLED, "REBALANCING")  # records.REBALANCING
# The outcome label of a Thrift call Storm clients follow to the leader (not a failure).
NOT_LEADER_OUTCOME = "not_leader"
# Scrapes are small GET requests: a head of 16 KiB at most, within 5 s of connecting.
METRICS_LIMITS = HeadLimits(line_bytes=8192, head_bytes=16384, timeout_s=5.0)
METRICS_THREADS = 4
STOP_JOIN_S = 15.0

LEADERSHIP_WAIT_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 900, 3600,
                           float("inf"))
CODE_SYNC_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600,
                     float("inf"))


# -- serving ---------------------------------------------------------------------------------
def metrics_tls_context(conf: Config | None, security: ClusterSecurity | None = None
                        ) -> ssl.SSLContext | None:
    """The server context of /metrics with ``storm.thrift.transport: tls`` (client
    certificates of the cluster's CA required, as on the Thrift port), else None: that
    of the daemon's ``security`` when given (every server of a process shares it), else
    made of ``conf``."""
    if security is not None:
        if not security.tls:
            return None
    elif conf is None or not tls_enabled(conf):
        return None
    try:
        return security.server_context() if security is not None else tls_server_context(conf)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"the TLS files of /metrics ({', '.join(FILE_KEYS)}): "
                          f"{exc}") from None


class MetricsServer:
    """Serve ``registry`` as ``/metrics`` on ``host:port`` until :meth:`stop`.

    The socket is bound in the constructor (a taken port fails there, and no thread
    starts); :meth:`start` starts ``METRICS_THREADS`` worker threads
    (``<name>-<port>-worker-<i>``) and the serving thread ``<name>-<port>``, :meth:`stop`
    stops and joins them all and closes the socket. Port 0 binds a free port (see
    :attr:`port`).

    cheroot serves it behind the UI's gate (nimbus/web/gate.py): a scrape reaches a worker
    only once its request's head has arrived, so clients that stall their request or
    their TLS handshake hold up no other scrape, and are dropped after
    ``METRICS_LIMITS.timeout_s``. With ``conf`` of a cluster with
    ``storm.thrift.transport: tls`` it serves HTTPS and requires a client certificate of
    the cluster's CA (docs/security.md), with the server context of the daemon's
    ``security`` when given; a ConfigError then names unusable TLS files.
    """

    def __init__(self, registry: CollectorRegistry, host: str, port: int, name: str,
                 conf: Config | None = None, security: ClusterSecurity | None = None):
        context = metrics_tls_context(conf, security)
        self._http = GatedServer(
            (host or "0.0.0.0", port), make_wsgi_app(registry), name=name,
            threads=METRICS_THREADS, limits=METRICS_LIMITS, server_name="nimbus-ha-metrics",
            ssl_adapter=ClientCertAdapter(context) if context is not None else None)
        try:
            self._http.bind_now()
        except OSError as exc:
            raise OSError(exc.errno, f"cannot serve metrics on {host}:{port}: {exc.strerror} "
                          f"(is another daemon using this metrics port?)") from None
        self.host = host
        self.port: int = int(self._http.bind_addr[1])
        self.scheme = "https" if context is not None else "http"
        self._http.name = f"{name}-{self.port}"
        self._thread = threading.Thread(target=self._http.serve, name=f"{name}-{self.port}",
                                        daemon=True)

    @property
    def url(self) -> str:
        """``http://host:port/metrics`` (``https://`` with TLS)."""
        return f"{self.scheme}://{self.host}:{self.port}/metrics"

    def start(self) -> None:
        self._http.prepare()
        self._thread.start()
        log.info("serving Prometheus metrics at %s", self.url)

    def stop(self) -> None:
        """Stop serving, join every thread, close the socket; safe to call more than once
        and on a server never started."""
        self._http.stop()
        if self._thread.is_alive():
            self._thread.join(timeout=STOP_JOIN_S)


def serve_metrics(registry: CollectorRegistry, host: str, port: int,
                  name: str, conf: Config | None = None,
                  security: ClusterSecurity | None = None) -> MetricsServer | None:
    """A bound (not yet started) :class:`MetricsServer`, or None when ``port`` is 0 (off).
    Pass the daemon's ``conf`` and ``security``: with TLS in the cluster, /metrics is
    HTTPS with client certificates."""
    if not port:
        return None
    return MetricsServer(registry, host, port, name, conf=conf, security=security)


# -- nimbus ----------------------------------------------------------------------------------
class _NimbusCollector(Collector):
    """What is read at scrape time: leadership now, and the summary cache's snapshot
    (kept current by ZooKeeper watches, so a scrape never touches ZooKeeper)."""

    def __init__(self, is_leader: Callable[[], bool], snapshot: Callable[[], Any],
                 min_replication: Callable[[str], int | None],
                 served_bytes: Callable[[], int] = lambda: 0,
                 code_missing: Callable[[], int] = lambda: 0):
        self._is_leader = is_leader
        self._snapshot = snapshot
        self._min_replication = min_replication
        self._served_bytes = served_bytes
        self._code_missing = code_missing

    def collect(self) -> Iterable[Metric]:
        yield GaugeMetricFamily("nimbus_is_leader",
                                "1 while this nimbus holds the leader lock, else 0",
                                value=1 if self._is_leader() else 0)
        yield CounterMetricFamily(
            "nimbus_code_served_bytes",
            "Bytes of topology code this nimbus sent over Thrift to peers and supervisors "
            "(its code egress; a distributor's own traffic, BitTorrent's, is not counted)",
            value=self._served_bytes())
        yield GaugeMetricFamily(
            "nimbus_code_missing_topologies",
            "Live topologies whose code this nimbus does not hold, as of its last code sync "
            "pass (a nimbus leads only when this is 0)", value=self._code_missing())
        snap = self._snapshot()
        yield GaugeMetricFamily(
            "nimbus_supervisors",
            "Supervisors registered in ZooKeeper (live sessions), as this nimbus's view "
            "holds them", value=len(snap.supervisors))
        by_status = GaugeMetricFamily("nimbus_topologies", "Live topologies by status",
                                      labels=["status"])
        counts = dict.fromkeys(TOPOLOGY_STATUSES, 0)
        for base in snap.storms.values():
            counts[base.status] = counts.get(base.status, 0) + 1
        for status, count in sorted(counts.items()):
            by_status.add_metric([status], count)
        yield by_status
        labels = ["topology_id", "topology"]
        replication = GaugeMetricFamily(
            "nimbus_topology_replication_count",
            "Hosts holding the topology's code (the distributor's replication count)",
            labels=labels)
        minimum = GaugeMetricFamily(
            "nimbus_topology_min_replication_count",
            "The topology's topology.min.replication.count (absent while this nimbus "
            "holds no copy of its configuration)", labels=labels)
        for topology_id, base in sorted(snap.storms.items()):
            replication.add_metric([topology_id, base.storm_name],
                                   snap.replication.get(topology_id, 0))
            wanted = self._min_replication(topology_id)
            if wanted is not None:
                minimum.add_metric([topology_id, base.storm_name], wanted)
        yield replication
        yield minimum


class NimbusMetrics:
    """A nimbus's metrics; the daemon calls the ``on_*`` hooks and wraps its handler.

    ``is_leader`` and ``snapshot`` (a ``ClusterSnapshot``) are read at scrape time;
    ``min_replication(topology_id)`` gives a topology's minimum, or None if unknown.
    """

    def __init__(self, distributor: str, is_leader: Callable[[], bool] | None = None,
                 snapshot: Callable[[], Any] | None = None,
                 min_replication: Callable[[str], int | None] = lambda _id: None,
                 clock: Callable[[], float] = time.monotonic,
                 served_bytes: Callable[[], int] = lambda: 0,
                 code_missing: Callable[[], int] = lambda: 0):
        """The scrape-time readers (``is_leader``, ``snapshot`` and the rest) may be
        given here or later, once the nimbus they read is built (:meth:`watch`).
        ``code_missing()``: how many live topologies' code this nimbus lacks."""
        self.registry = CollectorRegistry()
        self.distributor = distributor
        self._clock = clock
        self._queued_at: float | None = None
        self._queued_lock = threading.Lock()
        self.leader_changes = Counter(
            "nimbus_leader_changes", "Times this nimbus gained or lost the leadership",
            ["change"], registry=self.registry)
        for change in ("gained", "lost"):
            self.leader_changes.labels(change)   # exported as 0 before the first change
        self.leadership_wait = Histogram(
            "nimbus_leadership_wait_seconds",
            "Seconds from queueing for the leader lock (start, or losing the leadership) "
            "to gaining it", registry=self.registry, buckets=LEADERSHIP_WAIT_BUCKETS)
        self.code_sync_bytes = Counter(
            "nimbus_code_sync_bytes", "Bytes of topology code downloaded by the code sync",
            ["distributor"], registry=self.registry)
        self.code_sync_duration = Histogram(
            "nimbus_code_sync_duration_seconds",
            "Seconds one topology's code download took (outcome ok or error)",
            ["distributor", "outcome"], registry=self.registry, buckets=CODE_SYNC_BUCKETS)
        self.code_sync_bytes.labels(distributor)
        for outcome in ("ok", "error"):
            self.code_sync_duration.labels(distributor, outcome)
        # The age of the last completed leader duty cycle (the watchdog's measure).
        self.duty_cycle_age = Gauge(
            "nimbus_leader_duty_cycle_age_seconds",
            "Seconds since this nimbus last completed its cycle (with the leader's duties "
            "when due: kills, orphan code, scheduling); nimbus.leader.watchdog.secs bounds "
            "it while leading",
            registry=self.registry)
        self.thrift_calls = Counter(
            "nimbus_thrift_calls",
            "Thrift calls served, by method and outcome (ok, not_leader, or the exception "
            "type)", ["method", "outcome"], registry=self.registry)
        self.thrift_duration = Histogram(
            "nimbus_thrift_call_duration_seconds", "Seconds a Thrift call took to serve",
            ["method"], registry=self.registry)
        self.stale_view_nodes = Counter(
            "nimbus_view_stale_nodes",
            "Nodes the background audit found stale in this nimbus's in-memory view of the "
            "cluster state (a missed watch event), and re-read", ["directory"],
            registry=self.registry)
        for directory in NIMBUS_DIRECTORIES:
            self.stale_view_nodes.labels(directory)   # exported as 0 until one is found
        # The process's collections, not this daemon's alone (there is one collector).
        self.registry.register(GcPauseCollector(recorder()))
        if is_leader is not None and snapshot is not None:
            self.watch(is_leader, snapshot, min_replication, served_bytes, code_missing)

    def watch(self, is_leader: Callable[[], bool], snapshot: Callable[[], Any],
              min_replication: Callable[[str], int | None] = lambda _id: None,
              served_bytes: Callable[[], int] = lambda: 0,
              code_missing: Callable[[], int] = lambda: 0) -> None:
        """Read these at each scrape (once: the nimbus's own gauges)."""
        self.registry.register(_NimbusCollector(is_leader, snapshot, min_replication,
                                                served_bytes, code_missing))

    # -- hooks --------------------------------------------------------------------------
    def on_queued(self) -> None:
        """This nimbus queued for the leader lock: the wait starts now."""
        with self._queued_lock:
            self._queued_at = self._clock()

    def on_leadership(self, leader: bool) -> None:
        """A change of leadership the cycle saw: count it and time the wait for the
        lock."""
        now = self._clock()
        self.leader_changes.labels("gained" if leader else "lost").inc()
        with self._queued_lock:
            if leader:
                if self._queued_at is not None:
                    self.leadership_wait.observe(max(0.0, now - self._queued_at))
                self._queued_at = None
            else:
                # Losing the lock means queueing again (the elector re-queues by itself).
                self._queued_at = now

    def on_code_fetch(self, topology_id: str, seconds: float, code_dir: Path | None) -> None:
        """A download ended: ``code_dir`` is where the code now is, None if it failed."""
        outcome = "ok" if code_dir is not None else "error"
        self.code_sync_duration.labels(self.distributor, outcome).observe(max(0.0, seconds))
        if code_dir is not None:
            self.code_sync_bytes.labels(self.distributor).inc(_tree_bytes(code_dir))

    def on_stale_view(self, directory: str, _path: str) -> None:
        """The view's audit re-read a node of ``directory`` it held stale."""
        self.stale_view_nodes.labels(directory).inc()

    def instrument(self, handler: object) -> object:
        """``handler`` with every Thrift call counted (see :class:`InstrumentedHandler`)."""
        return InstrumentedHandler(handler, self)


def min_replication_reader(conf_file: Callable[[str], Path],
                           default: int) -> Callable[[str], int | None]:
    """``topology_id -> topology.min.replication.count``, read from the topology's own
    configuration file (``conf_file(topology_id)``, its stormconf.json in this host's code
    store) with ``default`` (the cluster's) for a topology that does not set it; None
    while the file is not held here. Read at each scrape: a small file, and no cache to
    keep in step with removals."""

    def read(topology_id: str) -> int | None:
        try:
            topo_conf = json.loads(conf_file(topology_id).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        value = topo_conf.get("topology.min.replication.count", default) \
            if isinstance(topo_conf, dict) else default
        return value if isinstance(value, int) and not isinstance(value, bool) else default

    return read


def _tree_bytes(root: Path) -> int:
    total = 0
    for path in root.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
        except OSError:
            continue  # removed meanwhile: nothing to count
    return total


def thrift_outcome(exc: BaseException | None) -> str:
    """``ok``, ``not_leader`` (a redirect to the leader) or the exception's type name."""
    if exc is None:
        return "ok"
    from nimbus.thrift import NOT_LEADER_PREFIX

    message = getattr(exc, "message", None) or ""
    if isinstance(message, str) and message.startswith(NOT_LEADER_PREFIX):
        return NOT_LEADER_OUTCOME
    return type(exc).__name__


class InstrumentedHandler:
    """A Thrift handler whose public methods count each call by method and outcome.

    thriftpy2's processor looks a method up with ``getattr(handler, name)`` and calls it:
    this wrapper is handed to the server instead of the handler and changes nothing
    else (exceptions pass through unchanged, so Storm's error contract holds).
    """

    def __init__(self, handler: object, metrics: NimbusMetrics):
        self._handler = handler
        self._metrics = metrics

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._handler, name)
        if name.startswith("_") or not callable(attr):
            return attr
        metrics = self._metrics

        def call(*args: Any, **kwargs: Any) -> Any:
            started = time.monotonic()
            failure: BaseException | None = None
            try:
                return attr(*args, **kwargs)
            except BaseException as exc:
                failure = exc
                raise
            finally:
                metrics.thrift_calls.labels(name, thrift_outcome(failure)).inc()
                metrics.thrift_duration.labels(name).observe(time.monotonic() - started)

        return call


# -- supervisor ------------------------------------------------------------------------------
class ComponentProgress:
    """The newest per-component progress of each worker, from its status beats.

    Beats arrive on the workers' reader threads; scrapes read on the metrics thread.
    Keyed by the worker's handle (weakly: a reaped worker's entry goes with it). The
    batch age is measured on this host's monotonic clock from the beat in which the
    component's ``batch_id`` last changed, so it is immune to the worker's wall clock.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        # handle -> component -> (stats, monotonic time its batch_id was first seen)
        self._seen: weakref.WeakKeyDictionary[Any, dict[str, tuple[dict[str, Any],
                                                                  float | None]]] = \
            weakref.WeakKeyDictionary()

    def observe(self, handle: Any, components: Any) -> None:
        """Record one beat's ``components`` ({name: {batch_id, ...}}) of ``handle``."""
        if not isinstance(components, Mapping):
            return
        now = self._clock()
        with self._lock:
            before = self._seen.get(handle, {})
            latest: dict[str, tuple[dict[str, Any], float | None]] = {}
            for name, raw in components.items():
                stats = _progress(raw)
                old = before.get(str(name))
                batch = stats["batch_id"]
                if batch is None:
                    since = None
                elif old is not None and old[0]["batch_id"] == batch:
                    since = old[1]
                else:
                    since = now
                latest[str(name)] = (stats, since)
            self._seen[handle] = latest

    def of(self, handle: Any) -> Iterator[tuple[str, dict[str, Any], float | None]]:
        """(component, stats, batch age in seconds or None) of ``handle``'s last beat."""
        now = self._clock()
        with self._lock:
            latest = dict(self._seen.get(handle, {}))
        for name, (stats, since) in sorted(latest.items()):
            yield name, stats, (max(0.0, now - since) if since is not None else None)


def _progress(raw: Any) -> dict[str, Any]:
    raw = raw if isinstance(raw, Mapping) else {}

    def number(value: Any) -> float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return float(value) if ok else 0.0

    batch = raw.get("batch_id")
    return {"batch_id": batch if isinstance(batch, int) and not isinstance(batch, bool)
            else None,
            "input_rows_per_second": number(raw.get("input_rows_per_second")),
            "processed_rows_per_second": number(raw.get("processed_rows_per_second")),
            "input_waiting": raw.get("input_waiting") is True}


class _SupervisorCollector(Collector):
    def __init__(self, workers: Callable[[], list[Any]],
                 restarts: Callable[[], Mapping[tuple[str, int], int]],
                 progress: ComponentProgress, warm: Callable[[], Any],
                 code_fetches: Callable[[], Mapping[str, int]] = dict,
                 states: Callable[[], Mapping[tuple[str, int], str]] | None = None,
                 frozen_orphans: Callable[[], int] = lambda: 0):
        self._workers = workers
        self._restarts = restarts
        self._progress = progress
        self._warm = warm
        self._code_fetches = code_fetches
        self._states = states
        self._frozen_orphans = frozen_orphans

    def collect(self) -> Iterable[Metric]:
        fetches = CounterMetricFamily(
            "supervisor_code_fetches",
            "Topologies whose code this supervisor fetched, by where it came from: "
            "distributor (the code distributor, docs/plugins.md) or nimbus (over Thrift)",
            labels=["source"])
        counted = self._code_fetches()
        for source in ("distributor", "nimbus"):
            fetches.add_metric([source], counted.get(source, 0))
        yield fetches
        handles = self._workers()
        yield GaugeMetricFamily("supervisor_workers", "Worker processes this supervisor runs",
                                value=len(handles))
        yield GaugeMetricFamily(
            "supervisor_workers_frozen",
            "Workers frozen because their lease ran out, waiting for a renewal to thaw them",
            value=sum(1 for handle in handles if handle.is_frozen()))
        yield GaugeMetricFamily(
            "supervisor_frozen_orphans",
            "Frozen workers on this host whose supervisor process is gone (any "
            "supervisor's): waiting to be taken over, or ended after "
            "supervisor.worker.orphan.timeout.secs", value=self._frozen_orphans())
        memory = GaugeMetricFamily(
            "supervisor_worker_memory_bytes",
            "Resident bytes of a worker's processes (Python, its JVM, its command)",
            labels=["topology_id", "port"])
        for handle in sorted(handles, key=lambda h: (h.topology_id, h.port)):
            memory.add_metric([handle.topology_id, str(handle.port)], handle.memory_bytes())
        yield memory
        warm = self._warm()  # a WarmSummary, or None without warm workers
        count = GaugeMetricFamily(
            "supervisor_warm_workers",
            "Warm workers (supervisor.warm.workers) by state: ready or starting",
            labels=["state"])
        count.add_metric(["ready"], warm.ready if warm else 0)
        count.add_metric(["starting"], warm.starting if warm else 0)
        yield count
        yield GaugeMetricFamily(
            "supervisor_warm_workers_memory_bytes",
            "Resident bytes of this supervisor's warm workers while they wait",
            value=warm.memory_bytes if warm else 0)
        restarts = CounterMetricFamily(
            "supervisor_worker_restarts",
            "Restarts of the worker on a slot after it crashed or went silent",
            labels=["topology_id", "port"])
        for (topology_id, port), count in sorted(self._restarts().items()):
            restarts.add_metric([topology_id, str(port)], count)
        yield restarts
        states = self._states() if self._states is not None else None
        state = GaugeMetricFamily(
            "supervisor_worker_state",
            "1 for the state the worker of an assigned slot is in (starting, running, "
            "frozen, restarting, dead), 0 for the others; running only while its last "
            "beat is within nimbus.task.timeout.secs", labels=["topology_id", "port", "state"])
        for (topology_id, port), current in sorted((states or {}).items()):
            for name in WORKER_STATES:
                state.add_metric([topology_id, str(port), name], int(name == current))
        yield state
        labels = ["topology_id", "port", "component"]
        families = {
            "input_rows_per_second": GaugeMetricFamily(
                "supervisor_component_input_rows_per_second",
                "Input rows per second of the component's last batch", labels=labels),
            "processed_rows_per_second": GaugeMetricFamily(
                "supervisor_component_processed_rows_per_second",
                "Processed rows per second of the component's last batch", labels=labels),
        }
        batch_id = GaugeMetricFamily("supervisor_component_batch_id",
                                     "Id of the component's last batch", labels=labels)
        waiting = GaugeMetricFamily(
            "supervisor_component_input_waiting",
            "1 while Spark says input is available for the component's query (a batch "
            "is due), else 0; with a batch age that grows, the pipeline is stalled",
            labels=labels)
        age = GaugeMetricFamily(
            "supervisor_component_batch_age_seconds",
            "Seconds since the component's batch id last changed (absent before its "
            "first batch)", labels=labels)
        for handle in sorted(handles, key=lambda h: (h.topology_id, h.port)):
            if states is not None and \
                    states.get((handle.topology_id, handle.port)) != RUNNING:
                continue  # its last numbers are history, not what it does now
            for component, stats, batch_age in self._progress.of(handle):
                values = [handle.topology_id, str(handle.port), component]
                for key, family in families.items():
                    family.add_metric(values, stats[key])
                waiting.add_metric(values, 1 if stats["input_waiting"] else 0)
                if stats["batch_id"] is not None:
                    batch_id.add_metric(values, stats["batch_id"])
                if batch_age is not None:
                    age.add_metric(values, batch_age)
        yield from families.values()
        yield batch_id
        yield waiting
        yield age


class SupervisorMetrics:
    """A supervisor's metrics, read at scrape time from its running workers' handles
    (``workers()``, each with ``topology_id`` and ``port``), its slots' restart counts
    (``restarts()``: {(topology_id, port): n}) and :attr:`progress`, which the
    supervisor feeds with each worker beat."""

    def __init__(self, workers: Callable[[], list[Any]],
                 restarts: Callable[[], Mapping[tuple[str, int], int]],
                 clock: Callable[[], float] = time.monotonic,
                 warm: Callable[[], Any] = lambda: None,
                 code_fetches: Callable[[], Mapping[str, int]] = dict,
                 states: Callable[[], Mapping[tuple[str, int], str]] | None = None,
                 frozen_orphans: Callable[[], int] = lambda: 0):
        """``warm()``: the supervisor's warm workers (a
        :class:`~nimbus.supervisor.warm_pool.WarmSummary`), or None when it keeps none;
        ``code_fetches()``: {"distributor" | "nimbus": topologies fetched that way};
        ``states()``: {(topology_id, port): state} of every assigned slot's worker
        (nimbus/state/worker_state.py), whose components' numbers are then exported
        only while it is running (None: every worker's are); ``frozen_orphans()``: the
        frozen workers of the host whose supervisor is gone
        (nimbus/supervisor/orphans.py)."""
        self.registry = CollectorRegistry()
        self.progress = ComponentProgress(clock)
        self.registry.register(_SupervisorCollector(workers, restarts, self.progress, warm,
                                                    code_fetches, states, frozen_orphans))


# Sample names of a family by its type: what a PromQL expression may name.
_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count",
                                                              "_created"),
             "summary": ("_sum", "_count", "_created"), "gauge": ("",), "info": ("_info",)}


def exported_metric_names(registry: CollectorRegistry) -> set[str]:
    """Every sample name ``registry`` can export (``x_total``, ``x_bucket``, ...), also
    of families that have no sample right now (no topology yet)."""
    names = set()
    for family in registry.collect():
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names
