"""ViewChanges: the ids a reader has not yet taken, from a view's change events."""

from __future__ import annotations

from nimbus.state.view_changes import ViewChanges


class Told:
    def __init__(self) -> None:
        self.listeners: list = []

    def listen(self, listener) -> None:
        self.listeners.append(listener)

    def tell(self, directory: str, topology_id: str) -> None:
        for listener in self.listeners:
            listener(directory, topology_id)


def test_takes_what_changed_in_its_directories_once():
    view = Told()
    changes = ViewChanges(view, ("storms", "assignments"))
    assert changes.take() is None, "the first take: everything is new to the reader"
    assert changes.take() == set()
    view.tell("storms", "a-1-1")
    view.tell("assignments", "b-1-1")
    view.tell("workerbeats", "c-1-1")  # not one of its directories
    assert changes.take() == {"a-1-1", "b-1-1"}
    assert changes.take() == set()


def test_a_change_of_the_directory_itself_or_a_restart_is_everything():
    view = Told()
    changes = ViewChanges(view, ("storms",))
    changes.take()
    view.tell("storms", "a-1-1")
    view.tell("storms", "")  # loaded again, reconnected
    assert changes.take() is None
    view.tell("storms", "a-1-1")
    changes.everything()
    assert changes.take() is None
    assert changes.take() == set()


def test_a_reader_that_stops_taking_keeps_a_bounded_set(monkeypatch):
    """A leader's code check takes only while it leads: once more ids than MOST
    changed since its last take, it keeps none and its next take is everything."""
    monkeypatch.setattr(ViewChanges, "MOST", 3)
    view = Told()
    changes = ViewChanges(view, ("storms",))
    changes.take()
    for n in range(3):
        view.tell("storms", f"t-{n}-1")
    assert changes.take() == {"t-0-1", "t-1-1", "t-2-1"}
    for n in range(4):
        view.tell("storms", f"t-{n}-1")
    assert len(changes._ids) == 0
    assert changes.take() is None
    assert changes.take() == set()
