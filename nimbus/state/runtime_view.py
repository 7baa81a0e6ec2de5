"""What runs where, as plain dicts: for ``topology-info``, ``errors``, the Thrift reads
(getTopologyInfo, getTopologyView, Storm UI's pages, getClusterInfo's supervisors), ``top``
and the UI's topology page.

Every function only reads. The cluster-wide rows (:func:`supervisor_rows`) come from the
cluster's one read model, a :class:`~nimbus.state.cluster_snapshot.ClusterSnapshot`; one
topology's workers, components and errors (:func:`topology_info`, :func:`errors`) from
nodes no snapshot holds (worker beats with their times, errors, the placement history),
read from ZooKeeper when asked, by any nimbus or a UI with its own client. The records
are those of docs/runtime.md: supervisors' ``SupervisorInfo``, the leader's
``Assignment``, the ``WorkerBeat`` that a supervisor writes for each of its workers and
the components' ``ErrorInfo``. A record this release cannot read (``RecordError``) is
skipped, or shown as a worker without a readable beat: one bad node must not hide the rest
of the cluster.

Shapes (all keys always present):

``supervisor_rows(snapshot)``, sorted by id::

    {"id": str, "host": str, "slots": int, "used_slots": int, "ports": [int],
     "used_ports": [int], "uptime_secs": int, "version": str}

``topology_info(state, topology_id, timeout_s=..., topology_conf=...)`` (None for an
unknown id)::

    {"id": str, "name": str, "status": str, "owner": str, "uptime_secs": int,
     "num_workers": int,                      # wanted (StormBase), not necessarily placed
     "workers": [{"worker": "worker-<i>", "index": int, "supervisor_id": str, "host": str,
                  "port": int, "uptime_secs": int, "state": str, "alive": bool,
                  "beat_age_secs": int | None, "backoff_secs": int, "last_error": str,
                  "restarts": int, "memory_bytes": int, "warm_start": bool,
                  "spark_ui_url": str,         # its Spark UI while it runs, else ""
                  "placements": [PLACEMENT],   # where it has run, newest first
                  "version": int | None,       # the code version it runs (None: unknown)
                  "assigned_version": int,     # the one the leader assigns it
                  "components": {name: COMPONENT}}],           # sorted by index
     "warm_workers": {supervisor_id: {"host", "ready", "starting", "memory_bytes"}},
     "components": {name: {"host_ports": ["host:port"], "batch_id": int | None,
                           "num_input_rows": int, "input_rows_per_second": float,
                           "processed_rows_per_second": float,
                           "progress": PROGRESS | None, "history": [POINT],
                           "history_end_secs": int | None, "reported_by": str | None,
                           "live": bool, "details_cut": bool,
                           "checkpoint": str | None}},
     "errors": ERRORS,
     "code_version": int,                     # the version that runs (1: never upgraded)
     "switch": SWITCH | None,                 # a switch of version under way
     "code_versions": [{"version": int, "state": str, "error": str,
                        "created_secs": int}]}  # kept versions, newest first

    PLACEMENT = {"supervisor_id": str, "host": str, "port": int, "since_secs": int,
                 "until_secs": int}            # until 0: placed there now

Code versions (:mod:`nimbus.state.code_versions`) come from ``/code-versions/<id>``:
``code_version`` is its ``running`` (what the workers run once no switch is under way),
``SWITCH`` its ``switch`` as written there ({"kind": "upgrade" | "rollback", "from",
"to", "strategy", "started_secs", "deadline_secs", "by", "switched": [executor]}), and
``code_versions`` the kept versions' number, state (running, switching, previous, old,
rolled back, failed) and recorded error; a topology never upgraded has version 1 alone,
and an unreadable node shows as that too. A worker's ``version`` is what its supervisor
says it runs (its beat's, when the supervisor says nothing of it), ``assigned_version``
what the leader's assignment wants it to run (they differ while it switches).

A component's ``progress`` (Spark's newest StreamingQueryProgress: sources with offsets,
sink, state operators, watermark, durations) and ``history`` (``POINT = [time_secs,
input_rows_per_second, processed_rows_per_second, batch_duration_ms | None]``, the last
15 minutes, oldest first) are those of :mod:`nimbus.state.beat_progress`, from the beat of
``reported_by`` (the worker running it: a running one first, else the newest beat);
``live`` says whether that worker runs, ``history_end_secs`` is its beat's time on the
same host's clock as the points (the charts end there), and ``details_cut`` that its
supervisor dropped details to keep the beat within its bound. ``checkpoint`` is
``<topology.spark.checkpoint.dir>/<topology-id>/<component>`` when ``topology_conf`` (the
topology's own configuration) names that root (:func:`nimbus.topology_paths.checkpoint_location`,
the worker's own spelling) and the component is a query (it reports Spark's progress);
None otherwise (without that root it is under each supervisor's ``storm.local.dir``, or
its own ``topology.spark.checkpoint.dir``). :func:`set_checkpoints` fills it in an
``info`` that was read without the configuration (by a nimbus, for instance). The
placement history is the leader's (:mod:`nimbus.master.placement_history` writes it).

A worker's ``state`` (starting, running, frozen, restarting or dead) is judged by
:func:`nimbus.state.worker_state.judge` on ZooKeeper's clock; ``alive`` is ``state ==
"running"``: its beat is fresh, within ``timeout_s`` (``nimbus.task.timeout.secs``). A
worker that is not running has an ``uptime_secs`` and ``memory_bytes`` of 0 and its
components keep their last batch id with 0 rows and rates: its last numbers are history,
not what it does now. ``restarts`` is its supervisor's count when the supervisor says
one, else its beat's.

    COMPONENT = {"batch_id": int | None, "num_input_rows": int,
                 "input_rows_per_second": float, "processed_rows_per_second": float}

``errors(state, topology_id)`` is ERRORS: ``{component: [{"error": str, "time_secs": int,
"host": str, "port": int}]}``, each list newest first (by ZooKeeper sequence number, not
by the reporting host's clock), at most 10.
"""

