"""Exit codes of ``python -m nimbus.worker``, the error that means "exit 2", and the
component a worker's own errors are reported under.

The supervisor restarts a worker after any non-zero exit (with backoff); the codes only
tell a reader of ``worker.log`` or the supervisor's log what kind of failure it was, but
one: :data:`EXIT_WARM_REFUSED`, on which the supervisor starts the topology cold at once
(nimbus/supervisor/ending.py). A worker killed by its lease dies of SIGKILL (returncode
-9 as Popen reports it).
"""

from __future__ import annotations

EXIT_OK = 0  # stopped on request (SIGTERM)
EXIT_STARTUP = 1  # worker.json unreadable, or no lease arrived in time
EXIT_INVALID_TOPOLOGY = 2  # the bundle cannot run: bad topology.yaml / topology.py / build()
EXIT_FAILED = 3  # it ran and failed: a query terminated, or the command exited
# A warm worker was handed a topology whose Spark settings its session cannot take: no
# failure of the topology's, the supervisor starts it cold at once.
EXIT_WARM_REFUSED = 4


def worker_component(worker_index: int) -> str:
    """The component under which errors about the worker as a whole are reported (the
    topology cannot be loaded, built or started; no lease came): its executor key
    ``worker-<i>``, as the supervisor reports its own errors about a worker. A query's or
    the command's own failure uses that component's name instead."""
    return f"worker-{worker_index}"


class InvalidTopology(Exception):
    """The bundle's topology cannot be run as written; the message tells the author why."""
