"""Leader election over ZooKeeper (Storm's ``ILeaderElector``).

Each queued nimbus owns an ephemeral sequential node under ``<root>/leader-lock``; the
lowest node is the leader. kazoo's ``Lock`` recipe is a blocking mutex; what the design
needs is a queue whose head can *refuse* the lock (when it lacks topology code) and
re-queue later, and whose node path serves as a fence for leader writes, so the elector
is built directly on kazoo's primitives and runs as one named loop (``leader-elector``):

* ``is_leader()`` is true only while this nimbus holds the lowest node, the connection
  is CONNECTED *and* the node's lease holds (:mod:`nimbus.master.leader_lease`): a
  SUSPENDED or LOST connection turns it false at once, and so does a lease that no
  answer from ZooKeeper renewed in time, however CONNECTED kazoo believes it is. A
  nimbus whose lease runs out steps down (logs "lost leadership") before its session
  can have expired, so before any other nimbus can take the lock; it claims the lock
  again only once an answer has renewed the lease.
* After a LOST session the node is gone; the thread re-queues when the client reconnects.
* Every SUSPENDED or LOST advances a connection epoch, under the same lock that sets the
  leader. A step claims leadership only if no such change happened since it began, so a
  connection lost while a step runs can never be followed by a claim on a node that
  died with the session.
* At the head of the queue the nimbus checks ``has_all_code()``; if any topology's code
  is missing it deletes its node, asks for a code sync, and re-queues as soon as
  :meth:`wake` is called by the sync and the code is complete. The check's own result
  (a :class:`~nimbus.master.code_sync.CodeCheck`: the live ids it read, those held) is
  what the "gained leadership" line logs: the evidence the lock was taken on.
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

from nimbus.background_loop import BackgroundLoop
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


class LeaderElector:
    """Queue for, hold and give up the leader lock; see the module docstring."""

    # Upper bound on how long a missed watch can delay a decision.
    SAFETY_INTERVAL_S = 2.0

    def __init__(
        self,
        zk: KazooClient,
        state: StormClusterState,
        address: str,
        has_all_code: Callable[[], Any],
        request_sync: Callable[[], None] = lambda: None,
        on_change: Callable[[bool], None] = lambda leader: None,
        session_timeout: SessionTimeout | None = None,
        check_layout: Callable[[], None] = lambda: None,
    ):
        """``has_all_code()`` returns a value that is true when this host holds every
        live topology's code; its ``str()`` (say, a CodeCheck's) is logged as the evidence
        when that value grants the lock, so a plain bool logs "(not reported)".

        ``on_change`` runs under a lock that kazoo's event thread also takes: it must
        return quickly and never wait for ZooKeeper. It is for signals (wake a loop, set
        a metric); what a new leadership calls for is decided by whoever reads
        :meth:`leadership` (the leader's duty cycle).

        ``session_timeout`` is the negotiated timeout of ``zk``'s session (by default the
        tracker :func:`~nimbus.state.session_timeout.track_negotiated_timeout` made for
        it, else kazoo's requested timeout): the lease is a share of it.

        ``check_layout()`` raises LayoutMissingError when the ZooKeeper root no longer
        holds the cluster this nimbus joined. It runs before every queue decision, so a
        nimbus left over from a wiped cluster never takes a place in the new one's queue,
        wherever in the queue its node would land."""
        self._zk = zk
        self._check_layout = check_layout
        self._state = state
        self._address = address
        self._has_all_code = has_all_code
        self._request_sync = request_sync
        self._on_change = on_change
        self._lock = threading.RLock()      # held by every queue decision (_evaluate)
        # Guards _leader_node, its callback, _epoch and _session_lost: kazoo's thread and
        # the election thread both change them.
        self._leader_lock = threading.RLock()
        self._epoch = 0                     # advanced by every SUSPENDED or LOST
        self._session_lost = False          # set on kazoo's thread, consumed by _evaluate
        self._layout_error = ""             # logged once per distinct problem
        self._want_queue = False
        self._waiting_for_code = False
        self._node: str | None = None
        self._leader_node: str | None = None   # the node verified as head of the queue
        self._term = 0                      # advanced by every gain of leadership
        self._token = uuid.uuid4().hex[:12]
        self._loop = BackgroundLoop("leader-elector", self._step,
                                    period=self.SAFETY_INTERVAL_S, wait_first=True,
                                    on_error=lambda exc: self._set_leader(None))
        self.session_timeout = session_timeout or session_timeout_of(
            zk, getattr(zk, "_session_timeout", 10_000) / 1000.0)
        self.lease = LeaderLease(zk, self.session_timeout, lambda: self._node,
                                 on_change=self._on_lease,
                                 probe=lambda: state.leader_lock_path)
        zk.add_listener(self._on_connection_state)

    # -- ILeaderElector ---------------------------------------------------------------
    def add_to_leader_lock_queue(self) -> None:
        """Queue up for the lock; returns at once, check :meth:`is_leader` afterwards."""
        with self._lock:
            self._want_queue = True
        self._loop.start()  # both start once only, and never after stop()
        self.lease.start()
        self.wake()

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
    def wake(self) -> None:
        """Re-evaluate soon (e.g. after a code sync completed or a watch fired)."""
        self._loop.wake()

    def stop(self) -> None:
        """Leave the queue, then stop the election and lease loops."""
        self.remove_from_leader_lock_queue()
        self._loop.stop(join_timeout=10)
        self.lease.stop()
        self._zk.remove_listener(self._on_connection_state)

    @property
    def waiting_for_code(self) -> bool:
        return self._waiting_for_code

    # -- internals ----------------------------------------------------------------------
    def _on_connection_state(self, state: str) -> None:
        # Runs on kazoo's event thread: only flip flags, never call ZooKeeper here, and
        # never touch _node (the election thread reads it under _lock): the LOST flag is
        # consumed there instead. The epoch makes a step that began before this change
        # unable to claim leadership afterwards (see _set_leader).
        if state in (KazooState.SUSPENDED, KazooState.LOST):
            with self._leader_lock:
                self._epoch += 1
                if state == KazooState.LOST:
                    self._session_lost = True  # the ephemeral node died with the session
                self._set_leader(None)
        self._loop.wake()

    def _on_lease(self, valid: bool) -> None:
        # The lease thread: a lease that ran out ends leadership now (ZooKeeper may be
        # unreachable, so nothing here waits for it); a renewed one lets the election
        # thread claim the lock again if this nimbus still heads the queue.
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
        self._loop.wake()

    def _set_leader(self, head: str | None, code: str = "", epoch: int | None = None) -> None:
        """Lead with ``head`` (the node verified at the head of the queue), or not.

        Called from the election thread and kazoo's event thread: the read-modify-write
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
            try:
                self._on_change(head is not None)
            except Exception:
                log.exception("leadership callback failed")

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

    def _step(self) -> None:
        """One step of the ``leader-elector`` loop: a queue decision (see the module
        doc). An unexpected error ends leadership (the loop's ``on_error``)."""
        try:
            with self._lock:
                self._evaluate()
            self._layout_error = ""
        except LayoutMissingError as exc:
            # Whether this nimbus holds all code cannot be known: it must not lead, nor
            # hold a place at the head of the queue that blocks a nimbus that can. It
            # queues again once the check passes, as after giving up for lack of code.
            if str(exc) != self._layout_error:
                log.error("not leading: %s", exc)
            self._layout_error = str(exc)
            with self._lock:
                self._drop_node()
                self._waiting_for_code = True
        except KazooException as exc:
            log.warning("leader election step failed (%s); retrying", exc)
            self._set_leader(None)
            if not self._loop.sleep(0.2):
                self._loop.wake()

    def _own_stale_nodes(self, nodes: list[str]) -> list[str]:
        return [n for n in nodes if self._token in n
                and posixpath.join(self._state.leader_lock_path, n) != self._node]

    def _evaluate(self) -> None:
        with self._leader_lock:
            epoch = self._epoch  # a claim of this step is valid only in this epoch
            lost, self._session_lost = self._session_lost, False
        if lost:
            self._node = None
        if self._zk.state != KazooState.CONNECTED:
            self._set_leader(None)
            return
        lock_path = self._state.leader_lock_path
        nodes = sorted(self._state.leader_lock_nodes(), key=_seq)
        stale = self._own_stale_nodes(nodes)
        if self._node is None and self._want_queue and stale \
                and (not self._waiting_for_code or self._has_all_code()):
            # A create whose reply was lost: the node is ours, adopt it.
            self._node = posixpath.join(lock_path, stale.pop(0))
        for node in stale:
            try:
                self._zk.delete(posixpath.join(lock_path, node))
            except NoNodeError:
                pass
        if not self._want_queue:
            self._drop_node()
            return
        self._check_layout()
        if self._node is None:
            if self._waiting_for_code and not self._has_all_code():
                return  # re-queue only once the sync has fetched what was missing
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
            self._loop.wake()
            return
        index = nodes.index(mine)
        if index == 0:
            check = self._has_all_code()  # the evidence the lock is taken on
            if check and not self.lease.valid(self._node):
                # A node just created, or a lease that ran out: prove it first.
                self.lease.renew_once()
            if check:
                if self._leader_node != self._node:  # report only when taking over
                    evidence = "" if isinstance(check, bool) else str(check)
                    self._set_leader(self._node, evidence, epoch)
            else:
                log.info("%s won the lock but lacks topology code: giving it up to sync",
                         self._address)
                self._drop_node()
                self._waiting_for_code = True
                self._request_sync()
            return
        self._set_leader(None)
        predecessor = posixpath.join(lock_path, nodes[index - 1])
        if self._zk.exists(predecessor, watch=lambda event: self._loop.wake()) is None:
            self._loop.wake()