from __future__ import annotations

import time
from typing import Any

from nimbus.state import worker_state
from nimbus.state.beat_progress import checked_history, checked_progress, checked_url
from nimbus.state.cluster_snapshot import ClusterSnapshot
from nimbus.state.cluster_state import MAX_ERRORS_PER_COMPONENT, StormClusterState
from nimbus.state.code_versions import CodeVersions
from nimbus.state.records import (
    WORKER_PREFIX,
    Assignment,
    PlacementHistory,
    RecordError,
    SupervisorInfo,
    WorkerBeat,
)
from nimbus.topology_paths import CHECKPOINT_DIR_KEY, checkpoint_location

# What decoding a record written by another release may raise (TypeError: a required
# field is missing).
UNREADABLE = (RecordError, TypeError)


def supervisor_rows(snapshot: ClusterSnapshot) -> list[dict[str, Any]]:
    """Every live supervisor of ``snapshot`` (sorted by id) with its slots and the slots
    in use (:meth:`ClusterSnapshot.used_ports`: the leader's assignments)."""
    used = snapshot.used_ports()
    out = []
    for supervisor_id, info in sorted(snapshot.supervisors.items()):
        ports = used.get(supervisor_id, [])
        out.append({"id": supervisor_id, "host": info.hostname, "slots": len(info.meta),
                    "used_slots": len(ports), "ports": sorted(info.meta),
                    "used_ports": ports, "uptime_secs": info.uptime_secs,
                    "version": info.version})
    return out


