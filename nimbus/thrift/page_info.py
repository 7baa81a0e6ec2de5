"""Storm UI's page structures (TopologyPageInfo, ComponentPageInfo, WorkerSummary) built
from :func:`nimbus.state.runtime_view.topology_info`'s dict.

The handler (``getTopologyPageInfo``, ``getComponentPageInfo``, ``getSupervisorPageInfo``)
reads and authorises; this module only maps nimbus-ha's model onto Storm's, with the
same executors getTopologyInfo reports, so that the calls agree with one another:

* An **executor** is one ExecutorSummary of getTopologyInfo: one per worker and
  component the worker reports, or one ``__system`` for a worker that reports none yet.
  A topology's ``num_executors`` and ``num_tasks`` count them (one task each); a
  worker's, those of the worker; a component's, the workers that run it.
* A **component** (a pipeline's query, a process topology's ``main``) is a **bolt**
  (``ComponentType.BOLT``); nimbus-ha has no spouts. A component that only has errors
  (``worker-<i>``: errors of the worker itself; a query no worker reports any more) is
  listed too, with 0 executors, so that its last error shows. ``is_include_sys`` decides
  whether system components (Storm's rule: an id that starts with ``__``) are listed.
* **Numbers** are those of Storm UI's REST resource ``/api/v1/topology/:id``
  (nimbus/ui/storm_json.py): ``emitted``, ``transferred`` and ``executed`` are the rows of
  the newest batch; acked, failed, latencies and capacity are 0 (no tuples, no acking).
* **Windows**: nimbus-ha keeps no windowed counters. Every window map has one entry, under
  the window asked for (``:all-time`` when none is given), holding the current numbers;
  any window is accepted. The stream maps are empty (no streams).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from nimbus.thrift import storm
from nimbus.thrift.numbers import i32

ALL_TIME = ":all-time"
#: The windows Storm's UI asks for (any other string is answered the same way).
WINDOWS = (ALL_TIME, "600", "10800", "86400")
#: Storm's per-worker system component: stands for a worker that reports no component yet
#: (as in getTopologyInfo).
SYSTEM_COMPONENT = "__system"


def window_key(window: str | None) -> str:
    """The key the window maps use: the window asked for, ``:all-time`` if none."""
    return window if window else ALL_TIME


def is_system(component: str) -> bool:
    """Storm's ``Utils.isSystemId``: system components' ids start with ``__``."""
    return component.startswith("__")


def worker_components(worker: dict[str, Any]) -> list[str]:
    """The components of ``worker``'s executors, as getTopologyInfo lists them."""
    return sorted(worker["components"]) or [SYSTEM_COMPONENT]


