"""The nemesis: silent network faults made with iptables DROP rules.

A cut is made in the *receiving* namespace: ``receiver`` drops every packet whose source
is ``sender`` (INPUT chain, by source address). Nothing is refused or reset, so the
sender's TCP stack sees silence, as with a real partition: a symmetric cut is two such
one-way cuts. :meth:`Nemesis.heal` removes exactly the rules it added.

Every cut and heal is recorded with its wall-clock time (``time.time()``, the clock of
the daemons' log lines) so the checker can measure from it. :class:`Flapper` cuts and
heals on its own named thread at intervals drawn from a seeded ``random.Random``.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from netlab import LabNetwork, Node


@dataclass(frozen=True)
class Rule:
    """``receiver`` drops what ``sender`` sends it."""

    receiver: Node
    sender: Node

    def argv(self, action: str) -> list[str]:
        return ["iptables", "-w", "5", action, "INPUT", "-s", f"{self.sender.address}/32",
                "-j", "DROP"]


@dataclass
class Event:
    """One fault or repair: what, between which nodes, and when (wall clock: began is
    just before the first rule changed, ended just after the last)."""

    kind: str                  # "cut" or "heal"
    label: str
    pairs: list[tuple[str, str]]  # (receiver, sender) names
    began: float
    ended: float = 0.0


@dataclass
class Cut:
    """The rules of one cut, until healed."""

    label: str
    rules: list[Rule]
    event: Event
    healed: Event | None = None


@dataclass
class Nemesis:
    """Cuts and heals in ``network``; keeps every event in ``events``."""

    network: LabNetwork
    events: list[Event] = field(default_factory=list)
    _active: list[Cut] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def one_way(self, receivers: Sequence[Node], senders: Sequence[Node],
                label: str = "") -> Cut:
        """Every node of ``receivers`` drops the packets of every node of ``senders``."""
        rules = [Rule(r, s) for r in receivers for s in senders if r != s]
        return self._apply(rules, label or f"{_names(senders)} -/-> {_names(receivers)}")

    def partition(self, side_a: Sequence[Node], side_b: Sequence[Node],
                  label: str = "") -> Cut:
        """A symmetric cut: no packet crosses between ``side_a`` and ``side_b``."""
        rules = [Rule(r, s) for r in side_a for s in side_b if r != s]
        rules += [Rule(r, s) for r in side_b for s in side_a if r != s]
        return self._apply(rules, label or f"{_names(side_a)} <-/-> {_names(side_b)}")

    def _apply(self, rules: list[Rule], label: str) -> Cut:
        event = Event("cut", label, [(r.receiver.name, r.sender.name) for r in rules],
                      time.time())
        cut = Cut(label, [], event)
        with self._lock:
            self._active.append(cut)
            try:
                for rule in rules:
                    self.network.run(rule.receiver, rule.argv("-A"))
                    cut.rules.append(rule)
            finally:
                event.ended = time.time()
                self.events.append(event)
        return cut

    def heal(self, cut: Cut | None = None) -> None:
        """Remove the rules of ``cut``, or of every cut still in place."""
        with self._lock:
            doomed = [cut] if cut is not None else list(self._active)
            for one in doomed:
                if one not in self._active:
                    continue
                event = Event("heal", one.label, list(one.event.pairs), time.time())
                for rule in one.rules:
                    self.network.run(rule.receiver, rule.argv("-D"), check=False)
                event.ended = time.time()
                one.healed = event
                self.events.append(event)
                self._active.remove(one)

    @property
    def active(self) -> list[Cut]:
        """The cuts still in place (every cut and heal made is in ``events``)."""
        with self._lock:
            return list(self._active)


def _names(nodes: Sequence[Node]) -> str:
    return ",".join(n.name for n in nodes)


@dataclass
class FlapCycle:
    """One cut of a flapping run: whom, how (symmetric or one-way), for how long."""

    target: str
    mode: str
    cut: Cut | None = None


class Flapper:
    """Cut ``target()`` from ``others`` and heal it again, over and over, at seeded
    intervals, on a thread of its own (``nemesis-flapper``) until :meth:`stop` or
    ``duration_s``.

    ``target()`` is asked afresh before each cut (the current leader, say); ``modes`` are
    drawn from: ``symmetric``, ``in`` (the target drops what the others send) and
    ``out`` (the others drop what the target sends).
    """

    def __init__(self, nemesis: Nemesis, rng: random.Random, target: Callable[[], Node],
                 others: Sequence[Node], duration_s: float,
                 cut_s: tuple[float, float], heal_s: tuple[float, float],
                 modes: Sequence[str] = ("symmetric",)):
        self.nemesis = nemesis
        self.rng = rng
        self.target = target
        self.others = list(others)
        self.duration_s = duration_s
        self.cut_s = cut_s
        self.heal_s = heal_s
        self.modes = list(modes)
        self.cycles: list[FlapCycle] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nemesis-flapper",
                                        daemon=True)

    def start(self) -> Flapper:
        self._thread.start()
        return self

    def _run(self) -> None:
        ends = time.monotonic() + self.duration_s
        try:
            while not self._stop.is_set() and time.monotonic() < ends:
                node = self.target()
                cycle = FlapCycle(node.name, self.rng.choice(self.modes))
                self.cycles.append(cycle)
                if cycle.mode == "symmetric":
                    cycle.cut = self.nemesis.partition([node], self.others)
                elif cycle.mode == "in":
                    cycle.cut = self.nemesis.one_way([node], self.others)
                else:
                    cycle.cut = self.nemesis.one_way(self.others, [node])
                self._stop.wait(self.rng.uniform(*self.cut_s))
                self.nemesis.heal(cycle.cut)
                self._stop.wait(self.rng.uniform(*self.heal_s))
        except BaseException as exc:  # reported by stop(): a nemesis that died silently
            self.error = exc           # would make a run look calmer than it was
        finally:
            self.nemesis.heal()

    def wait(self, timeout_s: float) -> bool:
        """Wait for the run to end by itself; True if it did."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop, heal, join; re-raises an error the thread met."""
        self._stop.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise RuntimeError("the flapper did not stop")
        if self.error is not None:
            raise RuntimeError(f"the flapper failed: {self.error}") from self.error