def errors(state: StormClusterState, topology_id: str) -> dict[str, list[dict[str, Any]]]:
    """component -> its kept errors, newest first (see the module docstring)."""
    out = {}
    for component in state.error_components(topology_id):
        kept = state.errors(topology_id, component)[-MAX_ERRORS_PER_COMPONENT:]
        if kept:
            out[component] = [{"error": e.error, "time_secs": e.error_time_secs,
                               "host": e.host, "port": e.port} for e in reversed(kept)]
    return out


def newest_error(state: StormClusterState, topology_id: str) -> str | None:
    """The newest error any component of the topology reported, as
    ``"<component>: <first line>"`` (None if there is none)."""
    found = [(kept[0]["time_secs"], component, kept[0]["error"])
             for component, kept in errors(state, topology_id).items()]
    if not found:
        return None
    _, component, text = max(found)
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{component}: {first}"


def _component_stats(raw: Any) -> dict[str, Any]:
    """A beat's component entry (Spark's lastProgress, or a process's pid) as numbers."""
    raw = raw if isinstance(raw, dict) else {}
    batch = raw.get("batch_id")
    return {"batch_id": batch if isinstance(batch, int) and not isinstance(batch, bool)
            else None,
            "num_input_rows": _number(raw.get("num_input_rows"), int),
            "input_rows_per_second": _number(raw.get("input_rows_per_second"), float),
            "processed_rows_per_second": _number(raw.get("processed_rows_per_second"),
                                                 float)}


def _number(value: Any, kind: type) -> Any:
    # Spark reports NaN-free numbers but a missing or null field is common (no batch yet).
    if isinstance(value, bool) or not isinstance(value, int | float):
        return kind(0)
    return kind(value)


def _worker_index(worker: str) -> int:
    try:
        return int(worker[len(WORKER_PREFIX):])
    except ValueError:
        return -1


def _warm_entry(info: SupervisorInfo) -> dict[str, Any]:
    return {"host": info.hostname, "ready": _number(info.warm_ready, int),
            "starting": _number(info.warm_starting, int),
            "memory_bytes": _number(info.warm_memory_bytes, int)}


def _placement_history(state: StormClusterState, topology_id: str) -> PlacementHistory | None:
    try:
        return state.placement_history(topology_id)[0]
    except UNREADABLE:
        return None   # written by another release: no history rather than no page


def _code_versions(state: StormClusterState, topology_id: str) -> CodeVersions | None:
    try:
        found = state.code_versions(topology_id)
    except UNREADABLE:
        return None   # written by another release: version 1 alone rather than no page
    return found[0] if found is not None else None


def version_facts(versions: CodeVersions | None, launch_secs: int = 0) -> dict[str, Any]:
    """``code_version``, ``switch`` and ``code_versions`` of :func:`topology_info` (see
    the module docstring) from a topology's CodeVersions (None: never upgraded, its
    version 1 submitted at ``launch_secs``)."""
    if versions is None or not versions.versions:
        return {"code_version": 1, "switch": None,
                "code_versions": [{"version": 1, "state": "running", "error": "",
                                   "created_secs": launch_secs}]}
    kept = sorted(versions.versions, key=lambda e: e["version"], reverse=True)
    return {"code_version": versions.running,
            "switch": {**versions.switch,
                       "switched": list(versions.switch.get("switched", []))}
            if versions.switch else None,
            "code_versions": [{"version": e["version"], "state": e["state"],
                               "error": e["error"], "created_secs": e["created_secs"]}
                              for e in kept]}


def worker_version(info: SupervisorInfo | None, topology_id: str, port: int,
                   beat: WorkerBeat | None) -> int | None:
    """The code version the worker of ``topology_id`` on ``port`` runs: its
    supervisor's word (the entry's "version"), else its beat's; None if neither says."""
    entry = info.workers.get(str(port)) if info is not None and isinstance(
        info.workers, dict) else None
    if isinstance(entry, dict) and entry.get("topology_id") == topology_id:
        said = entry.get("version")
        if isinstance(said, int) and not isinstance(said, bool) and said >= 1:
            return said
    if beat is not None and isinstance(beat.code_version, int) and \
            not isinstance(beat.code_version, bool) and beat.code_version >= 1:
        return beat.code_version
    return None


