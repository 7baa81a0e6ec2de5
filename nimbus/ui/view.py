"""What the UI shows, read from ZooKeeper with a client of the UI's own.

A named loop (``ui-cluster-view``) keeps a :class:`Snapshot` of nimbuses, the leader,
topologies, assignments, replica registrations and supervisors. ZooKeeper watches wake
it (so a new leader is seen within milliseconds of its lock), and a safety reload runs
every few seconds. Reads are pipelined (kazoo's async calls), so 1,000 topologies cost
one round trip's latency, not 1,000. REST requests then answer from memory.

While the dashboard is open (a dashboard request within :data:`DEMAND_S`), the same
thread also polls worker heartbeats once a second for records per second, restarts and
each worker's state (with their supervisors' nodes: nimbus/state/worker_state.py), and
the newest errors every few seconds: nothing watches those nodes, and nobody pays for
them when nobody looks.

A second named loop (``ui-topology-conf``) fetches each topology's configuration once
from a nimbus (getTopologyConf, secrets already redacted there): it holds
``topology.min.replication.count`` and is immutable after submit. It runs apart because a
Thrift call to a frozen nimbus may block for seconds, and the snapshot must not wait.
"""

from __future__ import annotations

import json
import logging
import posixpath
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError
from kazoo.protocol.states import KazooState, ZnodeStat

from nimbus.background_loop import BackgroundLoop
from nimbus.config import Config
from nimbus.master import runtime_view
from nimbus.redaction import redact
from nimbus.state import worker_state
from nimbus.state.cluster_state import LayoutMissingError, StormClusterState
from nimbus.state.records import (
    KILLED,
    Assignment,
    ErrorInfo,
    NimbusInfo,
    RecordError,
    StormBase,
    SupervisorInfo,
    WorkerBeat,
)
from nimbus.ui.timeline import Timeline, diff

log = logging.getLogger(__name__)

SAFETY_RELOAD_S = 30.0   # watches drive reloads; this only catches a missed one
COALESCE_S = 0.02        # a burst of watches makes one reload
CONF_EVERY_S = 1.0       # the configuration fetcher's pace
DEMAND_S = 10.0          # the dashboard counts as open this long after its last request
RATES_EVERY_S = 1.0
# Beats read per second at most: with more workers than this the rates are sampled less
# often (1,000 workers: every 5 s), so the UI's cost stays bounded as the cluster grows
# and the page still refreshes every second with the newest sample.
BEATS_PER_S = 200
ERRORS_EVERY_S = 5.0
REPLICAS_EVERY_S = 5.0   # the nimbuses' replication counts (one getClusterInfo)
HISTORY_POINTS = 60      # one per rates poll: a minute of records per second
UNREADABLE = (RecordError, TypeError, ValueError)


@dataclass(frozen=True)
class Snapshot:
    """The cluster as of ``taken_at`` (this host's clock); ``version`` grows per reload."""

    nimbuses: list[NimbusInfo] = field(default_factory=list)
    leader: str | None = None
    storms: dict[str, StormBase] = field(default_factory=dict)
    assignments: dict[str, Assignment] = field(default_factory=dict)
    replicas: dict[str, list[str]] = field(default_factory=dict)
    supervisors: dict[str, SupervisorInfo] = field(default_factory=dict)
    # Replication counts the nimbuses report (getClusterInfo): the only source for
    # store-backed distributors (s3, hdfs), which register no replicas in ZooKeeper.
    reported_replicas: dict[str, int] = field(default_factory=dict)
    taken_at: float = 0.0
    version: int = 0


@dataclass
class Live:
    """A topology's numbers from heartbeats and errors (dashboard only)."""

    records_per_second: float = 0.0
    history: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    restarts: int = 0
    alive_workers: int = 0      # running: a fresh beat (nimbus/state/worker_state.py)
    # state -> how many of its workers are in it (every state a key, once polled)
    worker_states: dict[str, int] = field(default_factory=dict)
    newest_error: dict[str, Any] | None = None
    error_count: int = 0


