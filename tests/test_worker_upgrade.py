"""The worker's side of upgrades (issue 31), Spark-free: a pipeline asked to stop lets
the batch under way commit first, within a bound of its supervisor's stop grace (fake
StreamingQuery objects stand in for Spark's); a process topology's health check says when
it first passed; the spec carries the code version."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import threading
import time
from pathlib import Path

import pytest
from worker_harness import worker_conf

from nimbus.worker import pipeline
from nimbus.worker.health import HealthCheck, HealthSpec
from nimbus.worker.pipeline import PipelineRunner, boundary_wait_s, finish_batches
from nimbus.worker_protocol.spec import SpecError, WorkerSpec

TOPOLOGY = "up-1-1700000000"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now = round(self.now + seconds, 6)


class FakeQuery:
    """A StreamingQuery whose trigger under way ends after ``active_for`` seconds of
    the clock (None: never), then reports the progress of the batch it ran."""

    def __init__(self, clock: FakeClock, active_for: float | None, *,
                 next_batch_after: float | None = None, active: bool = True) -> None:
        self._clock = clock
        self._ends = None if active_for is None else clock.now + active_for
        # A next trigger that begins right after the first one ends (input keeps coming).
        self._next = next_batch_after
        self.isActive = active
        self.events: list[str] = []

    def _done(self) -> bool:
        return self._ends is not None and self._clock.now >= self._ends

    @property
    def status(self) -> dict:
        active = not self._done() or (self._next is not None and
                                      self._clock.now >= self._ends + self._next)
        return {"message": "Processing new data" if active else "Waiting for data",
                "isDataAvailable": True, "isTriggerActive": active}

    @property
    def lastProgress(self) -> dict:  # noqa: N802 - Spark's name
        batch = 7 if self._done() else 6
        return {"batchId": batch, "timestamp": f"2026-11-27T10:00:0{batch}.000Z",
                "durationMs": {"addBatch": 10}}

    def stop(self) -> None:
        self.events.append(f"stop at {self._clock.now:.2f}")


class BrokenQuery:
    isActive = True

    @property
    def status(self) -> dict:
        raise RuntimeError("py4j: the JVM is gone")


def test_the_wait_is_half_the_stop_grace_leaving_time_to_stop_spark():
    assert boundary_wait_s(3.0) == 1.5      # the default grace
    assert boundary_wait_s(10.0) == 5.0
    assert boundary_wait_s(2.0) == 0.5
    assert boundary_wait_s(1.0) == 0.0 == boundary_wait_s(0.0)


def test_a_stop_waits_for_the_batch_under_way_to_commit():
    clock = FakeClock()
    query = FakeQuery(clock, active_for=0.4)
    waited, cut = finish_batches({"main": query}, 1.5, clock, clock.sleep)
    assert cut == [] and round(waited, 2) == 0.4
    assert not query.status["isTriggerActive"]


def test_the_next_batch_is_not_waited_for_once_the_one_under_way_committed():
    clock = FakeClock()
    # The trigger ends at 0.3 s and the next begins at once: a new progress shows it.
    query = FakeQuery(clock, active_for=0.3, next_batch_after=0.0)
    waited, cut = finish_batches({"main": query}, 1.5, clock, clock.sleep)
    assert cut == [] and round(waited, 2) == 0.3


def test_the_wait_is_bounded_and_says_which_batch_did_not_commit():
    clock = FakeClock()
    slow, done = FakeQuery(clock, active_for=None), FakeQuery(clock, active_for=0.1)
    waited, cut = finish_batches({"slow": slow, "done": done}, 1.5, clock, clock.sleep)
    assert cut == ["slow"] and round(waited, 2) == 1.5   # one deadline for all


def test_an_inactive_or_unreachable_query_is_not_waited_for():
    clock = FakeClock()
    gone = FakeQuery(clock, active_for=None, active=False)
    waited, cut = finish_batches({"gone": gone, "broken": BrokenQuery()}, 1.5, clock,
                                 clock.sleep)
    assert (waited, cut) == (0.0, [])


def spec(tmp_path: Path, grace: float = 3.0, **changes) -> WorkerSpec:
    conf = worker_conf({"storm.local.dir": str(tmp_path / "local"),
                        "supervisor.worker.shutdown.sleep.secs": grace})
    return WorkerSpec(**{"topology_id": TOPOLOGY, "port": 6700, "supervisor_id": "s",
                         "host": "h", "code_dir": str(tmp_path), "lease_fd": -1,
                         "status_fd": -1, "conf": conf, **changes})


def on_clock(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> None:
    """The runner's wait runs on ``clock`` (and sleeps on it)."""
    monkeypatch.setattr(pipeline, "finish_batches", functools.partial(
        finish_batches, clock=clock, sleep=clock.sleep))


