"""The worker with real Spark: the wordcount example end to end, a broken build(), a
failing query and a stalled one.

Each worker start costs a JVM start (5-15 s), so the module starts only four.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
from pathlib import Path

import pytest
from worker_harness import WorkerHarness, group_members, process_alive, wait_until

from nimbus.state.beat_progress import checked_history, checked_progress
from nimbus.worker_protocol.exits import EXIT_FAILED, EXIT_INVALID_TOPOLOGY, EXIT_OK

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SPARK_CONF = {"spark.ui.enabled": "false", "spark.driver.memory": "512m",
              "spark.sql.shuffle.partitions": "2"}
# First output needs a JVM start and a first batch; generous for a loaded 2-core machine.
SPARK_TIMEOUT = 120.0


def _load_counts():
    spec = importlib.util.spec_from_file_location(
        "wordcount_counts", REPO / "examples" / "wordcount" / "counts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


counts = _load_counts()


def text_of(i: int) -> str:
    return " ".join(f"w{j}" for j in range(i % 4))  # 0 to 3 words; 0 words is ""


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("worker-spark")


def base_conf(base: Path) -> dict:
    return {"storm.local.dir": str(base / "local"), "worker.heartbeat.frequency.secs": 1,
            "topology.spark.master": "local[1]", "topology.spark.conf": SPARK_CONF}


class Feeder:
    """Writes input files atomically (staged next to the input dir, then renamed in)."""

    def __init__(self, base: Path) -> None:
        self.input = base / "in"
        self.staging = base / "staging"
        self.input.mkdir()
        self.staging.mkdir()
        self.files = 0

    def feed(self, ids: range, per_file: int) -> None:
        for start in range(ids.start, ids.stop, per_file):
            self.files += 1
            name = f"records-{self.files:04d}.json"
            lines = [json.dumps({"id": i, "text": text_of(i)})
                     for i in range(start, min(start + per_file, ids.stop))]
            (self.staging / name).write_text("\n".join(lines) + "\n")
            os.replace(self.staging / name, self.input / name)


def committed_ids(output: Path) -> list[int]:
    return sorted(row["id"] for row in counts.committed_rows(output))


def command_name(pid: int) -> str:
    """The process's command name, or "" once it has exited."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        # Spark's driver runs short-lived helpers in the group; one may be gone by now.
        return ""


def jvm_pids(worker: WorkerHarness) -> list[int]:
    """The Java processes in the worker's process group (its Spark driver)."""
    return [pid for pid in group_members(worker.pid) if command_name(pid) == "java"]


