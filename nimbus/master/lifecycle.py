"""Topology lifecycle on the leader: submit, kill, (de)activate, rebalance, and the duties.

Submission is atomic. The code is staged on disk and distributed first; the topology
then comes into existence in one fenced multi-op (storms, assignments, workerbeats and
errors nodes together). A leader that dies before that op leaves no topology, only a
code node without a storm, which the next leader's duties remove. Every write here is
fenced by the leader lock (see ``cluster_state``), so a deposed leader changes nothing.

The code of a topology is kept, distributed and replicated by *code key*: version 1 (the
submitted code) under the topology id, a later version under ``<id>.v<N>``
(:mod:`nimbus.state.code_versions`, written by :mod:`nimbus.master.upgrades`, which uses
the staging, upload and replication wait here for a version as submit does for a
topology).
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from kazoo.exceptions import KazooException
from kazoo.protocol.states import KazooState

from nimbus.config import SUBMISSION_TOKEN_KEY, Config, ConfigError
from nimbus.distribution.archive import bundle_kind
from nimbus.distribution.distributors import CodeDistributor
from nimbus.distribution.local_code import LocalCodeStore, atomic_dir, sha256_file
from nimbus.master import rebalancing
from nimbus.master.elector import LeaderElector, NoLeaderError
from nimbus.state.cluster_state import ConcurrentChangeError, Fence, StormClusterState
from nimbus.state.cluster_view import ClusterView
from nimbus.state.code_versions import CodeVersions, is_version_key, topology_of
from nimbus.state.records import (
    ACTIVE,
    INACTIVE,
    KILLED,
    Assignment,
    CodeMeta,
    RecordError,
    StormBase,
)
from nimbus.topology_paths import relative_path_keys

log = logging.getLogger(__name__)

BUNDLE_FILE = "stormjar.jar"   # Storm's names for a topology's files
CONF_FILE = "stormconf.json"
TOPOLOGY_FILE = "stormcode.ser"
# Storm refuses these characters in topology names; we also refuse a leading dot.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_ -]{0,127}$")
# A topology's replication wait, and the cluster's ceiling on it (which -1 asks for).
REPLICATION_WAIT_KEY = "topology.max.replication.wait.time.sec"
REPLICATION_WAIT_CEILING_KEY = "nimbus.max.replication.wait.time.sec"


class TopologyNotFoundError(LookupError):
    """No live topology has that name (Storm's NotAliveException)."""


class TopologyExistsError(ValueError):
    """A live topology already has that name (Storm's AlreadyAliveException)."""


class InvalidTopologyError(ValueError):
    """A submission is malformed (Storm's InvalidTopologyException)."""


class SubmissionAbandonedError(RuntimeError):
    """The client of a submission hung up while it waited for replication; the
    submission was undone (nobody is left to tell whether it succeeded)."""


def _never() -> bool:
    return False


def check_topology_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise InvalidTopologyError(
            f"invalid topology name {name!r}: start with a letter or digit, then letters, "
            "digits, '_', '-' or space (at most 128; no '/', '.', ':' or '\\')")
    return name


class TopologyLifecycle:
    """The leader's actions on topologies; each checks leadership and is fenced."""

    def __init__(self, conf: Config, state: StormClusterState, store: LocalCodeStore,
                 distributor: CodeDistributor, elector: LeaderElector, address: str,
                 code_lost: Callable[[], frozenset[str]] = frozenset,
                 view: ClusterView | None = None, clock: Callable[[], float] = time.time):
        """``view``: where names and due kills are looked up (every action that does so
        needs one). ``clock``: epoch seconds, for rebalance deadlines (tests pass a
        fake)."""
        self.conf = conf
        self.clock = clock
        # Called after a rebalance deadline was set (the duty cycle's wake-up, so that it
        # runs when the deadline passes): see add_timer_listener.
        self._timer_listeners: list[Callable[[], None]] = []
        self._view = view
        # Live topologies whose code is lost everywhere (CodeSync.lost_topologies): a
        # leader that leads without them accepts no submissions (STORM-3664).
        self._code_lost = code_lost
        self.state = state
        self.store = store
        self.distributor = distributor
        self.elector = elector
        self.address = address
        self._pending: dict[str, tuple[str, str]] = {}  # id -> (name, token), in flight
        self._pending_lock = threading.Condition()
        self._replication_changed = threading.Condition()
        # Code keys of other uploads in flight (the versions nimbus.master.upgrades is
        # uploading): see add_pending_source.
        self._pending_sources: list[Callable[[], set[str]]] = []
        # The upgrades of these topologies (nimbus.master.upgrades.Upgrades), which set
        # this when they are built on this lifecycle: where the Thrift handler finds them.
        self.upgrades: Any = None

    # -- helpers --------------------------------------------------------------------------
    def pending_ids(self) -> set[str]:
        """The code keys of every upload in flight on this leader: submissions (their
        topology ids) and the versions of upgrades (``<id>.v<N>``). Their code exists
        before anything in ZooKeeper lists it, so the sync, the sweeper and the orphan
        removal leave it alone."""
        with self._pending_lock:
            pending = set(self._pending)
        for source in self._pending_sources:
            pending |= source()
        return pending

    def add_pending_source(self, source: Callable[[], set[str]]) -> None:
        """Count ``source()`` (code keys) among the uploads in flight (:meth:`pending_ids`)."""
        self._pending_sources.append(source)

    def _named(self, name: str) -> tuple[str, StormBase] | None:
        """The live topology named ``name``, from the view after a barrier: every
        topology created before the call is seen, in a constant number of round trips."""
        if self._view is None:
            raise RuntimeError("TopologyLifecycle needs a ClusterView to look up names")
        self._view.barrier(directories=("storms",))
        return self._view.find_storm_by_name(name)

    def find(self, name: str) -> tuple[str, StormBase]:
        found = self._named(name)
        if found is None:
            raise TopologyNotFoundError(f"no live topology named {name!r}")
        return found

    def topology_setting(self, topo_conf: dict[str, Any], key: str) -> Any:
        """The integer ``key`` of a topology's conf, or the cluster's value when it sets
        none; InvalidTopologyError when it is no integer."""
        value = topo_conf.get(key, self.conf[key])
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidTopologyError(f"topology conf: {key!r} must be an integer")
        return value

    def parse_topology_conf(self, json_conf: str) -> dict[str, Any]:
        """A submitted topology conf (JSON), checked as submit checks it: a JSON object
        whose known keys have the types of their defaults and whose path keys are
        absolute. InvalidTopologyError otherwise."""
        try:
            topo_conf = json.loads(json_conf or "{}")
        except json.JSONDecodeError as exc:
            raise InvalidTopologyError(f"topology conf is not JSON: {exc}") from None
        if not isinstance(topo_conf, dict):
            raise InvalidTopologyError("topology conf must be a JSON object")
        try:
            # The same checks as storm.yaml's: a known key's value must fit it.
            self.conf.check_layer(topo_conf, "topology conf")
        except ConfigError as exc:
            raise InvalidTopologyError(str(exc)) from None
        relative = relative_path_keys(topo_conf)
        if relative:
            raise InvalidTopologyError(
                f"topology conf: {', '.join(map(repr, relative))} must be an absolute path "
                "or a URI: a worker runs in its own directory on a supervisor host, so a "
                "relative path would name a place there (nimbus-ha submit resolves it "
                "against the directory it runs in)")
        return topo_conf

    def check_bundle(self, bundle: Path) -> str:
        """The kind of ``bundle`` (pipeline or process); InvalidTopologyError for one no
        worker can run, or one larger than nimbus.max.topology.bytes."""
        try:
            return bundle_kind(bundle, self.conf["nimbus.max.topology.bytes"])
        except ValueError as exc:
            raise InvalidTopologyError(str(exc)) from None

    # -- the code of a code key (a topology's version 1, or a later version) --------------
    def stage_code(self, code_key: str, bundle: Path, topo_conf: dict[str, Any],
                   topology_bytes: bytes) -> None:
        """Put the code of ``code_key`` in this leader's store, atomically."""
        with atomic_dir(self.store.path(code_key)) as staging:
            shutil.copyfile(bundle, staging / BUNDLE_FILE)
            (staging / CONF_FILE).write_text(json.dumps(topo_conf, sort_keys=True))
            (staging / TOPOLOGY_FILE).write_bytes(topology_bytes)

    def distribute_code(self, fence: Fence, code_key: str, now: int) -> None:
        """Create the code node of ``code_key``, upload its staged code through the
        distributor and publish the metafile, so that the other nimbuses replicate it."""
        self.state.begin_code(fence, code_key)
        metafile = self.distributor.upload(self.store.path(code_key), code_key)
        self.state.publish_code(fence, code_key, CodeMeta(
            distributor=self.distributor.name, metafile_b64=CodeMeta.pack(
                metafile.read_bytes()), uploaded_by=self.address, created_secs=now))

    def code_sha256(self, code_key: str) -> dict[str, str]:
        """file name -> sha256 of the staged code of ``code_key`` (what an Assignment
        gives supervisors to verify)."""
        code_dir = self.store.path(code_key)
        return {f: sha256_file(code_dir / f) for f in (BUNDLE_FILE, CONF_FILE, TOPOLOGY_FILE)}

    def discard_code(self, code_key: str) -> None:
        """Remove the code of ``code_key`` everywhere this leader can: its code node
        (fenced; the other nimbuses then drop their copies), the shared store's objects
        (only after that write succeeded), this host's distributor copy and store copy.
        A failure leaves a leak for the duties or the sweeper, never a loss."""
        if self.elector.is_leader():
            try:
                self.state.remove_code(self.elector.fence(), code_key)
                self._delete_shared(code_key)
            except Exception as exc:
                # Left to the next leader's duties (remove_orphan_code), fenced as here.
                log.warning("removing code node of %s failed: %s", code_key, exc)
        try:
            self.distributor.cleanup(code_key)
        except Exception as exc:
            log.warning("cleanup of %s failed: %s", code_key, exc)
        self.store.remove(code_key)

    # -- submit ---------------------------------------------------------------------------
    def submit(self, name: str, bundle: Path, json_conf: str, topology_bytes: bytes = b"",
               initial_status: str = ACTIVE,
               client_gone: Callable[[], bool] | None = None) -> str:
        """Distribute a bundle, wait for replication, then create the topology atomically.

        ``client_gone()`` is asked while the replication wait lasts: once it is true the
        submission is undone and SubmissionAbandonedError raised.
        """
        fence = self.elector.fence()
        check_topology_name(name)
        self.refuse_degraded("submissions")
        topo_conf = self.parse_topology_conf(json_conf)
        min_replicas = self.topology_setting(topo_conf, "topology.min.replication.count")
        max_wait = self.replication_wait(topo_conf)
        num_workers = self.topology_setting(topo_conf, "topology.workers")
        # Before anything is written: a bundle no worker can run (a plain Storm jar)
        # must leave no code directory and no znode behind.
        kind = self.check_bundle(bundle)

        token = str(topo_conf.get(SUBMISSION_TOKEN_KEY) or "")
        now = int(time.time())
        # Storm's form name-counter-time; the counter is random so that ids made by
        # different leaders (each counting from 1) cannot collide.
        topology_id = f"{name.replace(' ', '_')}-{secrets.randbelow(10**9)}-{now}"
        existing = self._claim_name(name, token, topology_id)
        if existing is not None:
            log.info("submission %s of %s is a retry: it created %s", token, name, existing)
            return existing
        try:
            self.stage_code(topology_id, bundle, topo_conf, topology_bytes)
            self.distribute_code(fence, topology_id, now)
            replicas = self.wait_for_replication(fence, topology_id, min_replicas, max_wait,
                                                 client_gone or _never)
            if replicas < min_replicas:
                log.warning("%s: %d of %d replicas after %ss; activating anyway",
                            topology_id, replicas, min_replicas, max_wait)
            base = StormBase(storm_name=name, launch_time_secs=now, status=initial_status,
                             num_workers=num_workers, owner=str(topo_conf.get(
                                 "topology.submitter.user", "")), submission_token=token)
            code_dir = self.store.path(topology_id)
            self.state.activate_storm(
                fence, topology_id, base,
                Assignment(master_code_dir=str(code_dir.resolve()),
                           code_sha256=self.code_sha256(topology_id)))
            log.info("submitted %s as %s (%s, %d replicas)", name, topology_id, kind,
                     replicas)
            return topology_id
        except BaseException:
            self._abandon(topology_id)
            raise
        finally:
            with self._pending_lock:
                self._pending.pop(topology_id, None)
                self._pending_lock.notify_all()

    def refuse_degraded(self, what: str) -> None:
        """InvalidTopologyError while this leader leads without some live topology's code
        (STORM-3664): it accepts no ``what`` (submissions, upgrades) until then."""
        lost = self._code_lost()
        if lost:
            raise InvalidTopologyError(
                f"this leader runs degraded and accepts no {what}: the code of "
                f"{len(lost)} live topologies is on no nimbus and in no store "
                f"[{','.join(sorted(lost))}]; restore a nimbus's storm.local.dir (or the "
                "store) that holds it, or kill them")

    @staticmethod
    def _alive(name: str) -> TopologyExistsError:
        return TopologyExistsError(
            f"topology {name!r} is already alive; to change its code keep it running and "
            f"use `nimbus-ha upgrade {name} PATH` (same topology id, same checkpoints)")

    def _claim_name(self, name: str, token: str, topology_id: str) -> str | None:
        """Reserve ``name`` for a new submission, or recognise a retry of an earlier one.

        Returns the id of the topology that a submission with the same ``token`` created
        (waiting while that one is still in flight), or None once ``name`` is reserved
        for ``topology_id``. Any other holder of the name is TopologyExistsError.
        """
        with self._pending_lock:
            while True:
                in_flight = [t for t, (n, _) in self._pending.items() if n == name]
                if in_flight:
                    if token and self._pending[in_flight[0]][1] == token:
                        # The same submission, still replicating: answer when it ends.
                        self._pending_lock.wait(1.0)
                        self.elector.fence()  # stop waiting once no longer leading
                        continue
                    raise self._alive(name)
                found = self._named(name)
                if found is not None:
                    if token and found[1].submission_token == token:
                        return found[0]
                    raise self._alive(name)
                self._pending[topology_id] = (name, token)
                return None

    def replication_wait(self, topo_conf: dict[str, Any]) -> int:
        """Seconds to wait for replicas: the topology's own wait, at most the cluster's
        ceiling, which -1 asks for. A wait that never ends would hold a Thrift thread,
        and the name, for as long as the leader lives."""
        ceiling = self.conf[REPLICATION_WAIT_CEILING_KEY]
        wanted = self.topology_setting(topo_conf, REPLICATION_WAIT_KEY)
        if wanted < -1:
            raise InvalidTopologyError(
                f"topology conf: {REPLICATION_WAIT_KEY!r} must be -1 (up to "
                f"{REPLICATION_WAIT_CEILING_KEY}) or 0 or more, got {wanted}")
        if wanted == -1 or wanted > ceiling:
            return ceiling
        return wanted

    def wait_for_replication(self, fence: Fence, code_key: str, wanted: int,
                             max_wait_s: int, client_gone: Callable[[], bool]) -> int:
        """Wait for ``wanted`` replicas of the code of ``code_key`` (a topology id or a
        version's key), woken by replica registrations; returns the count, which is
        below ``wanted`` once ``max_wait_s`` passed (the caller decides what then).

        A dropped ZooKeeper connection alone does not end the wait: the session may
        survive it, and the activation that follows is fenced anyway. Only a lock node
        that is really gone does, with NoLeaderError, which the Thrift handler turns into
        "not a leader, current leader is ...", so the client follows the redirect and
        retries there. A client that hangs up ends it too (SubmissionAbandonedError):
        it is checked at least every half second.
        """
        started = time.monotonic()
        deadline = started + max_wait_s
        while True:
            count = self.distributor.get_replication_count(code_key)
            if count >= wanted:
                return count
            if not self.elector.is_leader() and self._lock_gone(fence):
                raise NoLeaderError("lost leadership while waiting for replication")
            if client_gone():
                raise SubmissionAbandonedError(
                    f"{code_key}: its client hung up after {time.monotonic() - started:.0f}"
                    f"s of waiting for {wanted} replicas ({count} so far); upload undone")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return count
            with self._replication_changed:
                # Replica registrations notify; the timeout covers stores without watches
                # and bounds how late a client that hung up is noticed.
                self.state.replica_hosts(code_key, watch=self._notify_replication)
                self._replication_changed.wait(min(0.5, remaining))

    def _lock_gone(self, fence: Fence) -> bool:
        """True once ``fence``'s lock node is known to be gone (not merely unreachable)."""
        if self.state.zk.state != KazooState.CONNECTED:
            return False
        try:
            return self.state.zk.exists(fence.lock_path) is None
        except KazooException:
            return False

    def _notify_replication(self, _event: object) -> None:
        with self._replication_changed:
            self._replication_changed.notify_all()

    def _abandon(self, topology_id: str) -> None:
        """Undo a failed submission's code, unless the topology exists after all.

        The commit may have succeeded with its reply lost (ConnectionLoss): if the storm
        node exists, or that cannot be read, nothing is touched; the duty cycle removes
        code of submissions that really never completed.
        """
        try:
            exists = self.state.storm_base(topology_id) is not None
        except Exception as exc:
            log.warning("cannot tell whether %s was created (%s): leaving it to the duties",
                        topology_id, exc)
            return
        if exists:
            log.warning("%s was created although its submission reported an error",
                        topology_id)
            return
        self.discard_code(topology_id)

    def _delete_shared(self, topology_id: str) -> None:
        """Delete shared code of a topology whose removal from ZooKeeper just committed.

        Called only after a fenced write succeeded, so only a real leader's decision ever
        deletes shared code. A failure leaves objects behind (a leak, not a loss).
        """
        try:
            self.distributor.delete_shared(topology_id)
        except Exception as exc:
            log.warning("could not delete shared code of removed %s (%s); delete what "
                        "%s holds under %s by hand", topology_id, exc,
                        self.distributor.name, topology_id)

    # -- status changes ---------------------------------------------------------------------
    def _change(self, name: str, change: Any) -> None:
        fence = self.elector.fence()
        for _ in range(5):
            topology_id, _base = self.find(name)
            got = self.state.storm_base_versioned(topology_id)
            if got is None:
                raise TopologyNotFoundError(f"no live topology named {name!r}")
            base, version = got
            new = change(topology_id, base)
            if new is None:
                return
            try:
                self.state.update_storm(fence, topology_id, new, version)
                return
            except ConcurrentChangeError:
                continue
        raise ConcurrentChangeError(f"{name!r} kept changing; try again")

    def kill(self, name: str, wait_secs: int | None = None) -> None:
        """Mark a topology KILLED; its state and code go after ``wait_secs``."""
        wait = self.conf["topology.message.timeout.secs"] if wait_secs is None else wait_secs
        if wait < 0:
            raise InvalidTopologyError("kill wait must be >= 0 seconds")

        def change(_topology_id: str, base: StormBase) -> StormBase | None:
            if base.status == KILLED:
                return None
            # A rebalance under way ends here (Storm allows kill in REBALANCING).
            return rebalancing.cleared(replace(base, status=KILLED,
                                               kill_at_secs=int(time.time()) + wait))

        self._change(name, change)
        if wait == 0:
            try:
                self.remove_due_kills()
            except ConcurrentChangeError as exc:
                # KILLED is recorded; the duty cycle finishes the removal.
                log.info("removal of %s deferred to the next duty cycle: %s", name, exc)

    def _refuse_transition(self, name: str, base: StormBase, action: str) -> None:
        """InvalidTopologyError unless ``action`` may change ``base``: not while it is
        being killed, nor while it is REBALANCING (Storm's state machine allows only
        kill then)."""
        if base.status == KILLED:
            raise InvalidTopologyError(f"topology {name!r} is being killed")
        refused = rebalancing.refusal(name, base, action, self.clock())
        if refused:
            raise InvalidTopologyError(refused)

    def switch_under_way(self, topology_id: str) -> dict[str, Any]:
        """The switch of code version under way for ``topology_id`` (the ``switch`` of
        its /code-versions node: :mod:`nimbus.state.code_versions`), {} when none is.
        RecordError if that node holds something this release cannot read."""
        got = self.state.code_versions(topology_id)
        return dict(got[0].switch) if got is not None else {}

    def _refuse_during_switch(self, name: str, topology_id: str, action: str) -> None:
        """InvalidTopologyError while a switch of code version is under way (or cannot
        be known): its workers' versions are being changed slot by slot."""
        try:
            switch = self.switch_under_way(topology_id)
        except RecordError as exc:
            raise InvalidTopologyError(
                f"{action} of {name!r} refused: its code versions cannot be read "
                f"({exc})") from None
        if switch:
            raise InvalidTopologyError(
                f"topology {name!r} is switching from code version {switch.get('from')} "
                f"to {switch.get('to')} ({switch.get('kind')}, "
                f"{switch.get('strategy')}): {action} is refused until the switch ends; "
                f"wait for it (see `nimbus-ha history {name}`) or roll it back "
                f"(`nimbus-ha rollback {name}`); kill is allowed")

    def activate(self, name: str) -> None:
        def change(_topology_id: str, base: StormBase) -> StormBase | None:
            self._refuse_transition(name, base, "activate")
            return None if base.status == ACTIVE else replace(base, status=ACTIVE)

        self._change(name, change)

    def deactivate(self, name: str) -> None:
        """Mark a topology INACTIVE (the scheduler takes its workers off). Refused while
        a switch of code version is under way: with no worker left, nothing could judge
        the new version, which would then run untested and lose its automatic rollback
        (nimbus.master.version_switches); wait for the switch's end or roll it back."""
        def change(topology_id: str, base: StormBase) -> StormBase | None:
            self._refuse_transition(name, base, "deactivate")
            if base.status == INACTIVE:
                return None
            self._refuse_during_switch(name, topology_id, "deactivate")
            return replace(base, status=INACTIVE)

        self._change(name, change)

    def rebalance(self, name: str, wait_secs: int | None = None,
                  num_workers: int | None = None,
                  num_executors: dict[str, int] | None = None) -> None:
        """Change a topology's number of workers (Storm's ``rebalance -n N -w S``).

        Without a wait (None or 0) only StormBase.num_workers changes here (fenced, like
        the status changes); the scheduler's next pass grows or shrinks the assignment
        to it. With a wait of S seconds the topology goes REBALANCING (deactivated: its
        workers stop) and the leader's duty cycle applies the count and restores the
        status once S seconds have passed (:mod:`nimbus.master.rebalancing`).
        ``num_executors`` (per-component parallelism) has no meaning for pipeline or
        process topologies and is refused. Raises InvalidTopologyError for a bad value
        or a KILLED or REBALANCING topology and TopologyNotFoundError for an unknown name.
        """
        if num_executors:
            raise InvalidTopologyError(
                "rebalance: num_executors is not supported (a worker runs whole components);"
                " change num_workers instead")
        if wait_secs is not None and wait_secs < 0:
            raise InvalidTopologyError(f"rebalance wait must be >= 0 seconds, not {wait_secs}")
        if num_workers is None:
            raise InvalidTopologyError("rebalance: give num_workers (the only option "
                                       "nimbus-ha supports)")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) \
                or num_workers < 1:
            raise InvalidTopologyError(
                f"rebalance: num_workers must be an integer >= 1, not {num_workers!r}")

        wait = wait_secs or 0

        def change(topology_id: str, base: StormBase) -> StormBase | None:
            self._refuse_transition(name, base, "rebalance")
            self._refuse_during_switch(name, topology_id, "rebalance")
            return rebalancing.begin(base, num_workers, wait, self.clock())

        self._change(name, change)
        if wait:
            log.info("rebalancing %s to %d workers after %ds (REBALANCING until then)",
                     name, num_workers, wait)
            for listener in list(self._timer_listeners):
                listener()
        else:
            log.info("rebalanced %s to %d workers", name, num_workers)

    def add_timer_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after each rebalance that set a deadline (the duty
        cycle's wake-up: it then computes its next wait with that deadline)."""
        self._timer_listeners.append(listener)

    # -- duties (called periodically on the leader) ---------------------------------------
    def remove_due_kills(self) -> None:
        """Remove every KILLED topology whose wait has passed."""
        fence = self.elector.fence()
        now = time.time()
        if self._view is None:
            raise RuntimeError("TopologyLifecycle needs a ClusterView for its duties")
        # From memory: unreadable ones are left out (logged by the state), not killed.
        for topology_id, base in self._view.storms_in(KILLED).items():
            if base.kill_at_secs <= now:
                log.info("removing killed topology %s (%s)", base.storm_name, topology_id)
                # Its versions' code goes with it (remove_storm deletes their nodes).
                keys = [topology_id, *self.state.version_code_keys(topology_id)]
                self.state.remove_storm(fence, topology_id)
                for code_key in keys:
                    self._delete_shared(code_key)

    def complete_due_rebalances(self) -> int:
        """Complete every rebalance whose deadline has passed, whichever leader set it;
        returns how many were completed. Each is a fenced write that checks the version
        read, so a kill (or anything else) that came first wins; what was not
        completed is tried again by the next cycle."""
        fence = self.elector.fence()
        if self._view is None:
            raise RuntimeError("TopologyLifecycle needs a ClusterView for its duties")
        now = self.clock()
        done = 0
        for topology_id, base in self._view.storms_in(rebalancing.REBALANCING).items():
            if not rebalancing.is_due(base, now):
                continue
            got = self.state.storm_base_versioned(topology_id)  # the view may lag
            if got is None or not rebalancing.is_due(got[0], now):
                continue
            finished = rebalancing.finish(got[0])
            try:
                self.state.update_storm(fence, topology_id, finished, got[1])
            except ConcurrentChangeError:
                log.info("completing the rebalance of %s deferred: it changed meanwhile",
                         topology_id)
                continue
            done += 1
            log.info("rebalance of %s (%s) completed: %d workers, %s", got[0].storm_name,
                     topology_id, finished.num_workers, finished.status)
        return done

    def next_rebalance_s(self) -> float | None:
        """Seconds until the earliest rebalance deadline still to come (None: none),
        from the view's memory; None too while the view cannot answer."""
        if self._view is None:
            return None
        try:
            rebalances = self._view.storms_in(rebalancing.REBALANCING)
        except Exception:  # not loaded yet, say: the duty cycle's period applies
            return None
        return rebalancing.seconds_until_next(rebalances.values(), self.clock())

    def remove_orphan_code(self) -> None:
        """Remove code nodes of submissions that never completed (their leader died), and
        of versions that no topology keeps: the topology is gone, or its /code-versions
        node does not list the version (an upgrade whose leader died before it listed
        it, or a pruning that did not finish). Nothing in flight on this leader is
        touched, nor the versions of a topology whose /code-versions cannot be read."""
        fence = self.elector.fence()
        # Read in this order so that a submission or an upgrade finishing meanwhile is
        # seen as pending, or as a storm or a listed version, never as neither. From the
        # view, each read after a barrier (as current as a listing: every change made
        # before the barrier is in), so a duty run does not list 10,000 names twice.
        codes = self._current_ids("code-distributor")
        pending = self.pending_ids()
        storms = set(self._current_ids("storms"))
        listed: dict[str, frozenset[str] | None] = {}
        # Set operations first: only the keys of no live topology are looked at one by
        # one (a version key, <id>.v<N>, is never a topology id).
        for code_key in sorted(set(codes) - storms - pending):
            if is_version_key(code_key):
                topology_id = topology_of(code_key)
                if topology_id in storms:
                    if topology_id not in listed:
                        listed[topology_id] = self._listed_versions(topology_id)
                    keys = listed[topology_id]
                    if keys is None or code_key in keys:
                        continue
                    why = f"a version /code-versions/{topology_id} does not list"
                else:
                    why = "a version of a topology that is gone"
            else:
                why = "a submission that never completed"
            log.info("removing code of %s: %s", code_key, why)
            self.state.remove_code(fence, code_key)
            self._delete_shared(code_key)

    def _current_ids(self, directory: str) -> list[str]:
        """The topology ids (code keys) under ``directory``, from the view after a
        barrier; listed from ZooKeeper when the leader has no view."""
        if self._view is None:
            getter = (self.state.code_topologies if directory == "code-distributor"
                      else self.state.active_storms)
            return getter()
        self._view.barrier(directories=(directory,))
        return (self._view.code_topologies() if directory == "code-distributor"
                else self._view.active_storms())

    def _listed_versions(self, topology_id: str) -> frozenset[str] | None:
        """The code keys /code-versions lists for ``topology_id`` (none without the
        node), or None when it cannot be read (then nothing of it counts as orphaned)."""
        try:
            got = self.state.code_versions(topology_id)
        except RecordError:
            return None
        versions = got[0] if got is not None else CodeVersions()
        return frozenset(versions.keys(topology_id))
