"""Storm's cluster state in ZooKeeper behind a typed API (StormClusterState).

Layout under the root (``/storm`` by default)::

    storms/<id>                       StormBase, written by the leader
    assignments/<id>                  Assignment, written by the leader
    workerbeats/<id>/<node-port>      worker heartbeats (nimbus only creates the directory)
    errors/<id>/<component>/e<seq>    errors, the 10 newest per component are kept
    supervisors/<supervisor-id>       SupervisorInfo heartbeats (ephemeral)
    code-distributor/<key>            CodeMeta (the metafile); children: replica hosts.
                                      <key> is a topology id (version 1) or a version's
                                      code key, <id>.v<N> (nimbus.state.code_versions)
    nimbuses/<host:port>              NimbusInfo of every live nimbus (ephemeral)
    leader-lock/nimbus-<seq>          the leader lock queue (ephemeral sequential)
    supervisor-assignments/<sup-id>   SupervisorAssignments: the leader's index of the
                                      topologies with work on each supervisor
    placements/<id>                   PlacementHistory: where each worker has run, written
                                      by the leader with the assignment it describes
    code-versions/<id>                CodeVersions: an upgraded topology's versions and
                                      the switch under way, written by the leader

Every write that only the leader may make takes a :class:`Fence` and is one ZooKeeper
multi-op whose first operation checks that the leader's lock node still exists. A nimbus
whose session expired (so its lock node is gone) therefore cannot change cluster state,
even if it has not yet noticed that it lost the lock.
"""

from __future__ import annotations

import logging
import posixpath
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
)
from kazoo.protocol.states import ZnodeStat

from nimbus.state import leader_audit
from nimbus.state.code_versions import CodeVersions, is_version_key, topology_of
from nimbus.state.component_ids import TOPOLOGY_ID_RE, check_component_id
from nimbus.state.records import (
    Assignment,
    CodeMeta,
    ErrorInfo,
    NimbusInfo,
    PlacementHistory,
    Record,
    RecordError,
    StormBase,
    SupervisorAssignments,
    SupervisorInfo,
    WorkerBeat,
)

MAX_ERRORS_PER_COMPONENT = 10
Watch = Callable[[Any], None] | None
R = TypeVar("R", bound=Record)
log = logging.getLogger(__name__)

# A node this release cannot read is logged once per problem, again after this long if
# it persists, and again at once if it is deleted and made anew; this many are remembered.
UNREADABLE_RELOG_S = 600.0
UNREADABLE_REMEMBERED = 1024
# What setup() writes into the root (a uuid4's hex); any short printable word is taken.
CLUSTER_ID_RE = re.compile(r"^[!-~]{1,128}$")


def lock_sequence(name: str) -> int | None:
    """The sequence number of a leader-lock node (``nimbus-<token>-<sequence>``), or
    None for a name that no nimbus makes."""
    _head, sep, seq = name.rpartition("-")
    if not sep or not seq.isascii() or not seq.isdigit():
        return None
    return int(seq)


def is_topology_id(name: str) -> bool:
    """Whether ``name`` can be a topology id (``name-counter-time``, as submit makes
    them); any other child of a topology directory is no topology."""
    return bool(TOPOLOGY_ID_RE.fullmatch(name)) and ".." not in name



def check_path_part(part: str) -> str:
    """``part`` if it names exactly one node below its parent (no ``/``, not ``.`` or
    ``..``, not empty); ValueError otherwise."""
    if not isinstance(part, str) or not part or "/" in part or part in (".", "..") \
            or "\x00" in part:
        raise ValueError(f"not one ZooKeeper path part: {part!r:.80}")
    return part

class NotLeaderError(RuntimeError):
    """A leader-only write was refused: the writer no longer holds the leader lock."""


class ConcurrentChangeError(RuntimeError):
    """A write lost a race with another change; re-read and try again."""


class LayoutMissingError(RuntimeError):
    """A directory of the cluster layout (``/storm/storms``, ...) does not exist.

    This never means "empty": a wrong ``storm.zookeeper.root`` or a wiped or half-restored
    ZooKeeper looks the same, and acting on it as "nothing is live" would delete every
    topology's code. Callers stop and report instead.
    """


class ClusterNotSetUpError(LayoutMissingError):
    """No nimbus has set the cluster up under the root yet: the root is missing, or holds
    no cluster id (a nimbus writes the id last, once every directory exists). Readers
    started before any nimbus wait for this to change; see
    :meth:`StormClusterState.wait_set_up`."""


