"""Upgrades on the leader: new code versions of a running topology, the switch of its
workers from one version to another, the automatic rollback, and the pruning.

What is stored (:mod:`nimbus.state.code_versions`): version 1 is the submitted code
(code key: the topology id); ``upgrade`` makes version N = newest + 1 under the key
``<id>.v<N>``, distributed and replicated exactly as a submission's code
(:meth:`TopologyLifecycle.distribute_code`). ``/code-versions/<id>``
(:class:`~nimbus.state.code_versions.CodeVersions`) lists the kept versions, the running
one and the switch under way; ``/storms/<id>`` never changes.

How a switch goes, every step a fenced write of the leader:

1. :meth:`Upgrades.upgrade` stages, uploads and replicates the new version
   (``topology.min.replication.count`` replicas within the replication wait, or the
   version is removed again and the upgrade refused), then writes ``/code-versions``
   with the version in state SWITCHING and the switch (``from``, ``to``, strategy,
   deadline ``topology.upgrade.timeout.secs`` away). Nothing runs it yet.
2. The duty cycle's :meth:`Upgrades.advance` (after the scheduler, on the same thread, so
   the two never race) points the Assignment at the new version: every worker at once
   (``all``) or one at a time (``rolling``: ``worker_versions`` keeps the others on the
   old version). The Assignment and ``/code-versions`` are written in one transaction,
   each with the version read: a switch is never half-applied without ``/code-versions``
   saying so.
3. The supervisors say in their heartbeats which version each slot's worker runs,
   whether it committed on it and how often it exited before its first commit. A worker
   that runs the new version and committed is *switched*. Once every placed worker is,
   the switch completes (the version is RUNNING, the one before it PREVIOUS), and the
   versions beyond ``topology.code.versions.kept`` are removed (never the running one,
   the rollback target or a switch's ``from``/``to``).
4. A worker that exits on the new version before its first commit, or a deadline that
   passes first, fails the upgrade: the version is FAILED with the error, and a
   rollback switch (strategy all) to the previous version begins. A rollback that fails
   in turn is not rolled back again: the switch ends with its error recorded, logged at
   ERROR and reported in the topology's errors.

Everything is in ZooKeeper (the deadline in epoch seconds): a leader that dies mid-way
leaves the switch to the next leader's :meth:`Upgrades.advance`, which completes it or
rolls it back.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kazoo.exceptions import NoNodeError

from nimbus.master.lifecycle import (
    BUNDLE_FILE,
    CONF_FILE,
    SUBMISSION_TOKEN_KEY,
    TOPOLOGY_FILE,
    InvalidTopologyError,
    TopologyLifecycle,
    TopologyNotFoundError,
)
from nimbus.state.cluster_state import ConcurrentChangeError, Fence, StormClusterState
from nimbus.state.cluster_view import ClusterView
from nimbus.state.code_versions import (
    ALL,
    FAILED,
    OLD,
    PREVIOUS,
    ROLLBACK,
    ROLLED_BACK,
    ROLLING,
    RUNNING,
    STRATEGIES,
    SWITCHING,
    UPGRADE,
    CodeVersions,
    is_version_key,
    split_key,
    topology_of,
    version_key,
)
from nimbus.state.records import (
    KILLED,
    REBALANCING,
    WORKER_PREFIX,
    Assignment,
    ErrorInfo,
    RecordError,
    StormBase,
    SupervisorInfo,
)
from nimbus.topology_acl import SUBMITTER_KEY

log = logging.getLogger(__name__)

KEPT_KEY = "topology.code.versions.kept"
TIMEOUT_KEY = "topology.upgrade.timeout.secs"
WORKERS_KEY = "topology.workers"
CHECKPOINT_KEY = "topology.spark.checkpoint.dir"
#: Seconds between two looks at the workers while a switch is under way.
TICK_S = 1.0
#: The component under which a switch's failures are reported in ``/errors/<id>``.
ERROR_COMPONENT = "__upgrade"
#: Who a rollback that the leader began on its own is by (``switch["by"]``).
AUTOMATIC = "automatic rollback"
#: Tries of a write that lost a race with another change (ConcurrentChangeError).
ATTEMPTS = 5
#: The directories :meth:`Upgrades.advance` reads, after a barrier.
READS = ("storms", "assignments", "supervisors", "code-versions")


def _never() -> bool:
    return False


def _index(executor: str) -> int:
    """The index of ``worker-<i>`` (executors sort by it, not as text)."""
    try:
        return int(executor[len(WORKER_PREFIX):])
    except ValueError:
        return 1 << 30


# -- what a nimbus must hold ---------------------------------------------------------------

def code_keys(topology_id: str, versions: CodeVersions | None) -> list[str]:
    """The code keys of ``topology_id`` that a nimbus must hold to lead: every kept
    version's (listed in its /code-versions), or the id alone for a topology never
    upgraded."""
    if versions is None or not versions.versions:
        return [topology_id]
    return versions.keys(topology_id)


def required_code_keys(state: StormClusterState, live: Iterable[str]) -> frozenset[str]:
    """The code keys a nimbus must hold for the ``live`` topologies, read from ZooKeeper:
    one listing of /code-versions and one read per upgraded live topology. Of one whose
    /code-versions cannot be read, the id and every version that has a code node."""
    live = set(live)
    try:
        upgraded = set(state.zk.retry(state.zk.get_children, state.path("code-versions")))
    except NoNodeError:  # set up by an earlier release: nothing was ever upgraded
        upgraded = set()
    keys: set[str] = set()
    for topology_id in live:
        if topology_id not in upgraded:
            keys.add(topology_id)
            continue
        try:
            got = state.code_versions(topology_id)
        except RecordError:  # logged by the state: hold whatever it may need
            keys.add(topology_id)
            keys.update(state.version_code_keys(topology_id))
            continue
        keys.update(code_keys(topology_id, got[0] if got is not None else None))
    return frozenset(keys)


def view_code_keys(view: ClusterView, live: Iterable[str]) -> set[str]:
    """:func:`required_code_keys`, read from a view's memory."""
    live = set(live)
    upgraded = set(view.upgraded_topologies())
    keys: set[str] = set()
    unreadable = set()
    for topology_id in live:
        if topology_id not in upgraded:
            keys.add(topology_id)
            continue
        try:
            got = view.code_versions(topology_id)
        except RecordError:
            keys.add(topology_id)
            unreadable.add(topology_id)
            continue
        keys.update(code_keys(topology_id, got[0] if got is not None else None))
    if unreadable:
        keys.update(k for k in view.code_topologies()
                    if is_version_key(k) and topology_of(k) in unreadable)
    return keys


