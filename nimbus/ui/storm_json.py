"""Storm UI's REST shapes (field names of storm-webapp's UIHelpers and the Storm UI REST
API document), built from a :class:`nimbus.state.cluster_snapshot.ClusterSnapshot`.

nimbus-ha has no resource-aware scheduler, tuple acking or latencies: those fields are
present (so existing scripts find them) with zero values, and
``schedulerDisplayResource`` is false. One executor is one worker (as in getClusterInfo),
so ``tasksTotal`` = ``executorsTotal`` = ``workersTotal`` = workers placed.
"""

from __future__ import annotations

import time
from typing import Any

from nimbus import __version__
from nimbus.config import Config
from nimbus.state.cluster_snapshot import ClusterSnapshot
from nimbus.ui.local_nimbus import LocalNimbus
from nimbus.ui.pretty import pretty_uptime
from nimbus.ui.worker_logs import worker_log_link

LEADER, NOT_LEADER, OFFLINE = "Leader", "Not a Leader", "Offline"
ALL_TIME = ":all-time"


def cluster_summary(snap: ClusterSnapshot) -> dict[str, Any]:
    """GET /api/v1/cluster/summary."""
    used = snap.used_ports()
    total = sum(len(info.meta) for info in snap.supervisors.values())
    used_n = sum(len(used.get(sid, [])) for sid in snap.supervisors)
    executors = sum(snap.placed_workers(t) for t in snap.storms)
    return {"stormVersion": __version__, "supervisors": len(snap.supervisors),
            "topologies": len(snap.storms), "slotsTotal": total, "slotsUsed": used_n,
            "slotsFree": max(0, total - used_n), "executorsTotal": executors,
            "tasksTotal": executors, "schedulerDisplayResource": False,
            "totalMem": 0.0, "totalCpu": 0.0, "availMem": 0.0, "availCpu": 0.0,
            "memAssignedPercentUtil": 0.0, "cpuAssignedPercentUtil": 0.0}


def nimbus_status(snap: ClusterSnapshot, address: str) -> str:
    return LEADER if address == snap.leader else NOT_LEADER


def nimbus_summary(snap: ClusterSnapshot, conf: Config, now: float | None = None,
                   local: LocalNimbus | None = None) -> dict[str, Any]:
    """GET /api/v1/nimbus/summary: registered nimbuses, then seeds not registered
    (``Offline``: down, or not yet up). nimbus-ha adds ``dutyCycleAgeSecs`` to the
    leader's row when this UI runs inside the leader (``local``; see
    nimbus.ui.local_nimbus)."""
    now = time.time() if now is None else now
    out = []
    seen = set()
    for info in sorted(snap.nimbuses, key=lambda n: (n.host, n.port)):
        address = f"{info.host}:{info.port}"
        seen.add(address)
        up = max(0, int(now - info.start_time_secs))
        status = nimbus_status(snap, address)
        out.append({"host": info.host, "port": info.port,
                    "status": status, "version": info.version,
                    "nimbusUpTime": pretty_uptime(up), "nimbusUpTimeSeconds": up,
                    "nimbusLogLink": "",
                    **(local.duty_cycle_age_field(address, status == LEADER)
                       if local is not None else {})})
    for seed in conf.seeds:
        if str(seed) not in seen:
            seen.add(str(seed))
            out.append({"host": seed.host, "port": seed.port, "status": OFFLINE,
                        "version": "", "nimbusUpTime": pretty_uptime(0),
                        "nimbusUpTimeSeconds": 0, "nimbusLogLink": ""})
    return {"nimbuses": out}


def supervisor_summary(snap: ClusterSnapshot) -> dict[str, Any]:
    """GET /api/v1/supervisor/summary (used slots from the leader's assignments)."""
    used = snap.used_ports()
    return {"supervisors": [
        {"id": sid, "host": info.hostname, "uptime": pretty_uptime(info.uptime_secs),
         "uptimeSeconds": info.uptime_secs, "slotsTotal": len(info.meta),
         "slotsUsed": len(used.get(sid, [])), "totalMem": 0.0, "totalCpu": 0.0,
         "usedMem": 0.0, "usedCpu": 0.0, "version": info.version,
         # Warm workers (supervisor.warm.workers): nimbus-ha's, not Storm's.
         "warmReady": info.warm_ready, "warmStarting": info.warm_starting,
         "warmMemoryBytes": info.warm_memory_bytes}
        for sid, info in sorted(snap.supervisors.items())],
        "schedulerDisplayResource": False}


def topology_entry(snap: ClusterSnapshot, topology_id: str, now: float) -> dict[str, Any]:
    base = snap.storms[topology_id]
    up = max(0, int(now - base.launch_time_secs))
    placed = snap.placed_workers(topology_id)
    return {"id": topology_id, "name": base.storm_name, "status": base.status,
            "uptime": pretty_uptime(up), "uptimeSeconds": up, "tasksTotal": placed,
            "workersTotal": placed, "executorsTotal": placed,
            "replicationCount": max(len(snap.replica_hosts.get(topology_id, [])),
                                    snap.replication.get(topology_id, 0)),
            "requestedMemOnHeap": 0.0, "requestedMemOffHeap": 0.0,
            "requestedTotalMem": 0.0, "requestedCpu": 0.0, "assignedMemOnHeap": 0.0,
            "assignedMemOffHeap": 0.0, "assignedTotalMem": 0.0, "assignedCpu": 0.0}


