"""A daemon run in the foreground stops on request, also when asked half-way through
its start (nimbus/daemon_base.py): the stop then runs once the start has returned."""

from __future__ import annotations

import threading

from nimbus.daemon_base import Foreground


class Daemon:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.stopping = threading.Event()
        self.stopped = threading.Event()
        self.foreground = Foreground(self.start, self.stop, self.stopping, "test-shutdown")
        self.during_start = lambda: None

    def start(self) -> None:
        self.events.append("start begins")
        self.during_start()
        self.events.append("start ends")

    def stop(self) -> None:
        self.stopping.set()
        self.events.append(f"stop on {threading.current_thread().name}")
        self.stopped.set()


def test_a_stop_requested_during_the_start_runs_once_the_start_has_returned():
    daemon = Daemon()
    daemon.during_start = daemon.foreground.request_stop  # SIGTERM half-way
    daemon.foreground.start()
    daemon.foreground.run_forever()  # returns: the stop has begun
    assert daemon.stopped.wait(10)
    assert daemon.events == ["start begins", "start ends", "stop on test-shutdown"]


def test_a_stop_requested_after_the_start_runs_at_once():
    daemon = Daemon()
    daemon.foreground.start()
    assert not daemon.stopping.is_set()
    daemon.foreground.request_stop()
    daemon.foreground.run_forever()
    assert daemon.stopped.wait(10)
    assert daemon.events == ["start begins", "start ends", "stop on test-shutdown"]


def test_stop_once_lets_the_first_caller_stop_and_no_other():
    import threading

    from nimbus.daemon_base import StopOnce

    guard = StopOnce()
    firsts = []
    threads = [threading.Thread(target=lambda: firsts.append(guard.begin()))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert sorted(firsts) == [False] * 7 + [True]
    assert guard.stopping.is_set()