def _setter(event: threading.Event) -> Callable[[Any], None]:
    """A ZooKeeper watch that sets ``event``."""
    return lambda _watched: event.set()


class _UnreadableLog:
    """Logs the nodes this release cannot read: each problem of a node once, again after
    UNREADABLE_RELOG_S if it persists (heartbeats rewrite their nodes every few seconds),
    and again at once once the node was readable or gone in between. Remembers at most
    UNREADABLE_REMEMBERED nodes, indexed by directory so listings stay cheap."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # directory -> node name -> problem -> when it was last logged (monotonic)
        self._dirs: dict[str, dict[str, dict[str, float]]] = {}
        self._count = 0

    def report(self, path: str, problem: str) -> None:
        directory, name = posixpath.split(path)
        now = time.monotonic()
        with self._lock:
            problems = self._dirs.get(directory, {}).get(name)
            logged = problems.get(problem) if problems is not None else None
            if logged is not None and now - logged < UNREADABLE_RELOG_S:
                return
            if problems is None:
                if self._count >= UNREADABLE_REMEMBERED:
                    self._dirs.clear()
                    self._count = 0
                self._count += 1
            self._dirs.setdefault(directory, {}).setdefault(name, {})[problem] = now
        log.error("unreadable node, left as it is: %s", problem)

    def readable(self, path: str) -> None:
        if not self._count:
            return
        directory, name = posixpath.split(path)
        with self._lock:
            names = self._dirs.get(directory)
            if names is not None and names.pop(name, None) is not None:
                self._count -= 1

    def listed(self, directory: str, children: list[str]) -> None:
        """``directory`` holds ``children``: forget the nodes that are gone."""
        if directory not in self._dirs:
            return
        present = set(children)
        with self._lock:
            names = self._dirs.get(directory, {})
            for name in [n for n in names if n not in present]:
                del names[name]
                self._count -= 1

    def clear(self) -> None:
        with self._lock:
            self._dirs.clear()
            self._count = 0


@dataclass(frozen=True)
class Fence:
    """Proof of leadership: the path of the leader's own lock node."""

    lock_path: str


