"""A warm worker: Python up, pyspark imported and a SparkSession started, waiting for work.

``python -m nimbus.worker --warm <warm-dir>``. The supervisor keeps
``supervisor.warm.workers`` of these per host (``nimbus/supervisor/warm_pool.py``), so that
a pipeline that restarts or moves here skips the 10-15 s a SparkSession takes to start.

Order of events:

1. Read ``<warm-dir>/warm.json``: a :class:`~nimbus.worker.spec.WorkerSpec` holding the
   cluster's default worker configuration (no topology's) and the two inherited pipes.
2. Start the SparkSession with the cluster's default ``topology.spark.*`` settings and
   run one tiny job, then say ``{"warm": {"ready": ...}}`` on the status pipe.
3. Wait for one line on the lease pipe: ``take <worker-dir>``. Until then the process
   holds no lease and touches no checkpoint; EOF (its supervisor is gone) or SIGTERM ends
   it.
4. Taken: work in ``<worker-dir>``, read its ``worker.json`` (written by the supervisor
   with the same pipes), and make the session the topology's
   (:func:`~nimbus.worker.spark.adopt_session`). If a setting Spark fixes at start
   differs, say ``{"warm": {"refused": why}}`` and exit 4: the supervisor starts the
   topology cold. Otherwise run exactly as a cold worker does from step "wait for the
   first lease" (``nimbus/worker/main.py``).
"""

from __future__ import annotations

import json
import logging
import os
import select
import threading
import time
from pathlib import Path
from typing import Any

from nimbus.redaction import install_log_redaction
from nimbus.worker.exits import EXIT_FAILED, EXIT_OK, EXIT_STARTUP, EXIT_WARM_REFUSED
from nimbus.worker.spec import SpecError, WorkerSpec
from nimbus.worker.status import format_error

log = logging.getLogger("nimbus.worker.warm")

WARM_FILE = "warm.json"
TAKE = "take"
MAX_TAKE_LINE = 4096


def send_status(fd: int, obj: dict[str, Any]) -> None:
    """One status line, before a StatusWriter exists (nothing else writes yet)."""
    data = (json.dumps(obj, sort_keys=True) + "\n").encode("utf-8")
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def wait_for_take(fd: int, stop: threading.Event) -> Path | None:
    """The worker directory of the ``take <worker-dir>`` line read from ``fd``; None on
    EOF, on ``stop``, or on a line that is not a take.

    Reads one byte at a time, so that nothing after the line (the first lease) is taken
    out of the pipe before the lease reader starts."""
    line = bytearray()
    while not stop.is_set():
        ready, _, _ = select.select([fd], [], [], 0.5)
        if not ready:
            continue
        byte = os.read(fd, 1)
        if not byte:
            log.info("supervisor gone before this warm worker was taken")
            return None
        if byte == b"\n":
            break
        line += byte
        if len(line) > MAX_TAKE_LINE:
            log.error("the supervisor sent an overlong line; exiting")
            return None
    else:
        return None
    verb, _, rest = line.decode("utf-8", "replace").partition(" ")
    if verb != TAKE or not rest.startswith("/"):
        log.error("expected 'take <absolute worker dir>', got %r", bytes(line[:200]))
        return None
    return Path(rest)


def run_warm(warm_dir: Path) -> int:
    """Run a warm worker from ``<warm_dir>/warm.json`` (see the module docstring)."""
    from nimbus.worker.main import install_stop_handlers, run

    try:
        warm = WorkerSpec.load(warm_dir / WARM_FILE)
    except SpecError as exc:
        log.error("%s", exc)
        return EXIT_STARTUP
    install_log_redaction(warm.conf)
    stop = threading.Event()
    install_stop_handlers(stop)
    started = time.monotonic()
    log.info("warm worker pid %d (group %d): starting Spark with the cluster's defaults",
             os.getpid(), os.getpgrp())
    try:
        from nimbus.worker.spark import WarmMismatchError, adopt_session, build_session

        session = build_session(warm, app_name=f"nimbus-ha-warm-{warm.supervisor_id[:8]}")
        session.range(1).count()  # loads what a first batch needs, off the clock
    except Exception as exc:
        if stop.is_set():
            return EXIT_OK
        log.error("cannot start Spark: %s", format_error(exc))
        return EXIT_FAILED
    ready_s = time.monotonic() - started
    log.info("warm: Spark up in %.1f s; waiting to be taken", ready_s)
    try:
        send_status(warm.status_fd, {"warm": {"ready": True, "startup_secs": round(ready_s, 1)}})
    except OSError:
        return EXIT_OK  # the supervisor is gone
    worker_dir = wait_for_take(warm.lease_fd, stop)
    if worker_dir is None:
        return EXIT_OK
    waited = time.monotonic() - started - ready_s
    try:
        os.chdir(worker_dir)
        spec = WorkerSpec.load(worker_dir)
    except (OSError, SpecError) as exc:
        log.error("taken, but %s", exc)
        return EXIT_STARTUP
    install_log_redaction(spec.conf)
    log.info("taken after %.1f s warm: topology %s port %d, worker %d of %d, restarts %d",
             waited, spec.topology_id, spec.port, spec.worker_index, spec.num_workers,
             spec.restarts)
    try:
        adopt_session(session, warm, spec)
    except WarmMismatchError as exc:
        log.warning("cannot run it on this session: %s", exc)
        send_status(spec.status_fd, {"warm": {"refused": str(exc)}})
        return EXIT_WARM_REFUSED
    except Exception as exc:  # the session is unusable (its JVM died, say)
        log.error("cannot adopt the warm session: %s", format_error(exc))
        send_status(spec.status_fd, {"warm": {"refused": f"warm session unusable: {exc}"}})
        return EXIT_WARM_REFUSED
    return run(spec, stop, worker_dir, session)
