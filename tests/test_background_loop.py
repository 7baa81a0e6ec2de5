"""The shared background loop (nimbus.background_loop): a named thread that steps, waits
its period or for a wake-up, survives a failing step, and stops joined."""

from __future__ import annotations

import logging
import threading

from waiting import wait_for

from nimbus.background_loop import BackgroundLoop


class Steps:
    """A step that counts its runs and notes, for each, whether a wake-up began it."""

    def __init__(self) -> None:
        self.loop: BackgroundLoop | None = None
        self.woken: list[bool] = []

    def __call__(self) -> None:
        assert self.loop is not None
        self.woken.append(self.loop.woken)

    @property
    def count(self) -> int:
        return len(self.woken)


def make(steps: Steps, period, **kw) -> BackgroundLoop:  # type: ignore[no-untyped-def]
    steps.loop = BackgroundLoop("test-loop", steps, period, **kw)
    return steps.loop


def test_stop_joins_the_named_thread_and_no_step_begins_after_it():
    entered, release = threading.Event(), threading.Event()
    runs: list[int] = []

    def step() -> None:
        runs.append(1)
        entered.set()
        release.wait(10)

    loop = BackgroundLoop("test-loop-stop", step, None).start()
    assert entered.wait(10)
    assert "test-loop-stop" in [t.name for t in threading.enumerate()]
    stopper = threading.Thread(target=loop.stop, name="test-stopper", daemon=True)
    stopper.start()
    assert stopper.is_alive()      # stop() waits for the step under way
    release.set()
    stopper.join(10)
    assert not stopper.is_alive() and not loop.is_alive()
    assert "test-loop-stop" not in [t.name for t in threading.enumerate()]
    assert runs == [1] and loop.stopping


def test_start_starts_once_and_a_stopped_loop_stays_stopped():
    steps = Steps()
    loop = make(steps, None, wait_first=True)
    loop.start()
    loop.start()                    # no second thread, no error
    assert [t.name for t in threading.enumerate()].count("test-loop") == 1
    loop.stop()
    loop.start()
    assert not loop.is_alive() and steps.count == 0

    never = BackgroundLoop("test-loop-never", lambda: None, 0.0)
    never.stop()                    # before start: nothing to join
    never.start()
    assert not never.is_alive()


def test_wake_runs_a_step_before_the_period_ends():
    steps = Steps()
    loop = make(steps, 3600.0, wait_first=True).start()
    try:
        assert steps.count == 0     # waiting out its first hour
        loop.wake()
        wait_for(lambda: steps.count == 1, 10, "the step a wake-up asked for")
        loop.wake()
        wait_for(lambda: steps.count == 2, 10, "a second woken step")
        assert steps.woken == [True, True]
    finally:
        loop.stop()


def test_a_wake_up_during_a_step_is_not_lost():
    entered, release = threading.Event(), threading.Event()
    runs: list[bool] = []

    def step() -> None:
        runs.append(loop.woken)
        if len(runs) == 1:
            entered.set()
            release.wait(10)

    loop = BackgroundLoop("test-loop-busy", step, None)
    loop.start()
    try:
        assert entered.wait(10)
        loop.wake()                 # while the first step runs
        release.set()
        wait_for(lambda: len(runs) == 2, 10, "the step the wake-up asked for")
        assert runs == [False, True]
    finally:
        loop.stop()


def test_a_failing_step_is_logged_and_the_loop_goes_on(caplog):
    errors: list[Exception] = []
    runs: list[int] = []

    def step() -> None:
        runs.append(1)
        if len(runs) == 1:
            raise ValueError("first pass broke")

    loop = BackgroundLoop("test-loop-fails", step, 0.0, on_error=errors.append)
    with caplog.at_level(logging.ERROR, logger="nimbus.background_loop"):
        loop.start()
        try:
            wait_for(lambda: len(runs) >= 2, 10, "a step after the failing one")
        finally:
            loop.stop()
    [record] = [r for r in caplog.records if r.name == "nimbus.background_loop"]
    assert record.getMessage() == "test-loop-fails: step failed"
    assert record.exc_info is not None and str(record.exc_info[1]) == "first pass broke"
    assert [str(e) for e in errors] == ["first pass broke"]


def test_the_period_callable_is_asked_after_every_step():
    steps = Steps()
    asked: list[int] = []

    def period() -> float | None:
        asked.append(steps.count)
        return 0.0 if steps.count < 3 else None   # three at once, then wake-ups only

    loop = make(steps, period).start()
    try:
        wait_for(lambda: asked == [1, 2, 3], 10, "three steps, each followed by a wait")
        assert steps.count == 3 and steps.woken == [False, False, False]
        loop.wake()
        wait_for(lambda: asked == [1, 2, 3, 4], 10, "the woken fourth step")
        assert steps.woken[3] is True
    finally:
        loop.stop()


def test_a_failing_period_falls_back_to_a_short_wait(caplog):
    steps = Steps()

    def period() -> float:
        raise RuntimeError("no deadline")

    loop = make(steps, period)
    with caplog.at_level(logging.ERROR, logger="nimbus.background_loop"):
        loop.start()
        try:
            wait_for(lambda: steps.count >= 2, 10, "a step after the fallback wait")
        finally:
            loop.stop()
    assert "test-loop: period failed; waiting 1.0s" in [r.getMessage() for r in caplog.records]


def test_wake_ups_in_a_burst_make_one_step():
    steps = Steps()
    loop = make(steps, None, wait_first=True, coalesce_s=2.0).start()
    try:
        for _ in range(3):
            loop.wake()
        wait_for(lambda: steps.count == 1, 10, "one step for the burst")
    finally:
        loop.stop()                 # wakes the loop: a wake-up still pending would step
    assert steps.count == 1


def test_sleep_ends_at_stop():
    outcome: list[bool] = []
    entered = threading.Event()

    def step() -> None:
        entered.set()
        outcome.append(loop.sleep(3600))

    loop = BackgroundLoop("test-loop-sleeps", step, None)
    loop.start()
    assert entered.wait(10)
    loop.stop()
    assert outcome == [True] and not loop.is_alive()


def test_a_step_that_never_returns_is_reported_at_stop(caplog):
    entered, release = threading.Event(), threading.Event()

    def step() -> None:
        entered.set()
        release.wait(30)

    loop = BackgroundLoop("test-loop-hangs", step, None).start()
    assert entered.wait(10)
    with caplog.at_level(logging.WARNING, logger="nimbus.background_loop"):
        loop.stop(join_timeout=0.1)
    assert "test-loop-hangs did not stop within 0.1s: its step is still running" in [
        r.getMessage() for r in caplog.records]
    release.set()
    loop.stop()
    assert not loop.is_alive()
