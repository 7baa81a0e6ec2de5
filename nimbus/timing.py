"""The timing relations that safety and liveness need, checked when a daemon starts.

Each relation names the keys it ties together, and a daemon whose configuration breaks
one refuses to start with an error naming them (docs/runtime.md, "Timing relations").
Nimbuses and supervisors usually share one ``storm.yaml``, so each checks all of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nimbus.config import ConfigError

#: A worker's lease, as a share of the negotiated session timeout ``T``: one round trip
#: that proves the session renews it until ``sent + WORKER_LEASE_FRACTION * T``
#: (nimbus.supervisor.lease). The leader waits as long before it places work it took off
#: a live supervisor anywhere else (the release quarantine, nimbus.master.scheduler).
#: Below 1, so that every lease of a supervisor that is cut off ends before its session
#: can expire; the third left absorbs a late kill and clocks that run apart.
WORKER_LEASE_FRACTION = 2.0 / 3.0

#: (smaller key, larger key, why the first must be below the second)
RELATIONS = (
    ("supervisor.worker.timeout.secs", "nimbus.task.timeout.secs",
     "a worker that stops sending status must be killed by its supervisor before the "
     "leader gives up on it and places its work elsewhere"),
    ("supervisor.worker.start.timeout.secs", "nimbus.task.launch.secs",
     "a worker that never starts must be killed by its supervisor before the leader "
     "gives up on it and places its work elsewhere"),
)


def timing_problems(conf: Mapping[str, Any]) -> list[str]:
    """One sentence per relation ``conf`` breaks (none: all hold)."""
    problems = []
    watchdog, period = conf["nimbus.leader.watchdog.secs"], conf["nimbus.monitor.freq.secs"]
    if watchdog < 0 or 0 < watchdog <= period:
        problems.append(f"nimbus.leader.watchdog.secs ({watchdog}) must be 0 (off) or above "
                        f"nimbus.monitor.freq.secs ({period}): the leader's duty cycle runs "
                        "that often, so a smaller watchdog would end a healthy leader")
    for smaller, larger, why in RELATIONS:
        a, b = conf[smaller], conf[larger]
        if a >= b:
            problems.append(f"{smaller} ({a}) must be below {larger} ({b}): {why}")
    return problems


def check_timing(conf: Mapping[str, Any]) -> None:
    """Raise ConfigError naming the keys of every broken relation."""
    problems = timing_problems(conf)
    if problems:
        raise ConfigError("unsafe timing settings: " + "; ".join(problems))
