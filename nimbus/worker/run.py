"""A worker's life once its spec is read: the lease threads, the first lease (nothing
of the topology runs before it), then the pipeline or process topology, beating on the
status pipe, until SIGTERM (exit 0) or a failure (exit 2 or 3). Whenever the lease runs
out, the lease thread kills the whole process group instead (or freezes it in its
cgroup). Shared by a worker started for a slot (:mod:`nimbus.worker.main`) and a warm
worker once it is given one (:mod:`nimbus.worker.warm`).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from nimbus.worker.lease import Lease, freeze_own_cgroup
from nimbus.worker.status import StatusWriter
from nimbus.worker.takeover import TakeoverPoint
from nimbus.worker_protocol.exits import (
    EXIT_INVALID_TOPOLOGY,
    EXIT_OK,
    EXIT_STARTUP,
    worker_component,
)
from nimbus.worker_protocol.spec import WorkerSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("nimbus.worker")

def install_stop_handlers(stop: threading.Event) -> None:
    def request_stop(signum: int, _frame: FrameType | None) -> None:
        if not stop.is_set():
            log.info("%s received: stopping", signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, request_stop)


def run(spec: WorkerSpec, stop: threading.Event, worker_dir: Path,
        session: SparkSession | None = None) -> int:
    """Run the worker described by ``spec`` until stopped or failed; returns the exit code.

    ``worker_dir`` holds its ``worker.json`` (and its take-over socket);
    ``session``: a warm worker's SparkSession, already adopted for ``spec``."""
    status = StatusWriter(spec.status_fd, topology_id=spec.topology_id,
                          supervisor_id=spec.supervisor_id, host=spec.host, port=spec.port,
                          restarts=spec.restarts)
    # Every freeze ends after supervisor.worker.orphan.timeout.secs unless thawed first:
    # a frozen orphan must not hold its memory for ever (nimbus/worker/frozen.py).
    end_after_s = spec.orphan_timeout_s
    lease = Lease(spec.lease_fd, outlives_supervisor=True,
                  freeze=lambda: freeze_own_cgroup(end_after_s)).start()
    takeover = TakeoverPoint(worker_dir, lease, status,
                             hello=lambda: _hello(spec)).start()
    try:
        code = _run_topology(spec, stop, session, status, lease)
        # A supervisor that took this worker over did not start it: the code is news to it.
        status.exited(code)
        return code
    finally:
        takeover.stop()
        lease.stop()
        status.close()


def _run_topology(spec: WorkerSpec, stop: threading.Event, session: SparkSession | None,
                  status: StatusWriter, lease: Lease) -> int:
    whole = worker_component(spec.worker_index)  # errors about the worker as a whole
    wait = spec.first_lease_wait_s
    log.info("waiting up to %.0f s for the first lease", wait)
    if not lease.wait_first(wait, stop):
        if stop.is_set():
            return EXIT_OK
        status.error(whole, f"no lease received within {wait:g} s; not starting")
        return EXIT_STARTUP
    code_dir = Path(spec.code_dir)
    has_py = (code_dir / "topology.py").is_file()
    has_yaml = (code_dir / "topology.yaml").is_file()
    if has_py == has_yaml:
        which = "both" if has_py else "neither"
        status.error(whole, f"bundle {code_dir} holds {which} of topology.py and "
                            "topology.yaml; it needs exactly one")
        return EXIT_INVALID_TOPOLOGY
    if has_yaml:
        from nimbus.worker.process import run_process

        return run_process(spec, status, stop, lease)
    # Imported only here: a process topology never loads pyspark.
    from nimbus.worker.pipeline import run_pipeline

    return run_pipeline(spec, status, stop, session, lease)


def _hello(spec: WorkerSpec) -> dict[str, Any]:
    """What this worker says of itself to a supervisor that takes it over."""
    code_dir = Path(spec.code_dir)
    return {"pid": os.getpid(), "topology_id": spec.topology_id, "port": spec.port,
            "worker_index": spec.worker_index, "num_workers": spec.num_workers,
            "restarts": spec.restarts, "code_version": spec.code_version,
            "kind": "process" if (code_dir / "topology.yaml").is_file() else "pipeline"}


