"""The leader's duties, in order: step 5 of the nimbus's cycle (:mod:`nimbus.master.cycle`).

:meth:`LeaderDuties.run` runs them for one leadership:

1. the first run of a new leadership resets the scheduler's heartbeat clocks (ages are
   measured afresh by the new leader), the sweeper and the assignment index;
2. remove the KILLED topologies whose wait has passed; complete the rebalances whose
   wait has passed (REBALANCING back to the previous status with the new count; the
   deadline is in ZooKeeper, so this is whoever leads by then:
   :mod:`nimbus.master.rebalancing`);
3. remove the code of submissions that never completed;
4. schedule, fenced by the lock node of *this* leadership;
5. advance the switches of code version under way (:mod:`nimbus.master.version_switches`,
   through :class:`~nimbus.master.upgrades.Upgrades`: apply a switch to its Assignment,
   mark the workers that switched, roll back a failed upgrade, complete, prune old
   versions), on the same thread as the scheduler so that the two never race on an
   Assignment;
6. when that moved work or changed versions, refresh the cluster summary
   (read-your-writes); then bring each supervisor's index of its work up to date
   (:mod:`nimbus.master.assignment_index`);
7. sweep, at most every ``nimbus.sweep.freq.secs``: heartbeats of moved workers and
   shared code whose removal did not finish (:mod:`nimbus.master.sweepers`).

They are due every ``nimbus.monitor.freq.secs``, sooner when a worker held back by the
scheduler's release quarantine may go or a rebalance's wait ends, and about every second
while a switch of code version is under way (:meth:`due_in_s`), and at once when asked
(:meth:`ask`: a submit, a kill, a new deadline, an upgrade).

ZooKeeper unreachable: the elector already reports no leadership (SUSPENDED or LOST, or
a lease that ran out) and every leader write is fenced, so the duties then do nothing
until the connection and the lease are back. A ZooKeeper error inside them skips the
rest; the next run tries again.
"""

from __future__ import annotations

import logging
import threading
import time

from kazoo.exceptions import KazooException

from nimbus.master.assignment_index import AssignmentIndex
from nimbus.master.elector import LeaderElector, Leadership, NoLeaderError
from nimbus.master.lifecycle import TopologyLifecycle
from nimbus.master.scheduler import Scheduler
from nimbus.master.summary_cache import ClusterSummaryCache
from nimbus.master.sweepers import LeaderSweeper
from nimbus.master.upgrades import Upgrades
from nimbus.state.cluster_state import Fence, LayoutMissingError, NotLeaderError
from nimbus.state.cluster_view import ViewNotLoadedError
from nimbus.state.records import RecordError

# The daemon's logger, where these lines were logged before the cycle had a module of its
# own: log filters and alerts on "nimbus.master.daemon: scheduling stopped" keep working.
log = logging.getLogger("nimbus.master.daemon")

#: Margin past a held-back worker's release, so the pass that places it runs after it.
RELEASE_MARGIN_S = 0.05


class LeaderDuties:
    """The leader's duties; see the module doc. ``period_s`` is
    ``nimbus.monitor.freq.secs``."""

    def __init__(self, elector: LeaderElector, lifecycle: TopologyLifecycle,
                 scheduler: Scheduler, cache: ClusterSummaryCache, period_s: float,
                 sweeper: LeaderSweeper | None = None,
                 index: AssignmentIndex | None = None,
                 upgrades: Upgrades | None = None):
        self._elector = elector
        self._upgrades = upgrades
        self._sweeper = sweeper
        self._index = index
        self._lifecycle = lifecycle
        self._scheduler = scheduler
        self._cache = cache
        self._period_s = period_s
        self._term: int | None = None  # the leadership the scheduler was reset for
        self._node: str | None = None  # and its lock node
        self._error = ""  # the RecordError that last stopped scheduling, if any
        self._asked = threading.Event()
        self._last_run = float("-inf")

    def ask(self) -> None:
        """Have the duties run at the cycle's next step (which the caller wakes)."""
        self._asked.set()

    def due_in_s(self) -> float:
        """Seconds until the duties are due (0 or less: now): a period after the last
        run, or sooner when a held-back worker may go, a rebalance's wait ends or a
        switch of code version under way is to be looked at again."""
        if self._asked.is_set():
            return 0.0
        due = self._last_run + self._period_s - time.monotonic()
        for then in (self._scheduler.next_release_s(), self._lifecycle.next_rebalance_s()):
            if then is not None:
                due = min(due, then + RELEASE_MARGIN_S)
        if self._upgrades is not None:
            then = self._upgrades.due_in_s()
            if then is not None:
                due = min(due, then)
        return due

    def run(self, leadership: Leadership) -> None:
        """The duties of ``leadership``, in order (a new leadership's at once)."""
        self._asked.clear()
        self._last_run = time.monotonic()
        self._lead(leadership)

    def due(self, leadership: Leadership) -> bool:
        """Whether :meth:`run` is due now: asked, its time come, or a new leadership."""
        return leadership.term != self._term or self.due_in_s() <= 0

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
            switched = self._advance_upgrades(fence)
            if wrote or rebalanced or switched:
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

    def _advance_upgrades(self, fence: Fence) -> bool:
        """Advance the switches under way; whether that wrote. A failure of its own is
        logged and leaves the rest of the duties (the index, the sweeps) to run."""
        if self._upgrades is None:
            return False
        try:
            return self._upgrades.advance(fence)
        except (NotLeaderError, NoLeaderError, ViewNotLoadedError, LayoutMissingError,
                KazooException):
            raise
        except RecordError as exc:
            log.error("switches of code version not advanced: %s", exc)
        except Exception:
            log.exception("advancing the switches of code version failed")
        return False

    def _fence(self, leadership: Leadership) -> Fence:
        """The fence of the leadership this cycle began under. If that one has ended,
        even with a new one begun since, NoLeaderError: the new one's first cycle resets
        the scheduler before it schedules."""
        fence = self._elector.fence()
        if self._elector.leadership() != leadership:
            raise NoLeaderError("leadership changed during the duty cycle")
        return fence