class ViewUnavailableError(RuntimeError):
    """No snapshot yet, or ZooKeeper is unreachable: the UI cannot say anything true."""


def _decode(cls: Any, data: bytes | None) -> Any:
    if not data:
        return None
    try:
        return cls.decode(data)
    except UNREADABLE:
        return None  # written by another release: skipped, as runtime_view does


class ClusterView:
    """The UI's read side; see the module docstring. ``start`` / ``stop`` it."""

    def __init__(self, conf: Config, zk: KazooClient,
                 fetch_conf: Callable[[str], str] | None = None,
                 fetch_replicas: Callable[[], dict[str, int]] | None = None):
        self.conf = conf
        self.zk = zk
        # None for a view that reads through a nimbus (nimbus/ui/thrift_view.py).
        self.state: StormClusterState | None = (
            StormClusterState(zk, conf.zk_root) if zk is not None else None)
        # How often the snapshot is read again with no watch having fired.
        self._reload_every_s = SAFETY_RELOAD_S
        self.timeline = Timeline()
        self._fetch_conf = fetch_conf
        self._fetch_replicas = fetch_replicas
        self._reported: dict[str, int] = {}
        self._snapshot: Snapshot | None = None
        # Why there is no snapshot: no nimbus has set the cluster up under the root yet,
        # or the layout is gone (a wrong root, a wiped ZooKeeper); "" once it is read.
        self._layout_error = ""
        self._live: dict[str, Live] = {}
        self._topology_conf: dict[str, dict[str, Any]] = {}
        self._conf_failed: dict[str, float] = {}   # id -> monotonic time of last failure
        self._lock = threading.Lock()
        self._fresh = threading.Condition()
        self._requested = 0
        self._loaded = 0
        self._demand_until = 0.0
        self._live_version = 0
        # The cluster view's schedule: each step sets when the next one is due.
        self._next_safety = 0.0
        self._next_rates = self._next_errors = 0.0
        self._next_wait_s = 0.0
        self._next_replicas = 0.0
        self._loop = BackgroundLoop("ui-cluster-view", self._step,
                                    period=lambda: self._next_wait_s, coalesce_s=COALESCE_S)
        self._conf_loop = BackgroundLoop("ui-topology-conf", self._fetch_confs,
                                         period=CONF_EVERY_S, wait_first=True)

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        self.zk.add_listener(self._on_state)
        self._loop.start()
        self._conf_loop.start()

    def stop(self) -> None:
        """Stop both loops and wait for them (the ZooKeeper client stays open)."""
        self.zk.remove_listener(self._on_state)
        self._conf_loop.stop(join_timeout=15)
        self._loop.stop(join_timeout=15)

    def _on_state(self, state: str) -> None:
        if state == KazooState.CONNECTED:
            self._loop.wake()  # watches may have been lost with the session: reload

    def _changed(self, _event: object = None) -> None:
        self._loop.wake()

    # -- reads for the REST API ------------------------------------------------------
    #: What a failed read of the source may raise (logged briefly, retried).
    SOURCE_ERRORS: tuple[type[BaseException], ...] = (KazooException,)
    UNREACHABLE = "ZooKeeper is unreachable from the UI process"

    @property
    def connected(self) -> bool:
        return self.zk.state == KazooState.CONNECTED

    def snapshot(self) -> Snapshot:
        """The newest snapshot; ViewUnavailableError if none or the source is gone."""
        snap = self._snapshot
        if snap is None and self._layout_error:
            raise ViewUnavailableError(self._layout_error)
        if snap is None or not self.connected:
            raise ViewUnavailableError(self.UNREACHABLE if snap is not None else
                                       "the UI has not read the cluster state yet")
        return snap

    def storm_base(self, topology_id: str) -> StormBase | None:
        """The topology's StormBase now (None: no such topology), for an action's or a
        page's checks."""
        return self.state.storm_base(topology_id)  # type: ignore[union-attr]

    def topology_info(self, topology_id: str, timeout_s: float) -> dict[str, Any] | None:
        """``runtime_view.topology_info`` of one topology, read now (beats and errors are
        not in the snapshot); None for an unknown id."""
        return runtime_view.topology_info(self.state, topology_id,  # type: ignore[arg-type]
                                          timeout_s=timeout_s)

    def refresh_now(self, timeout_s: float = 3.0) -> None:
        """Wait (bounded) for a reload that started after this call (read-your-writes
        after an action)."""
        with self._fresh:
            self._requested += 1
            wanted = self._requested
        self._loop.wake()
        deadline = time.monotonic() + timeout_s
        with self._fresh:
            while self._loaded < wanted and time.monotonic() < deadline:
                self._fresh.wait(max(0.0, deadline - time.monotonic()))

    def wait_ready(self, timeout_s: float = 15.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while self._snapshot is None and not self._layout_error and \
                time.monotonic() < deadline:
            time.sleep(0.02)
        return self._snapshot is not None

    def demand(self) -> None:
        """Note that the dashboard is open: heartbeats and errors are polled meanwhile."""
        first = time.monotonic() > self._demand_until
        self._demand_until = time.monotonic() + DEMAND_S
        if first:
            self._loop.wake()

    def live(self, topology_id: str) -> Live:
        with self._lock:
            return self._live.get(topology_id) or Live()

    @property
    def live_version(self) -> int:
        return self._live_version

    def topology_conf(self, topology_id: str) -> dict[str, Any] | None:
        """The topology's redacted configuration if fetched yet."""
        with self._lock:
            return self._topology_conf.get(topology_id)

    def fetch_topology_conf(self, topology_id: str) -> dict[str, Any]:
        """The configuration now (cached, else asked of a nimbus); {} if none answers."""
        known = self.topology_conf(topology_id)
        if known is not None or self._fetch_conf is None:
            return known or {}
        return self._fetch_one(topology_id) or {}

    def try_fetch_topology_conf(self, topology_id: str) -> dict[str, Any] | None:
        """The configuration now (cached, else asked of a nimbus); None if none answers
        (the UI's authorisation then refuses to guess)."""
        known = self.topology_conf(topology_id)
        if known is not None or self._fetch_conf is None:
            return known
        return self._fetch_one(topology_id)

    def min_replication(self, topology_id: str) -> int:
        conf = self.topology_conf(topology_id) or {}
        value = conf.get("topology.min.replication.count")
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return int(self.conf["topology.min.replication.count"])

    # -- the loop --------------------------------------------------------------------
    def _step(self) -> None:
        """One step of ``ui-cluster-view``: reload when woken (a watch fired; a burst of
        them is one wake-up) or when the safety reload is due, poll heartbeats and
        errors while the dashboard is open, and set when the next step is due."""
        if self._loop.woken or time.monotonic() >= self._next_safety:
            self._reload_guarded()
            self._next_safety = time.monotonic() + self._reload_every_s
        demanded = time.monotonic() < self._demand_until
        if demanded and time.monotonic() >= self._next_rates:
            with_errors = time.monotonic() >= self._next_errors
            self._poll_live_guarded(with_errors)
            self._next_rates = time.monotonic() + self._rates_interval()
            if with_errors:
                self._next_errors = time.monotonic() + ERRORS_EVERY_S
        wait = self._next_safety - time.monotonic()
        if demanded:
            wait = min(wait, self._next_rates - time.monotonic())
        self._next_wait_s = max(0.01, wait)

    def _rates_interval(self) -> float:
        """Seconds between two heartbeat polls: RATES_EVERY_S, longer for big clusters."""
        snap = self._snapshot
        workers = 0 if snap is None else sum(
            len(a.executor_node_port) for a in snap.assignments.values())
        return max(RATES_EVERY_S, workers / BEATS_PER_S)

    def _reload_guarded(self) -> None:
        with self._fresh:
            generation = self._requested
        try:
            snap = self._load()
        except LayoutMissingError as exc:
            # Never shown as an empty cluster: every request answers with the reason
            # until a nimbus sets the root up (its watch wakes this loop) or it is back.
            if str(exc) != self._layout_error:
                log.warning("the UI shows no cluster: %s", exc)
            with self._fresh:
                self._snapshot, self._layout_error = None, str(exc)
                self._loaded = generation
                self._fresh.notify_all()
            self._loop.sleep(2.0)  # bounds the wait should a watch be lost
            return
        except self.SOURCE_ERRORS as exc:
            log.debug("UI reload failed: %s", exc)
            if not self._loop.sleep(0.5):
                self._loop.wake()
            return
        except Exception:  # a bug must not end the thread that every request relies on
            log.exception("UI reload failed")
            self._loop.sleep(1.0)
            return
        old = self._snapshot
        diff(self.timeline, old, snap)
        if self._layout_error:
            log.info("the cluster is there: the UI shows it")
        with self._fresh:
            self._snapshot, self._layout_error = snap, ""
            self._loaded = generation
            self._fresh.notify_all()

    def _gather_get(self, paths: list[str], watch: bool) -> list[bytes | None]:
        results = [self.zk.get_async(p, watch=self._changed if watch else None)
                   for p in paths]
        out: list[bytes | None] = []
        for res in results:
            try:
                out.append(res.get(timeout=10)[0])
            except NoNodeError:
                out.append(None)
        return out

    def _gather_children(self, paths: list[str], watch: bool,
                         missing: Callable[[str], None] | None = None) -> list[list[str]]:
        """Children of each path, sorted; a missing path reads as none, or is passed to
        ``missing`` (which raises) for directories of the layout."""
        results = [self.zk.get_children_async(p, watch=self._changed if watch else None)
                   for p in paths]
        out: list[list[str]] = []
        for path, res in zip(paths, results, strict=True):
            try:
                out.append(sorted(res.get(timeout=10)))
            except NoNodeError:
                if missing is not None:
                    missing(path)
                out.append([])
        return out

    def _layout_gone(self, path: str) -> None:
        # The root holds an id, so a nimbus set it up: a directory gone since is a wiped
        # or partly restored ZooKeeper, never an empty cluster.
        self.zk.exists(path, watch=self._changed)  # wakes the loop if it comes back
        raise LayoutMissingError(
            f"{path} does not exist: ZooKeeper was wiped or partly restored, or "
            f"storm.zookeeper.root ({self.state.root}) is wrong")

    def _load(self) -> Snapshot:
        st = self.state
        if st.set_up_id(watch=self._changed) is None:
            raise LayoutMissingError(
                f"{st.not_set_up_message()}: the UI is waiting for one")
        top_paths = [st.path("nimbuses"), st.path("leader-lock"), st.path("storms"),
                     st.path("supervisors"), st.path("code-distributor")]
        top = self._gather_children(top_paths, watch=True, missing=self._layout_gone)
        nimbus_names, lock_nodes, storm_ids, supervisor_ids, _code = top
        nimbus_data = self._gather_get([st.path("nimbuses", n) for n in nimbus_names], False)
        queue = sorted(lock_nodes, key=lambda n: n.rsplit("-", 1)[-1])
        leader_data = self._gather_get([posixpath.join(st.leader_lock_path, queue[0])],
                                       False) if queue else []
        bases = self._gather_get([st.storm_path(t) for t in storm_ids], watch=True)
        assigned = self._gather_get([st.path("assignments", t) for t in storm_ids], True)
        replicas = self._gather_children([st.code_path(t) for t in storm_ids], watch=True)
        sups = self._gather_get([st.path("supervisors", s) for s in supervisor_ids], False)

        storms: dict[str, StormBase] = {}
        assignments: dict[str, Assignment] = {}
        replica_map: dict[str, list[str]] = {}
        for topology_id, raw, assignment, hosts in zip(storm_ids, bases, assigned, replicas,
                                                       strict=True):
            base = _decode(StormBase, raw)
            if base is None:
                continue
            storms[topology_id] = base
            found = _decode(Assignment, assignment)
            if found is not None:
                assignments[topology_id] = found
            replica_map[topology_id] = hosts
        leader = leader_data[0].decode("utf-8", "replace") if leader_data and \
            leader_data[0] else None
        version = (self._snapshot.version if self._snapshot else 0) + 1
        return Snapshot(
            nimbuses=[n for n in (_decode(NimbusInfo, d) for d in nimbus_data) if n],
            leader=leader, storms=storms, assignments=assignments, replicas=replica_map,
            reported_replicas=dict(self._reported),
            supervisors={sid: info for sid, info in zip(
                supervisor_ids, (_decode(SupervisorInfo, d) for d in sups), strict=True)
                if info is not None},
            taken_at=time.time(), version=version)

    # -- heartbeats and errors (while the dashboard is open) --------------------------
    def _poll_live_guarded(self, with_errors: bool) -> None:
        try:
            self._poll_live(with_errors)
        except self.SOURCE_ERRORS as exc:
            log.debug("UI heartbeat poll failed: %s", exc)
        except Exception:
            log.exception("UI heartbeat poll failed")

    def _poll_live(self, with_errors: bool) -> None:
        snap = self._snapshot
        if snap is None:
            return
        st = self.state
        slots: list[tuple[str, str, int]] = []   # (topology, supervisor, port)
        for topology_id, assignment in snap.assignments.items():
            for sid, port in assignment.executor_node_port.values():
                slots.append((topology_id, str(sid), int(port)))
        supervisor_ids = sorted({sid for _t, sid, _p in slots})
        topology_ids = sorted(snap.assignments)
        # The beats, their supervisors' nodes and the assignments, with their stats, in
        # one round of pipelined reads: the workers are judged as topology-info judges
        # them, and the newest mtime among these nodes is "now" (worker_state).
        got = self._gather_get_stat(
            [st.path("workerbeats", t, f"{sid}-{port}") for t, sid, port in slots]
            + [st.path("supervisors", sid) for sid in supervisor_ids]
            + [st.path("assignments", t) for t in topology_ids])
        beats = got[:len(slots)]
        sups = {sid: (_decode(SupervisorInfo, g[0]), g[1].mtime) if g is not None else None
                for sid, g in zip(supervisor_ids, got[len(slots):len(slots) + len(
                    supervisor_ids)], strict=True)}
        assigned_ms = {t: g[1].mtime if g is not None else 0 for t, g in zip(
            topology_ids, got[len(slots) + len(supervisor_ids):], strict=True)}
        reference_ms = max((g[1].mtime for g in got if g is not None), default=0)
        timeout_s = float(self.conf["nimbus.task.timeout.secs"])
        rates: dict[str, float] = {}
        restarts: dict[str, int] = {}
        states: dict[str, list[str]] = {}
        for (topology_id, sid, port), found in zip(slots, beats, strict=True):
            sup = sups[sid]
            judged = worker_state.judge(
                supervisor_id=sid, supervisor=sup,
                said=worker_state.statement(sup[0] if sup else None, topology_id, port),
                beat_mtime_ms=found[1].mtime if found is not None else None,
                assignment_mtime_ms=assigned_ms[topology_id], reference_ms=reference_ms,
                timeout_s=timeout_s)
            states.setdefault(topology_id, []).append(judged.state)
            beat = _decode(WorkerBeat, found[0]) if found is not None else None
            counted = judged.restarts if judged.restarts is not None else (
                _int(beat.restarts) if beat is not None else 0)
            restarts[topology_id] = restarts.get(topology_id, 0) + counted
            if beat is None or not judged.alive:
                continue  # a worker that does not run processes nothing
            comps = beat.components if isinstance(beat.components, dict) else {}
            rates[topology_id] = rates.get(topology_id, 0.0) + sum(
                _float(c.get("processed_rows_per_second")) for c in comps.values()
                if isinstance(c, dict))
        newest = self._poll_errors(list(snap.storms)) if with_errors else None
        with self._lock:
            for gone in set(self._live) - set(snap.storms):
                del self._live[gone]
            for topology_id in snap.storms:
                live = self._live.setdefault(topology_id, Live())
                live.records_per_second = round(rates.get(topology_id, 0.0), 3)
                live.history.append(live.records_per_second)
                live.restarts = restarts.get(topology_id, 0)
                live.worker_states = worker_state.count_states(states.get(topology_id, []))
                live.alive_workers = live.worker_states[worker_state.RUNNING]
                if newest is not None:
                    live.newest_error, live.error_count = newest.get(topology_id, (None, 0))
            self._live_version += 1

    def _gather_get_stat(self, paths: list[str]) -> list[tuple[bytes, ZnodeStat] | None]:
        """(data, stat) of each path (None where there is no node), pipelined."""
        results = [self.zk.get_async(p) for p in paths]
        out: list[tuple[bytes, ZnodeStat] | None] = []
        for res in results:
            try:
                data, stat = res.get(timeout=10)
                out.append((data, stat))
            except NoNodeError:
                out.append(None)
        return out

    def _poll_errors(self, topology_ids: list[str]) -> dict[str, tuple[Any, int]]:
        """id -> (newest error as a dict or None, number of errors kept)."""
        st = self.state
        comps = self._gather_children([st.path("errors", t) for t in topology_ids], False)
        pairs = [(t, c) for t, cs in zip(topology_ids, comps, strict=True) for c in cs]
        kept = self._gather_children([st.path("errors", t, c) for t, c in pairs], False)
        newest_paths = [(t, c, st.path("errors", t, c, names[-1]))
                        for (t, c), names in zip(pairs, kept, strict=True) if names]
        counts: dict[str, int] = {}
        for (t, _c), names in zip(pairs, kept, strict=True):
            counts[t] = counts.get(t, 0) + len(names)
        data = self._gather_get([p for _, _, p in newest_paths], False)
        out: dict[str, tuple[Any, int]] = {t: (None, n) for t, n in counts.items()}
        for (t, c, _p), raw in zip(newest_paths, data, strict=True):
            err = _decode(ErrorInfo, raw)
            if err is None:
                continue
            current = out[t][0]
            if current is None or err.error_time_secs >= current["time"]:
                out[t] = ({"component": c, "error": err.error[:2000],
                           "time": err.error_time_secs, "host": err.host,
                           "port": err.port}, counts[t])
        return out

    # -- topology configurations -----------------------------------------------------
    def _fetch_confs(self) -> None:
        """One step of ``ui-topology-conf``: the nimbuses' replication counts every
        REPLICAS_EVERY_S, and up to ten configurations not fetched yet."""
        if self._fetch_replicas is not None and time.monotonic() >= self._next_replicas:
            self._next_replicas = time.monotonic() + REPLICAS_EVERY_S
            self._refresh_reported_replicas()
        snap = self._snapshot
        if snap is None or self._fetch_conf is None:
            return
        now = time.monotonic()
        todo = [t for t, base in snap.storms.items()
                if base.status != KILLED and self.topology_conf(t) is None
                and now - self._conf_failed.get(t, -1e9) > 30.0][:10]
        for topology_id in todo:
            if self._conf_loop.stopping:
                return
            self._fetch_one(topology_id)
        with self._lock:
            for gone in set(self._topology_conf) - set(snap.storms):
                del self._topology_conf[gone]

    def _refresh_reported_replicas(self) -> None:
        try:
            reported = self._fetch_replicas()  # type: ignore[misc]
        except Exception as exc:  # no nimbus answers now: keep the last counts
            log.debug("replication counts unavailable: %s", exc)
            return
        if reported != self._reported:
            self._reported = reported
            self._changed()  # a reload puts them into the next snapshot

    def _fetch_one(self, topology_id: str) -> dict[str, Any] | None:
        try:
            text = self._fetch_conf(topology_id)  # type: ignore[misc]
            conf = json.loads(text)
            if not isinstance(conf, dict):
                raise ValueError("topology conf is not a JSON object")
        except Exception as exc:  # any nimbus may be down or lack the code yet
            log.debug("configuration of %s unavailable: %s", topology_id, exc)
            self._conf_failed[topology_id] = time.monotonic()
            return None
        conf = redact(conf)
        with self._lock:
            self._topology_conf[topology_id] = conf
        return conf


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    return float(value)