def runner(tmp_path: Path, queries: dict, grace: float = 3.0) -> PipelineRunner:
    stop = threading.Event()
    stop.set()   # SIGTERM: the supervisor stops it
    run = PipelineRunner(spec(tmp_path, grace), status=None, stop=stop)  # type: ignore[arg-type]
    run.queries = queries
    return run


def test_a_stopping_pipeline_stops_its_queries_after_their_batch_commits(
        tmp_path, monkeypatch, caplog):
    clock = FakeClock()
    on_clock(monkeypatch, clock)
    query = FakeQuery(clock, active_for=0.6)
    with caplog.at_level(logging.INFO, logger="nimbus.worker.pipeline"):
        runner(tmp_path, {"main": query})._shutdown()
    assert query.events == ["stop at 100.60"]   # stopped once its batch committed
    assert any(m.startswith("stopping at a batch boundary: waited 0.6") for m in
               caplog.messages)


def test_a_batch_that_does_not_commit_in_time_is_stopped_and_said(tmp_path, monkeypatch,
                                                                    caplog):
    clock = FakeClock()
    on_clock(monkeypatch, clock)
    query = FakeQuery(clock, active_for=None)
    with caplog.at_level(logging.INFO, logger="nimbus.worker.pipeline"):
        runner(tmp_path, {"main": query}, grace=3.0)._shutdown()
    assert query.events == ["stop at 101.50"]   # 1.5 s of the 3 s grace, no more
    assert any("the batch under way of main did not commit within 1.5 s" in m and
               "runs again from the checkpoint" in m for m in caplog.messages)


def test_a_stuck_query_or_a_failure_is_not_waited_for(tmp_path, monkeypatch):
    clock = FakeClock()
    on_clock(monkeypatch, clock)
    stuck = FakeQuery(clock, active_for=None)
    run = runner(tmp_path, {"main": stuck})
    run.abandon = True           # the stall watch gave up on it: Spark may never stop it
    run._shutdown()
    assert stuck.events == [] and clock.now == 100.0
    failed = FakeQuery(clock, active_for=None)
    run = runner(tmp_path, {"main": failed})
    run.stop.clear()             # it exits on a failure, not asked to stop
    run._shutdown()
    assert failed.events == ["stop at 100.00"]


def test_the_spec_carries_the_code_version_and_the_stop_grace(tmp_path):
    assert spec(tmp_path).code_version == 1    # the submitted code; earlier specs too
    upgraded = spec(tmp_path, code_version=4)
    upgraded.dump(tmp_path)
    assert WorkerSpec.load(tmp_path).code_version == 4
    assert upgraded.stop_grace_s == 3.0
    with pytest.raises(SpecError, match="'code_version' must be 1 or more"):
        spec(tmp_path, code_version=0)
    fields = dataclasses.asdict(spec(tmp_path))
    del fields["code_version"]   # worker.json of an earlier release
    (tmp_path / "worker.json").write_text(json.dumps(fields))
    assert WorkerSpec.load(tmp_path).code_version == 1
    conf = dict(spec(tmp_path).conf)
    del conf["supervisor.worker.shutdown.sleep.secs"]
    with pytest.raises(SpecError, match="supervisor.worker.shutdown.sleep.secs"):
        spec(tmp_path, conf=conf).check_settings()


def test_a_file_health_check_passes_only_on_a_file_written_since_the_start(tmp_path):
    old = tmp_path / "hb"
    old.write_text("")
    os.utime(old, (time.time() - 600, time.time() - 600))   # an earlier run's
    check = HealthCheck(HealthSpec(file="hb", timeout_s=30, grace_s=0), tmp_path, {},
                        tmp_path)
    assert check.poll() is None and not check.passed
    assert check.poll() is None and not check.passed
    old.write_text("beat")   # written now
    assert check.poll() is None and check.passed


def test_a_command_health_check_passes_when_it_exits_zero(tmp_path):
    clock = FakeClock()
    check = HealthCheck(HealthSpec(command=["true"], every_s=1, grace_s=0), tmp_path,
                        dict(os.environ), tmp_path, clock=clock)
    assert check.poll() is None and not check.passed   # started, not done
    deadline = time.monotonic() + 10
    while not check.passed and time.monotonic() < deadline:
        time.sleep(0.05)
        assert check.poll() is None
    assert check.passed
    failing = HealthCheck(HealthSpec(command=["false"], every_s=1, grace_s=0), tmp_path,
                          dict(os.environ), tmp_path, clock=clock)
    failing.poll()
    failing._running.wait()   # type: ignore[union-attr]
    assert failing.poll() is not None and not failing.passed


