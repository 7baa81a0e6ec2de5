"""The soak's leadership arithmetic on made-up logs: overlaps, gaps, kills and freezes."""

from __future__ import annotations

from datetime import datetime

from soak import Freeze, leadership_report

BASE = datetime(2026, 11, 22, 6, 0, 0).timestamp()


class FakeNimbus:
    def __init__(self, index: int, lines: list[tuple[float, str]]):
        self.index = index
        self._text = "\n".join(
            f"{datetime.fromtimestamp(BASE + t):%Y-%m-%d %H:%M:%S},"
            f"{int(round((BASE + t) % 1 * 1000)):03d} INFO elector nimbus: {what}"
            for t, what in lines)

    def log_text(self) -> str:
        return self._text


GAIN = "127.0.0.1:1 gained leadership as /storm/leader-lock/n-1; code held: held 0 of 0"
LOST = "127.0.0.1:1 lost leadership"


def test_a_clean_handover_has_no_overlap_and_its_gap():
    report = leadership_report(
        [FakeNimbus(0, [(1, GAIN), (10, LOST)]), FakeNimbus(1, [(12.5, GAIN)])],
        kills={}, freezes=[], began=BASE, ended=BASE + 20)
    assert (report["leaderships"], report["two_leaders_at_once"]) == (2, 0)
    assert report["longest_no_leader_s"] == 2.5
    assert report["longest_no_leader_since"] == BASE + 10


def test_two_claims_at_once_are_counted():
    report = leadership_report(
        [FakeNimbus(0, [(1, GAIN), (10, LOST)]), FakeNimbus(1, [(9, GAIN)])],
        kills={}, freezes=[], began=BASE + 1, ended=BASE + 20)
    assert report["two_leaders_at_once"] == 1
    assert report["overlap_s"] == [1.0]


def test_a_kill_ends_a_leadership_that_the_log_never_closed():
    report = leadership_report(
        [FakeNimbus(0, [(1, GAIN)]), FakeNimbus(1, [(7, GAIN)])],
        kills={0: [BASE + 3]}, freezes=[], began=BASE + 1, ended=BASE + 20)
    assert report["two_leaders_at_once"] == 0
    assert report["longest_no_leader_s"] == 4.0
    assert report["longest_no_leader_since"] == BASE + 3


def test_a_freeze_ends_a_leadership_and_the_claim_after_the_thaw_is_measured():
    report = leadership_report(
        [FakeNimbus(0, [(1, GAIN), (10.25, LOST)]), FakeNimbus(1, [(8, GAIN)])],
        kills={}, freezes=[Freeze(0, BASE + 2, BASE + 10)], began=BASE + 1,
        ended=BASE + 20)
    assert report["two_leaders_at_once"] == 0
    assert report["claimed_after_thaw_s"] == 0.25
    assert report["longest_no_leader_s"] == 6.0


def test_a_leader_frozen_for_less_than_its_lease_leads_on_after_the_thaw():
    """Frozen 3 s (its lease is 4 s): it never lost the lead, so from the thaw to its
    "lost" line 20 s later it led; only the freeze itself is a time without a leader."""
    report = leadership_report(
        [FakeNimbus(0, [(1, GAIN), (25, LOST)]), FakeNimbus(1, [(26, GAIN)])],
        kills={}, freezes=[Freeze(0, BASE + 2, BASE + 5)], began=BASE + 1,
        ended=BASE + 30, lease_s=4.0)
    assert report["two_leaders_at_once"] == 0
    assert report["claimed_after_thaw_s"] == 0.0
    assert report["longest_no_leader_s"] == 3.0
    assert report["longest_no_leader_since"] == BASE + 2


def test_a_claim_after_a_thaw_that_overlaps_another_leader_is_listed_apart():
    report = leadership_report(
        [FakeNimbus(0, [(1, GAIN), (25, LOST)]), FakeNimbus(1, [(20, GAIN)])],
        kills={}, freezes=[Freeze(0, BASE + 2, BASE + 5)], began=BASE + 1,
        ended=BASE + 30, lease_s=4.0)
    assert report["two_leaders_at_once"] == 0
    assert report["led_on_overlap_s"] == [5.0]
