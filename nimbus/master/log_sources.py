"""Where a topology's worker logs can be read: ``nimbus-ha logs`` asks a nimbus
(getLogSources, nimbus/thrift/nimbus_ha.thrift), then each supervisor's logviewer.

A worker's log stays on the host that ran it after its work moves away (for
``supervisor.worker.log.retention.hours``), so every live supervisor with a logviewer is a
source, not only those the topology is assigned to now; those it is assigned to come
first. Shape::

    {"topology_id": str,
     "sources": [{"supervisor_id": str, "host": str, "port": int, "https": bool,
                  "assigned_ports": [int],
                  "assigned_workers": {"<port>": int}}]}   # assigned first, then by id

``port`` is the logviewer's; ``assigned_workers`` says which worker (``worker-<i>``) the
topology's assignment places on each of the supervisor's slots now
(``nimbus-ha logs --worker N``).
"""

from __future__ import annotations

from typing import Any

from nimbus.state.cluster_state import StormClusterState
from nimbus.state.records import WORKER_PREFIX, RecordError

UNREADABLE = (RecordError, TypeError)


def log_sources(state: StormClusterState, topology_id: str) -> dict[str, Any]:
    """The logviewers that may hold ``topology_id``'s worker logs (module docstring)."""
    assigned: dict[str, dict[int, int]] = {}   # supervisor -> {port: worker index}
    try:
        assignment = state.assignment_info(topology_id)
    except UNREADABLE:
        assignment = None
    if assignment is not None:
        for executor, slot in assignment.executor_node_port.items():
            index = executor.removeprefix(WORKER_PREFIX)
            assigned.setdefault(str(slot[0]), {})[int(slot[1])] = \
                int(index) if index.isdigit() else -1
    sources = []
    for supervisor_id in state.supervisors():
        try:
            info = state.supervisor_info(supervisor_id)
        except UNREADABLE:
            continue
        if info is None or not info.logviewer_port:
            continue
        slots = assigned.get(supervisor_id, {})
        sources.append({"supervisor_id": supervisor_id, "host": info.hostname,
                        "port": int(info.logviewer_port), "https": bool(info.logviewer_https),
                        "assigned_ports": sorted(slots),
                        "assigned_workers": {str(port): index
                                             for port, index in sorted(slots.items())}})
    sources.sort(key=lambda s: (not s["assigned_ports"], s["supervisor_id"]))
    return {"topology_id": topology_id, "sources": sources}
