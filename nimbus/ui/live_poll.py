"""The dashboard's live numbers, read from ZooKeeper: what no snapshot holds.

Worker heartbeats (records per second, restarts) and each worker's state (judged with
its supervisor's node: nimbus/state/worker_state.py), and the newest error of each
topology. Nothing watches those nodes: the UI polls them while the dashboard is open
(:mod:`nimbus.ui.reader`), in one round of pipelined reads (:mod:`nimbus.ui.zk_reads`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient

from nimbus.state import worker_state
from nimbus.state.cluster_snapshot import ClusterSnapshot
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.records import ErrorInfo, SupervisorInfo, WorkerBeat
from nimbus.ui.zk_reads import children_all, decode, get_all, get_all_with_stat

#: The newest error's text is cut to this many characters.
ERROR_CHARS = 2000


@dataclass
class WorkerNumbers:
    """Per topology id: records per second of its running workers, restarts, and the
    state of each of its placed workers."""

    rates: dict[str, float] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    states: dict[str, list[str]] = field(default_factory=dict)


def poll_workers(zk: KazooClient, state: StormClusterState, snap: ClusterSnapshot,
                 timeout_s: float) -> WorkerNumbers:
    """The numbers of every worker the snapshot's assignments place. ``timeout_s``
    (``nimbus.task.timeout.secs``): how old a beat may be for its worker to run."""
    slots: list[tuple[str, str, int]] = []   # (topology, supervisor, port)
    for topology_id, assignment in snap.assignments.items():
        for sid, port in assignment.executor_node_port.values():
            slots.append((topology_id, str(sid), int(port)))
    supervisor_ids = sorted({sid for _t, sid, _p in slots})
    topology_ids = sorted(snap.assignments)
    # The beats, their supervisors' nodes and the assignments, with their stats, in
    # one round of pipelined reads: the workers are judged as topology-info judges
    # them, and the newest mtime among these nodes is "now" (worker_state).
    got = get_all_with_stat(
        zk, [state.path("workerbeats", t, f"{sid}-{port}") for t, sid, port in slots]
        + [state.path("supervisors", sid) for sid in supervisor_ids]
        + [state.path("assignments", t) for t in topology_ids])
    beats = got[:len(slots)]
    sups = {sid: (decode(SupervisorInfo, g[0]), g[1].mtime) if g is not None else None
            for sid, g in zip(supervisor_ids, got[len(slots):len(slots) + len(
                supervisor_ids)], strict=True)}
    assigned_ms = {t: g[1].mtime if g is not None else 0 for t, g in zip(
        topology_ids, got[len(slots) + len(supervisor_ids):], strict=True)}
    reference_ms = max((g[1].mtime for g in got if g is not None), default=0)
    out = WorkerNumbers()
    for (topology_id, sid, port), found in zip(slots, beats, strict=True):
        sup = sups[sid]
        judged = worker_state.judge(
            supervisor_id=sid, supervisor=sup,
            said=worker_state.statement(sup[0] if sup else None, topology_id, port),
            beat_mtime_ms=found[1].mtime if found is not None else None,
            assignment_mtime_ms=assigned_ms[topology_id], reference_ms=reference_ms,
            timeout_s=timeout_s)
        out.states.setdefault(topology_id, []).append(judged.state)
        beat = decode(WorkerBeat, found[0]) if found is not None else None
        counted = judged.restarts if judged.restarts is not None else (
            _int(beat.restarts) if beat is not None else 0)
        out.restarts[topology_id] = out.restarts.get(topology_id, 0) + counted
        if beat is None or not judged.alive:
            continue  # a worker that does not run processes nothing
        comps = beat.components if isinstance(beat.components, dict) else {}
        out.rates[topology_id] = out.rates.get(topology_id, 0.0) + sum(
            _float(c.get("processed_rows_per_second")) for c in comps.values()
            if isinstance(c, dict))
    return out


def poll_errors(zk: KazooClient, state: StormClusterState,
                topology_ids: list[str]) -> dict[str, tuple[dict[str, Any] | None, int]]:
    """id -> (newest error as a dict or None, number of errors kept): the dict has
    ``component``, ``error`` (its first :data:`ERROR_CHARS` characters), ``time``,
    ``host`` and ``port``."""
    comps = children_all(zk, [state.path("errors", t) for t in topology_ids])
    pairs = [(t, c) for t, cs in zip(topology_ids, comps, strict=True) for c in cs]
    kept = children_all(zk, [state.path("errors", t, c) for t, c in pairs])
    newest_paths = [(t, c, state.path("errors", t, c, names[-1]))
                    for (t, c), names in zip(pairs, kept, strict=True) if names]
    counts: dict[str, int] = {}
    for (t, _c), names in zip(pairs, kept, strict=True):
        counts[t] = counts.get(t, 0) + len(names)
    data = get_all(zk, [p for _, _, p in newest_paths])
    out: dict[str, tuple[dict[str, Any] | None, int]] = {
        t: (None, n) for t, n in counts.items()}
    for (t, c, _p), raw in zip(newest_paths, data, strict=True):
        err = decode(ErrorInfo, raw)
        if err is None:
            continue
        current = out[t][0]
        if current is None or err.error_time_secs >= current["time"]:
            out[t] = ({"component": c, "error": err.error[:ERROR_CHARS],
                       "time": err.error_time_secs, "host": err.host,
                       "port": err.port}, counts[t])
    return out


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    return float(value)
