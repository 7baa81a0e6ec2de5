"""The nimbus's cycle (nimbus.master.cycle) with fakes for its facts: the order of its
steps, and what each fact makes it do. The elector itself runs against a real ZooKeeper
in test_fencing_and_election.py, and whole nimbuses in the HA tests."""

from __future__ import annotations

import pytest
from kazoo.exceptions import ConnectionLoss

from nimbus.master.cycle import Bell, NimbusCycle
from nimbus.master.elector import ElectionStep, Leadership
from nimbus.state.cluster_state import LayoutMissingError


class Journal(list):
    """What the cycle did, in order."""


class FakeRegistration:
    def __init__(self, journal, fail=False):
        self.journal, self.fail = journal, fail

    def ensure(self):
        self.journal.append("register")
        if self.fail:
            raise ConnectionLoss()


class FakeView:
    def __init__(self, loaded=True):
        self.loaded = loaded


class FakeCode:
    def __init__(self, journal, check=True, error=None, layout_error=None):
        self.journal, self.check, self.error = journal, check, error
        self.layout_error = layout_error
        self.syncs_asked = 0

    def check_cluster(self):
        if self.layout_error is not None:
            raise self.layout_error

    def check_code(self, leading=False):
        self.journal.append("code check")
        if self.error is not None:
            raise self.error
        return self.check

    def resync(self):
        self.syncs_asked += 1


class FakeElector:
    SAFETY_INTERVAL_S = 2.0
    RETRY_PAUSE_S = 0.2

    def __init__(self, journal, steps, wants_check=True):
        self.journal = journal
        self.steps = list(steps)     # the ElectionSteps to return, in turn
        self.wants_check = wants_check
        self.codes = []              # the code each step was given
        self.current: Leadership | None = None
        self.aside = []

    def wants_code_check(self):
        return self.wants_check

    def step(self, code):
        self.journal.append("decide")
        self.codes.append(code)
        step = self.steps.pop(0)
        self.current = step.leadership
        return step

    def step_failed(self, exc):
        self.journal.append("step failed")
        self.current = None
        return ElectionStep(None, retry_in_s=self.RETRY_PAUSE_S)

    def stand_aside(self, problem):
        self.aside.append(str(problem))
        self.current = None

    def leadership(self):
        return self.current

    def is_leader(self):
        return self.current is not None


class FakeDuties:
    def __init__(self, journal, due=True):
        self.journal, self.is_due = journal, due
        self.ran: list[Leadership] = []

    def ask(self):
        self.is_due = True

    def due(self, leadership):
        return self.is_due

    def due_in_s(self):
        return 0.0 if self.is_due else 10.0

    def run(self, leadership):
        self.journal.append("duties")
        self.ran.append(leadership)


class FakeSummary:
    def __init__(self, journal):
        self.journal = journal

    def wake(self, _event=None):
        self.journal.append("summary")


class Told:
    def __init__(self):
        self.changes = []

    def on_leadership(self, leader):
        self.changes.append(leader)


LEADING = Leadership("/lock/nimbus-a-0000000000", 1)


def cycle_of(steps, *, register_fails=False, loaded=True, check=True, code_error=None,
             wants_check=True, due=True, layout_error=None):
    journal = Journal()
    parts = dict(
        registration=FakeRegistration(journal, register_fails), view=FakeView(loaded),
        code=FakeCode(journal, check, code_error, layout_error),
        elector=FakeElector(journal, steps, wants_check), duties=FakeDuties(journal, due),
        summary=FakeSummary(journal), observer=Told())
    completed = []
    cycle = NimbusCycle(Bell(), completed=lambda: completed.append(1), **parts)
    return cycle, journal, parts, completed


def test_a_leaders_cycle_runs_its_steps_in_order():
    cycle, journal, parts, completed = cycle_of([ElectionStep(LEADING)])
    cycle.run_cycle()
    assert journal == ["register", "code check", "decide", "summary", "duties"]
    assert parts["elector"].codes == [True], "the decision is taken on the code check"
    assert parts["duties"].ran == [LEADING]
    assert parts["observer"].changes == [True]
    assert completed == [1] and cycle.cycles == 1


def test_a_follower_further_back_reads_no_code_and_runs_no_duties():
    cycle, journal, parts, _ = cycle_of([ElectionStep(None)], wants_check=False)
    cycle.run_cycle()
    assert journal == ["register", "decide"]
    assert parts["elector"].codes == [None]
    assert parts["observer"].changes == []


def test_giving_up_for_lack_of_code_asks_the_sync_once():
    cycle, journal, parts, _ = cycle_of([ElectionStep(None, lacks_code=True),
                                         ElectionStep(None)], check=False)
    cycle.run_cycle()
    cycle.run_cycle()
    assert parts["code"].syncs_asked == 1
    assert "duties" not in journal


def test_duties_wait_while_the_view_is_read_again():
    cycle, journal, parts, _ = cycle_of([ElectionStep(LEADING)], loaded=False)
    cycle.run_cycle()
    assert parts["duties"].ran == []
    assert journal[-1] == "summary", "leadership is still told"
    assert parts["observer"].changes == [True]


def test_duties_not_due_do_not_run_unless_forced():
    cycle, _, parts, _ = cycle_of([ElectionStep(LEADING)] * 2, due=False)
    cycle.run_cycle()
    assert parts["duties"].ran == []
    cycle.run_cycle(duties=True)
    assert parts["duties"].ran == [LEADING]


def test_a_failed_registration_skips_the_rest_and_retries_soon():
    cycle, journal, parts, completed = cycle_of([], register_fails=True)
    cycle.run_cycle()
    assert journal == ["register"]
    assert completed == [1], "the watchdog still sees the cycle complete"
    assert cycle._wait_s() == pytest.approx(1.0)


def test_a_wiped_root_makes_the_nimbus_stand_aside():
    problem = LayoutMissingError("/storm holds cluster b, not a")
    cycle, journal, parts, _ = cycle_of([], code_error=problem)
    cycle.run_cycle()
    assert parts["elector"].aside == [str(problem)]
    assert "decide" not in journal and "duties" not in journal


def test_a_follower_further_back_stands_aside_too_when_the_root_was_wiped():
    problem = LayoutMissingError("/storm holds cluster b, not a")
    cycle, journal, parts, _ = cycle_of([], wants_check=False, layout_error=problem)
    cycle.run_cycle()
    assert parts["elector"].aside == [str(problem)]
    assert journal == ["register"], "no code read, no queue step"


def test_a_zookeeper_error_in_the_code_check_ends_the_step_and_retries_soon():
    cycle, journal, parts, _ = cycle_of([], code_error=ConnectionLoss())
    cycle.run_cycle()
    assert journal == ["register", "code check", "step failed"]
    assert cycle._wait_s() == pytest.approx(0.2)


def test_a_spell_lost_and_another_won_between_two_cycles_are_both_told():
    later = Leadership(LEADING.node, 2)
    cycle, _, parts, _ = cycle_of([ElectionStep(LEADING), ElectionStep(later),
                                   ElectionStep(None)])
    cycle.run_cycle()
    cycle.run_cycle()
    cycle.run_cycle()
    assert parts["observer"].changes == [True, False, True, False]


def test_a_bell_rung_before_the_loop_exists_wakes_its_first_cycle():
    bell = Bell()
    bell.ring()
    journal = Journal()
    woken = []

    class Loop:
        def wake(self):
            woken.append(1)

    bell.attach(Loop())
    bell.ring()
    assert woken == [1, 1]
    assert journal == []
