"""The UI's read side: what every REST request and the dashboard answer from.

A :class:`UIReader` holds the newest
:class:`~nimbus.state.cluster_snapshot.ClusterSnapshot` (the cluster's one read model:
nimbuses, the leader, topologies, assignments, supervisors, replication) and a named
loop (``ui-cluster-view``) that takes a new one when its source says something changed,
and every few seconds as a safety net. Requests then answer from memory. Where the
snapshots come from is the subclass's business:

* :class:`nimbus.ui.summary_reader.SummaryReader`: a UI inside a nimbus
  (``nimbus.ui.enabled``) reuses that nimbus's summary, kept current by its watches;
* :class:`nimbus.ui.zk_reader.ZooKeeperReader`: ``nimbus-ha ui`` reads ZooKeeper with a
  client of its own (``ui.source: zookeeper``);
* :class:`nimbus.ui.thrift_reader.ThriftReader`: ``nimbus-ha ui`` asks a nimbus
  (``ui.source: thrift``).

While the dashboard is open (a dashboard request within :data:`DEMAND_S`), the same
thread also polls the numbers no snapshot holds: worker heartbeats once a second for
records per second, restarts and each worker's state, and the newest errors every few
seconds (:class:`Live`); nobody pays for them when nobody looks.

A second named loop (``ui-topology-conf``) fetches each topology's configuration from a
nimbus (getTopologyConf, secrets already redacted there): it holds
``topology.min.replication.count`` and who may read or change the topology
(``topology.users``, ``topology.readonly.users``). A version's conf never changes, but an
upgrade makes a new version with a conf of its own (:mod:`nimbus.state.code_versions`),
so the conf is kept with the code version it was fetched for (the snapshot's
``running_versions``) and counts as unknown, and is fetched again, once the topology
runs another version: a user an upgrade removed loses access as soon as the UI sees the
switch's end. The loop runs apart because a Thrift call to a frozen nimbus may block for
seconds, and the snapshot must not wait.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nimbus.background_loop import BackgroundLoop
from nimbus.config import Config
from nimbus.read_your_writes import Reloads
from nimbus.redaction import redact
from nimbus.state.cluster_snapshot import ClusterSnapshot
from nimbus.state.cluster_state import LayoutMissingError
from nimbus.state.records import KILLED, StormBase
from nimbus.ui.timeline import Timeline, diff

log = logging.getLogger(__name__)

SAFETY_RELOAD_S = 30.0   # the source's news drive reloads; this only catches a missed one
COALESCE_S = 0.02        # a burst of news makes one reload
CONF_EVERY_S = 1.0       # the configuration fetcher's pace
DEMAND_S = 10.0          # the dashboard counts as open this long after its last request
RATES_EVERY_S = 1.0
# Beats read per second at most: with more workers than this the rates are sampled less
# often (1,000 workers: every 5 s), so the UI's cost stays bounded as the cluster grows
# and the page still refreshes every second with the newest sample.
BEATS_PER_S = 200
ERRORS_EVERY_S = 5.0
HISTORY_POINTS = 60      # one per rates poll: a minute of records per second


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


class ClusterUnavailableError(RuntimeError):
    """No snapshot yet, or its source is unreachable: the UI cannot say anything true."""


class UIReader:
    """The UI's read side (module docstring); a subclass says where snapshots come from
    (:meth:`_load`), how the live numbers are polled (:meth:`_poll_live`) and how one
    topology is read (:meth:`storm_base`, :meth:`topology_info`). ``start``/``stop``."""

    #: What a failed read of the source may raise (logged briefly, retried).
    SOURCE_ERRORS: tuple[type[BaseException], ...] = ()
    UNREACHABLE = "the UI's source of the cluster is unreachable"

    def __init__(self, conf: Config, fetch_conf: Callable[[str], str] | None = None):
        self.conf = conf
        # How often the snapshot is taken again with no news from the source.
        self._reload_every_s = SAFETY_RELOAD_S
        self.timeline = Timeline()
        self._fetch_conf = fetch_conf
        self._snapshot: ClusterSnapshot | None = None
        # Why there is no snapshot: no nimbus has set the cluster up under the root yet,
        # or the layout is gone (a wrong root, a wiped ZooKeeper); "" once it is read.
        self._layout_error = ""
        self._live: dict[str, Live] = {}
        # id -> (the code version it was fetched for, the conf): see the module docstring
        self._topology_conf: dict[str, tuple[int, dict[str, Any]]] = {}
        # (id, code version) -> monotonic time of the last failed fetch
        self._conf_failed: dict[tuple[str, int], float] = {}
        self._lock = threading.Lock()
        self._reloads = Reloads()   # read-your-writes (refresh_now)
        self._demand_until = 0.0
        self._live_version = 0
        # The loop's schedule: each step sets when the next one is due.
        self._next_safety = 0.0
        self._next_rates = self._next_errors = 0.0
        self._next_wait_s = 0.0
        self._loop = BackgroundLoop("ui-cluster-view", self._step,
                                    period=lambda: self._next_wait_s, coalesce_s=COALESCE_S)
        self._conf_loop = BackgroundLoop("ui-topology-conf", self._fetch_confs,
                                         period=CONF_EVERY_S, wait_first=True)

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        self._loop.start()
        self._conf_loop.start()

    def stop(self) -> None:
        """Stop both loops and wait for them (the source itself stays open)."""
        self._conf_loop.stop(join_timeout=15)
        self._loop.stop(join_timeout=15)

    def _changed(self, _event: object = None) -> None:
        """News from the source: take a new snapshot soon (a burst makes one)."""
        self._loop.wake()

    # -- what a subclass provides --------------------------------------------------------
    @property
    def connected(self) -> bool:
        """Whether the source answers now (else the snapshot is not shown)."""
        raise NotImplementedError

    def _load(self) -> ClusterSnapshot | None:
        """A snapshot from the source; None: nothing to show yet. LayoutMissingError:
        the cluster is not there (shown as such), SOURCE_ERRORS: retried soon."""
        raise NotImplementedError

    def _poll_live(self, with_errors: bool) -> None:
        """Update :attr:`_live` (and bump :attr:`_live_version`) for the snapshot's
        topologies; the newest errors too when ``with_errors``."""
        raise NotImplementedError

    def storm_base(self, topology_id: str) -> StormBase | None:
        """The topology's StormBase now (None: no such topology), for an action's or a
        page's checks."""
        raise NotImplementedError

    def topology_info(self, topology_id: str, timeout_s: float) -> dict[str, Any] | None:
        """:func:`nimbus.state.runtime_view.topology_info` of one topology, read now
        (beats and errors are not in the snapshot); None for an unknown id."""
        raise NotImplementedError

    # -- reads for the REST API ------------------------------------------------------
    def snapshot(self) -> ClusterSnapshot:
        """The newest snapshot; ClusterUnavailableError if none or the source is gone."""
        snap = self._snapshot
        if snap is None and self._layout_error:
            raise ClusterUnavailableError(self._layout_error)
        if snap is None or not self.connected:
            raise ClusterUnavailableError(self.UNREACHABLE if snap is not None else
                                          "the UI has not read the cluster state yet")
        return snap

    def refresh_now(self, timeout_s: float = 3.0) -> None:
        """Wait (bounded) for a reload that started after this call (read-your-writes
        after an action)."""
        self._reloads.wait_for_next(self._loop.wake, timeout_s)

    def wait_ready(self, timeout_s: float = 15.0) -> bool:
        """Wait (bounded) for the first snapshot, or for the reason there is none;
        whether there is one."""
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

    def running_version(self, topology_id: str) -> int:
        """The code version the topology runs, as the newest snapshot says (1 before
        any snapshot)."""
        snap = self._snapshot
        return snap.running_version(topology_id) if snap is not None else 1

    def topology_conf(self, topology_id: str) -> dict[str, Any] | None:
        """The topology's redacted configuration, if fetched yet for the code version it
        runs now (the conf of a version it no longer runs is never answered)."""
        version = self.running_version(topology_id)
        with self._lock:
            known = self._topology_conf.get(topology_id)
        return known[1] if known is not None and known[0] == version else None

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
        """One step of ``ui-cluster-view``: reload when woken (news from the source; a
        burst of it is one wake-up) or when the safety reload is due, poll heartbeats
        and errors while the dashboard is open, and set when the next step is due."""
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
        generation, _asked = self._reloads.begin()
        try:
            snap = self._load()
        except LayoutMissingError as exc:
            # Never shown as an empty cluster: every request answers with the reason
            # until a nimbus sets the root up (the source's news wakes this loop) or it
            # is back.
            if str(exc) != self._layout_error:
                log.warning("the UI shows no cluster: %s", exc)
            with self._reloads.finish(generation):
                self._snapshot, self._layout_error = None, str(exc)
            self._loop.sleep(2.0)  # bounds the wait should the news be lost
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
        if snap is not None and snap is not old:
            diff(self.timeline, old, snap)
            if self._layout_error:
                log.info("the cluster is there: the UI shows it")
        with self._reloads.finish(generation):
            if snap is not None:
                self._snapshot, self._layout_error = snap, ""

    def _poll_live_guarded(self, with_errors: bool) -> None:
        try:
            self._poll_live(with_errors)
        except self.SOURCE_ERRORS as exc:
            log.debug("UI heartbeat poll failed: %s", exc)
        except Exception:
            log.exception("UI heartbeat poll failed")

    # -- topology configurations -----------------------------------------------------
    def _fetch_confs(self) -> None:
        """One step of ``ui-topology-conf``: up to ten configurations not fetched yet."""
        snap = self._snapshot
        if snap is None or self._fetch_conf is None:
            return
        now = time.monotonic()
        todo = [t for t, base in snap.storms.items()
                if base.status != KILLED and self.topology_conf(t) is None
                and now - self._conf_failed.get((t, snap.running_version(t)), -1e9) > 30.0
                ][:10]
        for topology_id in todo:
            if self._conf_loop.stopping:
                return
            self._fetch_one(topology_id)
        with self._lock:
            for gone in set(self._topology_conf) - set(snap.storms):
                del self._topology_conf[gone]
            for key in [k for k in self._conf_failed if k[0] not in snap.storms]:
                del self._conf_failed[key]

    def _fetch_one(self, topology_id: str) -> dict[str, Any] | None:
        # The version is read before the fetch: a conf fetched while the topology
        # switched is kept for the version before, and never answered for the new one.
        version = self.running_version(topology_id)
        try:
            text = self._fetch_conf(topology_id)  # type: ignore[misc]
            conf = json.loads(text)
            if not isinstance(conf, dict):
                raise ValueError("topology conf is not a JSON object")
        except Exception as exc:  # any nimbus may be down or lack the code yet
            log.debug("configuration of %s (version %d) unavailable: %s", topology_id,
                      version, exc)
            with self._lock:
                self._conf_failed[(topology_id, version)] = time.monotonic()
            return None
        conf = redact(conf)
        with self._lock:
            self._topology_conf[topology_id] = (version, conf)
        return conf