class StormClusterState:
    """Typed reads and writes of the cluster's state; one instance per ZooKeeper client."""

    SUBTREES = ("storms", "assignments", "workerbeats", "errors", "supervisors",
                "code-distributor", "nimbuses", "leader-lock", "supervisor-assignments",
                "placements", "code-versions")

    def __init__(self, zk: KazooClient, root: str = "/storm", audit_writer: str = ""):
        """``audit_writer`` (this nimbus's address) turns on the audit trail of leader
        writes (:mod:`nimbus.state.leader_audit`, ``nimbus.audit.leader.writes``)."""
        self.zk = zk
        self.root = "/" + root.strip("/")
        self.audit_writer = audit_writer
        self._unreadable = _UnreadableLog()

    # -- paths -------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    def storm_path(self, topology_id: str) -> str:
        return self.path("storms", topology_id)

    def code_path(self, topology_id: str) -> str:
        return self.path("code-distributor", topology_id)

    @property
    def leader_lock_path(self) -> str:
        return self.path("leader-lock")

    def setup(self) -> str:
        """Create the directories of the layout (idempotent); return the cluster's id.

        The id is made once, when the root is first set up, and kept as the root's data.
        A local copy of code made for another id belongs to another cluster (or to a
        ZooKeeper that was since wiped): see :meth:`LocalCodeStore.claim`.
        """
        self.zk.retry(self.zk.ensure_path, self.root)
        for sub in self.SUBTREES:
            self.zk.retry(self.zk.ensure_path, self.path(sub))
        if self.audit_writer:
            self.zk.retry(self.zk.ensure_path, self.path(leader_audit.AUDIT_DIR))
        return self.cluster_id()

    def check_cluster(self, expected: str) -> None:
        """Raise LayoutMissingError unless the root still holds cluster ``expected``.

        A nimbus keeps running while ZooKeeper is wiped; when some nimbus then restarts
        and sets the layout up anew, the root holds a new id and every directory is empty.
        The nimbuses still running must not read that as "no topology is live".
        """
        try:
            data, _ = self.zk.retry(self.zk.get, self.root)
        except NoNodeError:
            data = b""
        current = data.decode("utf-8", "replace")
        if current != expected:
            shown = current if CLUSTER_ID_RE.fullmatch(current) else f"{data[:40]!r}"
            raise LayoutMissingError(
                f"ZooKeeper root {self.root} holds cluster {shown or '(none)'}, not "
                f"cluster {expected} that this nimbus joined (ZooKeeper wiped and set up "
                "again, or restored from elsewhere?); refusing to act on it. Restart this "
                "nimbus to join the new cluster: its code is then kept aside, never removed"
            )

    def cluster_id(self) -> str:
        """The id written into the root node by the first :meth:`setup`.

        Raises LayoutMissingError when the root holds something else (not a short
        printable word): a root of some other application, or damaged data, is not
        adopted as a cluster."""
        data, stat = self.zk.retry(self.zk.get, self.root)
        if not data:
            made = uuid.uuid4().hex
            try:
                self.zk.retry(self.zk.set, self.root, made.encode(), version=stat.version)
                return made
            except BadVersionError:  # another nimbus set it first: theirs wins
                data = self.zk.retry(self.zk.get, self.root)[0]
        return self._checked_id(data)

    def set_up_id(self, watch: Watch = None) -> str | None:
        """The cluster's id once a nimbus has set the layout up; None while none has (the
        root missing or still without its id). Creates nothing. ``watch`` fires when the
        root is created or its data is set (the id is written after every directory).

        Raises LayoutMissingError when the root holds something that is not an id."""
        try:
            data, _ = self.zk.retry(self.zk.get, self.root, watch=watch)
        except NoNodeError:
            if self.zk.retry(self.zk.exists, self.root, watch=watch) is None:
                return None
            return self.set_up_id(watch)  # created between the two calls: read it
        if not data:
            return None
        return self._checked_id(data)

    def _checked_id(self, data: bytes) -> str:
        """The cluster id the root's ``data`` holds; LayoutMissingError when it holds
        something else (a root of another application, or damaged data)."""
        current = data.decode("utf-8", "replace")
        if not CLUSTER_ID_RE.fullmatch(current):
            raise LayoutMissingError(
                f"ZooKeeper root {self.root} holds {data[:40]!r} ({len(data)} bytes) where "
                "nimbus-ha keeps its cluster id: not a nimbus-ha root, or damaged; check "
                "storm.zookeeper.root")
        return current

    def not_set_up_message(self) -> str:
        return (f"no nimbus has set the cluster up under {self.root} yet (start a nimbus, "
                "or check storm.zookeeper.root and storm.zookeeper.servers)")

    def wait_set_up(self, timeout_s: float,
                    waiting: Callable[[str], None] = lambda message: None) -> str:
        """The cluster's id, waiting up to ``timeout_s`` for a nimbus to set the layout up
        (a reader started before any nimbus). ``waiting(message)`` is called once, when
        the first look finds nothing yet.

        Raises ClusterNotSetUpError at the deadline, and LayoutMissingError at once for a
        root that holds something else."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        told = False
        while True:
            changed = threading.Event()
            found = self.set_up_id(watch=_setter(changed))
            if found is not None:
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ClusterNotSetUpError(
                    f"{self.not_set_up_message()}; gave up after {timeout_s:.0f}s "
                    "(nimbus.client.wait.secs)")
            if not told:
                waiting(f"{self.not_set_up_message()}: waiting up to {timeout_s:.0f}s "
                        "(nimbus.client.wait.secs)")
                told = True
            # The watch wakes this at once; the bound covers a watch lost with a session.
            changed.wait(min(remaining, 2.0))

    # -- low-level helpers ---------------------------------------------------------------
    def _children(self, path: str, watch: Watch = None, layout: bool = False) -> list[str]:
        """Children of ``path``; an absent node has none, unless it is a ``layout``
        directory (made by :meth:`setup`, never removed): then LayoutMissingError, since
        an absent directory is not an empty one."""
        try:
            children = sorted(self.zk.retry(self.zk.get_children, path, watch=watch))
            self._unreadable.listed(path, children)
            return children
        except NoNodeError:
            if layout:
                raise LayoutMissingError(
                    f"{path} does not exist in ZooKeeper: storm.zookeeper.root is wrong or "
                    "ZooKeeper was wiped or partly restored; refusing to treat it as empty"
                ) from None
            return []

    def _layout_children(self, sub: str, watch: Watch = None) -> list[str]:
        return self._children(self.path(sub), watch, layout=True)

    def _topology_children(self, sub: str, watch: Watch = None) -> list[str]:
        """The topology ids under layout directory ``sub``. A child whose name is not a
        topology id (``name-counter-time``, as submit makes them) is no topology: it is
        logged once and left out, and left alone."""
        ids = []
        for child in self._layout_children(sub, watch):
            if is_topology_id(child):
                ids.append(child)
            else:
                self.note_not_topology_id(sub, child)
        return ids

    def note_not_topology_id(self, sub: str, child: str) -> None:
        """Log once that ``child`` of layout directory ``sub`` is no topology (its name
        is not ``name-counter-time``): it is left out, and left alone."""
        path = self.path(sub, child)
        self._unreadable.report(path, f"{path}: not a topology id (name-counter-time); "
                                      "ignored")

    def _get(self, path: str, watch: Watch = None) -> tuple[bytes, ZnodeStat] | None:
        try:
            return self.zk.retry(self.zk.get, path, watch=watch)
        except NoNodeError:
            return None

    def decode_record(self, cls: type[R], path: str, got: tuple[bytes, ZnodeStat]) -> R:
        """Decode a node's record; a RecordError (naming ``path``) is logged (see
        :class:`_UnreadableLog`), then raised."""
        try:
            record = cls.decode(got[0], source=path)
        except RecordError as exc:
            self._unreadable.report(path, str(exc))
            raise
        self._unreadable.readable(path)
        return record

    def read_with_stat(self, cls: type[R], path: str) -> tuple[R | None, ZnodeStat] | None:
        """The record at ``path`` with its node's stat (its ``mtime`` is the ZooKeeper
        server's clock: what worker liveness is judged by, nimbus/state/worker_state.py);
        None if there is no node, and (None, stat) if it holds nothing this release can
        read (logged once, as :meth:`decode_record` does)."""
        got = self._get(path)
        if got is None:
            return None
        try:
            return self.decode_record(cls, path, got), got[1]
        except RecordError:
            return None, got[1]

    def forget_unreadable(self) -> None:
        """Forget which unreadable nodes were logged: each is logged again when next
        read (the fuzz campaign starts every case like this)."""
        self._unreadable.clear()

    def _subtree(self, path: str) -> list[str]:
        """Every node under ``path`` and ``path`` itself, children before parents."""
        out: list[str] = []
        for child in self._children(path):
            out.extend(self._subtree(posixpath.join(path, child)))
        if self.zk.retry(self.zk.exists, path) is not None:
            out.append(path)
        return out

    def _commit(self, fence: Fence, build: Callable[[Any], None]) -> list[Any]:
        """Run ``build(txn)`` inside a multi-op that first checks the leader's lock node."""
        txn = self.zk.transaction()
        txn.check(fence.lock_path, 0)
        build(txn)
        if self.audit_writer:  # last: the caller's results keep their positions
            leader_audit.add_audit(txn, self.root, fence.lock_path, self.audit_writer)
        results = txn.commit()
        if isinstance(results[0], Exception) and not isinstance(results[0], RolledBackError):
            raise NotLeaderError(
                f"refused: this nimbus no longer holds the leader lock ({fence.lock_path})"
            )
        for res in results[1:]:
            if isinstance(res, Exception) and not isinstance(res, RolledBackError):
                raise ConcurrentChangeError(f"cluster state changed concurrently: {res!r}")
        return results[1:-1] if self.audit_writer else results[1:]

    def supervisor_index_path(self, supervisor_id: str) -> str:
        return self.path("supervisor-assignments", supervisor_id)

    def write_supervisor_index(self, fence: Fence, changes: dict[str, list[str] | None],
                               existing: set[str]) -> None:
        """Set each supervisor's index (fenced, one transaction): ``None`` deletes its
        node; a supervisor not in ``existing`` has its node created.
        ConcurrentChangeError if a node was not as ``existing`` says."""
        def build(txn: Any) -> None:
            for supervisor_id, topologies in sorted(changes.items()):
                path = self.supervisor_index_path(supervisor_id)
                if topologies is None:
                    txn.delete(path)
                elif supervisor_id in existing:
                    txn.set_data(path, SupervisorAssignments(topologies).encode())
                else:
                    txn.create(path, SupervisorAssignments(topologies).encode())

        if changes:
            self._commit(fence, build)

    def check_leader(self, fence: Fence) -> None:
        """Raise NotLeaderError unless the fence's lock node still exists (one round trip;
        what a leader checks before an action outside ZooKeeper)."""
        self._commit(fence, lambda txn: None)

    def delete_nodes(self, fence: Fence, paths: list[str]) -> int:
        """Delete leaf nodes, fenced; one already gone is skipped. Returns how many this
        call deleted. NotLeaderError if the fence no longer holds."""
        if not paths:
            return 0
        try:
            self._commit(fence, lambda txn: [txn.delete(p) for p in paths])
            return len(paths)
        except ConcurrentChangeError:
            pass  # one of them went (or grew a child) meanwhile: one at a time
        deleted = 0
        for path in paths:
            try:
                self._commit(fence, lambda txn, p=path: txn.delete(p))
                deleted += 1
            except ConcurrentChangeError:
                continue
        return deleted

    # -- topologies --------------------------------------------------------------------
    def active_storms(self, watch: Watch = None) -> list[str]:
        """Ids of every topology under /storms (ACTIVE, INACTIVE or KILLED)."""
        return self._topology_children("storms", watch)

    def storm_base(self, topology_id: str, watch: Watch = None) -> StormBase | None:
        """The topology's StormBase; None if it has none. RecordError if unreadable."""
        path = self.storm_path(topology_id)
        got = self._get(path, watch)
        return self.decode_record(StormBase, path, got) if got else None

    def storm_base_versioned(self, topology_id: str) -> tuple[StormBase, int] | None:
        path = self.storm_path(topology_id)
        got = self._get(path)
        return (self.decode_record(StormBase, path, got), got[1].version) if got else None

    def find_storm_by_name(self, name: str) -> tuple[str, StormBase] | None:
        """The live topology named ``name``; one whose StormBase is unreadable has no
        name this release can see (it is logged, and skipped)."""
        for topology_id in self.active_storms():
            try:
                base = self.storm_base(topology_id)
            except RecordError:
                continue
            if base is not None and base.storm_name == name:
                return topology_id, base
        return None

    def activate_storm(self, fence: Fence, topology_id: str, base: StormBase,
                       assignment: Assignment) -> None:
        """Make a submitted topology exist, atomically: all of its nodes or none."""

        def build(txn: Any) -> None:
            txn.create(self.storm_path(topology_id), base.encode())
            txn.create(self.path("assignments", topology_id), assignment.encode())
            txn.create(self.path("workerbeats", topology_id), b"")
            txn.create(self.path("errors", topology_id), b"")

        self._commit(fence, build)

    def update_storm(self, fence: Fence, topology_id: str, base: StormBase,
                     expected_version: int) -> None:
        """Replace a StormBase if nobody changed it since ``expected_version`` was read."""
        self._commit(fence, lambda txn: txn.set_data(
            self.storm_path(topology_id), base.encode(), expected_version))

    def remove_storm(self, fence: Fence, topology_id: str) -> None:
        """Delete every node of a topology (storm, assignment, beats, errors, code).

        Replicas and heartbeats may appear while the subtree is being read; the delete is
        then re-read and retried a few times before ConcurrentChangeError is raised.
        """
        for attempt in range(5):
            doomed: list[str] = []
            for sub in ("code-distributor", "errors", "workerbeats", "placements",
                        "code-versions", "assignments", "storms"):
                doomed.extend(self._subtree(self.path(sub, topology_id)))
            for key in self.version_code_keys(topology_id):  # its versions' code
                doomed[:0] = self._subtree(self.code_path(key))
            if not doomed:
                return
            try:
                self._commit(fence, lambda txn, d=doomed: [txn.delete(p) for p in d])
                return
            except ConcurrentChangeError:
                if attempt == 4:
                    raise

    # -- code versions (nimbus.state.code_versions) ------------------------------------
    def code_versions_path(self, topology_id: str) -> str:
        return self.path("code-versions", topology_id)

    def code_versions(self, topology_id: str) -> tuple[CodeVersions, int] | None:
        """(CodeVersions, data version) of a topology; None if it was never upgraded.
        RecordError if unreadable."""
        path = self.code_versions_path(topology_id)
        got = self._get(path)
        if not got:
            return None
        return self.decode_record(CodeVersions, path, got), got[1].version

    def version_code_keys(self, topology_id: str) -> list[str]:
        """Code keys of versions 2 and later of ``topology_id`` that have a code node
        (whether or not /code-versions lists them: an upload in flight, say)."""
        return [key for key in self.code_topologies()
                if is_version_key(key) and topology_of(key) == topology_id]

    def write_switch(self, fence: Fence, topology_id: str, versions: CodeVersions,
                     versions_version: int | None, assignment: Assignment | None = None,
                     assignment_version: int | None = None) -> None:
        """Write a topology's CodeVersions (creating the node when ``versions_version``
        is None) and, in the same transaction, its Assignment if given (replacing version
        ``assignment_version`` of it). ConcurrentChangeError, with nothing written, if
        either node was not as the caller read it."""
        def build(txn: Any) -> None:
            path = self.code_versions_path(topology_id)
            if versions_version is None:
                txn.create(path, versions.encode())
            else:
                txn.set_data(path, versions.encode(), versions_version)
            if assignment is not None:
                txn.set_data(self.path("assignments", topology_id), assignment.encode(),
                             -1 if assignment_version is None else assignment_version)

        self._commit(fence, build)

    # -- assignments -------------------------------------------------------------------
    def assignments(self, watch: Watch = None) -> list[str]:
        return self._topology_children("assignments", watch)

    def assignment_info(self, topology_id: str, watch: Watch = None) -> Assignment | None:
        """The topology's Assignment; None if it has none. RecordError if unreadable."""
        path = self.path("assignments", topology_id)
        got = self._get(path, watch)
        return self.decode_record(Assignment, path, got) if got else None

    def set_assignment(self, fence: Fence, topology_id: str, assignment: Assignment,
                       placements: PlacementHistory | None = None,
                       placements_version: int | None = None) -> None:
        """Write the topology's Assignment and, in the same transaction, its
        ``placements`` if given: replacing version ``placements_version`` of its node, or
        creating the node when that is None. ConcurrentChangeError (nothing written) if
        that node was not as the caller read it."""
        def build(txn: Any) -> None:
            txn.set_data(self.path("assignments", topology_id), assignment.encode())
            if placements is None:
                return
            path = self.placements_path(topology_id)
            if placements_version is None:
                txn.create(path, placements.encode())
            else:
                txn.set_data(path, placements.encode(), placements_version)

        self._commit(fence, build)

    # -- placement history -------------------------------------------------------------
    def placements_path(self, topology_id: str) -> str:
        return self.path("placements", topology_id)

    def placement_history(self, topology_id: str) -> tuple[PlacementHistory | None,
                                                           int | None]:
        """(the topology's PlacementHistory, its node's version); (None, None) when it has
        no node (none recorded yet: a topology of an earlier release, or never placed).
        RecordError if the node holds something this release cannot read."""
        path = self.placements_path(topology_id)
        got = self._get(path)
        if got is None:
            return None, None
        return self.decode_record(PlacementHistory, path, got), got[1].version

    # -- supervisors and workers (written by those daemons, read by nimbus) -------------
    def supervisors(self, watch: Watch = None) -> list[str]:
        return self._layout_children("supervisors", watch)

    def supervisor_info(self, supervisor_id: str) -> SupervisorInfo | None:
        """A supervisor's heartbeat; None if it has none, or none this release can read
        (a newer release's, or damaged: logged once), so it counts as not alive."""
        path = self.path("supervisors", supervisor_id)
        got = self._get(path)
        if not got:
            return None
        try:
            return self.decode_record(SupervisorInfo, path, got)
        except RecordError:
            return None

    def supervisor_heartbeat(self, supervisor_id: str, info: SupervisorInfo) -> None:
        path = self.path("supervisors", supervisor_id)
        try:
            self.zk.set(path, info.encode())
        except NoNodeError:
            self.zk.create(path, info.encode(), ephemeral=True)

    def heartbeat_storms(self) -> list[str]:
        return self._topology_children("workerbeats")

    def worker_heartbeat(self, topology_id: str, node: str, port: int, info: bytes) -> None:
        path = self.path("workerbeats", topology_id, f"{node}-{port}")
        try:
            self.zk.set(path, info)
        except NoNodeError:
            self.zk.create(path, info, makepath=False)

    def get_worker_heartbeat(self, topology_id: str, node: str, port: int) -> bytes | None:
        got = self._get(self.path("workerbeats", topology_id, f"{node}-{port}"))
        return got[0] if got else None

    def worker_beat(self, topology_id: str, node: str, port: int) -> WorkerBeat | None:
        """A worker's heartbeat record; None if it has none. RecordError if unreadable
        (the node exists: the worker beats, but its numbers cannot be read)."""
        path = self.path("workerbeats", topology_id, f"{node}-{port}")
        got = self._get(path)
        return self.decode_record(WorkerBeat, path, got) if got else None

    # -- errors ------------------------------------------------------------------------
    def error_topologies(self) -> list[str]:
        return self._topology_children("errors")

    def report_error(self, topology_id: str, component_id: str, error: ErrorInfo) -> bool:
        """Append an error for a component, keeping only the newest ten.

        Raises InvalidComponentError (a ValueError) for a component id that is not one
        (:mod:`nimbus.state.component_ids`) and ValueError for a topology id that is not
        one path part, writing nothing.

        Returns False, writing nothing, when ``/errors/<topology-id>`` is gone: the
        topology was removed (its directory is made at submit and deleted at removal), and
        a late report from one of its workers must not bring the node back, where nothing
        would ever delete it again. Returns True once the error is stored.
        """
        # Both parts come from a worker (a tenant's code): they must name one node each,
        # or an absolute "component" would aim the trim below at any node of the cluster.
        check_component_id(component_id)
        check_path_part(topology_id)
        topology_dir = self.path("errors", topology_id)
        base = posixpath.join(topology_dir, component_id)
        for _ in range(3):
            try:
                # Never makepath: only the component's node may be created, and only
                # below a topology directory that still exists.
                self.zk.retry(self.zk.create, base, b"")
            except NodeExistsError:
                pass
            except NoNodeError:
                return False  # the topology is gone
            try:
                self.zk.retry(self.zk.create, posixpath.join(base, "e"), error.encode(),
                              sequence=True)
                break
            except NoNodeError:
                # The component node went between the two creates: the topology is being
                # removed (then the next create finds no directory) or was just cleaned.
                continue
        else:
            return False
        for stale in self._children(base)[:-MAX_ERRORS_PER_COMPONENT]:
            try:
                self.zk.delete(posixpath.join(base, stale))
            except NoNodeError:
                pass
        return True

    def error_components(self, topology_id: str) -> list[str]:
        """Components of a topology that reported errors (sorted; none if it is gone)."""
        return self._children(self.path("errors", topology_id))

    def errors(self, topology_id: str, component_id: str) -> list[ErrorInfo]:
        """A component's kept errors, oldest first (by ZooKeeper sequence number).

        Errors are written by supervisors of any release: one this release cannot read is
        logged once and skipped rather than hiding the others.
        """
        base = self.path("errors", topology_id, component_id)
        out = []
        for child in self._children(base):
            path = posixpath.join(base, child)
            got = self._get(path)
            if got:
                try:
                    out.append(self.decode_record(ErrorInfo, path, got))
                except RecordError:
                    continue
        return out

    # -- code distribution -------------------------------------------------------------
    def code_topologies(self, watch: Watch = None) -> list[str]:
        return self._topology_children("code-distributor", watch)

    def code_meta(self, topology_id: str, watch: Watch = None) -> CodeMeta | None:
        """The published metafile, or None while the upload is still in progress.
        RecordError if the node holds something else."""
        path = self.code_path(topology_id)
        if watch is not None:
            # exists() leaves a watch even when the node is absent, so creation wakes us.
            self.zk.retry(self.zk.exists, path, watch=watch)
        got = self._get(path, watch)
        if not got or not got[0]:
            return None
        return self.decode_record(CodeMeta, path, got)

    def begin_code(self, fence: Fence, topology_id: str) -> None:
        """Create a topology's code node (no metafile yet) so replicas can register."""
        self._commit(fence, lambda txn: txn.create(self.code_path(topology_id), b""))

    def publish_code(self, fence: Fence, topology_id: str, meta: CodeMeta) -> None:
        """Publish a topology's metafile so that other nimbuses start replicating it."""
        self._commit(fence, lambda txn: txn.set_data(self.code_path(topology_id), meta.encode()))

    def remove_code(self, fence: Fence, topology_id: str) -> None:
        doomed = self._subtree(self.code_path(topology_id))
        if doomed:
            self._commit(fence, lambda txn: [txn.delete(p) for p in doomed])

    def replica_hosts(self, topology_id: str, watch: Watch = None) -> list[str]:
        return self._children(self.code_path(topology_id), watch)

    def register_replica(self, topology_id: str, host: str, endpoint: str = "") -> bool:
        """Announce (ephemerally) that ``host`` holds a complete copy of the code.

        ``endpoint`` is where peers fetch it (defaults to ``host``). Returns False,
        registering nothing, when the topology's code node is gone: a late registration
        must never bring back a topology that was removed.
        """
        path = posixpath.join(self.code_path(topology_id), host)
        data = (endpoint or host).encode()
        try:
            self.zk.create(path, data, ephemeral=True)
        except NoNodeError:
            return False
        except NodeExistsError:
            # Possibly left by our own previous session until it expires: make it ours.
            try:
                self.zk.delete(path)
                self.zk.create(path, data, ephemeral=True)
            except (NoNodeError, NodeExistsError):
                return self.zk.exists(path) is not None
        return True

    def replica_endpoints(self, topology_id: str) -> dict[str, str]:
        """host -> fetch endpoint of every registered replica."""
        out = {}
        for host in self.replica_hosts(topology_id):
            got = self._get(posixpath.join(self.code_path(topology_id), host))
            if got:
                out[host] = got[0].decode("utf-8", "replace") or host
        return out

    def unregister_replica(self, topology_id: str, host: str) -> None:
        try:
            self.zk.delete(posixpath.join(self.code_path(topology_id), host))
        except (NoNodeError, NotEmptyError):
            pass

    # -- nimbuses ------------------------------------------------------------------------
    def register_nimbus(self, info: NimbusInfo) -> None:
        path = self.path("nimbuses", f"{info.host}:{info.port}")
        try:
            self.zk.create(path, info.encode(), ephemeral=True)
        except NodeExistsError:
            self.zk.delete(path)
            self.zk.create(path, info.encode(), ephemeral=True)

    def nimbuses(self, watch: Watch = None) -> list[NimbusInfo]:
        """Every registered nimbus; a registration this release cannot read is logged
        once and left out."""
        out = []
        for child in self._layout_children("nimbuses", watch):
            path = self.path("nimbuses", child)
            got = self._get(path)
            if got:
                try:
                    out.append(self.decode_record(NimbusInfo, path, got))
                except RecordError:
                    continue
        return out

    def leader_lock_nodes(self, watch: Watch = None) -> list[str]:
        """Names of the nodes queued under the leader lock (unsorted). A node whose name
        no nimbus makes (no ``-<sequence>`` at its end) is logged once and left out."""
        nodes = []
        for node in self._layout_children("leader-lock", watch):
            if lock_sequence(node) is None:
                self._unreadable.report(
                    posixpath.join(self.leader_lock_path, node),
                    f"{posixpath.join(self.leader_lock_path, node)}: not a leader lock node "
                    "(nimbus-<id>-<sequence>); not counted in the queue")
                continue
            nodes.append(node)
        return nodes

    # -- early removal of a dead leader's lock node -------------------------------------
    #: What the leader-lock directory's data holds after a dead process's lock nodes were
    #: removed before its session expired (nimbus.state.incarnation), until the next
    #: leader has read it: that leader cannot rely on the predecessor's last write
    #: being a session timeout old (nimbus.master.scheduler, the takeover hold).
    REMOVED_EARLY = b"removed-before-session-expiry"

    def remove_dead_lock_nodes(self, nodes: dict[str, int]) -> None:
        """Delete lock nodes (name -> version) of a process known to be dead, and mark
        the removal for the next leader, in one transaction."""
        txn = self.zk.transaction()
        for name, version in nodes.items():
            txn.delete(posixpath.join(self.leader_lock_path, name), version=version)
        txn.set_data(self.leader_lock_path, self.REMOVED_EARLY)
        results = txn.commit()
        failed = [r for r in results if isinstance(r, Exception)
                  and not isinstance(r, RolledBackError)]
        if failed:
            raise failed[0]   # nothing was removed (a node gone or changed meanwhile)

    def lock_nodes_removed_early(self) -> bool:
        """Whether lock nodes were removed early (see :meth:`remove_dead_lock_nodes`)
        since a leader last cleared the mark."""
        data, _stat = self.zk.get(self.leader_lock_path)
        return data == self.REMOVED_EARLY

    def clear_removed_early(self, fence: Fence) -> None:
        """The leader has taken the early removal into account (a fenced write: a
        deposed leader must not clear a mark meant for its successor)."""
        self._commit(fence, lambda txn: txn.set_data(self.leader_lock_path, b""))

    def leader_queue(self, watch: Watch = None) -> list[tuple[str, str]]:
        """(lock node name, host:port) of every queued nimbus, the leader first."""
        out = []
        nodes = self.leader_lock_nodes(watch)
        for node in sorted(nodes, key=lambda n: (lock_sequence(n), n)):
            path = posixpath.join(self.leader_lock_path, node)
            got = self._get(path)
            if got:
                address = got[0].decode("utf-8", "replace")
                host, sep, port = address.rpartition(":")
                if not (sep and host and port.isascii() and port.isdigit()):
                    # Still queued (its place counts), but no nimbus wrote this.
                    self._unreadable.report(path, f"{path}: holds {got[0][:40]!r}, not host:port")
                out.append((node, address))
        return out