# -- a new version whose components differ, beside workers that may run the old ones -------
class FakeWriter:
    """An unstarted DataStreamWriter: what the runner does with it is recorded."""

    def __init__(self, name: str, started: list[str]) -> None:
        self.name, self.started = name, started

    def option(self, key: str, value: str) -> FakeWriter:
        return self

    def queryName(self, name: str) -> FakeWriter:  # noqa: N802 - Spark's name
        return self

    def start(self) -> FakeStartedQuery:
        self.started.append(self.name)
        return FakeStartedQuery()


class FakeStartedQuery:
    isActive = False

    def stop(self) -> None:
        pass


class FakeStatus:
    def __init__(self) -> None:
        self.declared: list[tuple[list[str], list[str]]] = []
        self.errors: list[tuple[str, str]] = []

    def components(self, every: list[str], mine: list[str]) -> None:
        self.declared.append((every, mine))

    def error(self, component: str, error: str) -> None:
        self.errors.append((component, error))


class FakeSession:
    sparkContext = None   # no UI address

    def stop(self) -> None:
        pass


def run_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, names: list[str],
              **changes) -> tuple[int, list[str], FakeStatus]:
    """Run a pipeline whose build() returns writers named ``names`` on a session already
    up (a warm worker's), until its queries are started."""
    started: list[str] = []
    monkeypatch.setattr(pipeline, "load_build", lambda code_dir: lambda spark, conf: names)
    monkeypatch.setattr(pipeline, "writers_of",
                        lambda result: {n: FakeWriter(n, started) for n in result})
    status = FakeStatus()
    run = PipelineRunner(spec(tmp_path, **changes), status,  # type: ignore[arg-type]
                         threading.Event(), session=FakeSession())  # type: ignore[arg-type]
    run._watch = lambda: 0   # type: ignore[method-assign]
    return run.run(), started, status


V1 = ["counts", "enrich"]
V2 = ["alerts", "counts", "enrich"]


def test_a_worker_of_several_whose_components_changed_starts_no_query(tmp_path,
                                                                      monkeypatch):
    """2 workers, v1 [counts, enrich]: worker-1 runs enrich. v2 adds alerts: worker-0
    would run alerts and enrich while worker-1 may still run enrich on v1."""
    code, started, status = run_built(tmp_path, monkeypatch, V2, worker_index=0,
                                      num_workers=2, code_version=2,
                                      previous_components=V1)
    assert code == 2 and started == []        # EXIT_INVALID_TOPOLOGY: a failure of v2
    assert status.declared == []   # the slot keeps v1's components for its next worker
    assert status.errors == [("worker-0", (
        "the new code's components ['alerts', 'counts', 'enrich'] differ from the running "
        "code's ['counts', 'enrich']: with 2 workers a component would move to another "
        "worker while the old one still runs it; rebalance to 1 worker first, or "
        "deactivate, upgrade, then activate"))]
    # A component removed or renamed alike.
    for names in (["counts"], ["counts", "enriched"]):
        code, started, _ = run_built(tmp_path, monkeypatch, names, worker_index=1,
                                     num_workers=2, previous_components=V1)
        assert (code, started) == (2, [])


@pytest.mark.parametrize(("num_workers", "previous", "runs"), [
    (1, V1, V2),                            # one worker: one process at a time
    (2, [], ["alerts", "enrich"]),          # nothing known of the slot's last worker
    (2, ["enrich", "counts", "alerts"], ["alerts", "enrich"]),   # the same, any order
])
def test_a_single_worker_or_an_unchanged_or_unknown_list_runs(tmp_path, monkeypatch,
                                                              num_workers, previous, runs):
    code, started, status = run_built(tmp_path, monkeypatch, V2, worker_index=0,
                                      num_workers=num_workers, previous_components=previous)
    assert (code, started, status.errors) == (0, runs, [])
    assert status.declared == [(V2, runs)]


def test_the_spec_carries_the_previous_components_checked(tmp_path):
    assert spec(tmp_path).previous_components == []   # unknown; earlier specs too
    told = spec(tmp_path, previous_components=V1)
    told.dump(tmp_path)
    assert WorkerSpec.load(tmp_path).previous_components == V1
    for bad in ("counts", ["counts", 3], [""], ["x" * 65], ["a"] * 10_001, {"a": 1}):
        with pytest.raises(SpecError, match="previous_components"):
            spec(tmp_path, previous_components=bad)
    fields = dataclasses.asdict(spec(tmp_path))
    fields["previous_components"] = [None]
    (tmp_path / "worker.json").write_text(json.dumps(fields))
    with pytest.raises(SpecError, match="previous_components"):
        WorkerSpec.load(tmp_path)
