"""The leader's watchdog (nimbus.master.leader_watchdog) with a fake clock: it fires only
for a leader whose duty cycle is overdue, once, giving up the lock before it exits."""

from __future__ import annotations

import threading

from nimbus.master.leader_watchdog import EXIT_CODE, LeaderWatchdog, thread_stacks


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(leading: list[bool], calls: list[str], clock: Clock,
         give_up=None) -> LeaderWatchdog:  # type: ignore[no-untyped-def]
    return LeaderWatchdog(10.0, lambda: leading[0],
                          give_up=give_up or (lambda: calls.append("give up")),
                          exit=lambda code: calls.append(f"exit {code}"), clock=clock)


def test_it_fires_only_for_an_overdue_leader(caplog):
    clock, leading, calls = Clock(), [False], []
    dog = make(leading, calls, clock)
    clock.now += 60
    assert not dog.check_once()            # a follower: nothing to watch
    leading[0] = True
    assert not dog.check_once()            # counted from the moment it leads
    clock.now += 9
    dog.cycle_completed()
    clock.now += 9.5
    assert not dog.check_once() and calls == []
    assert dog.age_s() == 9.5
    clock.now += 1
    with caplog.at_level("CRITICAL", logger="nimbus.master.leader_watchdog"):
        assert dog.check_once()
    assert calls == ["give up", f"exit {EXIT_CODE}"]
    message = caplog.records[0].getMessage()
    assert message.startswith("the leader's duty cycle has not completed for 10.5s "
                              "(nimbus.leader.watchdog.secs 10): giving up leadership and "
                              "exiting with code 70; every thread's stack:")
    assert "--- thread MainThread" in message
    assert not dog.check_once() and len(calls) == 2   # once


def test_a_give_up_that_hangs_does_not_stop_the_exit(monkeypatch):
    import nimbus.master.leader_watchdog as module

    monkeypatch.setattr(module, "GIVE_UP_WAIT_S", 0.2)
    clock, leading, calls = Clock(), [True], []
    dog = make(leading, calls, clock, give_up=lambda: threading.Event().wait(30))
    dog.check_once()
    clock.now += 11
    assert dog.check_once() and calls == [f"exit {EXIT_CODE}"]


def test_thread_stacks_name_every_thread():
    stuck = threading.Event()
    thread = threading.Thread(target=stuck.wait, name="stuck-in-a-plugin", daemon=True)
    thread.start()
    try:
        assert "--- thread stuck-in-a-plugin" in thread_stacks()
    finally:
        stuck.set()
        thread.join(5)