# -- what the supervisors say of the workers ----------------------------------------------

@dataclass(frozen=True)
class WorkerFacts:
    """What a supervisor's heartbeat says of the worker of one executor's slot."""

    version: int      # the code version it runs
    committed: bool   # it committed a batch (or passed its health check) on that version
    failures: int     # its exits on that version before any commit
    error: str        # the last error its supervisor saw ("" if none)
    state: str = ""   # its supervisor's word for it: starting, running, frozen, ...


def worker_facts(info: SupervisorInfo | None, topology_id: str,
                 port: int) -> WorkerFacts | None:
    """The facts of ``topology_id``'s worker on ``port`` in a supervisor's heartbeat;
    None when it says nothing of it (another topology's worker there, an earlier
    release that reports no version, an entry this release cannot read)."""
    if info is None or not isinstance(info.workers, dict):
        return None
    entry = info.workers.get(str(port))
    if not isinstance(entry, dict) or entry.get("topology_id") != topology_id:
        return None
    version, committed = entry.get("version"), entry.get("committed", False)
    failures, error = entry.get("failures", 0), entry.get("last_error", "")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1 or \
            not isinstance(committed, bool) or not isinstance(failures, int) or \
            isinstance(failures, bool) or failures < 0:
        return None
    state = entry.get("state")
    return WorkerFacts(version, committed, failures,
                       error.strip().splitlines()[0][:300] if isinstance(error, str)
                       and error.strip() else "", state if isinstance(state, str) else "")


# -- the states at the end of a switch -------------------------------------------------------

def completed_versions(versions: CodeVersions) -> CodeVersions:
    """``versions`` once its switch has completed: ``to`` runs (RUNNING); ``from`` of a
    rollback keeps FAILED (an automatic one) or is ROLLED_BACK (by hand), as is the
    target of a switch interrupted by a rollback; the version that ran before
    becomes PREVIOUS (the one before it OLD) unless it is the one rolled back from."""
    switch = versions.switch
    kind, frm, to = switch["kind"], switch["from"], switch["to"]
    old_running = versions.running
    new_previous = None
    if old_running != to and not (kind == ROLLBACK and old_running == frm):
        new_previous = old_running
    entries = []
    for entry in versions.versions:
        entry = dict(entry)
        number, state = entry["version"], entry["state"]
        if number == to:
            entry.update(state=RUNNING, error="")
        elif number == frm and kind == ROLLBACK:
            if state != FAILED:
                entry["state"] = ROLLED_BACK
        elif number == frm and state == SWITCHING:
            entry["state"] = ROLLED_BACK
        elif number == new_previous:
            entry["state"] = PREVIOUS
        elif state == PREVIOUS and new_previous is not None:
            entry["state"] = OLD
        elif state in (RUNNING, SWITCHING):  # none should be left: what ran is OLD now
            entry["state"] = OLD
        entries.append(entry)
    return CodeVersions(versions=entries, running=to, switch={})


def history_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """A version as ``history`` shows it: the sha256 of its bundle, not of every file."""
    sha = entry.get("sha256") or {}
    return {"version": entry["version"], "sha256": str(sha.get(BUNDLE_FILE, "")),
            "submitter": entry["submitter"], "created_secs": entry["created_secs"],
            "state": entry["state"], "error": entry["error"]}


