"""The leader's switches of code version: the duty that carries every switch under way
to its end, whoever leads by then.

An upgrade or a rollback (:mod:`nimbus.master.upgrades`) only writes its switch into
``/code-versions/<id>`` (:class:`~nimbus.state.code_versions.CodeVersions`: ``from``,
``to``, strategy, deadline). :meth:`VersionSwitches.advance`, run by the duty cycle after
the scheduler on the same thread (:mod:`nimbus.master.duties`: the two never race on an
Assignment), does the rest, every step a fenced write of the leader:

1. It points the Assignment at the new version: every worker at once (``all``) or one at
   a time (``rolling``: ``worker_versions`` keeps the others on the old version). The
   Assignment and ``/code-versions`` are written in one transaction, each with the
   version read: a switch is never half-applied without ``/code-versions`` saying so.
2. The supervisors say in their heartbeats which version each slot's worker runs,
   whether it committed on it and how often it exited before its first commit
   (:func:`~nimbus.master.version_rules.worker_facts`). A worker that runs the new
   version and committed is *switched*. Once every placed worker is, the switch
   completes (:func:`~nimbus.master.version_rules.completed_versions`: the version is
   RUNNING, the one before it PREVIOUS), and the versions beyond
   ``topology.code.versions.kept`` are removed
   (:func:`~nimbus.master.version_rules.versions_to_prune`). With no worker placed,
   nothing can be judged: an INACTIVE topology (no worker runs) completes at once, an
   ACTIVE one waits for its workers until the deadline (``deactivate`` is refused
   while a switch is under way, :mod:`nimbus.master.lifecycle`).
3. A worker that exits on the new version before its first commit, or a deadline that
   passes first, fails the upgrade: the version is FAILED with the error, and a
   rollback switch (strategy all) begins, to the version that last completed a switch
   (``running``; the switch's ``from`` when that is the failing version itself:
   :meth:`VersionSwitches.rollback_target`). The deadline is ``topology.upgrade.timeout.secs``
   after the switch began, and in a rolling switch after the last worker switched: each
   worker has a timeout of its own. A rollback that fails in turn is not rolled back
   again: the switch ends with its error recorded, logged at ERROR and reported in the
   topology's errors.

Everything is in ZooKeeper (the deadline in epoch seconds): a leader that dies mid-way
leaves the switch to the next leader's :meth:`VersionSwitches.advance`, which completes
it or rolls it back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from nimbus.master.lifecycle import TopologyLifecycle
from nimbus.master.version_rules import (
    KEPT_KEY,
    TIMEOUT_KEY,
    completed_versions,
    kept_count,
    switch_timeout,
    versions_to_prune,
    worker_facts,
)
from nimbus.state.cluster_state import ConcurrentChangeError, Fence
from nimbus.state.cluster_view import ClusterView
from nimbus.state.code_versions import (
    ALL,
    FAILED,
    ROLLBACK,
    ROLLING,
    SWITCHING,
    UPGRADE,
    CodeVersions,
    version_key,
)
from nimbus.state.records import (
    INACTIVE,
    KILLED,
    WORKER_PREFIX,
    Assignment,
    ErrorInfo,
    RecordError,
    StormBase,
)

# The upgrades' logger, where these lines were logged before the switch had a module of
# its own: one logger follows an upgrade from its call to its end, and filters and alerts
# on "nimbus.master.upgrades" keep working.
log = logging.getLogger("nimbus.master.upgrades")

#: Seconds between two looks at the workers while a switch is under way.
TICK_S = 1.0
#: The component under which a switch's failures are reported in ``/errors/<id>``.
ERROR_COMPONENT = "__upgrade"
#: Who a rollback that the leader began on its own is by (``switch["by"]``).
AUTOMATIC = "automatic rollback"
#: The directories :meth:`VersionSwitches.advance` reads, after a barrier.
READS = ("storms", "assignments", "supervisors", "code-versions")


def _index(executor: str) -> int:
    """The index of ``worker-<i>`` (executors sort by it, not as text)."""
    try:
        return int(executor[len(WORKER_PREFIX):])
    except ValueError:
        return 1 << 30


class VersionSwitches:
    """The leader's duty of carrying the switches under way; see the module docstring.

    Built on every nimbus; :meth:`advance` is the leader's, each write fenced.
    ``clock``: epoch seconds (tests pass a fake)."""

    def __init__(self, lifecycle: TopologyLifecycle, view: ClusterView,
                 clock: Callable[[], float] = time.time):
        self._lifecycle = lifecycle
        self._view = view
        self._state = lifecycle.state
        self._elector = lifecycle.elector
        self._conf = lifecycle.conf
        self._clock = clock
        self._last_advance = float("-inf")

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
        now = int(self._clock())
        timeout_s = self._timeout((versions.entry(to) or {}).get("conf", {}))
        rolling = switch["strategy"] == ROLLING
        supervisors = self._view.supervisors()
        placed = sorted(assignment.executor_node_port, key=_index)
        before = set(switch.get("switched", []))
        switched = list(switch.get("switched", []))
        failure = ""
        deadline_passed = now >= switch["deadline_secs"]
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
                log.warning("%s of %s runs version %d without a failure but has committed "
                            "nothing in %ss (no input?): counted as switched", executor,
                            base.storm_name, to, timeout_s)
            elif facts.failures >= 1 and not failure:
                host = assignment.node_host.get(supervisor_id, supervisor_id)
                failure = (f"{executor} on {host}:{port} exited before its first commit "
                           f"({facts.failures} time{'s' if facts.failures > 1 else ''})"
                           + (f": {facts.error}" if facts.error else ""))
        done = [e for e in placed if e in switched]
        newly = [e for e in done if e not in before]
        asked = [e for e in placed if e not in switched and assignment.code_for(e)[0] == to]
        if not failure and rolling and newly and len(done) < len(placed) and \
                not (deadline_passed and asked):
            # A rolling switch gives each worker a timeout of its own: the deadline moves
            # on each time one more worker has switched (a worker already asked to
            # switch whose deadline passed is not let off by another's success).
            switch = {**switch, "deadline_secs": max(switch["deadline_secs"],
                                                     now + timeout_s)}
            deadline_passed = False
        if not failure and deadline_passed and not placed and base.status != INACTIVE:
            failure = (f"no worker was placed to run version {to} within {timeout_s}s "
                       "(topology.upgrade.timeout.secs): no free slot, or no supervisor?")
        elif not failure and deadline_passed and len(done) < len(placed):
            failure = (f"not every worker ran version {to} and committed within "
                       f"{timeout_s}s{' of its turn' if rolling else ''} "
                       f"(topology.upgrade.timeout.secs{', rolling' if rolling else ''}): "
                       f"{len(done)} of {len(placed)} did")
        if failure:
            return self._fail(fence, topology_id, base, versions, node_version, assignment,
                              assignment_version, failure)
        # With no worker placed nothing can be judged: only an INACTIVE topology (which
        # the scheduler gives no worker) completes so, the new version untested. An
        # ACTIVE one waits for its workers (its supervisors back, say) or its deadline.
        if (placed and len(done) == len(placed)) or (not placed and base.status == INACTIVE):
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
        to, now = switch["to"], int(self._clock())
        name = base.storm_name
        target = self.rollback_target(versions)
        if switch["kind"] == UPGRADE and target is not None:
            timeout_s = self._timeout(versions.entry(target)["conf"])
            entries = []
            for entry in versions.versions:
                entry = dict(entry)
                if entry["version"] == to:
                    entry.update(state=FAILED, error=error)
                elif entry["version"] == target:
                    entry.update(state=SWITCHING, error="")
                entries.append(entry)
            new = CodeVersions(versions=entries, running=versions.running, switch={
                "kind": ROLLBACK, "from": to, "to": target, "strategy": ALL,
                "started_secs": now, "deadline_secs": now + timeout_s, "by": AUTOMATIC,
                "switched": []})
            self._state.write_switch(fence, topology_id, new, node_version,
                                     self._settled(assignment, new, target),
                                     assignment_version)
            log.warning("version %d of %s failed before its first commit: %s; rolling back "
                        "to %d", to, name, error, target)
            self._report(topology_id, f"version {to} failed before its first commit: "
                                      f"{error}; rolling back to version {target}")
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

    @staticmethod
    def rollback_target(versions: CodeVersions) -> int | None:
        """The version an automatic rollback of ``versions``' switch goes back to: the
        running one (the last to complete a switch), unless that is the very version
        that failed, then the one the switch started from; None when neither is kept
        (or is the failing version).

        Not simply ``from``: after a ``rollback --to N`` issued during a switch,
        ``from`` is the interrupted switch's target, which never completed one."""
        switch = versions.switch
        to = switch["to"]
        for number in (versions.running, switch["from"]):
            if number != to and versions.entry(number) is not None:
                return number
        return None

    def _complete(self, fence: Fence, topology_id: str, base: StormBase,
                  versions: CodeVersions, node_version: int, assignment: Assignment,
                  assignment_version: int) -> bool:
        switch = versions.switch
        ended = completed_versions(versions)
        self._state.write_switch(fence, topology_id, ended, node_version,
                                 self._settled(assignment, ended, switch["to"]),
                                 assignment_version)
        if not assignment.executor_node_port:
            log.info("%s %s to version %d (inactive, no worker placed: not tested; its "
                     "workers run it once it is activated, and a failure then is not "
                     "rolled back automatically)",
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
        return switch_timeout(topo_conf, self._conf[TIMEOUT_KEY])

    def _kept(self, versions: CodeVersions) -> int:
        return kept_count(versions, self._conf[KEPT_KEY])

    def _doomed(self, versions: CodeVersions) -> list[int]:
        return versions_to_prune(versions, self._kept(versions))

    def _prune(self, fence: Fence, topology_id: str, base: StormBase,
               versions: CodeVersions, node_version: int) -> bool:
        """Remove the versions :func:`~nimbus.master.version_rules.versions_to_prune`
        names: from /code-versions first (CAS, so a nimbus stops needing them before they
        go), then their code everywhere."""
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
                error=message, error_time_secs=int(self._clock()),
                host=self._lifecycle.address.rpartition(":")[0]))
        except Exception as exc:
            log.warning("could not report the switch's error of %s: %s", topology_id, exc)
