"""One row per live topology, as ``nimbus-ha top`` shows them: read from ZooKeeper by a
nimbus (getTopologyRows, nimbus/thrift/nimbus_ha.thrift) and sent to ``top`` as JSON.

The topologies are those of the nimbus's summary (its
:class:`~nimbus.state.cluster_snapshot.ClusterSnapshot`); their numbers are those of
``topology-info`` (:func:`nimbus.state.runtime_view.topology_info`), read when asked:
workers running (a fresh beat, nimbus/state/worker_state.py) of those wanted, rates summed
over the running workers, the last batch id and the newest error's first line.
"""

from __future__ import annotations

from typing import Any

from nimbus.state import runtime_view, worker_state
from nimbus.state.cluster_snapshot import ClusterSnapshot
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.records import RecordError

#: The newest error is cut to this many characters (its first line only).
ERROR_WIDTH = 60


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= ERROR_WIDTH else line[:ERROR_WIDTH - 3] + "..."


def row_of(info: dict[str, Any]) -> dict[str, Any]:
    """The row of one topology from its ``runtime_view.topology_info``: the keys
    ``name``, ``id``, ``status``, ``workers_alive`` (running), ``workers_wanted``,
    ``worker_states`` ({state: count}), ``restarts``, ``input_rows_per_second``,
    ``processed_rows_per_second``, ``batch_id`` (None before the first batch),
    ``newest_error`` ("component: first line", or ""), ``newest_error_detail`` (None, or
    ``{"component", "error" (its first 2,000 characters), "time", "host", "port"}``: what
    the dashboard shows) and ``error_count`` (errors kept, all components)."""
    components = info["components"].values()
    batches = [c["batch_id"] for c in components if c["batch_id"] is not None]
    newest: tuple[int, str] | None = None
    detail: dict[str, Any] | None = None
    for component, kept in info["errors"].items():
        if kept and (newest is None or kept[0]["time_secs"] > newest[0]):
            newest = (kept[0]["time_secs"], f"{component}: {_first_line(kept[0]['error'])}")
            detail = {"component": component, "error": kept[0]["error"][:2000],
                      "time": kept[0]["time_secs"], "host": kept[0]["host"],
                      "port": kept[0]["port"]}
    return {
        "name": info["name"], "id": info["id"], "status": info["status"],
        "workers_alive": sum(1 for w in info["workers"] if w["alive"]),
        "workers_wanted": info["num_workers"],
        "worker_states": worker_state.count_states([w["state"] for w in info["workers"]]),
        "restarts": sum(w["restarts"] for w in info["workers"]),
        "input_rows_per_second": sum(c["input_rows_per_second"] for c in components),
        "processed_rows_per_second": sum(c["processed_rows_per_second"] for c in components),
        "batch_id": max(batches) if batches else None,
        "newest_error": newest[1] if newest else "", "newest_error_detail": detail,
        "error_count": sum(len(kept) for kept in info["errors"].values())}


def topology_rows(state: StormClusterState, snapshot: ClusterSnapshot, may_read: Any = None,
                  timeout_s: float = worker_state.DEFAULT_TIMEOUT_S) -> list[dict[str, Any]]:
    """One row (:func:`row_of`) per topology of ``snapshot``, read from ``state`` now,
    sorted by name; with ``may_read`` (topology id -> bool), only the topologies it
    allows. ``timeout_s``: ``nimbus.task.timeout.secs``, as topology-info judges
    workers."""
    rows = []
    for topology_id in sorted(snapshot.storms):
        if may_read is not None and not may_read(topology_id):
            continue
        try:
            info = runtime_view.topology_info(state, topology_id, timeout_s=timeout_s)
        except RecordError:
            continue  # a StormBase this release cannot read: the state logs it
        if info is None:  # removed since the listing
            continue
        rows.append(row_of(info))
    return sorted(rows, key=lambda r: (r["name"], r["id"]))