class Upgrades:
    """The leader's upgrades of running topologies; see the module docstring.

    Built on every nimbus (``history`` answers anywhere); the other calls are the
    leader's, each fenced. ``clock``: epoch seconds (tests pass a fake)."""

    def __init__(self, lifecycle: TopologyLifecycle, view: ClusterView,
                 clock: Callable[[], float] = time.time):
        self._lifecycle = lifecycle
        self._view = view
        self._state = lifecycle.state
        self._store = lifecycle.store
        self._elector = lifecycle.elector
        self.conf = lifecycle.conf
        self.clock = clock
        self._lock = threading.Lock()
        self._in_flight: dict[str, str] = {}   # code key -> topology id, being uploaded
        self._wake: list[Callable[[], None]] = []
        self._last_advance = float("-inf")
        # Versions being uploaded are pending code: the sync, the sweeper and the orphan
        # removal leave them alone.
        lifecycle.add_pending_source(self.pending_keys)
        lifecycle.upgrades = self

    # -- for the others ---------------------------------------------------------------------
    def pending_keys(self) -> set[str]:
        """The code keys of versions being uploaded on this leader (not listed yet)."""
        with self._lock:
            return set(self._in_flight)

    def add_wake_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after each switch begun by a call (the duties' wake-up, so
        that :meth:`advance` applies it at once)."""
        self._wake.append(listener)

    def running_key(self, topology_id: str) -> str:
        """The code key of the version ``topology_id``'s workers run (its id when it was
        never upgraded, or when that is not known here), from the view's memory."""
        try:
            got = self._view.code_versions(topology_id)
        except Exception:  # not loaded, unreadable: the submitted code
            return topology_id
        if got is None or got[0].entry(got[0].running) is None:
            return topology_id
        return version_key(topology_id, got[0].running)

    def due_in_s(self) -> float | None:
        """Seconds until :meth:`advance` should look at the workers again: about
        TICK_S after its last run while any switch is under way, None otherwise."""
        try:
            switching = False
            for topology_id in self._view.upgraded_topologies():
                try:
                    got = self._view.code_versions(topology_id)
                except RecordError:
                    continue
                if got is not None and got[0].switch:
                    switching = True
                    break
        except Exception:  # the view is not loaded: the duties' own period applies
            return None
        if not switching:
            return None
        return self._last_advance + TICK_S - time.monotonic()

    # -- upgrade ------------------------------------------------------------------------------
    def upgrade(self, name: str, bundle: Path, json_conf: str, strategy: str = ALL,
                by: str = "", client_gone: Callable[[], bool] | None = None
                ) -> tuple[str, int]:
        """Upload ``bundle`` as the next version of live topology ``name`` and begin the
        switch of its workers to it; returns (topology id, the new version).

        The new version's conf is the running version's overlaid with ``json_conf``
        (checked as submit checks a conf). Refused with InvalidTopologyError, nothing
        written, when: a switch is under way; the topology is being killed or
        REBALANCING; the change would alter ``topology.workers`` (use rebalance),
        ``topology.spark.checkpoint.dir`` (the checkpoints would be lost) or the bundle's
        kind (pipeline or process); the version does not reach
        ``topology.min.replication.count`` replicas within the replication wait (it is
        removed again). TopologyNotFoundError for an unknown name. A retry carrying the
        same ``topology.submission.token`` is answered with the version it made.
        """
        fence = self._elector.fence()
        lifecycle = self._lifecycle
        if strategy not in STRATEGIES:
            raise InvalidTopologyError(
                f"upgrade strategy must be {' or '.join(STRATEGIES)}, not {strategy!r:.40}")
        lifecycle.refuse_degraded("upgrades")
        topology_id, base = lifecycle.find(name)
        self._refuse_status(name, base, "upgrade")
        overlay = lifecycle.parse_topology_conf(json_conf)
        token = str(overlay.get(SUBMISSION_TOKEN_KEY) or "")
        got = self._state.code_versions(topology_id)
        versions = got[0] if got is not None else None
        if token and versions is not None:
            for entry in versions.versions:
                if entry["version"] > 1 and entry["conf"].get(SUBMISSION_TOKEN_KEY) == token:
                    log.info("upgrade %s of %s is a retry: it made version %d", token, name,
                             entry["version"])
                    return topology_id, entry["version"]
        if versions is not None and versions.switch:
            raise InvalidTopologyError(self._busy(name, versions.switch))
        running = versions.running if versions is not None else 1
        running_conf = self._conf_of(topology_id, versions, running)
        kind = lifecycle.check_bundle(bundle)
        # The owner stays the owner: an upgrade does not change who submitted it.
        overlay.pop(SUBMITTER_KEY, None)
        new_conf = {**running_conf, **overlay}
        self._check_change(name, topology_id, running, running_conf, new_conf, kind)
        min_replicas = lifecycle.topology_setting(new_conf, "topology.min.replication.count")
        max_wait = lifecycle.replication_wait(new_conf)
        timeout_s = self._at_least_one(new_conf, TIMEOUT_KEY)
        self._at_least_one(new_conf, KEPT_KEY)
        submitter = by or str(running_conf.get(SUBMITTER_KEY) or "")
        version, key = self._claim(name, topology_id, versions)
        now = int(self.clock())
        listed = False
        try:
            try:
                topology_bytes = (self._store.path(version_key(topology_id, running))
                                  / TOPOLOGY_FILE).read_bytes()
            except OSError:
                topology_bytes = b""
            lifecycle.stage_code(key, bundle, new_conf, topology_bytes)
            lifecycle.distribute_code(fence, key, now)
            replicas = lifecycle.wait_for_replication(fence, key, min_replicas, max_wait,
                                                      client_gone or _never)
            if replicas < min_replicas:
                raise InvalidTopologyError(
                    f"version {version} of {name!r} reached {replicas} of the "
                    f"{min_replicas} replicas topology.min.replication.count asks for "
                    f"within {max_wait}s: upgrade refused, the version removed and nothing "
                    "switched (are the other nimbuses up? see `nimbus-ha list`)")
            entry = {"version": version, "sha256": lifecycle.code_sha256(key),
                     "submitter": submitter, "created_secs": now, "state": SWITCHING,
                     "error": "", "conf": new_conf}
            switch = {"kind": UPGRADE, "from": running, "to": version, "strategy": strategy,
                      "started_secs": now, "deadline_secs": now + timeout_s,
                      "by": submitter, "switched": []}
            self._begin(fence, topology_id, name, base, running, running_conf, entry, switch)
            listed = True
        except BaseException:
            if not listed:
                self._abandon(topology_id, key, version)
            raise
        finally:
            with self._lock:
                self._in_flight.pop(key, None)
        log.info("upgrading %s to version %d (%s): %s, %d replicas, rolled back unless every "
                 "worker runs it and committed within %ds", name, version, strategy, key,
                 replicas, timeout_s)
        self._ring()
        return topology_id, version

    def _claim(self, name: str, topology_id: str,
               versions: CodeVersions | None) -> tuple[int, str]:
        """The number and code key of the next version of ``topology_id``, marked in
        flight; InvalidTopologyError while another upgrade of it is uploading here."""
        # A code node may be left by an upgrade whose leader died before listing it:
        # never reuse its number (the orphan removal takes it away meanwhile).
        existing = [split_key(k)[1] for k in self._state.version_code_keys(topology_id)]
        with self._lock:
            uploading = [split_key(k)[1] for k, t in self._in_flight.items()
                         if t == topology_id]
            if uploading:
                raise InvalidTopologyError(
                    f"an upgrade of {name!r} is already uploading (version "
                    f"{uploading[0]}): wait for it to be answered")
            version = max([versions.newest() if versions else 1, *existing]) + 1
            key = version_key(topology_id, version)
            self._in_flight[key] = topology_id
        return version, key

    def _begin(self, fence: Fence, topology_id: str, name: str, base: StormBase,
               running: int, running_conf: dict[str, Any], entry: dict[str, Any],
               switch: dict[str, Any]) -> None:
        """Write the new version and its switch into /code-versions (CAS, a few tries),
        created with a version-1 entry when the topology was never upgraded."""
        for _attempt in range(ATTEMPTS):
            got = self._state.code_versions(topology_id)
            if got is None:
                versions, node_version = self._first(topology_id, base, running_conf), None
            else:
                versions, node_version = got
            if versions.switch:
                raise InvalidTopologyError(self._busy(name, versions.switch))
            if versions.running != running:
                raise ConcurrentChangeError(
                    f"{name!r} switched to version {versions.running} meanwhile; try again")
            new = CodeVersions(versions=[*versions.versions, entry], running=running,
                               switch=switch)
            try:
                self._state.write_switch(fence, topology_id, new, node_version)
                break
            except ConcurrentChangeError:
                continue
        else:
            raise ConcurrentChangeError(f"/code-versions/{topology_id} kept changing; "
                                        "try again")
        if self._state.storm_base(topology_id) is None:
            # Removed (a kill) just before the write: the node would outlive it.
            self._state.delete_nodes(fence, [self._state.code_versions_path(topology_id)])
            raise TopologyNotFoundError(f"no live topology named {name!r}")

    def _first(self, topology_id: str, base: StormBase,
               running_conf: dict[str, Any]) -> CodeVersions:
        """The /code-versions of a topology never upgraded: version 1, as submitted."""
        assignment = self._state.assignment_info(topology_id)
        sha = dict(assignment.code_sha256) if assignment is not None else {}
        if not sha:
            sha = self._lifecycle.code_sha256(topology_id)
        return CodeVersions(versions=[{
            "version": 1, "sha256": sha, "submitter": base.owner,
            "created_secs": base.launch_time_secs, "state": RUNNING, "error": "",
            "conf": running_conf}], running=1, switch={})

    def _abandon(self, topology_id: str, key: str, version: int) -> None:
        """Remove the code of an upgrade that failed, unless /code-versions lists it
        after all (a write whose reply was lost): then it is kept, and its switch goes
        on. When that cannot be read, the duties' orphan removal decides later."""
        try:
            got = self._state.code_versions(topology_id)
        except Exception as exc:
            log.warning("cannot tell whether version %d of %s was listed (%s): leaving it "
                        "to the duties", version, topology_id, exc)
            return
        if got is not None and got[0].entry(version) is not None:
            log.warning("version %d of %s was listed although its upgrade reported an "
                        "error", version, topology_id)
            return
        self._lifecycle.discard_code(key)

    def _check_change(self, name: str, topology_id: str, running: int,
                      running_conf: dict[str, Any], new_conf: dict[str, Any],
                      kind: str) -> None:
        """InvalidTopologyError for a change no upgrade may make."""
        reasons = {
            WORKERS_KEY: "an upgrade keeps the number of workers: change it with "
                         f"`nimbus-ha rebalance {name} -n N`",
            CHECKPOINT_KEY: "the new version would start from another checkpoint and lose "
                            "the state and progress of the running one (submit a new "
                            "topology to start afresh)"}
        for key, why in reasons.items():
            was, now = running_conf.get(key, self.conf[key]), new_conf.get(key, self.conf[key])
            if was != now:
                raise InvalidTopologyError(
                    f"upgrade of {name!r} refused: it changes {key} from {was!r:.200} to "
                    f"{now!r:.200}; {why}")
        bundle = self._store.path(version_key(topology_id, running)) / BUNDLE_FILE
        try:
            running_kind = self._lifecycle.check_bundle(bundle)
        except InvalidTopologyError as exc:
            raise InvalidTopologyError(
                f"upgrade of {name!r} refused: this leader cannot read the bundle of its "
                f"running version {running} ({exc})") from None
        if running_kind != kind:
            raise InvalidTopologyError(
                f"upgrade of {name!r} refused: version {running} is a {running_kind} "
                f"topology and the new bundle a {kind} one; a topology keeps its kind "
                "(submit the other kind as a new topology)")

    def _conf_of(self, topology_id: str, versions: CodeVersions | None,
                 number: int) -> dict[str, Any]:
        """The conf version ``number`` runs with: its /code-versions entry's, or for a
        topology never upgraded the submitted stormconf.json held here."""
        entry = versions.entry(number) if versions is not None else None
        if entry is not None:
            return dict(entry["conf"])
        path = self._store.path(version_key(topology_id, number)) / CONF_FILE
        try:
            conf = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InvalidTopologyError(
                f"this leader cannot read the conf of version {number} of {topology_id} "
                f"({exc}); try again once its code sync has fetched it") from None
        if not isinstance(conf, dict):
            raise InvalidTopologyError(f"the conf of version {number} of {topology_id} is "
                                       "not a JSON object")
        return conf

    def _at_least_one(self, topo_conf: dict[str, Any], key: str) -> int:
        value = self._lifecycle.topology_setting(topo_conf, key)
        if value < 1:
            raise InvalidTopologyError(f"topology conf: {key!r} must be at least 1, "
                                       f"got {value}")
        return int(value)

    @staticmethod
    def _refuse_status(name: str, base: StormBase, action: str) -> None:
        if base.status == KILLED:
            raise InvalidTopologyError(f"topology {name!r} is being killed")
        if base.status == REBALANCING:
            raise InvalidTopologyError(
                f"topology {name!r} is {REBALANCING}: {action} is refused until the "
                "rebalance completes; kill is allowed")

    @staticmethod
    def _busy(name: str, switch: dict[str, Any]) -> str:
        return (f"topology {name!r} is already switching from version {switch['from']} to "
                f"{switch['to']} ({switch['kind']}, {switch['strategy']}, started by "
                f"{switch.get('by') or 'unknown'}): wait for it to end (`nimbus-ha history "
                f"{name}`) or roll it back (`nimbus-ha rollback {name}`)")

    def _ring(self) -> None:
        for listener in list(self._wake):
            try:
                listener()
            except Exception:
                log.exception("upgrade wake-up listener failed")

    # -- rollback -----------------------------------------------------------------------------
    def rollback(self, name: str, to: int | None = None, by: str = "") -> tuple[str, int]:
        """Switch live topology ``name`` to its kept version ``to`` (default: the
        PREVIOUS one; during an upgrade's switch, the version it switches from), every
        worker at once; returns (topology id, that version). The switch is a rollback
        when ``to`` is older than the version running (or being switched to), else an
        upgrade (which is rolled back automatically if it fails). A switch under way is
        replaced (its target is ROLLED_BACK). InvalidTopologyError for a version not
        kept, the one that runs (or is switched to) already, a topology never upgraded,
        KILLED or REBALANCING, and for no ``to`` during a rollback's switch."""
        fence = self._elector.fence()
        if to is not None and (isinstance(to, bool) or not isinstance(to, int) or to < 1):
            raise InvalidTopologyError(f"a code version is a number >= 1, not {to!r:.40}")
        topology_id, base = self._lifecycle.find(name)
        self._refuse_status(name, base, "rollback")
        for _attempt in range(ATTEMPTS):
            got = self._state.code_versions(topology_id)
            if got is None:
                raise InvalidTopologyError(
                    f"topology {name!r} has one code version only (it was never upgraded): "
                    "nothing to roll back to")
            versions, node_version = got
            switch = versions.switch
            current = switch["to"] if switch else versions.running
            kept = ", ".join(str(e["version"]) for e in versions.versions)
            target = to
            if target is None:
                if switch and switch["kind"] == ROLLBACK:
                    raise InvalidTopologyError(
                        f"topology {name!r} is already rolling back to version {current} "
                        f"(by {switch.get('by') or 'unknown'}); name another version with "
                        "--to N")
                if switch:
                    target = switch["from"]
                else:
                    previous = [e["version"] for e in versions.versions
                                if e["state"] == PREVIOUS]
                    if not previous:
                        raise InvalidTopologyError(
                            f"topology {name!r} has no previous version to roll back to "
                            f"(kept: {kept}); name one with --to N")
                    target = max(previous)
            entry = versions.entry(target)
            if entry is None:
                raise InvalidTopologyError(
                    f"version {target} of {name!r} is not kept (kept: {kept})")
            if target == current:
                raise InvalidTopologyError(
                    f"topology {name!r} is already switching to version {target}" if switch
                    else f"topology {name!r} already runs version {target}")
            now = int(self.clock())
            timeout_s = self._at_least_one(entry["conf"], TIMEOUT_KEY)
            who = by or "unknown"
            entries = []
            for each in versions.versions:
                each = dict(each)
                if each["version"] == target:
                    each.update(state=SWITCHING, error="")
                elif switch and each["version"] == current and each["state"] == SWITCHING:
                    each.update(state=ROLLED_BACK,
                                error=f"rolled back by {who} during its switch")
                entries.append(each)
            new_switch = {"kind": ROLLBACK if target < current else UPGRADE, "from": current,
                          "to": target, "strategy": ALL, "started_secs": now,
                          "deadline_secs": now + timeout_s, "by": by, "switched": []}
            new = CodeVersions(versions=entries, running=versions.running, switch=new_switch)
            try:
                self._state.write_switch(fence, topology_id, new, node_version)
                break
            except ConcurrentChangeError:
                continue
        else:
            raise ConcurrentChangeError(f"/code-versions/{topology_id} kept changing; "
                                        "try again")
        log.info("switching %s (%s) from version %d to version %d (%s by %s)", name,
                 topology_id, current, target, new_switch["kind"], who)
        self._ring()
        return topology_id, target

    # -- history ------------------------------------------------------------------------------
    def history(self, name: str) -> dict[str, Any]:
        """The versions of live topology ``name`` (any nimbus answers, from its view after
        a barrier), JSON-ready: ``{"topology_id", "name", "running", "switch": {kind,
        from, to, strategy, started_secs, deadline_secs, by, switched} or None,
        "versions": [{"version", "sha256" (of its bundle), "submitter", "created_secs",
        "state", "error"}, ...] newest first}``. TopologyNotFoundError for an unknown
        name; RecordError for records this release cannot read."""
        topology_id, base = self._lifecycle.find(name)
        self._view.barrier(directories=("code-versions", "assignments"))
        got = self._view.code_versions(topology_id)
        if got is None:
            found = self._view.assignment(topology_id)
            sha = dict(found[0].code_sha256) if found is not None else {}
            versions = CodeVersions(versions=[{
                "version": 1, "sha256": sha, "submitter": base.owner,
                "created_secs": base.launch_time_secs, "state": RUNNING, "error": "",
                "conf": {}}], running=1, switch={})
        else:
            versions = got[0]
        return {"topology_id": topology_id, "name": base.storm_name,
                "running": versions.running,
                "switch": dict(versions.switch) if versions.switch else None,
                "versions": [history_entry(e) for e in sorted(
                    versions.versions, key=lambda e: e["version"], reverse=True)]}

    # -- the duty -----------------------------------------------------------------------------
    def advance(self, fence: Fence | None = None) -> bool:
        """The leader's duty, after the scheduler: apply each switch under way to its
        topology's Assignment, mark the workers that switched, roll back a failed
        upgrade, complete a switch every worker made, prune old versions, and remove a
        /code-versions node its topology outlived. Returns whether it wrote anything."""
        self._last_advance = time.monotonic()
        fence = fence if fence is not None else self._elector.fence()
        # A switch begun by a call just now is seen (one round trip).
        self._view.barrier(directories=("code-versions",))
        work = [t for t in self._view.upgraded_topologies() if self._needs_work(t)]
        if not work:
            return False
        self._view.barrier(directories=READS)
        wrote = False
        for topology_id in work:
            for _attempt in range(3):
                try:
                    wrote = self._step(fence, topology_id) or wrote
                    break
                except ConcurrentChangeError as exc:
                    log.info("advancing the switch of %s again: %s", topology_id, exc)
                    self._view.barrier(directories=READS)
            else:
                log.info("the switch of %s kept changing: left to the next cycle",
                         topology_id)
        return wrote

    def _needs_work(self, topology_id: str) -> bool:
        """From memory: whether ``topology_id`` has a switch under way, versions to
        prune, or no topology any more."""
        try:
            got = self._view.code_versions(topology_id)
            if got is None:
                return False
            versions = got[0]
            return bool(versions.switch) or self._view.storm_base(topology_id) is None or \
                bool(self._doomed(versions))
        except RecordError:
            return False  # logged by the state; nothing is changed until it is readable

    def _step(self, fence: Fence, topology_id: str) -> bool:
        got = self._view.code_versions(topology_id)
        if got is None:
            return False
        versions, node_version = got
        try:
            base = self._view.storm_base(topology_id)
        except RecordError:
            return False
        if base is None:
            return self._remove_leftover(fence, topology_id)
        if base.status == KILLED:
            return False  # the kill ends the switch: nothing is switched any more
        if not versions.switch:
            return self._prune(fence, topology_id, base, versions, node_version)
        found = self._view.assignment(topology_id)
        if found is None:
            return False
        assignment, assignment_version = found
        switch = versions.switch
        to = switch["to"]
        now = int(self.clock())
        supervisors = self._view.supervisors()
        placed = sorted(assignment.executor_node_port, key=_index)
        switched = list(switch.get("switched", []))
        failure = ""
        deadline_passed = now >= switch["deadline_secs"]
        idle: list[str] = []
        for executor in placed:
            supervisor_id, port = assignment.executor_node_port[executor]
            facts = worker_facts(supervisors.get(supervisor_id), topology_id, int(port))
            if facts is None or facts.version != to or executor in switched:
                continue
            if facts.committed:
                switched.append(executor)
                log.info("%s of %s runs version %d and committed (%d of %d switched)",
                         executor, base.storm_name, to,
                         sum(e in switched for e in placed), len(placed))
            elif deadline_passed and facts.failures == 0 and facts.state == "running":
                # Running on the new version since, without a failure, but with nothing
                # to commit (no input): no batch can judge it, so it counts as switched.
                switched.append(executor)
                idle.append(executor)
                log.warning("%s of %s runs version %d without a failure but has committed "
                            "nothing in %ss (no input?): counted as switched", executor,
                            base.storm_name, to,
                            switch["deadline_secs"] - switch["started_secs"])
            elif facts.failures >= 1 and not failure:
                host = assignment.node_host.get(supervisor_id, supervisor_id)
                failure = (f"{executor} on {host}:{port} exited before its first commit "
                           f"({facts.failures} time{'s' if facts.failures > 1 else ''})"
                           + (f": {facts.error}" if facts.error else ""))
        done = [e for e in placed if e in switched]
        asked = [e for e in placed if e not in switched and assignment.code_for(e)[0] == to]
        if not failure and len(done) < len(placed) and deadline_passed and idle \
                and switch["strategy"] == ROLLING and not asked:
            # A rolling switch goes on to its next worker, with a timeout of its own.
            target = versions.entry(to)
            switch = {**switch, "deadline_secs": now + self._timeout(
                target["conf"] if target else {})}
        elif not failure and len(done) < len(placed) and deadline_passed:
            failure = (f"not every worker ran version {to} and committed within "
                       f"{self._timeout((versions.entry(to) or {}).get('conf', {}))}s "
                       f"(topology.upgrade.timeout.secs): {len(done)} of {len(placed)} did")
        if failure:
            return self._fail(fence, topology_id, base, versions, node_version, assignment,
                              assignment_version, failure)
        if len(done) == len(placed):
            return self._complete(fence, topology_id, base, replace(
                versions, switch={**switch, "switched": switched}), node_version,
                assignment, assignment_version)
        new_versions = replace(versions, switch={**switch, "switched": switched})
        new_assignment = self._switching(assignment, new_versions, base)
        if new_versions == versions and new_assignment == assignment:
            return False
        self._state.write_switch(
            fence, topology_id, new_versions, node_version,
            new_assignment if new_assignment != assignment else None, assignment_version)
        if new_assignment != assignment:
            log.info("%s: %s", base.storm_name, self._describe(new_assignment, switch))
        return True

    @staticmethod
    def _describe(assignment: Assignment, switch: dict[str, Any]) -> str:
        if switch["strategy"] == ALL or not assignment.worker_versions:
            return f"every worker assigned version {switch['to']} ({switch['kind']})"
        on_new = sorted(set(assignment.executor_node_port) - set(assignment.worker_versions),
                        key=_index)
        return (f"{', '.join(on_new) or 'no worker'} assigned version {switch['to']} "
                f"({switch['kind']}, rolling), the others stay on version {switch['from']}")

    def _switching(self, assignment: Assignment, versions: CodeVersions,
                   base: StormBase) -> Assignment:
        """The Assignment during ``versions``' switch: every worker on ``to`` (all), or
        those switched and the one switching now on ``to`` and the others on ``from``
        (rolling: the lowest index not switched yet among the placed ones)."""
        switch = versions.switch
        to, frm = switch["to"], switch["from"]
        target = versions.entry(to)
        source = versions.entry(frm)
        sha_to = dict(target["sha256"]) if target else dict(assignment.code_sha256)
        if switch["strategy"] != ROLLING or source is None:
            return replace(assignment, code_version=to, code_sha256=sha_to,
                           worker_versions={}, version_sha256={})
        executors = sorted(set(assignment.executor_node_port) | {
            f"{WORKER_PREFIX}{i}" for i in range(max(0, base.num_workers))}, key=_index)
        switched = set(switch.get("switched", []))
        waiting = [e for e in executors if e not in switched]
        now_switching = next((e for e in waiting if e in assignment.executor_node_port),
                             waiting[0] if waiting else None)
        return replace(assignment, code_version=to, code_sha256=sha_to,
                       worker_versions={e: frm for e in waiting if e != now_switching},
                       version_sha256={str(frm): dict(source["sha256"])})

    def _settled(self, assignment: Assignment, versions: CodeVersions,
                 number: int) -> Assignment:
        """The Assignment once every worker runs version ``number``."""
        entry = versions.entry(number)
        sha = dict(entry["sha256"]) if entry else dict(assignment.code_sha256)
        return replace(assignment, code_version=number, code_sha256=sha,
                       worker_versions={}, version_sha256={})

    def _fail(self, fence: Fence, topology_id: str, base: StormBase, versions: CodeVersions,
              node_version: int, assignment: Assignment, assignment_version: int,
              error: str) -> bool:
        switch = versions.switch
        frm, to, now = switch["from"], switch["to"], int(self.clock())
        name = base.storm_name
        if switch["kind"] == UPGRADE and versions.entry(frm) is not None:
            source = versions.entry(frm)
            timeout_s = self._timeout(source["conf"])
            entries = []
            for entry in versions.versions:
                entry = dict(entry)
                if entry["version"] == to:
                    entry.update(state=FAILED, error=error)
                elif entry["version"] == frm:
                    entry.update(state=SWITCHING, error="")
                entries.append(entry)
            new = CodeVersions(versions=entries, running=versions.running, switch={
                "kind": ROLLBACK, "from": to, "to": frm, "strategy": ALL,
                "started_secs": now, "deadline_secs": now + timeout_s, "by": AUTOMATIC,
                "switched": []})
            self._state.write_switch(fence, topology_id, new, node_version,
                                     self._settled(assignment, new, frm), assignment_version)
            log.warning("version %d of %s failed before its first commit: %s; rolling back "
                        "to %d", to, name, error, frm)
            self._report(topology_id, f"version {to} failed before its first commit: "
                                      f"{error}; rolling back to version {frm}")
            return True
        # A rollback (or a switch whose source is gone) that failed: not rolled back again.
        ended = completed_versions(versions)
        for entry in ended.versions:
            if entry["version"] == to:
                entry.update(state=FAILED, error=f"{switch['kind']} to it failed: {error}")
        self._state.write_switch(fence, topology_id, ended, node_version,
                                 self._settled(assignment, ended, to), assignment_version)
        log.error("the %s of %s to version %d failed: %s; it is not rolled back again: "
                  "its workers stay assigned version %d (fix it with `nimbus-ha upgrade` "
                  "or `nimbus-ha rollback %s --to N`)", switch["kind"], name, to, error, to,
                  name)
        self._report(topology_id, f"{switch['kind']} to version {to} failed: {error}; not "
                                  "rolled back again")
        return True

    def _complete(self, fence: Fence, topology_id: str, base: StormBase,
                  versions: CodeVersions, node_version: int, assignment: Assignment,
                  assignment_version: int) -> bool:
        switch = versions.switch
        ended = completed_versions(versions)
        self._state.write_switch(fence, topology_id, ended, node_version,
                                 self._settled(assignment, ended, switch["to"]),
                                 assignment_version)
        if not assignment.executor_node_port:
            log.info("%s %s to version %d (no worker is placed: they run it once placed)",
                     base.storm_name, "upgraded" if switch["kind"] == UPGRADE
                     else "rolled back", switch["to"])
        elif switch["kind"] == UPGRADE:
            log.info("%s upgraded to version %d", base.storm_name, switch["to"])
        else:
            log.info("%s rolled back to version %d", base.storm_name, switch["to"])
        got = self._state.code_versions(topology_id)  # what was just written, to prune
        if got is not None:
            self._prune(fence, topology_id, base, got[0], got[1])
        return True

    def _timeout(self, topo_conf: dict[str, Any]) -> int:
        value = topo_conf.get(TIMEOUT_KEY, self.conf[TIMEOUT_KEY])
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return int(self.conf[TIMEOUT_KEY])
        return value

    def _kept(self, versions: CodeVersions) -> int:
        entry = versions.entry(versions.running)
        value = (entry["conf"] if entry else {}).get(KEPT_KEY, self.conf[KEPT_KEY])
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return int(self.conf[KEPT_KEY])
        return value

    def _doomed(self, versions: CodeVersions) -> list[int]:
        """The versions to prune: beyond the newest ``topology.code.versions.kept``,
        never the running one, a PREVIOUS one (the rollback target), nor a switch's
        ``from`` or ``to``; none while a switch is under way."""
        if versions.switch:
            return []
        numbers = sorted((e["version"] for e in versions.versions), reverse=True)
        keep = set(numbers[:self._kept(versions)]) | {versions.running} | {
            e["version"] for e in versions.versions if e["state"] == PREVIOUS}
        return [n for n in numbers if n not in keep]

    def _prune(self, fence: Fence, topology_id: str, base: StormBase,
               versions: CodeVersions, node_version: int) -> bool:
        """Remove the versions :meth:`_doomed` names: from /code-versions first (CAS, so a
        nimbus stops needing them before they go), then their code everywhere."""
        doomed = self._doomed(versions)
        if not doomed:
            return False
        kept = [e for e in versions.versions if e["version"] not in doomed]
        self._state.write_switch(fence, topology_id, replace(versions, versions=kept),
                                 node_version)
        for number in doomed:
            self._lifecycle.discard_code(version_key(topology_id, number))
        log.info("removed version%s %s of %s (topology.code.versions.kept %d; kept %s)",
                 "s" if len(doomed) > 1 else "", ", ".join(map(str, sorted(doomed))),
                 base.storm_name, self._kept(versions),
                 ", ".join(str(e["version"]) for e in kept))
        return True

    def _remove_leftover(self, fence: Fence, topology_id: str) -> bool:
        """Delete a /code-versions node whose topology is gone (an upgrade written just
        after the topology's removal), once ZooKeeper itself confirms it."""
        if self._state.storm_base(topology_id) is not None:
            return False  # the view trailed
        deleted = self._state.delete_nodes(fence, [self._state.code_versions_path(topology_id)])
        if deleted:
            log.info("removed /code-versions/%s: its topology is gone", topology_id)
        return bool(deleted)

    def _report(self, topology_id: str, message: str) -> None:
        """Put ``message`` into the topology's errors (what topology-info and the UI
        show), best effort."""
        try:
            self._state.report_error(topology_id, ERROR_COMPONENT, ErrorInfo(
                error=message, error_time_secs=int(self.clock()),
                host=self._lifecycle.address.rpartition(":")[0]))
        except Exception as exc:
            log.warning("could not report the switch's error of %s: %s", topology_id, exc)
