"""Leader election over ZooKeeper (Storm's ``ILeaderElector``).

Each queued nimbus owns an ephemeral sequential node under ``<root>/leader-lock``; the
lowest node is the leader. kazoo's ``Lock`` recipe is a blocking mutex; what the design
needs is a queue whose head can *refuse* the lock (when it lacks topology code) and
re-queue later, and whose node path serves as a fence for leader writes, so the elector
is built directly on kazoo's primitives, its decisions taken in the nimbus's cycle:

* ``is_leader()`` is true only while this nimbus holds the lowest node, the connection
  is CONNECTED *and* the node's lease holds (:mod:`nimbus.master.leader_lease`): a
  SUSPENDED or LOST connection turns it false at once, and so does a lease that no
  answer from ZooKeeper renewed in time, however CONNECTED kazoo believes it is. A
  nimbus whose lease runs out steps down (logs "lost leadership") before its session
  can have expired, so before any other nimbus can take the lock; it claims the lock
  again only once an answer has renewed the lease.
* After a LOST session the node is gone; the cycle re-queues when the client reconnects.
* Every SUSPENDED or LOST advances a connection epoch, under the same lock that sets the
  leader. A step claims leadership only if no such change happened since it began, so a
  connection lost while a step runs can never be followed by a claim on a node that
  died with the session.
* The elector does not run on its own: the nimbus's cycle (:mod:`nimbus.master.cycle`)
  calls :meth:`LeaderElector.step` with the facts the decision needs, and the elector
  rings the cycle's bell when it learns something (a predecessor gone, a connection
  change, a lease renewed or run out). Taking the lock is decided only in a step;
  *losing* it takes effect at once on whichever thread learns of it (kazoo's, the
  lease's), since that must never wait for a cycle.
* At the head of the queue a step needs the code check (a
  :class:`~nimbus.master.code_sync.CodeCheck`: the live ids it read, those held), which
  the cycle supplies when :meth:`LeaderElector.wants_code_check` says so. If any
  topology's code is missing the nimbus deletes its node, the step reports it
  (``lacks_code``, for the cycle to ask the code sync for it), and it re-queues in the
  first step whose check is complete. The check that granted the lock is what the
  "gained leadership" line logs: the evidence the lock was taken on.
* Node names carry a per-process id, so a node whose create reply was lost, or whose
  delete failed, is recognised as ours on the next step and adopted or removed: it can
  never block the queue while this process lives.
* The fence is the node that was verified to head the queue. Nodes ahead of it can never
  reappear, so while it exists no other nimbus leads.
"""

from __future__ import annotations

import logging
import posixpath
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NoNodeError,
    SessionExpiredError,
)
from kazoo.protocol.states import KazooState

from nimbus.master.leader_lease import LeaderLease
from nimbus.state.cluster_state import (
    Fence,
    LayoutMissingError,
    StormClusterState,
    lock_sequence,
)
from nimbus.state.session_timeout import SessionTimeout, session_timeout_of

log = logging.getLogger(__name__)

LOCK_PREFIX = "nimbus-"


class NoLeaderError(RuntimeError):
    """No nimbus currently holds the leader lock."""


def _seq(node: str) -> int:
    # leader_lock_nodes leaves out names without a sequence number; were one to slip
    # through, it would queue last, never ahead of a nimbus.
    seq = lock_sequence(node)
    return seq if seq is not None else sys.maxsize


@dataclass(frozen=True)
class Leadership:
    """One spell of leadership of this nimbus: the lock node that fences its writes,
    and its term, which every gain of leadership advances (a lock claimed again after a
    lease ran out is a new term, on the same node)."""

    node: str
    term: int


@dataclass(frozen=True)
class ElectionStep:
    """What one :meth:`LeaderElector.step` decided: the leadership it leaves (None: not
    leading), whether it gave up the head of the queue for lack of code (the code sync
    is to be asked for it), and, after a ZooKeeper error, how soon to step again."""

    leadership: Leadership | None
    lacks_code: bool = False
    retry_in_s: float | None = None