def topology_summary(snap: ClusterSnapshot, now: float | None = None) -> dict[str, Any]:
    """GET /api/v1/topology/summary, sorted by name then id."""
    now = time.time() if now is None else now
    ids = sorted(snap.storms, key=lambda t: (snap.storms[t].storm_name, t))
    return {"topologies": [topology_entry(snap, t, now) for t in ids],
            "schedulerDisplayResource": False}


def _component_error(errors: list[dict[str, Any]], now: float) -> dict[str, Any]:
    newest = errors[0] if errors else None
    if newest is None:
        return {"lastError": "", "errorHost": "", "errorPort": None, "errorTime": None,
                "errorLapsedSecs": None, "errorWorkerLogLink": ""}
    return {"lastError": newest["error"], "errorHost": newest["host"],
            "errorPort": newest["port"] or None, "errorTime": newest["time_secs"],
            "errorLapsedSecs": max(0, int(now - newest["time_secs"])),
            "errorWorkerLogLink": ""}


def topology_detail(snap: ClusterSnapshot, info: dict[str, Any], topology_conf: dict[str, Any],
                    default_msg_timeout: int, now: float | None = None) -> dict[str, Any]:
    """GET /api/v1/topology/:id from runtime_view.topology_info's ``info``.

    Every component of a pipeline (or a process topology's ``main``) is listed as a
    bolt; ``emitted``/``executed``/``transferred`` are its input rows of the last batch.
    nimbus-ha adds ``components`` (runtime_view's per-component numbers, with rates),
    ``errors`` (every kept error, newest first per component), and to each worker its
    ``state``, ``alive``, ``beatAgeSecs``, ``backoffSecs``, ``lastError`` and
    ``restarts`` (nimbus/state/worker_state.py; uptime 0 while it is not running).
    """
    now = time.time() if now is None else now
    entry = topology_entry(snap, info["id"], now) if info["id"] in snap.storms else None
    placed = len(info["workers"])
    rows = sum(c["num_input_rows"] for c in info["components"].values())
    workers = [{"supervisorId": w["supervisor_id"], "host": w["host"], "port": w["port"],
                "topologyId": info["id"], "topologyName": info["name"],
                "executorsTotal": 1, "assignedMemOnHeap": 0.0, "assignedMemOffHeap": 0.0,
                "assignedCpu": 0.0,
                "componentNumTasks": {c: 1 for c in w["components"]},
                "uptime": pretty_uptime(w["uptime_secs"]), "uptimeSeconds": w["uptime_secs"],
                "workerLogLink": worker_log_link(snap, w["supervisor_id"], info["id"],
                                                 w["port"]),
                # nimbus-ha's (nimbus/state/worker_state.py): whether it runs, and why not
                "state": w["state"], "alive": w["alive"], "beatAgeSecs": w["beat_age_secs"],
                "backoffSecs": w["backoff_secs"], "lastError": w["last_error"],
                "restarts": w["restarts"]} for w in info["workers"]]
    bolts = []
    for name, comp in info["components"].items():
        n = len(comp["host_ports"])
        bolts.append({"boltId": name, "capacity": "0.000", "processLatency": "0.000",
                      "executeLatency": "0.000", "executors": n, "tasks": n,
                      "acked": 0, "failed": 0, "emitted": comp["num_input_rows"],
                      "transferred": comp["num_input_rows"],
                      "executed": comp["num_input_rows"],
                      **_component_error(info["errors"].get(name, []), now),
                      "requestedMemOnHeap": 0.0, "requestedMemOffHeap": 0.0,
                      "requestedCpu": 0.0})
    msg_timeout = topology_conf.get("topology.message.timeout.secs", default_msg_timeout)
    return {"id": info["id"], "name": info["name"], "status": info["status"],
            "uptime": pretty_uptime(info["uptime_secs"]),
            "uptimeSeconds": info["uptime_secs"], "tasksTotal": placed,
            "workersTotal": placed, "executorsTotal": placed,
            "msgTimeout": msg_timeout if isinstance(msg_timeout, int) else
            default_msg_timeout,
            "window": ALL_TIME, "windowHint": "All time", "schedulerDisplayResource": False,
            "replicationCount": entry["replicationCount"] if entry else 0,
            "debug": False, "samplingPct": 10.0,
            "assignedMemOnHeap": 0.0, "assignedMemOffHeap": 0.0, "assignedTotalMem": 0.0,
            "assignedCpu": 0.0, "requestedMemOnHeap": 0.0, "requestedMemOffHeap": 0.0,
            "requestedCpu": 0.0,
            "topologyStats": [{"windowPretty": "All time", "window": ALL_TIME,
                               "emitted": rows, "transferred": rows,
                               "completeLatency": "0.000", "acked": 0, "failed": 0}],
            "workers": workers, "spouts": [], "bolts": bolts,
            "configuration": topology_conf,
            "components": info["components"], "errors": info["errors"]}


def operation(name: str, topology_id: str) -> dict[str, Any]:
    """The answer of a successful POST action, as Storm gives it."""
    return {"topologyOperation": name, "topologyId": topology_id, "status": "success"}
