"""The leader's duties as one cycle, read top to bottom (patroni's ``run_cycle``).

Every ``nimbus.monitor.freq.secs`` (sooner when a worker held back by the scheduler's
release quarantine may go or a rebalance's wait ends, and at once when woken) the
``leader-duties`` loop runs :meth:`LeaderDutyCycle.run_cycle`:

1. leadership: lead only on a lock whose lease holds (``elector.leadership()``); a
   follower's cycle ends here. The first cycle of a new leadership resets the
   scheduler's heartbeat clocks, so that ages are measured afresh by the new leader;
2. remove the KILLED topologies whose wait has passed; complete the rebalances whose
   wait has passed (REBALANCING back to the previous status with the new count; the
   deadline is in ZooKeeper, so this is whoever leads by then:
   :mod:`nimbus.master.rebalancing`);
3. remove the code of submissions that never completed;
4. schedule, fenced by the lock node of *this* leadership;
5. when that moved work, refresh the cluster summary (read-your-writes); then bring each
   supervisor's index of its work up to date (:mod:`nimbus.master.assignment_index`);
6. sweep, at most every ``nimbus.sweep.freq.secs``: heartbeats of moved workers and
   shared code whose removal did not finish (:mod:`nimbus.master.sweepers`);
7. record the cycle as completed, for the leader's watchdog
   (:mod:`nimbus.master.leader_watchdog`), leader or not.

Others only wake the cycle: the elector when leadership changes, the daemon when it
stops, a rebalance that set a deadline. Nothing is decided in their callbacks.

ZooKeeper unreachable: the elector already reports no leadership (SUSPENDED or LOST, or
a lease that ran out) and every leader write is fenced, so a cycle then does nothing
until the connection and the lease are back. A ZooKeeper error inside a cycle skips the
rest of it; the next cycle tries again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kazoo.exceptions import KazooException

from nimbus.background_loop import BackgroundLoop
from nimbus.master.assignment_index import AssignmentIndex
from nimbus.master.elector import LeaderElector, Leadership, NoLeaderError
from nimbus.master.lifecycle import TopologyLifecycle
from nimbus.master.scheduler import Scheduler
from nimbus.master.summary_cache import ClusterSummaryCache
from nimbus.master.sweepers import LeaderSweeper
from nimbus.state.cluster_state import Fence, LayoutMissingError, NotLeaderError
from nimbus.state.cluster_view import ViewNotLoadedError
from nimbus.state.records import RecordError

# The daemon's logger, where these lines were logged before the cycle had a module of its
# own: log filters and alerts on "nimbus.master.daemon: scheduling stopped" keep working.
log = logging.getLogger("nimbus.master.daemon")

#: Margin past a held-back worker's release, so the pass that places it runs after it.
RELEASE_MARGIN_S = 0.05


class LeaderDutyCycle:
    """The ``leader-duties`` loop and its cycle; see the module doc.

    ``period_s`` is ``nimbus.monitor.freq.secs``; ``completed()`` is called at the end of
    every cycle, however it ended (the watchdog's ``cycle_completed``).
    """

    def __init__(self, elector: LeaderElector, lifecycle: TopologyLifecycle,
                 scheduler: Scheduler, cache: ClusterSummaryCache, period_s: float,
                 completed: Callable[[], None], sweeper: LeaderSweeper | None = None,
                 index: AssignmentIndex | None = None):
        self._elector = elector
        self._sweeper = sweeper
        self._index = index
        self._lifecycle = lifecycle
        self._scheduler = scheduler
        self._cache = cache
        self._period_s = period_s
        self._completed = completed
        self._term: int | None = None  # the leadership the scheduler was reset for
        self._node: str | None = None  # and its lock node
        self._error = ""  # the RecordError that last stopped scheduling, if any
        self.cycles = 0   # cycles completed (tests wait on it)
        self._loop = BackgroundLoop("leader-duties", self.run_cycle, period=self._wait_s,
                                    wait_first=True)
        lifecycle.add_timer_listener(self.wake)  # a new deadline: compute the wait again

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        self._loop.start()

    def stop(self, join_timeout: float = 10.0) -> None:
        """No cycle begins after this; waits for the one under way."""
        self._loop.stop(join_timeout)

    def wake(self) -> None:
        """Run a cycle now (or right after the one under way)."""
        self._loop.wake()

    def _wait_s(self) -> float:
        wait = self._period_s
        # A held-back worker may go then; a rebalance's wait ends then.
        for due in (self._scheduler.next_release_s(), self._lifecycle.next_rebalance_s()):
            if due is not None:
                wait = min(wait, due + RELEASE_MARGIN_S)
        return wait

    # -- the cycle ----------------------------------------------------------------------
    def run_cycle(self) -> None:
        """One pass of the leader's duties, in order; a no-op on followers."""
        try:
            leadership = self._elector.leadership()
            if leadership is not None:
                self._lead(leadership)
        finally:
            self.cycles += 1
            self._completed()

    def _lead(self, leadership: Leadership) -> None:
        if leadership.term != self._term:
            self._term = leadership.term
            # Heartbeat ages are measured afresh by a new leader. A new lock node means
            # another nimbus may have led since: its releases are not known here.
            self._scheduler.reset(successor=leadership.node != self._node)
            if self._sweeper is not None:
                self._sweeper.reset()
            if self._index is not None:
                self._index.reset()
            self._node = leadership.node
        try:
            self._lifecycle.remove_due_kills()
            rebalanced = self._lifecycle.complete_due_rebalances()
            self._lifecycle.remove_orphan_code()
            fence = self._fence(leadership)
            wrote = self._scheduler.schedule(fence)
            if wrote or rebalanced:
                # Read-your-writes: once a pass has moved work, the summary getClusterInfo
                # serves shows it (one barrier, only after passes that wrote).
                self._cache.refresh_now()
            if self._index is not None:
                self._index.sync(fence, fresh=bool(wrote))
            if self._sweeper is not None:
                self._sweeper.sweep(fence)
            if self._error:
                log.info("scheduling resumed")
                self._error = ""
        except (NotLeaderError, NoLeaderError):
            log.info("duties skipped: leadership lost during the cycle")
        except ViewNotLoadedError as exc:
            log.warning("duties skipped, retrying next cycle: %s", exc)
        except LayoutMissingError as exc:
            log.error("duties skipped, nothing removed: %s", exc)
        except RecordError as exc:
            # A node the scheduler cannot read (a newer release's, or damaged): placing
            # work without knowing where that topology runs could double-book slots, so
            # nothing is scheduled until it is readable again. Logged once per problem.
            if str(exc) != self._error:
                log.error("scheduling stopped, no assignment changed: %s", exc)
            self._error = str(exc)
        except KazooException as exc:
            log.warning("duties failed, retrying next cycle: %s", exc)
        except Exception:
            log.exception("duties failed")

    def _fence(self, leadership: Leadership) -> Fence:
        """The fence of the leadership this cycle began under. If that one has ended,
        even with a new one begun since, NoLeaderError: the new one's first cycle resets
        the scheduler before it schedules."""
        fence = self._elector.fence()
        if self._elector.leadership() != leadership:
            raise NoLeaderError("leadership changed during the duty cycle")
        return fence
