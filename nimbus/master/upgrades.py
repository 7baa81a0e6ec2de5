"""Upgrades of a running topology as they are asked for: ``upgrade`` (a new code version
and the switch of the workers to it), ``rollback`` (a switch to a kept version) and
``history`` (the versions kept and the switch under way), through :class:`Upgrades`, the
one object the nimbus, its duties and its Thrift service hold.

What is stored (:mod:`nimbus.state.code_versions`): version 1 is the submitted code
(code key: the topology id); ``upgrade`` makes version N = newest + 1 under the key
``<id>.v<N>``, distributed and replicated exactly as a submission's code
(:meth:`TopologyLifecycle.distribute_code`). ``/code-versions/<id>``
(:class:`~nimbus.state.code_versions.CodeVersions`) lists the kept versions, the running
one and the switch under way; ``/storms/<id>`` never changes.

:meth:`Upgrades.upgrade` stages, uploads and replicates the new version
(``topology.min.replication.count`` replicas within the replication wait, or the version
is removed again and the upgrade refused), then writes ``/code-versions`` with the
version in state SWITCHING and the switch (``from``, ``to``, strategy, deadline
``topology.upgrade.timeout.secs`` away). :meth:`Upgrades.rollback` writes a switch to a
kept version the same way. Nothing runs either yet: the leader's duty
(:meth:`Upgrades.advance`, carried out by
:class:`~nimbus.master.version_switches.VersionSwitches`) applies the switch to the
Assignment, completes it once every worker runs the new version and committed, or rolls
it back. Every write is a fenced write of the leader.

The rules both sides apply (which code keys a nimbus holds, which versions are pruned,
the states at a switch's end, what a heartbeat says of a worker) are
:mod:`nimbus.master.version_rules`; this module still offers their names, and the
switch's, to those that import them from here.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nimbus.config import SUBMISSION_TOKEN_KEY
from nimbus.master.lifecycle import (
    BUNDLE_FILE,
    CONF_FILE,
    TOPOLOGY_FILE,
    InvalidTopologyError,
    TopologyLifecycle,
    TopologyNotFoundError,
)
from nimbus.master.version_rules import (
    KEPT_KEY,
    TIMEOUT_KEY,
    WorkerFacts,
    code_keys,
    completed_versions,
    required_code_keys,
    view_code_keys,
    worker_facts,
)
from nimbus.master.version_switches import (
    AUTOMATIC,
    ERROR_COMPONENT,
    READS,
    TICK_S,
    VersionSwitches,
)
from nimbus.state.cluster_state import ConcurrentChangeError, Fence
from nimbus.state.cluster_view import ClusterView
from nimbus.state.code_versions import (
    ALL,
    PREVIOUS,
    ROLLBACK,
    ROLLED_BACK,
    RUNNING,
    STRATEGIES,
    SWITCHING,
    UPGRADE,
    CodeVersions,
    split_key,
    version_key,
)
from nimbus.state.records import KILLED, REBALANCING, StormBase
from nimbus.topology_acl import SUBMITTER_KEY

# Names this module has always offered (the code sync, the duties, Thrift and tests
# import them from here).
__all__ = ["ATTEMPTS", "AUTOMATIC", "CHECKPOINT_KEY", "ERROR_COMPONENT", "KEPT_KEY",
           "READS", "TICK_S", "TIMEOUT_KEY", "WORKERS_KEY", "Upgrades", "WorkerFacts",
           "code_keys", "completed_versions", "history_entry", "required_code_keys",
           "view_code_keys", "worker_facts"]

log = logging.getLogger(__name__)

WORKERS_KEY = "topology.workers"
CHECKPOINT_KEY = "topology.spark.checkpoint.dir"
#: Tries of a write that lost a race with another change (ConcurrentChangeError).
ATTEMPTS = 5


def _never() -> bool:
    return False


def history_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """A version as ``history`` shows it: the sha256 of its bundle, not of every file."""
    sha = entry.get("sha256") or {}
    return {"version": entry["version"], "sha256": str(sha.get(BUNDLE_FILE, "")),
            "submitter": entry["submitter"], "created_secs": entry["created_secs"],
            "state": entry["state"], "error": entry["error"]}


class Upgrades:
    """The upgrades of running topologies; see the module docstring.

    Built on every nimbus (``history`` answers anywhere); the other calls are the
    leader's, each fenced; :meth:`advance` and :meth:`due_in_s`, the leader's duty, are
    carried out by :attr:`switches`. ``clock``: epoch seconds (tests pass a fake)."""

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
        self.switches = VersionSwitches(lifecycle, view, clock=clock)
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
        def change(found: CodeVersions | None) -> CodeVersions:
            versions = found or self._first(topology_id, base, running_conf)
            if versions.switch:
                raise InvalidTopologyError(self._busy(name, versions.switch))
            if versions.running != running:
                raise ConcurrentChangeError(
                    f"{name!r} switched to version {versions.running} meanwhile; try again")
            return CodeVersions(versions=[*versions.versions, entry], running=running,
                                switch=switch)

        self._write_versions(fence, topology_id, change)
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

    def _write_versions(self, fence: Fence, topology_id: str,
                        change: Callable[[CodeVersions | None], CodeVersions]) -> None:
        """Read /code-versions/<id>, have ``change`` make its next value (it gets None for a
        topology never upgraded, and raises to refuse), and write that with CAS; read and
        tried again on a concurrent change, ConcurrentChangeError after ATTEMPTS."""
        for _attempt in range(ATTEMPTS):
            got = self._state.code_versions(topology_id)
            versions, node_version = got if got is not None else (None, None)
            new = change(versions)   # its refusals go to the caller, never tried again
            try:
                self._state.write_switch(fence, topology_id, new, node_version)
                return
            except ConcurrentChangeError:
                continue
        raise ConcurrentChangeError(f"/code-versions/{topology_id} kept changing; try again")

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
        chosen: dict[str, Any] = {}

        def change(versions: CodeVersions | None) -> CodeVersions:
            if versions is None:
                raise InvalidTopologyError(
                    f"topology {name!r} has one code version only (it was never upgraded): "
                    "nothing to roll back to")
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
            chosen.update(current=current, target=target, kind=new_switch["kind"], who=who)
            return CodeVersions(versions=entries, running=versions.running, switch=new_switch)

        self._write_versions(fence, topology_id, change)
        current, target, who = chosen["current"], chosen["target"], chosen["who"]
        log.info("switching %s (%s) from version %d to version %d (%s by %s)", name,
                 topology_id, current, target, chosen["kind"], who)
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

    # -- the switches under way: the leader's duty --------------------------------------------
    def advance(self, fence: Fence | None = None) -> bool:
        """Carry every switch under way a step on (:meth:`VersionSwitches.advance
        <nimbus.master.version_switches.VersionSwitches.advance>`); the duties run it
        after the scheduler. Returns whether it wrote anything."""
        return self.switches.advance(fence)

    def due_in_s(self) -> float | None:
        """Seconds until :meth:`advance` should look at the workers again (about
        TICK_S while a switch is under way), None when no switch is."""
        return self.switches.due_in_s()