def placements_of(history: PlacementHistory | None, worker: str) -> list[dict[str, Any]]:
    """The placements of ``worker`` in ``history``, newest first (what readers show)."""
    if history is None:
        return []
    return [dict(entry) for entry in reversed(history.workers.get(worker, []))]


def checkpoint_of(topology_conf: dict[str, Any] | None, topology_id: str,
                  component: str) -> str | None:
    """Where ``component``'s query checkpoints, when the topology's own configuration
    names the root (see the module docstring); None otherwise."""
    if not topology_conf or not topology_conf.get(CHECKPOINT_DIR_KEY):
        return None
    return checkpoint_location(topology_conf, topology_id, component)


def _details(raw: Any) -> dict[str, Any]:
    """The progress, history and whether details were cut, of a beat's component entry,
    checked again (a beat may come from another release)."""
    raw = raw if isinstance(raw, dict) else {}
    return {"progress": checked_progress(raw.get("progress")),
            "history": checked_history(raw.get("history")),
            "details_cut": raw.get("details_cut") is True}


def set_checkpoints(info: dict[str, Any],
                    topology_conf: dict[str, Any] | None) -> dict[str, Any]:
    """Each component's ``checkpoint`` in ``info`` (a :func:`topology_info`, read here or
    by a nimbus) from the topology's own configuration, in place (and returned): the
    location (:func:`checkpoint_of`) for a query (a component that reports Spark's
    progress), None for anything else."""
    for name, component in info["components"].items():
        component["checkpoint"] = checkpoint_of(topology_conf, info["id"], name) \
            if component.get("progress") is not None else None
    return info