def test_wordcount_is_exactly_once_across_kill_9_stop_and_lease_expiry(base):
    feeder = Feeder(base)
    output = base / "out"
    conf = {**base_conf(base), "wordcount.input.dir": str(feeder.input),
            "wordcount.output.dir": str(output), "wordcount.trigger.secs": 1,
            "wordcount.max.files.per.trigger": 2}
    worker_dir = base / "workers" / "wordcount-1-1-6700"

    def worker(restarts: int) -> WorkerHarness:
        return WorkerHarness(worker_dir, topology_id="wordcount-1-1",
                             code_dir=REPO / "examples" / "wordcount", conf=conf,
                             restarts=restarts)

    first = worker(0)
    feeder.feed(range(0, 10), per_file=5)
    first.start()
    try:
        first.keep_renewing(ttl=30, every=1)
        first.wait_for(lambda: committed_ids(output) == list(range(10)), SPARK_TIMEOUT,
                       "ids 0-9 in the committed output")
        first.wait_for(lambda: any(b["components"].get("main", {}).get("batch_id", -1) >= 0
                                   for b in first.beats()), 10, "a beat with a batch id")
        beat = first.beats()[-1]
        assert set(beat["components"]) == {"main"}
        main = beat["components"]["main"]
        assert set(main) == {
            "batch_id", "num_input_rows", "input_rows_per_second",
            "processed_rows_per_second", "timestamp", "input_waiting", "progress", "history"}
        # Spark's full progress: the file source and its offsets, the sink, the
        # durations; and the charts' history. The supervisor's checks keep all of it.
        progress = main["progress"]
        (source,) = progress["sources"]
        assert source["description"] == f"FileStreamSource[file:{feeder.input}]"
        assert '"logOffset"' in source["end_offset"]
        assert progress["sink"]["description"].startswith("FileSink[")
        assert progress["duration_ms"]["triggerExecution"] > 0
        assert main["history"] and all(len(point) == 4 for point in main["history"])
        assert checked_progress(progress) == progress
        assert checked_history(main["history"]) == main["history"]
        assert "spark_ui_url" not in beat, "spark.ui.enabled is false: no Spark UI"

        # Records fed while it runs are picked up.
        feeder.feed(range(10, 20), per_file=5)
        first.wait_for(lambda: committed_ids(output) == list(range(20)), 60,
                       "ids 10-19 in the committed output")

        # Ten files, two per batch: kill -9 the whole group once the first of these
        # batches has committed, while the next ones are still to come or running.
        feeder.feed(range(20, 40), per_file=2)
        first.wait_for(lambda: len(committed_ids(output)) > 20, 60, "a batch of ids 20-39")
        os.killpg(first.pid, signal.SIGKILL)
        assert first.wait_exit(timeout=30) == -signal.SIGKILL
        wait_until(lambda: not group_members(first.pid), 30, "the JVM to die with the group")
        at_kill = committed_ids(output)
        assert len(at_kill) == len(set(at_kill)) and set(at_kill) <= set(range(40))
        assert len(at_kill) < 40  # killed with batches still to run: a real mid-run kill
        assert first.errors() == []
    finally:
        first.close()

    second = worker(1)
    second.start()
    try:
        second.keep_renewing(ttl=30, every=1)
        feeder.feed(range(40, 50), per_file=5)
        second.wait_for(lambda: committed_ids(output) == list(range(50)), SPARK_TIMEOUT,
                        "every id 0-49 exactly once after the restart")
        rows = counts.committed_rows(output)
        assert sorted((r["id"], r["words"]) for r in rows) == [
            (i, i % 4) for i in range(50)]
        assert second.beats()[-1]["restarts"] == 1

        # As the supervisor stops a worker: SIGTERM to the group (the JVM gets it too, and
        # ignores it: the worker stops the query and Spark in order).
        second.signal(signal.SIGTERM, group=True)
        assert second.wait_exit(timeout=60) == EXIT_OK
        wait_until(lambda: not group_members(second.pid), 30, "the group to be gone")
        assert second.errors() == []
        log = second.log_text()
        assert "stopping query main\n" in log
        assert "WARNING [MainThread] nimbus.worker.pipeline: stopping" not in log
    finally:
        second.close()

    # A lease that runs out: the worker kills its group, Spark's JVM included, mid-run.
    third = worker(2)
    third.start()
    try:
        third.keep_renewing(ttl=30, every=1)
        feeder.feed(range(50, 60), per_file=5)
        third.wait_for(lambda: committed_ids(output) == list(range(60)), SPARK_TIMEOUT,
                       "ids 50-59 in the committed output")
        [jvm] = jvm_pids(third)
        third.stop_renewing()
        third.lease(0.5)
        feeder.feed(range(60, 70), per_file=1)
        assert third.wait_exit(timeout=30) == -signal.SIGKILL
        wait_until(lambda: not group_members(third.pid), 30, "the JVM to die with the group")
        assert not process_alive(jvm)
        assert "lease lost (lease deadline passed" in third.log_text()
        assert third.errors() == []
    finally:
        third.close()
    ids = committed_ids(output)
    assert ids == sorted(set(ids)) and set(range(60)) <= set(ids) <= set(range(70))


