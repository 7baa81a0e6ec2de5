"""``python -m nimbus.worker <worker-dir>``: one worker process (see docs/runtime.md).

Order of events: read ``worker.json``; start the lease threads; wait for the first lease
(nothing of the topology runs before it); run the pipeline or process topology, beating
on the status pipe, until SIGTERM (exit 0) or a failure (exit 2 or 3). Whenever the lease
runs out, the lease thread kills the whole process group instead.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from pathlib import Path

from nimbus.redaction import install_log_redaction
from nimbus.state.worker_logs import LogSettings, log_root, port_dir
from nimbus.worker.lease import ensure_group_leader
from nimbus.worker.log_pump import start_pump
from nimbus.worker.run import install_stop_handlers, run
from nimbus.worker.warm import run_warm
from nimbus.worker_protocol.exits import EXIT_STARTUP
from nimbus.worker_protocol.spec import SpecError, WorkerSpec

log = logging.getLogger("nimbus.worker")


def configure_logging() -> None:
    """Timestamped lines on stderr: into ``worker.log``, through the log pump once it
    runs (nimbus/worker/log_pump.py), or where the supervisor sent it before."""
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr,
        format="%(asctime)s %(levelname)s [%(threadName)s] %(name)s: %(message)s")
    # py4j logs every gateway connection at INFO.
    logging.getLogger("py4j").setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nimbus.worker",
                                     description="Run one nimbus-ha worker (started by a "
                                                 "supervisor; see docs/runtime.md).")
    parser.add_argument("worker_dir", type=Path, help="directory holding worker.json")
    parser.add_argument("--warm", action="store_true",
                        help="start as a warm worker: WORKER_DIR holds warm.json, and the "
                             "supervisor hands it a worker directory later "
                             "(nimbus/worker/warm.py)")
    args = parser.parse_args(argv)
    configure_logging()
    # Before anything else: the lease kill must hit this process's own group only.
    ensure_group_leader()
    if args.warm:
        return run_warm(args.worker_dir)
    try:
        spec = WorkerSpec.load(args.worker_dir)
        spec.check_settings()  # validated now rather than mid-run
    except SpecError as exc:
        log.error("%s", exc)
        return EXIT_STARTUP
    install_log_redaction(spec.conf)
    try:
        log_dir = port_dir(log_root(spec.conf), spec.topology_id, spec.port)
    except ValueError as exc:
        log.warning("worker logs not rotated: %s", exc)
        pump = None
    else:
        pump = start_pump(log_dir, LogSettings.from_conf(spec.conf))
    try:
        stop = threading.Event()
        install_stop_handlers(stop)
        log.info("worker pid %d (group %d): topology %s port %d, worker %d of %d, "
                 "restarts %d, code version %d", os.getpid(), os.getpgrp(),
                 spec.topology_id, spec.port, spec.worker_index, spec.num_workers,
                 spec.restarts, spec.code_version)
        code = run(spec, stop, args.worker_dir.resolve())
        log.info("worker exits with code %d", code)
        return code
    finally:
        if pump is not None:
            pump.stop()
