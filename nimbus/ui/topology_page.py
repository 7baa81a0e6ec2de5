"""The topology page's data: what ``GET /api/v1/topology/:id/page`` and Storm UI's
``GET /api/v1/topology/:id/component/:component`` answer, built from
:func:`nimbus.state.runtime_view.topology_info`'s dict (read from ZooKeeper by this UI, or
from a nimbus: nothing here reads anything).

``/page`` is nimbus-ha's extension, one request per refresh of the page
(nimbus/ui/static/topology.js): the ``topology_info`` dict itself (snake_case, as
``topology-info --json`` prints it: workers with their state and placement history,
components with Spark's newest progress, the charts' history and the checkpoint
location, every kept error, the code version that runs and a switch under way), plus
``may_change`` (whether the caller may act on it) and ``generated_at``. The page's
Versions panel reads ``/api/v1/topology/:id/history`` besides.

``/component/:component`` is Storm UI's component page (Storm 1.x's field names; a
component is a bolt, one executor per worker that runs it, as getComponentPageInfo says),
with nimbus-ha's numbers and details beside Storm's fields: ``batchId``,
``inputRowsPerSecond``, ``processedRowsPerSecond``, ``progress``, ``history``,
``historyEndSecs``, ``reportedBy``, ``live``, ``detailsCut``, ``checkpoint`` and
``sparkUiUrls``.

Text that workers wrote (errors, source and sink descriptions, offsets) has the
cluster's known secrets masked (nimbus.redaction.mask), as on ``/api/v1/topology/:id``.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

from nimbus.redaction import mask
from nimbus.ui.pretty import pretty_uptime

ALL_TIME = ":all-time"


def _masked(value: Any) -> Any:
    return mask(value) if isinstance(value, str) else value


def mask_info(info: dict[str, Any]) -> dict[str, Any]:
    """``info`` with worker-written text masked, in place (and returned)."""
    for errors in info["errors"].values():
        for error in errors:
            error["error"] = mask(str(error.get("error", "")))
    for worker in info["workers"]:
        worker["last_error"] = mask(str(worker["last_error"]))
    for version in info.get("code_versions") or []:   # absent from earlier releases
        version["error"] = mask(str(version.get("error") or ""))
    for component in info["components"].values():
        progress = component.get("progress")
        if not progress:
            continue
        for source in progress["sources"]:
            for key in ("description", "start_offset", "end_offset", "latest_offset"):
                source[key] = _masked(source[key])
        if progress["sink"]:
            progress["sink"]["description"] = _masked(progress["sink"]["description"])
    return info


def page_data(info: dict[str, Any], may_change: bool,
              now: float | None = None) -> dict[str, Any]:
    """GET /api/v1/topology/:id/page (see the module docstring)."""
    return {**info, "may_change": may_change,
            "generated_at": int(time.time() if now is None else now)}


def known_components(info: dict[str, Any]) -> list[str]:
    """The components the page and Storm's component resource know: those a worker
    reports, and those that only have errors (``worker-<i>``, a query gone)."""
    return sorted(set(info["components"]) | set(info["errors"]))


def _error(error: dict[str, Any], now: float) -> dict[str, Any]:
    return {"errorTime": error["time_secs"] * 1000,   # Storm's: milliseconds
            "errorHost": error["host"], "errorPort": error["port"] or None,
            "error": error["error"],
            "errorLapsedSecs": max(0, int(now - error["time_secs"])),
            "errorWorkerLogLink": ""}


def _stats(rows: int) -> dict[str, Any]:
    return {"emitted": rows, "transferred": rows, "executed": rows, "acked": 0,
            "failed": 0, "capacity": "0.000", "executeLatency": "0.000",
            "processLatency": "0.000"}


def component_detail(info: dict[str, Any], component: str,
                     now: float | None = None) -> dict[str, Any] | None:
    """GET /api/v1/topology/:id/component/:component; None if the topology has no such
    component (see :func:`known_components`)."""
    if component not in known_components(info):
        return None
    now = time.time() if now is None else now
    comp = info["components"].get(component) or {}
    workers = [w for w in info["workers"] if component in w["components"]]
    rows = comp.get("num_input_rows", 0)
    executors = []
    for w in workers:
        task = w["index"] + 1
        executors.append({
            "id": f"[{task}-{task}]", "encodedId": quote(f"[{task}-{task}]", safe=""),
            "host": w["host"], "port": w["port"], "uptime": pretty_uptime(w["uptime_secs"]),
            "uptimeSeconds": w["uptime_secs"], "workerLogLink": "",
            **_stats(w["components"][component]["num_input_rows"]),
            # nimbus-ha's: the worker's state (nimbus/state/worker_state.py)
            "worker": w["worker"], "state": w["state"], "alive": w["alive"]})
    return {
        "id": component, "encodedId": quote(component, safe=""), "name": info["name"],
        "user": info["owner"], "topologyId": info["id"],
        "encodedTopologyId": quote(info["id"], safe=""), "topologyStatus": info["status"],
        "componentType": "bolt", "executors": len(workers), "tasks": len(workers),
        "window": ALL_TIME, "windowHint": "All time", "debug": False, "samplingPct": 10.0,
        "eventLogLink": "", "profilingAndDebuggingCapable": False,
        "profileActionEnabled": False, "profilerActive": [],
        "requestedMemOnHeap": 0.0, "requestedMemOffHeap": 0.0, "requestedCpu": 0.0,
        "schedulerDisplayResource": False,
        "componentErrors": [_error(e, now) for e in info["errors"].get(component, [])],
        "boltStats": [{"windowPretty": "All time", "window": ALL_TIME, **_stats(rows)}],
        "inputStats": [], "outputStats": [{"stream": "default", "emitted": rows,
                                           "transferred": rows}],
        "executorStats": executors,
        # nimbus-ha's (runtime_view.topology_info's component, camelCase)
        "batchId": comp.get("batch_id"),
        "inputRowsPerSecond": comp.get("input_rows_per_second", 0.0),
        "processedRowsPerSecond": comp.get("processed_rows_per_second", 0.0),
        "progress": comp.get("progress"), "history": comp.get("history", []),
        "historyEndSecs": comp.get("history_end_secs"),
        "reportedBy": comp.get("reported_by"), "live": comp.get("live", False),
        "detailsCut": comp.get("details_cut", False),
        "checkpoint": comp.get("checkpoint"),
        "sparkUiUrls": sorted({w["spark_ui_url"] for w in workers if w["spark_ui_url"]})}