def topology_info(state: StormClusterState, topology_id: str, now: float | None = None,
                  timeout_s: float = worker_state.DEFAULT_TIMEOUT_S,
                  topology_conf: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The topology's workers, components and errors; None if no topology has that id.

    ``now`` (default: this host's clock) is what uptimes are measured against;
    ``timeout_s`` (``nimbus.task.timeout.secs``) is how old a worker's beat may be, by
    ZooKeeper's clock, for the worker to count as running; ``topology_conf`` (the
    topology's own configuration, as getTopologyConf gives it) is where its components'
    checkpoint locations come from (none without it).
    """
    base = state.storm_base(topology_id)
    if base is None:
        return None
    now = time.time() if now is None else now
    found = state.read_with_stat(Assignment, state.path("assignments", topology_id))
    assignment = (found[0] if found is not None else None) or Assignment(master_code_dir="")
    assignment_ms = found[1].mtime if found is not None else 0
    slots = sorted(((str(w), str(sp[0]), int(sp[1]))
                    for w, sp in assignment.executor_node_port.items()),
                   key=lambda slot: _worker_index(slot[0]))
    # Every node whose mtime is judged is read before the first judgement: the newest
    # of their mtimes is the reference "now" (worker_state's module docstring).
    supervisors = {sid: state.read_with_stat(SupervisorInfo, state.path("supervisors", sid))
                   for sid in sorted({sid for _w, sid, _p in slots})}
    beats = {(sid, port): state.read_with_stat(
        WorkerBeat, state.path("workerbeats", topology_id, f"{sid}-{port}"))
        for _w, sid, port in slots}
    reference_ms = max([assignment_ms, *(got[1].mtime for got in
                                         [*supervisors.values(), *beats.values()]
                                         if got is not None)])
    history = _placement_history(state, topology_id)
    workers = []
    # component -> [(running, beat mtime, worker, beat time, details)]: who reports it
    reporters: dict[str, list[tuple[bool, int, str, int, dict[str, Any]]]] = {}
    for worker, supervisor_id, port in slots:
        sup = supervisors[supervisor_id]
        got = beats[(supervisor_id, port)]
        beat = got[0] if got is not None else None
        judged = worker_state.judge(
            supervisor_id=supervisor_id,
            supervisor=(sup[0], sup[1].mtime) if sup is not None else None,
            said=worker_state.statement(sup[0] if sup else None, topology_id, port),
            beat_mtime_ms=got[1].mtime if got is not None else None,
            assignment_mtime_ms=assignment_ms, reference_ms=reference_ms,
            timeout_s=timeout_s)
        started = assignment.executor_start_time_secs.get(worker)
        reported = beat.components if beat and isinstance(beat.components, dict) else {}
        components = {str(name): _component_stats(stats)
                      for name, stats in sorted(reported.items())}
        if not judged.alive:  # its last numbers are history, not what it does now
            components = {name: {**_component_stats({}), "batch_id": stats["batch_id"]}
                          for name, stats in components.items()}
        for name, stats in sorted(reported.items()):
            reporters.setdefault(str(name), []).append(
                (judged.alive, got[1].mtime if got is not None else 0, worker,
                 _number(beat.time_secs, int) if beat else 0, _details(stats)))
        restarts = judged.restarts if judged.restarts is not None else (
            _number(beat.restarts, int) if beat else 0)
        workers.append({
            "worker": worker, "index": _worker_index(worker),
            "supervisor_id": supervisor_id,
            "host": assignment.node_host.get(supervisor_id, supervisor_id), "port": port,
            "uptime_secs": max(0, int(now - started)) if started is not None
            and judged.alive else 0,
            "state": judged.state, "alive": judged.alive,
            "beat_age_secs": judged.beat_age_secs, "backoff_secs": judged.backoff_secs,
            "last_error": judged.last_error, "restarts": restarts,
            "memory_bytes": _number(beat.memory_bytes, int) if beat and judged.alive else 0,
            "warm_start": beat.warm_start is True if beat else False,
            "spark_ui_url": checked_url(beat.spark_ui_url) if beat and judged.alive else "",
            "placements": placements_of(history, worker),
            "version": worker_version(sup[0] if sup is not None else None, topology_id,
                                      port, beat),
            "assigned_version": assignment.code_for(worker)[0],
            "components": components})
    components: dict[str, dict[str, Any]] = {}
    for w in workers:
        for name, stats in w["components"].items():
            agg = components.setdefault(name, {
                "host_ports": [], "batch_id": None, "num_input_rows": 0,
                "input_rows_per_second": 0.0, "processed_rows_per_second": 0.0})
            agg["host_ports"].append(f"{w['host']}:{w['port']}")
            if stats["batch_id"] is not None:
                agg["batch_id"] = max(stats["batch_id"], agg["batch_id"] or 0)
            # A process topology runs its command on every worker: rates add up.
            for key in ("num_input_rows", "input_rows_per_second",
                        "processed_rows_per_second"):
                agg[key] += stats[key]
    for name, agg in components.items():
        # The newest details of a running worker, else of the newest beat.
        live, _mtime, worker, beat_time, details = max(reporters[name],
                                                       key=lambda r: (r[0], r[1]))
        agg.update({"progress": details["progress"], "history": details["history"],
                    "history_end_secs": beat_time or None,
                    "reported_by": worker, "live": live,
                    "details_cut": details["details_cut"], "checkpoint": None})
    return set_checkpoints({
        "id": topology_id, "name": base.storm_name, "status": base.status,
        "owner": base.owner, "uptime_secs": max(0, int(now - base.launch_time_secs)),
        "num_workers": base.num_workers, "workers": workers,
        "warm_workers": {sid: _warm_entry(got[0]) for sid, got in supervisors.items()
                         if got is not None and got[0] is not None},
        "components": dict(sorted(components.items())),
        "errors": errors(state, topology_id),
        **version_facts(_code_versions(state, topology_id),
                        _number(base.launch_time_secs, int))}, topology_conf)
