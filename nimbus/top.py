"""``nimbus-ha top``: a refreshing table of every topology, read from ZooKeeper.

One row per live topology: status, workers running of those wanted (and how many are
starting, frozen, restarting or dead: nimbus/state/worker_state.py), restarts, input
and processed rows per second (summed over its running workers), its last batch id and
its newest error. The numbers are those of ``topology-info``
(:mod:`nimbus.master.runtime_view`), read with a read-only client, so ``top`` needs no
leader and keeps running through a failover.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from kazoo.exceptions import KazooException
from rich.console import Console
from rich.live import Live
from rich.table import Table

from nimbus.master import runtime_view
from nimbus.state import worker_state
from nimbus.state.cluster_state import LayoutMissingError, StormClusterState
from nimbus.state.records import RecordError

COLUMNS = ("topology", "id", "status", "workers", "restarts", "input rows/s",
           "processed rows/s", "last batch", "newest error")
ERROR_WIDTH = 60


def topology_rows(state: StormClusterState,
                  timeout_s: float = worker_state.DEFAULT_TIMEOUT_S) -> list[dict[str, Any]]:
    """One dict per live topology (sorted by name), with the keys ``name``, ``id``,
    ``status``, ``workers_alive`` (running), ``workers_wanted``, ``worker_states``
    ({state: count}), ``restarts``, ``input_rows_per_second``,
    ``processed_rows_per_second``, ``batch_id`` (None before the first batch) and
    ``newest_error`` ("component: first line", or ""). ``timeout_s``:
    ``nimbus.task.timeout.secs``, as topology-info judges workers."""
    rows = []
    for topology_id in state.active_storms():
        try:
            info = runtime_view.topology_info(state, topology_id, timeout_s=timeout_s)
        except RecordError:
            continue  # a StormBase this release cannot read: the state logs it
        if info is None:  # removed since the listing
            continue
        components = info["components"].values()
        batches = [c["batch_id"] for c in components if c["batch_id"] is not None]
        newest: tuple[int, str] | None = None
        for component, kept in info["errors"].items():
            if kept and (newest is None or kept[0]["time_secs"] > newest[0]):
                newest = (kept[0]["time_secs"], f"{component}: {_first_line(kept[0]['error'])}")
        rows.append({
            "name": info["name"], "id": topology_id, "status": info["status"],
            "workers_alive": sum(1 for w in info["workers"] if w["alive"]),
            "workers_wanted": info["num_workers"],
            "worker_states": worker_state.count_states([w["state"] for w in info["workers"]]),
            "restarts": sum(w["restarts"] for w in info["workers"]),
            "input_rows_per_second": sum(c["input_rows_per_second"] for c in components),
            "processed_rows_per_second": sum(c["processed_rows_per_second"]
                                             for c in components),
            "batch_id": max(batches) if batches else None,
            "newest_error": newest[1] if newest else ""})
    return sorted(rows, key=lambda r: (r["name"], r["id"]))


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= ERROR_WIDTH else line[:ERROR_WIDTH - 3] + "..."


def _workers_cell(row: dict[str, Any]) -> str:
    """``running/wanted``, and the workers not running by state: ``0/1 (1 restarting)``."""
    others = ", ".join(f"{n} {s}" for s, n in row["worker_states"].items()
                       if n and s != worker_state.RUNNING)
    cell = f"{row['workers_alive']}/{row['workers_wanted']}"
    return f"{cell} ({others})" if others else cell


def render(rows: list[dict[str, Any]], problem: str = "") -> Table:
    """The table of ``rows``; ``problem`` (ZooKeeper unreachable, ...) is its caption."""
    table = Table(*COLUMNS, title=f"nimbus-ha top  {time.strftime('%H:%M:%S')}",
                  title_justify="left", caption=problem or None, caption_justify="left")
    for r in rows:
        table.add_row(r["name"], r["id"], r["status"], _workers_cell(r), str(r["restarts"]),
                      f"{r['input_rows_per_second']:.1f}",
                      f"{r['processed_rows_per_second']:.1f}",
                      "-" if r["batch_id"] is None else str(r["batch_id"]),
                      r["newest_error"] or "-")
    if not rows:
        table.add_row("(no topologies)", *[""] * (len(COLUMNS) - 1))
    return table


def snapshot(state: StormClusterState,
             timeout_s: float = worker_state.DEFAULT_TIMEOUT_S) -> Table:
    """Read the cluster now and render it; a read that fails is shown, not raised, so
    a refreshing ``top`` survives ZooKeeper hiccups."""
    try:
        return render(topology_rows(state, timeout_s))
    except LayoutMissingError as exc:
        return render([], str(exc))
    except KazooException as exc:
        return render([], f"ZooKeeper unreachable, retrying: {type(exc).__name__} {exc}")


def run(state: StormClusterState, console: Console, interval_s: float, once: bool,
        stop: threading.Event | None = None,
        timeout_s: float = worker_state.DEFAULT_TIMEOUT_S) -> None:
    """Print one table (``once``), or refresh it every ``interval_s`` until Ctrl-C or
    ``stop`` is set. ``timeout_s``: ``nimbus.task.timeout.secs`` (see topology_rows)."""
    if once:  # a failed read is an error here (exit status 1), not a caption
        console.print(render(topology_rows(state, timeout_s)))
        return
    stop = stop or threading.Event()
    with Live(snapshot(state, timeout_s), console=console, auto_refresh=False) as live:
        try:
            while not stop.wait(interval_s):
                live.update(snapshot(state, timeout_s), refresh=True)
        except KeyboardInterrupt:
            pass