def executors(info: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """(worker, component) of every executor, in getTopologyInfo's order."""
    return [(worker, component) for worker in info["workers"]
            for component in worker_components(worker)]


def executor_summary(worker: dict[str, Any], component: str) -> Any:
    """The ExecutorSummary getTopologyInfo gives this executor."""
    task = i32(worker["index"] + 1)
    return storm.ExecutorSummary(
        executor_info=storm.ExecutorInfo(task_start=task, task_end=task),
        component_id=component, host=worker["host"], port=i32(worker["port"]),
        uptime_secs=i32(worker["uptime_secs"]))


def error_info(error: dict[str, Any]) -> Any:
    """One of runtime_view's errors as Storm's ErrorInfo (as getTopologyInfo gives it)."""
    return storm.ErrorInfo(error=error["error"], error_time_secs=i32(error["time_secs"]),
                           host=error["host"] or None, port=i32(error["port"]) or None)


def _rows(worker: dict[str, Any], component: str) -> int:
    """The rows of the newest batch of ``component`` on ``worker`` (0 if not running)."""
    stats = worker["components"].get(component)
    return int(stats["num_input_rows"]) if stats else 0


def aggregate(num_executors: int, rows: int, last_error: Any = None) -> Any:
    """A bolt's ComponentAggregateStats (see the module docstring for the numbers)."""
    return storm.ComponentAggregateStats(
        type=storm.ComponentType.BOLT,
        common_stats=storm.CommonAggregateStats(
            num_executors=i32(num_executors), num_tasks=i32(num_executors),
            emitted=rows, transferred=rows, acked=0, failed=0),
        specific_stats=storm.SpecificAggregateStats(bolt=storm.BoltAggregateStats(
            execute_latency_ms=0.0, process_latency_ms=0.0, executed=rows, capacity=0.0)),
        last_error=last_error)


def _by_component(info: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """component -> the workers of its executors; error-only components with none."""
    found: dict[str, list[dict[str, Any]]] = {}
    for worker, component in executors(info):
        found.setdefault(component, []).append(worker)
    for component in info["errors"]:
        found.setdefault(component, [])
    return dict(sorted(found.items()))


def _last_error(info: dict[str, Any], component: str) -> Any:
    kept = info["errors"].get(component) or []
    return error_info(kept[0]) if kept else None  # runtime_view: newest first


def worker_summary(info: dict[str, Any], worker: dict[str, Any], include_sys: bool,
                   readable: bool = True) -> Any:
    """Storm's WorkerSummary of one of ``info``'s workers. ``component_to_num_tasks`` is
    left unset when the caller may not read the topology (``readable`` false), as Storm's
    getSupervisorPageInfo does."""
    components = worker_components(worker)
    tasks = {c: 1 for c in components if include_sys or not is_system(c)}
    return storm.WorkerSummary(
        supervisor_id=worker["supervisor_id"], host=worker["host"],
        port=i32(worker["port"]), topology_id=info["id"], topology_name=info["name"],
        num_executors=i32(len(components)),
        component_to_num_tasks=tasks if readable else None,
        uptime_secs=i32(worker["uptime_secs"]))


def topology_stats(info: dict[str, Any], window: str, include_sys: bool) -> Any:
    """TopologyStats: the current numbers under ``window`` only."""
    rows = sum(_rows(worker, component) for worker, component in executors(info)
               if include_sys or not is_system(component))
    return storm.TopologyStats(
        window_to_emitted={window: rows}, window_to_transferred={window: rows},
        window_to_complete_latencies_ms={window: 0.0}, window_to_acked={window: 0},
        window_to_failed={window: 0})


def topology_page(info: dict[str, Any], window: str | None, include_sys: bool,
                  topology_conf: str | None, replication_count: int | None) -> Any:
    """TopologyPageInfo of ``info`` (runtime_view.topology_info of one topology).

    ``topology_conf`` is the redacted JSON getTopologyConf gives (None: unset, when this
    nimbus holds no copy of the code yet)."""
    key = window_key(window)
    bolts = {component: aggregate(len(workers), sum(_rows(w, component) for w in workers),
                                  _last_error(info, component))
             for component, workers in _by_component(info).items()
             if include_sys or not is_system(component)}
    count = i32(len(executors(info)))
    return storm.TopologyPageInfo(
        id=info["id"], name=info["name"], uptime_secs=i32(info["uptime_secs"]),
        status=info["status"], num_tasks=count, num_workers=i32(len(info["workers"])),
        num_executors=count, topology_conf=topology_conf, id_to_spout_agg_stats={},
        id_to_bolt_agg_stats=bolts, topology_stats=topology_stats(info, key, include_sys),
        owner=info["owner"] or None, replication_count=replication_count,
        workers=[worker_summary(info, w, include_sys) for w in info["workers"]])


def known_components(info: dict[str, Any]) -> list[str]:
    """Every component getComponentPageInfo answers for: those getTopologyInfo names
    (its executors' and its errors'), whatever ``is_include_sys``."""
    return list(_by_component(info))


def component_page(info: dict[str, Any], component_id: str, window: str | None,
                   include_sys: bool) -> Any:
    """ComponentPageInfo of ``component_id``; NotAliveException if the topology has no
    such component. ``include_sys`` changes nothing here: nimbus-ha has no streams, which
    is what Storm filters with it on this page."""
    workers = _by_component(info).get(component_id)
    if workers is None:
        names = known_components(info)
        listed = ", ".join(repr(n) for n in names[:20]) + (", ..." if len(names) > 20
                                                           else "")
        raise storm.NotAliveException(
            msg=f"topology {info['name']!r} ({info['id']}) has no component "
                f"{component_id[:200]!r}; its components: {listed or 'none yet'}")
    key = window_key(window)
    rows = sum(_rows(w, component_id) for w in workers)
    return storm.ComponentPageInfo(
        component_id=component_id, component_type=storm.ComponentType.BOLT,
        topology_id=info["id"], topology_name=info["name"],
        num_executors=i32(len(workers)), num_tasks=i32(len(workers)),
        window_to_stats={key: aggregate(len(workers), rows,
                                        _last_error(info, component_id))},
        gsid_to_input_stats={}, sid_to_output_stats={},
        exec_stats=[storm.ExecutorAggregateStats(
            exec_summary=executor_summary(w, component_id),
            stats=aggregate(1, _rows(w, component_id))) for w in workers],
        errors=[error_info(e) for e in info["errors"].get(component_id) or []],
        topology_status=info["status"])


def supervisor_summary(supervisor_id: str, info: Any, used_ports: Iterable[int]) -> Any:
    """The SupervisorSummary getClusterInfo gives a supervisor (``info``: its
    SupervisorInfo; ``used_ports``: the slots the leader's assignments use)."""
    return storm.SupervisorSummary(
        host=info.hostname, uptime_secs=i32(info.uptime_secs), num_workers=len(info.meta),
        num_used_workers=len(list(used_ports)), supervisor_id=supervisor_id,
        version=info.version or None)
