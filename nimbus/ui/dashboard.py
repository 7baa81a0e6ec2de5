"""The dashboard's one request (GET /api/v1/ui/dashboard): everything the page draws.

Not a Storm path: Storm's UI makes a request per table; one request per refresh keeps
the cost of an open page low (the answer is built once per change and second).
"""

from __future__ import annotations

from typing import Any

from nimbus.config import Config
from nimbus.redaction import mask
from nimbus.state.cluster_snapshot import ClusterSnapshot
from nimbus.state.records import KILLED
from nimbus.state.worker_state import count_states
from nimbus.ui import storm_json
from nimbus.ui.local_nimbus import LocalNimbus
from nimbus.ui.reader import UIReader

TIMELINE_SHOWN = 50
# A topology's own numbers (Storm's getTopologyPageInfo): shown only to who may read it.
PRIVATE_FIELDS = {"workersAlive": None, "workerStates": None, "recordsPerSecond": None,
                  "history": [], "restarts": None, "newestError": None, "errorCount": 0}


def restrict_topology(entry: dict[str, Any], may_read: bool,
                      may_change: bool) -> dict[str, Any]:
    """A dashboard topology row for one caller: its summary (Storm's getClusterInfo,
    open to every caller) always, its own numbers and errors only if ``may_read``."""
    out = {**entry, "mayRead": may_read, "mayChange": may_change}
    if not may_read:
        out.update(PRIVATE_FIELDS)
    return out


def code_completeness(snap: ClusterSnapshot) -> dict[str, tuple[int, int]]:
    """nimbus host:port -> (live topologies whose code it holds, live topologies).

    "Holds" means it registered a complete replica under /code-distributor/<id>
    (host-based distributors: localfs, torrent); KILLED topologies do not count.
    """
    live = [t for t, base in snap.storms.items() if base.status != KILLED]
    out = {}
    for info in snap.nimbuses:
        address = f"{info.host}:{info.port}"
        held = sum(1 for t in live if address in snap.replica_hosts.get(t, []))
        out[address] = (held, len(live))
    return out


def dashboard_data(reader: UIReader, snap: ClusterSnapshot, conf: Config, now: float,
                   local: LocalNimbus | None = None) -> dict[str, Any]:
    """The dashboard's JSON (see nimbus/ui/static/dashboard.js for its use); ``local``:
    the nimbus this UI runs inside, if any (its duty-cycle age while it leads)."""
    completeness = code_completeness(snap)
    nimbuses = []
    for entry in storm_json.nimbus_summary(snap, conf, now, local)["nimbuses"]:
        address = f"{entry['host']}:{entry['port']}"
        held, live = completeness.get(address, (0, 0))
        nimbuses.append({**entry, "address": address, "codeHeld": held, "codeLive": live})
    topologies = []
    for entry in storm_json.topology_summary(snap, now)["topologies"]:
        topology_id = entry["id"]
        live = reader.live(topology_id)
        newest = live.newest_error
        if newest is not None and "error" in newest:  # worker text: mask known secrets
            newest = {**newest, "error": mask(str(newest["error"]))}
        topologies.append({
            "id": topology_id, "name": entry["name"], "status": entry["status"],
            "uptime": entry["uptime"], "workersTotal": entry["workersTotal"],
            "workersWanted": snap.storms[topology_id].num_workers,
            # Running workers (a fresh beat), and how many are in each state
            # (nimbus/state/worker_state.py): the rule topology-info and top follow.
            "workersAlive": live.alive_workers,
            "workerStates": dict(live.worker_states) or count_states([]),
            "replicationCount": entry["replicationCount"],
            "replicationMin": reader.min_replication(topology_id),
            "recordsPerSecond": live.records_per_second, "history": list(live.history),
            "restarts": live.restarts, "newestError": newest,
            "errorCount": live.error_count})
    events = reader.timeline.events()[-TIMELINE_SHOWN:]
    return {"generatedAt": now, "leader": snap.leader,
            "cluster": storm_json.cluster_summary(snap),
            "nimbuses": nimbuses,
            "supervisors": storm_json.supervisor_summary(snap)["supervisors"],
            "topologies": topologies, "timeline": list(reversed(events))}
