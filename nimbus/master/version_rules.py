"""The rules of code versions, as data: which code keys a nimbus must hold, which versions
the leader prunes, the states of the versions once a switch ends, the settings a version
runs its switch with, and what a supervisor's heartbeat says of a worker's version.

Nothing here writes: the leader's switch (:mod:`nimbus.master.version_switches`) and the
operator's calls (:mod:`nimbus.master.upgrades`) apply these rules, and the code sync
(:mod:`nimbus.master.code_sync`) fetches what :func:`required_code_keys` names. The
record they read, ``/code-versions/<id>`` with its states and code keys, is
:mod:`nimbus.state.code_versions`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import NoNodeError

from nimbus.state.cluster_state import StormClusterState
from nimbus.state.cluster_view import ClusterView
from nimbus.state.code_versions import (
    FAILED,
    OLD,
    PREVIOUS,
    ROLLBACK,
    ROLLED_BACK,
    RUNNING,
    SWITCHING,
    CodeVersions,
    is_version_key,
    topology_of,
)
from nimbus.state.records import RecordError, SupervisorInfo

#: How many versions a topology keeps (its running version's conf, else the cluster's).
KEPT_KEY = "topology.code.versions.kept"
#: How long a switch may take before it is rolled back (its target's conf, else the
#: cluster's).
TIMEOUT_KEY = "topology.upgrade.timeout.secs"


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


def view_code_keys_of(view: ClusterView, topology_id: str) -> frozenset[str]:
    """:func:`required_code_keys` of one live topology, read from a view's memory (a
    lookup, and a pass over the code nodes only when its /code-versions is unreadable)."""
    try:
        got = view.code_versions(topology_id)
    except RecordError:
        return frozenset([topology_id, *(
            k for k in view.code_topologies()
            if is_version_key(k) and topology_of(k) == topology_id)])
    return frozenset(code_keys(topology_id, got[0] if got is not None else None))


def view_code_keys(view: ClusterView, live: Iterable[str]) -> set[str]:
    """:func:`required_code_keys`, read from a view's memory."""
    live = set(live)
    upgraded = set(view.upgraded_topologies())
    keys: set[str] = live - upgraded  # version 1 only: the key is the id (a set operation)
    unreadable = set()
    for topology_id in live & upgraded:
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


# -- the settings of a version, and the pruning --------------------------------------------

def switch_timeout(topo_conf: dict[str, Any], default: Any) -> int:
    """``topology.upgrade.timeout.secs`` of a version's conf; ``default`` (the cluster's)
    when the conf has none, or no number >= 1."""
    value = topo_conf.get(TIMEOUT_KEY, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return int(default)
    return value


def kept_count(versions: CodeVersions, default: Any) -> int:
    """``topology.code.versions.kept`` of the running version's conf; ``default`` (the
    cluster's) when the conf has none, or no number >= 1."""
    entry = versions.entry(versions.running)
    value = (entry["conf"] if entry else {}).get(KEPT_KEY, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return int(default)
    return value


def versions_to_prune(versions: CodeVersions, kept: int) -> list[int]:
    """The versions to prune, newest first: beyond the newest ``kept``, never the running
    one, a PREVIOUS one (the rollback target), nor a switch's ``from`` or ``to``; none
    while a switch is under way."""
    if versions.switch:
        return []
    numbers = sorted((e["version"] for e in versions.versions), reverse=True)
    keep = set(numbers[:kept]) | {versions.running} | {
        e["version"] for e in versions.versions if e["state"] == PREVIOUS}
    return [n for n in numbers if n not in keep]
