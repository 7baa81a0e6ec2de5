"""Pipeline topologies: ``topology.py`` whose ``build(spark, conf)`` returns stream writers.

``build`` returns one unstarted ``DataStreamWriter`` (component ``main``) or a dict
``{component: DataStreamWriter}``. The worker starts the components assigned to it with
``checkpointLocation`` = ``<checkpoint root>/<topology-id>/<component>`` and ``queryName``
= ``<topology-id>.<component>``, beats their progress, and exits when one fails. The
checkpoint is the topology's whatever version of its code runs (an upgrade starts the
new version from it: nimbus.state.code_versions).

Asked to stop (SIGTERM), it stops at a batch boundary where it can: it lets the batch
under way of each query commit first (:func:`finish_batches`), for at most
:func:`boundary_wait_s` of the supervisor's stop grace, then stops the queries and Spark.
A batch still running at that bound is interrupted: it has its offsets in the
checkpoint's log and no commit, so the next worker runs it again from the checkpoint,
and exactly-once holds either way. A stuck query is never waited for.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nimbus.state.beat_progress import checked_url
from nimbus.state.component_ids import InvalidComponentError, check_component_id
from nimbus.topology_paths import checkpoint_location
from nimbus.worker.lease import Lease
from nimbus.worker.progress import QueryProgress
from nimbus.worker.stall import StallWatch
from nimbus.worker.status import StatusWriter, format_error
from nimbus.worker_protocol.component_share import assigned, changed_components
from nimbus.worker_protocol.exits import (
    EXIT_FAILED,
    EXIT_INVALID_TOPOLOGY,
    EXIT_OK,
    InvalidTopology,
    worker_component,
)
from nimbus.worker_protocol.spec import SpecError, WorkerSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

log = logging.getLogger(__name__)

TOPOLOGY_PY = "topology.py"
MAIN = "main"
#: A stopping pipeline waits for its batches under way at most this share of its
#: supervisor's stop grace (``supervisor.worker.shutdown.sleep.secs``, after which the
#: supervisor kills the group) ...
BOUNDARY_SHARE = 0.5
#: ... and never so long that less than this is left to stop the queries and Spark.
STOP_RESERVE_S = 1.5
BOUNDARY_POLL_S = 0.05
# Component names end up in paths and query names.

Build = Callable[["SparkSession", dict[str, Any]], Any]


def load_build(code_dir: Path) -> Build:
    """Import ``<code_dir>/topology.py`` (with ``code_dir`` on ``sys.path``) and return
    its ``build``; raises InvalidTopology with the reason."""
    path = code_dir / TOPOLOGY_PY
    if str(code_dir) not in sys.path:
        sys.path.insert(0, str(code_dir))
    spec = importlib.util.spec_from_file_location("topology", path)
    if spec is None or spec.loader is None:
        raise InvalidTopology(f"{TOPOLOGY_PY}: cannot be imported from {code_dir}")
    module = importlib.util.module_from_spec(spec)
    # Registered under its name so that pickled references (UDFs) resolve to it.
    sys.modules["topology"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise InvalidTopology(f"importing {TOPOLOGY_PY} failed: {format_error(exc)}") from None
    build = getattr(module, "build", None)
    if not callable(build):
        raise InvalidTopology(f"{TOPOLOGY_PY} defines no function build(spark, conf)")
    return build  # type: ignore[no-any-return]


def writers_of(result: Any) -> dict[str, DataStreamWriter]:
    """Normalise what ``build`` returned to ``{component: writer}``; raises InvalidTopology
    with a message that says how to fix it."""
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

    if isinstance(result, DataStreamWriter):
        return {MAIN: result}
    if isinstance(result, DataFrame):
        kind = "a streaming DataFrame" if result.isStreaming else "a DataFrame"
        raise InvalidTopology(f"build() returned {kind}, not a DataStreamWriter: "
                              "return df.writeStream... (an unstarted writer with its sink)")
    if isinstance(result, StreamingQuery):
        raise InvalidTopology("build() returned a started StreamingQuery, not a "
                              "DataStreamWriter: return df.writeStream... without .start(); "
                              "the worker starts it with its checkpoint location")
    if isinstance(result, Mapping):
        if not result:
            raise InvalidTopology("build() returned an empty dict: no component to run")
        writers: dict[str, DataStreamWriter] = {}
        for name, writer in result.items():
            try:
                check_component_id(name)
            except InvalidComponentError as exc:
                raise InvalidTopology(f"build() returned an unusable component name: "
                                      f"{exc}") from None
            if not isinstance(writer, DataStreamWriter):
                raise InvalidTopology(f"build() returned {type(writer).__name__} for "
                                      f"component {name!r}, not a DataStreamWriter: "
                                      "return df.writeStream...")
            writers[name] = writer
        return writers
    raise InvalidTopology(f"build() returned {type(result).__name__}, not a DataStreamWriter "
                          "or a dict {component: DataStreamWriter}: return df.writeStream...")



def boundary_wait_s(grace_s: float) -> float:
    """How long a stopping pipeline waits for its batches under way to commit, given its
    supervisor's stop grace: :data:`BOUNDARY_SHARE` of it, leaving at least
    :data:`STOP_RESERVE_S` (1.5 s of the default 3)."""
    return max(0.0, min(grace_s * BOUNDARY_SHARE, grace_s - STOP_RESERVE_S))


def _progress_mark(query: StreamingQuery) -> tuple[Any, Any] | None:
    """What tells one trigger's progress from the next one's: (batch id, timestamp)."""
    progress = query.lastProgress
    if not progress:
        return None
    return progress.get("batchId"), progress.get("timestamp")


def _trigger_active(query: StreamingQuery) -> bool:
    return bool((query.status or {}).get("isTriggerActive"))


def finish_batches(queries: Mapping[str, StreamingQuery], bound_s: float,
                   clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> tuple[float, list[str]]:
    """Wait while a trigger of any of ``queries`` is under way (Spark's
    ``status["isTriggerActive"]``), each until its trigger ends (its status says so, or
    a newer progress shows it ended and the next one began), all within ``bound_s``.
    Returns (seconds waited, the queries whose trigger was still under way at the
    bound). A query that is not active, or whose JVM does not answer, is not waited
    for."""
    started = clock()
    deadline = started + bound_s
    cut: list[str] = []
    for name, query in queries.items():
        try:
            if not query.isActive:
                continue
            seen = _progress_mark(query)
            while _trigger_active(query):
                if _progress_mark(query) != seen:
                    break   # that batch committed; the next one began: not waited for
                if clock() >= deadline:
                    cut.append(name)
                    break
                sleep(BOUNDARY_POLL_S)
        except Exception as exc:  # the JVM may be going (a group SIGTERM before it ignored it)
            log.warning("stopping query %s: its batch under way cannot be waited for: %s",
                        name, format_error(exc, 300))
    return clock() - started, cut


class PipelineRunner:
    """Runs one worker's share of a pipeline topology; :meth:`run` returns the exit code."""

    def __init__(self, spec: WorkerSpec, status: StatusWriter, stop: threading.Event,
                 session: SparkSession | None = None, lease: Lease | None = None):
        """``session``: a SparkSession already up (a warm worker's, adopted for ``spec``);
        by default the runner starts one. ``lease``: where a rebalance that keeps this
        worker's components tells it its new place (``assign`` lines)."""
        self.spec = spec
        self.status = status
        self.stop = stop
        self.spark: SparkSession | None = None
        self._warm_session = session
        self._lease = lease
        self._components: list[str] = []     # every component of the topology
        self._misplaced = ""                 # why an assign did not fit what runs here
        self.queries: dict[str, StreamingQuery] = {}
        self._progress: dict[str, QueryProgress] = {}   # each query's beat and history
        self._spark_ui_url = ""   # its SparkSession's UI, when the topology enables it
        # Component of the errors about the whole topology (worker-<i>).
        self.whole = worker_component(spec.worker_index)
        self.abandon = False   # exit without stopping the queries (one is stuck)

    def run(self) -> int:
        try:
            return self._run()
        finally:
            self._shutdown()

    def _fail(self, component: str, error: str, code: int) -> int:
        """Report ``error`` and return ``code``; during a requested stop, failures are what
        stopping causes (a group SIGTERM reaches a JVM still starting), so exit 0 quietly."""
        if self.stop.is_set():
            log.info("ignored while stopping: %s: %s", component, error[:300])
            return EXIT_OK
        self.status.error(component, error)
        return code

    def _run(self) -> int:
        spec = self.spec
        try:
            # Import before starting Spark: a broken topology.py costs no JVM start.
            build = load_build(Path(spec.code_dir))
        except InvalidTopology as exc:
            return self._fail(self.whole, str(exc), EXIT_INVALID_TOPOLOGY)

        from nimbus.worker.spark import build_session

        try:
            self.spark = self._warm_session or build_session(spec)
        except InvalidTopology as exc:
            return self._fail(self.whole, str(exc), EXIT_INVALID_TOPOLOGY)
        except Exception as exc:
            return self._fail(self.whole, f"cannot start Spark: {format_error(exc)}",
                              EXIT_FAILED)
        if self.stop.is_set():
            return EXIT_OK

        try:
            writers = writers_of(build(self.spark, dict(spec.conf)))
        except InvalidTopology as exc:
            return self._fail(self.whole, str(exc), EXIT_INVALID_TOPOLOGY)
        except Exception as exc:
            return self._fail(self.whole, f"build() raised {format_error(exc)}",
                              EXIT_INVALID_TOPOLOGY)

        # An upgrade that changes the components moves shares between workers: never
        # beside an old worker that may still run one of them (checked before anything
        # is declared or started, so the slot's remembered components stay the old code's).
        refused = changed_components(spec.previous_components, list(writers),
                                     spec.num_workers)
        if refused:
            return self._fail(self.whole, refused, EXIT_INVALID_TOPOLOGY)
        mine = assigned(list(writers), spec.worker_index, spec.num_workers)
        log.info("components %s; this worker (%d of %d) runs %s", sorted(writers),
                 spec.worker_index, spec.num_workers, mine)
        self._components = sorted(writers)
        if self._lease is not None:
            self._lease.on_assign = self._reassign
        self.status.components(self._components, mine)
        self._spark_ui_url = self._ui_url()
        for name in mine:
            if self.stop.is_set():
                return EXIT_OK
            # The one spelling of the location, shared with every screen that shows it.
            location = checkpoint_location(spec.conf, spec.topology_id, name)
            try:
                self.queries[name] = (writers[name]
                                      .option("checkpointLocation", location)
                                      .queryName(f"{spec.topology_id}.{name}")
                                      .start())
            except Exception as exc:
                return self._fail(name, f"cannot start the query: {format_error(exc)}",
                                  EXIT_FAILED)
            self._progress[name] = QueryProgress()
            log.info("started query %s.%s (checkpoint %s)", spec.topology_id, name, location)
        return self._watch()

    def _ui_url(self) -> str:
        """The SparkSession's UI address (``uiWebUrl``), "" when the topology turned the
        UI off (``spark.ui.enabled``) or it is unknown."""
        try:
            return checked_url(self.spark.sparkContext.uiWebUrl)  # type: ignore[union-attr]
        except Exception as exc:  # a JVM on its way down: no link, no failure
            log.debug("no Spark UI address: %s", format_error(exc, 200))
            return ""

    def _reassign(self, worker_index: int, num_workers: int) -> None:
        """The lease reader's thread: a rebalance kept this worker (see StatusWriter's
        ``components``). It runs on as ``worker-<index>`` of ``num_workers``."""
        before = assigned(self._components, self.spec.worker_index, self.spec.num_workers)
        after = assigned(self._components, worker_index, num_workers) \
            if 0 <= worker_index < num_workers else None
        if after != before:
            self._misplaced = (f"told to run on as worker {worker_index} of {num_workers}, "
                               f"which runs {after}, not {before}")
            return
        log.info("rebalanced: now worker %d of %d, running %s as before", worker_index,
                 num_workers, before)
        self.spec.worker_index, self.spec.num_workers = worker_index, num_workers
        self.whole = worker_component(worker_index)

    def _watch(self) -> int:
        interval = self.spec.heartbeat_secs
        # Judged on the worker's running time: a freeze (nimbus/worker/lease.py) is no
        # stall of the query's.
        clock = self._lease.running_clock if self._lease is not None else time.monotonic
        stalls = StallWatch(self.spec.stall_timeout_s, clock)
        while not self.stop.is_set():
            if self._misplaced:  # never sent by a supervisor that agrees with this worker
                return self._fail(self.whole, self._misplaced, EXIT_FAILED)
            try:
                components = {}
                for name, query in self.queries.items():
                    failure = self._failure(query)
                    if failure is not None:
                        return self._fail(name, failure, EXIT_FAILED)
                    components[name] = self._progress[name].report(query, time.time())
                    waiting = bool((query.status or {}).get("isDataAvailable"))
                    # Input that waits while batches do not advance is a stall: the
                    # supervisor's metric lets an alert see it before the restart.
                    components[name]["input_waiting"] = waiting
                    stalled = stalls.observe(name, components[name]["batch_id"], waiting)
                    if stalled is not None:
                        # A stuck query may not stop either (Spark waits for its thread
                        # for ever): exit without the graceful stop; the JVM goes with
                        # this process, and the supervisor kills what is left.
                        self.abandon = True
                        return self._fail(name, stalled, EXIT_FAILED)
            except Exception as exc:
                # A JVM gone (or a group SIGTERM that reached it before it was told to
                # ignore SIGTERM) fails the call; if a stop was requested, that is no error.
                self.stop.wait(0.5)
                return self._fail(self.whole, f"lost Spark: {format_error(exc)}",
                                  EXIT_FAILED)
            self.status.beat(components, spark_ui_url=self._spark_ui_url)
            self.stop.wait(interval)
        return EXIT_OK

    @staticmethod
    def _failure(query: StreamingQuery) -> str | None:
        exc = query.exception()
        if exc is not None:
            return f"query failed: {format_error(exc)}"
        if not query.isActive:
            return ("query terminated without an error: a topology's query must run until "
                    "stopped (Trigger.availableNow/once queries are not supported)")
        return None

    def _shutdown(self) -> None:
        if self.abandon:
            log.warning("not stopping the queries or Spark: a query is stuck")
            return
        if self.stop.is_set() and self.queries:
            self._finish_batches()
        for name, query in self.queries.items():
            try:
                if query.isActive:
                    log.info("stopping query %s", name)
                    query.stop()
            except Exception as exc:  # the JVM may already be gone (group SIGTERM)
                log.warning("stopping query %s: %s", name, format_error(exc, 300))
        if self.spark is not None:
            started = time.monotonic()
            try:
                self.spark.stop()
            except Exception as exc:
                log.warning("stopping Spark: %s", format_error(exc, 300))
            log.info("Spark stopped in %.1f s", time.monotonic() - started)


    def _finish_batches(self) -> None:
        """Asked to stop: let the batches under way commit first (a bounded wait)."""
        try:
            bound = boundary_wait_s(self.spec.stop_grace_s)
        except SpecError as exc:
            log.warning("not waiting for the batches under way: %s", exc)
            return
        waited, cut = finish_batches(self.queries, bound)
        if cut:
            log.warning("stopping: the batch under way of %s did not commit within %.1f s "
                        "(of supervisor.worker.shutdown.sleep.secs %g): it is stopped and "
                        "runs again from the checkpoint", ", ".join(cut), bound,
                        self.spec.stop_grace_s)
        else:
            log.info("stopping at a batch boundary: waited %.2f s for the batches under "
                     "way to commit", waited)


def run_pipeline(spec: WorkerSpec, status: StatusWriter, stop: threading.Event,
                 session: SparkSession | None = None, lease: Lease | None = None) -> int:
    """Run the pipeline topology of ``spec`` until ``stop`` is set or a query fails, on
    ``session`` if given (a warm worker's) or on a SparkSession of its own.

    Returns 0 when stopped, 2 when topology.py or build() is unusable, 3 when Spark or a
    query failed.
    """
    return PipelineRunner(spec, status, stop, session, lease).run()
