"""A warm worker: Python up, pyspark imported and a SparkSession started, waiting for work.

``python -m nimbus.worker --warm <warm-dir>``. The supervisor keeps
``supervisor.warm.workers`` of these per host (``nimbus/supervisor/warm_pool.py``), so that
a pipeline that restarts or moves here skips the 10-15 s a SparkSession takes to start.

Order of events:

1. Read ``<warm-dir>/warm.json``: a :class:`~nimbus.worker_protocol.spec.WorkerSpec` holding the
   cluster's default worker configuration (no topology's) and the two inherited pipes.
2. Start the SparkSession with the cluster's default ``topology.spark.*`` settings and
   run one tiny job, then say ``{"warm": {"ready": ...}}`` on the status pipe.
3. Wait for one line on the lease pipe: ``take <worker-dir>``. Until then the process
   holds no lease and touches no checkpoint; SIGTERM ends it. On EOF (its supervisor is
   gone) it listens on ``<warm-dir>/supervisor.sock`` for up to :data:`ORPHAN_WAIT_S`
   (mode 0600; only root or its own user, ``SO_PEERCRED``) and exits if nobody comes.
   The supervisor's next process connects at start, reads one line,
   ``{"takeover": {"kind": "warm", "pid", "lease_fd", "status_fd"}}``, and from then on
   the connection is this worker's lease and status pipes (the two descriptors it names,
   which that supervisor writes into ``worker.json``): the wait for ``take`` goes on
   there. A warm worker holds no lease, so waiting endangers nothing; it saves the
   restarted supervisor a SparkSession start.
4. Taken: work in ``<worker-dir>``, read its ``worker.json`` (written by the supervisor
   with the same pipes), and make the session the topology's
   (:func:`~nimbus.worker.spark.adopt_session`). If a setting Spark fixes at start
   differs, say ``{"warm": {"refused": why}}`` and exit 4: the supervisor starts the
   topology cold. Otherwise run exactly as a cold worker does from step "wait for the
   first lease" (``nimbus/worker/run.py``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import threading
import time
from pathlib import Path
from typing import Any

from nimbus.redaction import install_log_redaction
from nimbus.state.worker_logs import LogSettings, log_root, port_dir
from nimbus.worker.log_pump import LogPump, start_pump
from nimbus.worker.run import install_stop_handlers, run
from nimbus.worker.status import format_error
from nimbus.worker.takeover import listen_at, supervisor_peer
from nimbus.worker_protocol.exits import EXIT_FAILED, EXIT_OK, EXIT_STARTUP, EXIT_WARM_REFUSED
from nimbus.worker_protocol.spec import SpecError, WorkerSpec
from nimbus.worker_protocol.takeover import SOCKET_NAME
from nimbus.worker_protocol.warm import TAKE, WARM_FILE

log = logging.getLogger("nimbus.worker.warm")

MAX_TAKE_LINE = 4096
#: How long a warm worker whose supervisor died waits for the supervisor's next process.
ORPHAN_WAIT_S = 60.0


class SupervisorGone(Exception):
    """The lease pipe reached EOF before a ``take`` line."""


def send_status(fd: int, obj: dict[str, Any]) -> None:
    """One status line, before a StatusWriter exists (nothing else writes yet)."""
    data = (json.dumps(obj, sort_keys=True) + "\n").encode("utf-8")
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def wait_for_take(fd: int, stop: threading.Event) -> Path | None:
    """The worker directory of the ``take <worker-dir>`` line read from ``fd``; None on
    ``stop`` or on a line that is not a take; :class:`SupervisorGone` on EOF.

    Reads one byte at a time, so that nothing after the line (the first lease) is taken
    out of the pipe before the lease reader starts."""
    line = bytearray()
    while not stop.is_set():
        ready, _, _ = select.select([fd], [], [], 0.5)
        if not ready:
            continue
        byte = os.read(fd, 1)
        if not byte:
            raise SupervisorGone
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


def await_successor(warm_dir: Path, stop: threading.Event, timeout_s: float,
                    ready_s: float) -> tuple[int, int] | None:
    """Listen on ``<warm_dir>/supervisor.sock`` until a supervisor process (root, or this
    worker's own user) connects, at most ``timeout_s``; say who this is and return the
    connection as (lease fd, status fd). None on timeout, ``stop``, or a socket that
    cannot be made."""
    try:
        listener = listen_at(warm_dir)
    except OSError as exc:
        log.warning("cannot wait for the supervisor's next process (%s): exiting", exc)
        return None
    try:
        end = time.monotonic() + timeout_s
        while not stop.is_set():
            left = end - time.monotonic()
            if left <= 0:
                log.info("no supervisor came for this warm worker: exiting")
                return None
            ready, _, _ = select.select([listener], [], [], min(left, 0.5))
            if not ready:
                continue
            fds: list[int] = []
            try:
                conn, _ = listener.accept()
                pid = supervisor_peer(conn)
                if pid is None:
                    continue
                conn.setblocking(True)
                fds.append(conn.detach())
                fds.append(os.dup(fds[0]))
                lease_fd, status_fd = fds
                send_status(status_fd, {"takeover": {
                    "kind": "warm", "pid": os.getpid(), "lease_fd": lease_fd,
                    "status_fd": status_fd, "startup_secs": ready_s}})
            except OSError as exc:  # it went away meanwhile: wait for another
                log.warning("a take-over failed (%s); waiting on", exc)
                for fd in fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                continue
            log.warning("kept by supervisor process %d", pid)
            return lease_fd, status_fd
        return None
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            (warm_dir / SOCKET_NAME).unlink()


def run_warm(warm_dir: Path) -> int:
    """Run a warm worker from ``<warm_dir>/warm.json`` (see the module docstring)."""
    try:
        warm = WorkerSpec.load(warm_dir / WARM_FILE)
    except SpecError as exc:
        log.error("%s", exc)
        return EXIT_STARTUP
    install_log_redaction(warm.conf)
    # Its log is its warm directory's until it is taken, then its slot's.
    pump = start_pump(warm_dir, LogSettings.from_conf(warm.conf))
    try:
        return _run_warm(warm_dir, warm, pump)
    finally:
        if pump is not None:
            pump.stop()


def _run_warm(warm_dir: Path, warm: WorkerSpec, pump: LogPump | None) -> int:
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
    fds = (warm.lease_fd, warm.status_fd)
    while True:
        try:
            worker_dir = wait_for_take(fds[0], stop)
            break
        except SupervisorGone:
            log.info("supervisor gone before this warm worker was taken: waiting up to "
                     "%.0f s for its next process", ORPHAN_WAIT_S)
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            adopted = await_successor(warm_dir, stop, ORPHAN_WAIT_S,
                                      ready_s=round(ready_s, 1))
            if adopted is None:
                return EXIT_OK
            fds = adopted
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
    if pump is not None:
        try:
            pump.move_to(port_dir(log_root(spec.conf), spec.topology_id, spec.port))
        except (OSError, ValueError) as exc:
            log.warning("its log stays %s: %s", pump.path, exc)
    log.info("taken after %.1f s warm: topology %s port %d, worker %d of %d, restarts "
             "%d, code version %d", waited, spec.topology_id, spec.port, spec.worker_index,
             spec.num_workers, spec.restarts, spec.code_version)
    try:
        adopt_session(session, warm, spec)
    except WarmMismatchError as exc:
        log.warning("cannot run it on this session: %s", exc)
        return _refuse(spec.status_fd, str(exc))
    except Exception as exc:  # the session is unusable (its JVM died, say)
        log.error("cannot adopt the warm session: %s", format_error(exc))
        return _refuse(spec.status_fd, f"warm session unusable: {exc}")
    return run(spec, stop, worker_dir, session)


def _refuse(status_fd: int, why: str) -> int:
    """Say why this warm worker cannot run the topology, and with which exit code it
    exits (a supervisor that kept it from an earlier process sees no exit status)."""
    with contextlib.suppress(OSError):
        send_status(status_fd, {"warm": {"refused": why}})
        send_status(status_fd, {"exit": EXIT_WARM_REFUSED})
    return EXIT_WARM_REFUSED
