"""Notice a silently dead ZooKeeper connection that kazoo cannot notice itself.

kazoo detects a dead connection with pings: when it has *sent* nothing for a third of
the session timeout it pings, and drops the connection if the ping goes unanswered. But
every request counts as a ping ("requests act as implicit pings", kazoo's connection
loop), so a client that keeps sending (a nimbus serving reads, a view auditing itself, a
lease being renewed) never pings. Over a silent partition (packets dropped, no reset)
its requests pile up unanswered, the connection stays "CONNECTED", no SUSPENDED is ever
reported, and kazoo never tries another server of the ensemble, until the partition
heals and the server says the session has expired.

:class:`ConnectionWatchdog` closes that gap for one client: a named loop sends a cheap
``exists`` every ``T / 10`` (at most 1 s; ``T`` the negotiated session timeout) and, when
nothing has arrived for ``2/3 T`` (the read timeout kazoo would apply to a ping: no
answer to any request, no watch event) while kazoo reports CONNECTED, asks kazoo's
connection thread to drop the connection (the same request kazoo's own test harness
uses). kazoo then reports SUSPENDED, fails the requests in flight with ConnectionLoss
and reconnects, to another server if one answers, within the session.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kazoo.client import KazooClient
from kazoo.protocol.states import KazooState

from nimbus.background_loop import BackgroundLoop
from nimbus.state.recursive_watch import RecursiveWatchClient
from nimbus.state.session_timeout import SessionTimeout

log = logging.getLogger(__name__)

#: kazoo's own read timeout, as a share of the negotiated session timeout.
SILENCE_FRACTION = 2.0 / 3.0


class ConnectionWatchdog:
    """Probe ``zk`` and drop its connection when it answers nothing; see the module doc."""

    def __init__(self, zk: KazooClient, timeout: SessionTimeout, name: str,
                 probe_path: str = "/", clock: Callable[[], float] = time.monotonic):
        self._zk = zk
        self._timeout = timeout
        self._probe_path = probe_path
        self._clock = clock
        self._last_answer = clock()
        self._connected_since = clock()
        self._oldest_pending: object = None  # see _note_progress
        self.drops = 0   # connections dropped for silence (tests and logs read it)
        # The interval is read at every wait: the negotiated timeout may change.
        self._loop = BackgroundLoop(f"zk-watchdog-{name}", self.check_once,
                                    period=lambda: self.interval_s, wait_first=True)
        zk.add_listener(self._on_state)

    def start(self) -> ConnectionWatchdog:
        """Start watching (once; a stopped watchdog stays stopped)."""
        self._loop.start()
        return self

    def stop(self) -> None:
        self._loop.stop(join_timeout=10)
        self._zk.remove_listener(self._on_state)

    @property
    def interval_s(self) -> float:
        return min(1.0, max(0.05, self._timeout.seconds / 10.0))

    @property
    def silence_limit_s(self) -> float:
        return SILENCE_FRACTION * self._timeout.seconds

    def silent_for(self) -> float:
        """Seconds since the last answer (or since the connection was made)."""
        return self._clock() - max(self._last_answer, self._connected_since)

    def _on_state(self, state: str) -> None:
        # kazoo's event thread: only note the time, a new connection starts a new count.
        if state == KazooState.CONNECTED:
            self._connected_since = self._clock()

    def _note_progress(self) -> None:
        """Count any answer as one: the oldest request awaiting its answer (kazoo's
        queue of sent requests) changed since the last check. A view loading 10,000
        topologies has tens of thousands of reads in flight, answered one by one in
        order; the probe waits behind them all, yet the connection is plainly alive.
        Over a silent partition nothing is answered and the oldest stays the same."""
        pending = getattr(self._zk, "_pending", None)
        try:
            oldest = pending[0] if pending else None
        except IndexError:  # emptied meanwhile
            oldest = None
        if oldest is not None and oldest is not self._oldest_pending:
            if self._oldest_pending is not None:
                self._last_answer = self._clock()
        self._oldest_pending = oldest
        # Watch events count too. When a nimbus with 10,000 replicas dies, its session's
        # expiry sends each other nimbus 20,000 events at once, ahead of every answer;
        # reading them takes seconds, over a connection that is plainly alive. (Only
        # the daemons' handler notes this, on the monotonic clock the watchdog runs on.)
        inbound = getattr(getattr(self._zk, "handler", None), "last_inbound", None)
        if isinstance(inbound, float) and inbound > self._last_answer:
            self._last_answer = inbound

    def _answered(self, result: object) -> None:
        try:
            result.get_nowait()  # type: ignore[attr-defined]
        except Exception:
            return  # an error is no proof the connection carries answers
        self._last_answer = self._clock()

    def check_once(self) -> bool:
        """Send one probe; drop the connection if it has been silent too long. Returns
        whether it dropped it."""
        if self._zk.state != KazooState.CONNECTED:
            return False
        self._note_progress()
        silent = self.silent_for()
        if silent > self.silence_limit_s:
            log.warning("no answer from ZooKeeper for %.0f ms over a connection kazoo "
                        "reports as up (a silent partition?): dropping it so that kazoo "
                        "reconnects, to another server if one answers",
                        silent * 1000)
            self.drops += 1
            self._connected_since = self._clock()  # one drop per silence
            # Imported here: a private marker of kazoo's, the one its test harness uses.
            from kazoo.protocol.connection import _CONNECTION_DROP

            self._zk._call(_CONNECTION_DROP, None)
            return True
        try:
            self._zk.exists_async(self._probe_path).rawlink(self._answered)
        except Exception as exc:
            log.debug("ZooKeeper probe not sent: %s", exc)
        return False


class WatchedKazooClient(RecursiveWatchClient):
    """A kazoo client with a :class:`ConnectionWatchdog` and a tracked negotiated session
    timeout (:mod:`nimbus.state.session_timeout`); :meth:`stop` stops the watchdog too.
    It can hold recursive watches (:mod:`nimbus.state.recursive_watch`).

    Every daemon's client is one of these (``make_zk_client``)."""

    def __init__(self, *args: object, watchdog_name: str = "zk", **kwargs: object):
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        from nimbus.state.session_timeout import track_negotiated_timeout

        # Before start(): the first connection's negotiated timeout is seen too.
        self.session_timeout = track_negotiated_timeout(self, self._session_timeout / 1000.0)
        self.watchdog = ConnectionWatchdog(self, self.session_timeout, watchdog_name)

    def start(self, timeout: float = 15) -> None:
        super().start(timeout)
        self.watchdog.start()

    def stop(self) -> None:
        self.watchdog.stop()
        super().stop()
