"""StallWatch (nimbus.worker.stall): a query whose batch id stands still while input
waits is stalled; an idle one (nothing to read) never is."""

from __future__ import annotations

from nimbus.worker.stall import StallWatch


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_stalled_only_with_input_waiting_for_the_whole_timeout():
    clock = Clock()
    watch = StallWatch(300, clock)
    assert watch.observe("main", 4, True) is None
    clock.now = 299
    assert watch.observe("main", 4, True) is None
    clock.now = 300
    assert watch.observe("main", 4, True) == (
        "query stalled: no batch committed for 300s while input is waiting "
        "(topology.stall.timeout.secs 300); restarting it")


def test_progress_and_idleness_restart_the_clock():
    clock = Clock()
    watch = StallWatch(10, clock)
    watch.observe("a", 1, True)
    clock.now = 9
    assert watch.observe("a", 2, True) is None          # it committed
    clock.now = 18
    assert watch.observe("a", 2, False) is None         # idle: nothing to read
    clock.now = 27
    assert watch.observe("a", 2, True) is None          # data came 9 s ago only
    clock.now = 28.5
    assert watch.observe("a", 2, True) is not None
    assert watch.observe("b", -1, True) is None         # each query on its own


def test_off():
    clock = Clock()
    watch = StallWatch(-1, clock)
    watch.observe("a", 1, True)
    clock.now = 10**6
    assert watch.observe("a", 1, True) is None