class LeaderElector:
    """Queue for, hold and give up the leader lock; see the module docstring."""

    #: Upper bound on how long a missed watch can delay a decision: the cycle steps at
    #: least this often.
    SAFETY_INTERVAL_S = 2.0
    #: Pause before the next step after a ZooKeeper error.
    RETRY_PAUSE_S = 0.2

    def __init__(
        self,
        zk: KazooClient,
        state: StormClusterState,
        address: str,
        wake: Callable[[], None] = lambda: None,
        session_timeout: SessionTimeout | None = None,
    ):
        """``wake()`` asks the nimbus's cycle for a step soon (its bell): rung from
        kazoo's event thread, watches and the lease's thread, so it must only signal.

        ``session_timeout`` is the negotiated timeout of ``zk``'s session (by default the
        tracker :func:`~nimbus.state.session_timeout.track_negotiated_timeout` made for
        it, else kazoo's requested timeout): the lease is a share of it."""
        self._zk = zk
        self._state = state
        self._address = address
        self._wake = wake
        self._lock = threading.RLock()      # held by every queue decision (step)
        # Guards _leader_node, _epoch and _session_lost: kazoo's thread, the lease's and
        # the cycle's all change them.
        self._leader_lock = threading.RLock()
        self._epoch = 0                     # advanced by every SUSPENDED or LOST
        self._session_lost = False          # set on kazoo's thread, consumed by step
        self._layout_error = ""             # logged once per distinct problem
        self._want_queue = False
        self._queued_once = False           # steps before the first queueing do nothing
        self._waiting_for_code = False
        self._maybe_head = True             # no node ahead of ours known: check the code
        self._node: str | None = None
        self._leader_node: str | None = None   # the node verified as head of the queue
        self._term = 0                      # advanced by every gain of leadership
        self._token = uuid.uuid4().hex[:12]
        self._stopped = False
        self.session_timeout = session_timeout or session_timeout_of(
            zk, getattr(zk, "_session_timeout", 10_000) / 1000.0)
        self.lease = LeaderLease(zk, self.session_timeout, self._current_node,
                                 on_change=self._on_lease,
                                 probe=self._lock_path)
        zk.add_listener(self._on_connection_state)

    # -- ILeaderElector ---------------------------------------------------------------
    def add_to_leader_lock_queue(self) -> None:
        """Queue up for the lock; returns at once, check :meth:`is_leader` afterwards."""
        with self._lock:
            if self._stopped:
                return
            self._want_queue = True
            self._queued_once = True
        self.lease.start()  # once only, and never after stop()
        self._wake()

    @property
    def token(self) -> str:
        """The id in this process's lock node names (``nimbus-<token>-<sequence>``)."""
        return self._token

    def remove_nodes_of(self, token: str) -> list[str]:
        """Delete the lock nodes that ``token``'s process made for this nimbus's address
        and return their names. Only for a process known to be dead (see
        :mod:`nimbus.state.incarnation`): its session, and so its nodes, would otherwise
        live on for up to a session timeout, and keep the lock if one headed the queue."""
        if not token or token == self._token:
            return []
        doomed = {}
        for name in self._state.leader_lock_nodes():
            if not name.startswith(f"{LOCK_PREFIX}{token}-"):
                continue
            try:
                data, stat = self._zk.get(posixpath.join(self._state.leader_lock_path, name))
            except NoNodeError:
                continue
            if data.decode("utf-8", "replace") == self._address:   # else never touched
                doomed[name] = stat.version
        if doomed:
            # With the mark that makes the next leader wait out the releases the dead one
            # may have made moments ago (nimbus.master.scheduler).
            self._state.remove_dead_lock_nodes(doomed)
        return sorted(doomed)

    def remove_from_leader_lock_queue(self) -> None:
        """Leave the queue, releasing the lock at once if held (used on SIGTERM)."""
        with self._lock:
            self._want_queue = False
            self._drop_node()

    def is_leader(self) -> bool:
        """True only while this nimbus holds the lock over a CONNECTED session and the
        lock node's lease holds. Asks nothing of ZooKeeper: it answers at once even
        while ZooKeeper is unreachable."""
        head = self._leader_node
        return (head is not None and head == self._node
                and self._zk.state == KazooState.CONNECTED and self.lease.valid(head))

    def leadership(self) -> Leadership | None:
        """This nimbus's leadership now: None unless :meth:`is_leader`. Asks nothing of
        ZooKeeper."""
        with self._leader_lock:  # the node and its term, of one and the same spell
            head = self._leader_node
            if head is None or not self.is_leader():
                return None
            return Leadership(head, self._term)

    def fence(self) -> Fence:
        """The fence for a leader write; raises if this nimbus is not the leader."""
        head = self._leader_node
        if not self.is_leader() or head is None:
            raise NoLeaderError("this nimbus is not the leader")
        return Fence(head)

    def zookeeper_answering(self) -> bool:
        """Whether ZooKeeper answered this nimbus recently (within a lease's length);
        asks nothing of ZooKeeper. When it is false a read would only queue in kazoo."""
        return self._zk.state == KazooState.CONNECTED and self.lease.answering()

    def get_leader_address(self) -> str:
        """``host:port`` of the current leader; raises NoLeaderError when there is none."""
        queue = self._state.leader_queue()
        if not queue:
            raise NoLeaderError("no nimbus holds the leader lock")
        return queue[0][1]

    def leader_address_within(self, timeout_s: float) -> str:
        """:meth:`get_leader_address`, giving up after ``timeout_s`` (TimeoutError, or a
        kazoo error) instead of waiting as long as kazoo queues the reads: for answers
        that must not hang while ZooKeeper may be unreachable."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self._leader_address_by(deadline)
            except (ConnectionLoss, SessionExpiredError, ConnectionClosedError):
                # Reconnecting (a thawed or healed process): worth another try in time.
                if time.monotonic() + 0.05 >= deadline:
                    raise
                time.sleep(0.05)

    def _leader_address_by(self, deadline: float) -> str:
        lock_path = self._state.leader_lock_path
        children = self._zk.get_children_async(lock_path).get(
            timeout=max(0.0, deadline - time.monotonic()))
        nodes = sorted((n for n in children if lock_sequence(n) is not None), key=_seq)
        if not nodes:
            raise NoLeaderError("no nimbus holds the leader lock")
        data, _stat = self._zk.get_async(posixpath.join(lock_path, nodes[0])).get(
            timeout=max(0.0, deadline - time.monotonic()))
        return data.decode("utf-8", "replace")

    def get_all_nimbus_addresses(self) -> list[str]:
        """Addresses of every live nimbus, the leader included."""
        return [f"{n.host}:{n.port}" for n in self._state.nimbuses()]

    # -- lifecycle ----------------------------------------------------------------------
    def stop(self) -> None:
        """Leave the queue and stop the lease; later steps do nothing."""
        with self._lock:
            self._stopped = True
        self.remove_from_leader_lock_queue()
        self.lease.stop()
        self._zk.remove_listener(self._on_connection_state)

    @property
    def waiting_for_code(self) -> bool:
        """Whether this nimbus left the queue for lack of code and waits to re-queue."""
        return self._waiting_for_code

    def wants_code_check(self) -> bool:
        """Whether the next step needs the code check: to queue (again), or at the head
        of the queue (or possibly there: the node ahead of ours went away). A nimbus
        further back needs none, which keeps a large cluster's followers from reading
        every topology at each step."""
        return self._want_queue and (self._node is None or self._waiting_for_code
                                     or self._maybe_head)

    def _current_node(self) -> str | None:
        return self._node

    def _lock_path(self) -> str:
        return self._state.leader_lock_path

    # -- internals ----------------------------------------------------------------------
    def _on_connection_state(self, state: str) -> None:
        # Runs on kazoo's event thread: only flip flags, never call ZooKeeper here, and
        # never touch _node (the cycle's step reads it under _lock): the LOST flag is
        # consumed there instead. The epoch makes a step that began before this change
        # unable to claim leadership afterwards (see _set_leader).
        if state in (KazooState.SUSPENDED, KazooState.LOST):
            with self._leader_lock:
                self._epoch += 1
                if state == KazooState.LOST:
                    self._session_lost = True  # the ephemeral node died with the session
                self._set_leader(None)
        self._wake()

    def _on_lease(self, valid: bool) -> None:
        # The lease thread: a lease that ran out ends leadership now (ZooKeeper may be
        # unreachable, so nothing here waits for it); a renewed one lets the cycle's
        # next step claim the lock again if this nimbus still heads the queue.
        if not valid:
            with self._leader_lock:
                if self._leader_node is not None:
                    silent = self.lease.silent_for()
                    log.warning(
                        "%s leader lease ran out: no answer from ZooKeeper for %s (lease "
                        "%.0f ms of a %.0f ms session); stepping down", self._address,
                        "ever" if silent is None else f"{silent * 1000:.0f} ms",
                        self.lease.length_s * 1000, self.session_timeout.seconds * 1000)
                    self._epoch += 1  # a step under way must not claim on the old proof
                    self._set_leader(None)
        self._wake()

    def _set_leader(self, head: str | None, code: str = "", epoch: int | None = None) -> None:
        """Lead with ``head`` (the node verified at the head of the queue), or not.

        Called from the cycle's step and kazoo's event thread: the read-modify-write
        and the callback run under one lock so that two changes cannot interleave.
        ``code`` is the evidence of the code check that granted the lock. ``epoch`` is the
        connection epoch the deciding step began in: if the connection was SUSPENDED or
        LOST since, the claim is refused (the listener has already woken the thread for
        another step).
        """
        with self._leader_lock:
            if head and epoch is not None and epoch != self._epoch:
                log.info("%s not claiming leadership as %s: the ZooKeeper connection "
                         "changed while it was verified", self._address, head)
                return
            if head and not self.lease.valid(head):
                log.info("%s not claiming leadership as %s yet: its lease does not hold "
                         "(no recent answer from ZooKeeper)", self._address, head)
                return
            was = self._leader_node is not None
            if head and not was:
                # Logged before it takes effect, so whoever sees this nimbus lead can
                # already read what it held when it took over.
                log.info("%s gained leadership as %s; code held: %s",
                         self._address, head, code or "(not reported)")
                self._term += 1
            self._leader_node = head  # losing takes effect first, then is logged
            if was == (head is not None):
                return
            if not head:
                log.info("%s lost leadership", self._address)
                self._wake()  # the cycle sees the change (metrics, summary) at once

    def _drop_node(self) -> None:
        self._set_leader(None)
        node, self._node = self._node, None
        if node is not None:
            try:
                self._zk.retry(self._zk.delete, node)
            except NoNodeError:
                pass
            except KazooException as exc:
                # Still ours: the next step recognises it by its name and removes it.
                log.warning("could not delete lock node %s yet: %s", node, exc)

    def step(self, code: Any = None) -> ElectionStep:
        """One queue decision (see the module doc), on the nimbus's cycle.

        ``code`` is the code check when :meth:`wants_code_check` asked for it (a value
        that is true when this host holds every live topology's code; its ``str()``, a
        CodeCheck's, is logged as the evidence when it grants the lock), else None. A
        step that reaches the head of the queue without one claims nothing and asks
        for another step at once. A ZooKeeper error ends leadership and asks for a step
        again soon (``retry_in_s``); so does any other error, which is raised."""
        try:
            with self._lock:
                if self._stopped or not self._queued_once:
                    return ElectionStep(None)
                step = self._evaluate(code)
            self._layout_error = ""
            return step
        except KazooException as exc:
            return self.step_failed(exc)
        except Exception:
            self._set_leader(None)
            raise

    def step_failed(self, exc: KazooException) -> ElectionStep:
        """A step that ZooKeeper failed (here, or in reading the facts for it): not
        leading until a step succeeds, which is asked for soon."""
        log.warning("leader election step failed (%s); retrying", exc)
        self._set_leader(None)
        return ElectionStep(None, retry_in_s=self.RETRY_PAUSE_S)

    def stand_aside(self, problem: LayoutMissingError) -> None:
        """Whether this host holds all code cannot be known (the ZooKeeper root no longer
        holds the cluster this nimbus joined): it must not lead, nor hold a place at the
        head of the queue that blocks a nimbus that can. It queues again in the first
        step whose code check passes, as after giving up for lack of code."""
        if str(problem) != self._layout_error:
            log.error("not leading: %s", problem)
        self._layout_error = str(problem)
        with self._lock:
            self._drop_node()
            self._waiting_for_code = True

    def _own_stale_nodes(self, nodes: list[str]) -> list[str]:
        return [n for n in nodes if self._token in n
                and posixpath.join(self._state.leader_lock_path, n) != self._node]

    def _evaluate(self, code: Any) -> ElectionStep:
        with self._leader_lock:
            epoch = self._epoch  # a claim of this step is valid only in this epoch
            lost, self._session_lost = self._session_lost, False
        if lost:
            self._node = None
        if self._zk.state != KazooState.CONNECTED:
            self._set_leader(None)
            return ElectionStep(None)
        lock_path = self._state.leader_lock_path
        nodes = sorted(self._state.leader_lock_nodes(), key=_seq)
        stale = self._own_stale_nodes(nodes)
        if self._node is None and self._want_queue and stale \
                and (not self._waiting_for_code or code):
            # A create whose reply was lost: the node is ours, adopt it.
            self._node = posixpath.join(lock_path, stale.pop(0))
        for node in stale:
            try:
                self._zk.delete(posixpath.join(lock_path, node))
            except NoNodeError:
                pass
        if not self._want_queue:
            self._drop_node()
            return ElectionStep(None)
        if self._node is None:
            if self._waiting_for_code and not code:
                # Re-queue only once the sync has fetched what was missing.
                return ElectionStep(None)
            self._waiting_for_code = False
            self._node = self._zk.create(
                posixpath.join(lock_path, f"{LOCK_PREFIX}{self._token}-"),
                self._address.encode(), ephemeral=True, sequence=True,
            )
            log.info("%s queued for leadership as %s", self._address, self._node)
            nodes = sorted(self._state.leader_lock_nodes(), key=_seq)
        mine = posixpath.basename(self._node)
        if mine not in nodes:
            self._node = None
            self._set_leader(None)
            self._wake()
            return ElectionStep(None)
        index = nodes.index(mine)
        if index == 0:
            self._maybe_head = True
            if code is None:
                # Reached the head since the cycle asked: step again with the check.
                self._wake()
                return ElectionStep(self.leadership())
            if code and not self.lease.valid(self._node):
                # A node just created, or a lease that ran out: prove it first.
                self.lease.renew_once()
            if code:
                if self._leader_node != self._node:  # report only when taking over
                    evidence = "" if isinstance(code, bool) else str(code)
                    self._set_leader(self._node, evidence, epoch)
                return ElectionStep(self.leadership())
            log.info("%s won the lock but lacks topology code: giving it up to sync",
                     self._address)
            self._drop_node()
            self._waiting_for_code = True
            return ElectionStep(None, lacks_code=True)
        self._maybe_head = False
        self._set_leader(None)
        predecessor = posixpath.join(lock_path, nodes[index - 1])
        if self._zk.exists(predecessor, watch=self._on_predecessor_event) is None:
            self._maybe_head = True
            self._wake()
        return ElectionStep(None)

    def _on_predecessor_event(self, _event: object) -> None:
        # kazoo's event thread: the node ahead of ours changed (went away): this nimbus
        # may head the queue now, so the next step checks the code.
        self._maybe_head = True
        self._wake()