def test_build_returning_a_batch_dataframe_is_refused_with_exit_2(base):
    code = base / "batch-code"
    code.mkdir()
    (code / "topology.py").write_text("def build(spark, conf):\n    return spark.range(3)\n")
    worker = WorkerHarness(base / "workers" / "batch-1-1-6700", topology_id="batch-1-1",
                           code_dir=code, conf=base_conf(base)).start()
    try:
        worker.keep_renewing(ttl=30, every=1)
        assert worker.wait_exit(timeout=SPARK_TIMEOUT) == EXIT_INVALID_TOPOLOGY
        worker.wait_for(worker.errors, 5, "the error line")
        assert worker.errors() == [{
            "component": "worker-0",
            "error": "build() returned a DataFrame, not a DataStreamWriter: "
                     "return df.writeStream... (an unstarted writer with its sink)"}]
        assert worker.beats() == []
    finally:
        worker.close()


FAILING_TOPOLOGY = '''
from pyspark.sql import functions as F


def explode(value):
    # A module-level function: Spark's Python worker must import this bundle to run it.
    if value >= 0:
        raise ValueError(f"boom at {value}")
    return value


def build(spark, conf):
    rate = spark.readStream.format("rate").option("rowsPerSecond", 5).load()
    failing = rate.select(F.udf(explode, "long")("value").alias("v"))
    return {"ok": rate.writeStream.format("noop"),
            "fails": failing.writeStream.format("noop")}
'''


def test_a_failing_query_is_reported_under_its_component_with_exit_3(base):
    code = base / "failing-code"
    code.mkdir()
    (code / "topology.py").write_text(FAILING_TOPOLOGY)
    worker = WorkerHarness(base / "workers" / "failing-1-1-6700", topology_id="failing-1-1",
                           code_dir=code, conf=base_conf(base)).start()
    try:
        worker.keep_renewing(ttl=30, every=1)
        assert worker.wait_exit(timeout=SPARK_TIMEOUT) == EXIT_FAILED
        worker.wait_for(worker.errors, 5, "the error line")
        [error] = worker.errors()
        assert error["component"] == "fails"
        assert error["error"].startswith("query failed: StreamingQueryException: ")
        assert "ValueError: boom at 0" in error["error"]
        assert len(error["error"]) <= 2048
        log = worker.log_text()
        assert "started query failing-1-1.fails (checkpoint " \
            f"{base / 'local' / 'checkpoints' / 'failing-1-1' / 'fails'})" in log
        assert "started query failing-1-1.ok" in log
    finally:
        worker.close()


STALLING_TOPOLOGY = '''
import time


def hang_after_the_first(batch, batch_id):
    if batch_id >= 1:
        time.sleep(3600)  # a sink that never answers


def build(spark, conf):
    rate = spark.readStream.format("rate").option("rowsPerSecond", 5).load()
    return {"hangs": rate.writeStream.foreachBatch(hang_after_the_first)
            .trigger(processingTime="1 second")}
'''


def test_a_query_that_stops_committing_with_input_waiting_is_restarted(base):
    """Issue 20: a query that hangs without failing was never replaced; with
    topology.stall.timeout.secs its worker exits, saying so, for its supervisor to
    restart it."""
    code = base / "stalling-code"
    code.mkdir()
    (code / "topology.py").write_text(STALLING_TOPOLOGY)
    worker = WorkerHarness(base / "workers" / "stalling-1-1-6700", topology_id="stalling-1-1",
                           code_dir=code, conf={**base_conf(base),
                                                "topology.stall.timeout.secs": 4}).start()
    try:
        worker.keep_renewing(ttl=30, every=1)
        assert worker.wait_exit(timeout=SPARK_TIMEOUT) == EXIT_FAILED
        worker.wait_for(worker.errors, 5, "the error line")
        [error] = worker.errors()
        assert error["component"] == "hangs"
        assert error["error"].startswith("query stalled: no batch committed for ")
        assert error["error"].endswith("while input is waiting "
                                       "(topology.stall.timeout.secs 4); restarting it")
    finally:
        worker.close()
