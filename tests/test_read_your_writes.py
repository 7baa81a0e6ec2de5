"""Read-your-writes for a reloading reader (nimbus/read_your_writes.py): an ask is
answered only by a reload that began after it."""

from __future__ import annotations

import threading

from nimbus.read_your_writes import Reloads


def test_an_ask_waits_for_a_reload_begun_after_it_not_for_one_under_way():
    reloads = Reloads()
    under_way, _ = reloads.begin()          # a reload that began before the ask
    answered = threading.Event()
    woken = threading.Event()

    def ask():
        if reloads.wait_for_next(woken.set, timeout_s=30):
            answered.set()

    asker = threading.Thread(target=ask, name="asker")
    asker.start()
    assert woken.wait(10)
    with reloads.finish(under_way):         # it ends: it did not see the asker's write
        pass
    assert not answered.wait(0.2)
    generation, asked = reloads.begin()     # the loop, woken, begins the next one
    assert asked
    with reloads.finish(generation):
        pass
    asker.join(10)
    assert answered.is_set()
    assert reloads.begin() == (generation, False)


def test_an_ask_no_reload_answers_gives_up_at_its_timeout():
    assert Reloads().wait_for_next(lambda: None, timeout_s=0.05) is False
