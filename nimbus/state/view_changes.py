"""Which topologies changed in a view since a reader last looked.

A reader that keeps something per topology (the scheduler's topologies at rest, the
summary's replica counts) brings it up to date from the ids that changed, not from a
pass over every topology after each change: at 10,000 topologies that pass, at every
submit, was most of a nimbus's work.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol


class ListenedView(Protocol):
    def listen(self, listener: Callable[[str, str], None]) -> None: ...


class ViewChanges:
    """The topology ids changed under some of a view's directories since the last
    :meth:`take`, from the view's change events (told on its caches' threads).

    Take *before* reading the view's records: a change that lands in between is then
    taken again next time, never lost. The view tells a change only once it holds it,
    and a barrier returns only after every change before it was told, so after a
    barrier and a take the records read hold every change taken.
    """

    #: More ids than this since the last take: "every topology" instead. A reader that
    #: stops taking for a while (a leader's check, once it no longer leads) keeps a
    #: bounded set, and a reader that takes after a burst this size reads everything
    #: once, which costs about as much as applying each change.
    MOST = 4096

    def __init__(self, view: ListenedView, directories: tuple[str, ...]):
        self._directories = frozenset(directories)
        self._lock = threading.Lock()
        self._ids: set[str] = set()
        self._all = True  # before the first take, every topology is new to the reader
        view.listen(self._note)

    def _note(self, directory: str, topology_id: str) -> None:
        if directory not in self._directories:
            return
        with self._lock:
            if self._all:
                return  # every id will be read: nothing to keep
            if topology_id:
                self._ids.add(topology_id)
                if len(self._ids) > self.MOST:
                    self._ids, self._all = set(), True
            else:  # the directory itself: loaded again, reconnected
                self._ids, self._all = set(), True

    def everything(self) -> None:
        """Have the next :meth:`take` answer "every topology" (a reader starting over,
        or one that failed to apply what it took)."""
        with self._lock:
            self._all = True

    def take(self) -> set[str] | None:
        """The ids changed since the last take; None when every topology may have."""
        with self._lock:
            ids, every = self._ids, self._all
            self._ids, self._all = set(), False
        return None if every else ids
