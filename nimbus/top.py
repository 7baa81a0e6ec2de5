"""``nimbus-ha top``: a refreshing table of every topology the caller may read.

One row per live topology: status, workers running of those wanted (and how many are
starting, frozen, restarting or dead: nimbus/state/worker_state.py), restarts, input
and processed rows per second (summed over its running workers), its last batch id and
its newest error. The rows are those of :mod:`nimbus.master.topology_rows`, asked of any
nimbus (getTopologyRows): ``top`` needs no ZooKeeper access and no leader, and keeps
running through a failover.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from nimbus.state import worker_state

COLUMNS = ("topology", "id", "status", "workers", "restarts", "input rows/s",
           "processed rows/s", "last batch", "newest error")

# Reads the rows now (nimbus.thrift.client.NimbusClient.topology_rows); raises on failure.
ReadRows = Callable[[], list[dict[str, Any]]]


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


def snapshot(read_rows: ReadRows) -> Table:
    """Read the rows now and render them; a read that fails is shown, not raised, so
    a refreshing ``top`` survives a nimbus going away (the next read asks another)."""
    try:
        return render(read_rows())
    except Exception as exc:  # noqa: BLE001 - any failure is a caption, and top goes on
        return render([], f"no answer, retrying: {type(exc).__name__}: {exc}")


def run(read_rows: ReadRows, console: Console, interval_s: float, once: bool,
        stop: threading.Event | None = None) -> None:
    """Print one table (``once``), or refresh it every ``interval_s`` until Ctrl-C or
    ``stop`` is set."""
    if once:  # a failed read is an error here (exit status 1), not a caption
        console.print(render(read_rows()))
        return
    stop = stop or threading.Event()
    with Live(snapshot(read_rows), console=console, auto_refresh=False) as live:
        try:
            while not stop.wait(interval_s):
                live.update(snapshot(read_rows), refresh=True)
        except KeyboardInterrupt:
            pass
