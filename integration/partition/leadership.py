"""Who led when: from the nimbuses' own logs and from what clients were told.

* A nimbus's log has ``<addr> gained leadership as <node>; ...`` and ``<addr> lost
  leadership`` lines (format ``%(asctime)s %(levelname)s ...``, local time to the
  millisecond). Its leadership is the interval between the two, or from the gain to the
  end of the process (or of the run) when no loss follows.
* A client answer in which a nimbus names *itself* the leader (``getLeader``, or its own
  ``NimbusSummary.isLeader`` in ``getClusterInfo``) is a claim over the whole time the
  call was in flight, ``[sent, received]``: the nimbus said so at some moment in there.
  Its claims in a row, with no answer in between saying otherwise, are one interval
  (:func:`claims`): what a client polling it could only take for one leadership.

Two intervals of different nimbuses that overlap are two leaders at once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
GAINED = re.compile(r": (\S+) gained leadership as ")
LOST = re.compile(r": (\S+) lost leadership(?:\W.*)?$")
NEGOTIATED = re.compile(r"negotiated timeout (\d+)")
ZK_TIME = re.compile(r"^(\d{4}-\d\d-\d\d_\d\d:\d\d:\d\d,\d{3}) ")
ESTABLISHED = re.compile(r"Established session (0x[0-9a-f]+) with negotiated timeout \d+ "
                         r"for client /([\d.]+):")
EXPIRING = re.compile(r"Expiring session (0x[0-9a-f]+),")
# The calls whose answer says whom the nimbus asked takes for the leader.
LEADER_CALLS = ("getLeader", "getClusterInfo")


@dataclass(frozen=True)
class Interval:
    """``who`` led (or claimed to) from ``start`` to ``end`` (wall clock)."""

    who: str
    start: float
    end: float


@dataclass(frozen=True)
class Overlap:
    """Two leaders at once: ``first`` and ``second`` from ``start`` to ``end``."""

    first: str
    second: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


def log_time(line: str) -> float | None:
    match = LOG_TIME.match(line)
    if match is None:
        return None
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def log_events(text: str) -> list[tuple[float, str]]:
    """(wall clock, ``"gained"`` or ``"lost"``) of one nimbus's log, in order."""
    out = []
    for line in text.splitlines():
        kind = "gained" if GAINED.search(line) else "lost" if LOST.search(line) else None
        if kind is None:
            continue
        stamp = log_time(line)
        if stamp is not None:
            out.append((stamp, kind))
    return out


def negotiated_timeouts_ms(zookeeper_log: str) -> list[int]:
    """Every session timeout the ZooKeeper server granted, from its log."""
    return [int(m) for m in NEGOTIATED.findall(zookeeper_log)]


def session_expiries(zookeeper_log: str) -> dict[str, list[float]]:
    """Client address -> wall times at which the server expired one of its sessions."""
    owner: dict[str, str] = {}
    out: dict[str, list[float]] = {}
    for line in zookeeper_log.splitlines():
        found = ESTABLISHED.search(line)
        if found:
            owner[found.group(1)] = found.group(2)
            continue
        found = EXPIRING.search(line)
        stamp = ZK_TIME.match(line)
        if found and stamp and found.group(1) in owner:
            when = datetime.strptime(stamp.group(1), "%Y-%m-%d_%H:%M:%S,%f").timestamp()
            out.setdefault(owner[found.group(1)], []).append(when)
    return out


def log_intervals(events: Mapping[str, list[tuple[float, str]]],
                  ends: Mapping[str, float]) -> list[Interval]:
    """Leadership intervals by the logs; one still open ends at ``ends[who]`` (the
    process's end, or the end of the run)."""
    out = []
    for who, found in events.items():
        start = None
        for stamp, kind in sorted(found):
            if kind == "gained" and start is None:
                start = stamp
            elif kind == "lost" and start is not None:
                out.append(Interval(who, start, stamp))
                start = None
        if start is not None:
            out.append(Interval(who, start, max(start, ends[who])))
    return sorted(out, key=lambda i: i.start)


def current_leader(events: Mapping[str, list[tuple[float, str]]]) -> str | None:
    """The nimbus whose log says it leads now; of several (two leaders), the one that
    gained last."""
    open_since = {}
    for who, found in events.items():
        start = None
        for stamp, kind in sorted(found):
            start = stamp if kind == "gained" else None
        if start is not None:
            open_since[who] = start
    return max(open_since, key=open_since.get) if open_since else None


def overlaps(intervals: Iterable[Interval]) -> list[Overlap]:
    """Every pair of intervals of different holders that overlap in time."""
    ordered = sorted(intervals, key=lambda i: i.start)
    found = []
    for index, one in enumerate(ordered):
        for other in ordered[index + 1:]:
            if other.start >= one.end:
                break
            if other.who != one.who:
                found.append(Overlap(one.who, other.who, other.start,
                                     min(one.end, other.end)))
    return found


def claims(history: Iterable[Mapping[str, Any]]) -> list[Interval]:
    """What clients were told, as leadership intervals per nimbus.

    Every answer in which a nimbus named itself the leader claims ``[sent, received]``;
    a nimbus's consecutive claims (by time sent) are one interval, from the first one's
    sending to the last one's reply, as long as nothing it answered in between said
    otherwise (an answer naming another leader, or any failed call, ends the interval).
    """
    answers: dict[str, list[Mapping[str, Any]]] = {}
    for record in history:
        if record.get("kind") == "poll" and record.get("received") is not None \
                and record.get("call") in LEADER_CALLS:
            answers.setdefault(record["target"], []).append(record)
    out = []
    for who, found in answers.items():
        start = end = None
        for record in sorted(found, key=lambda r: r["sent"]):
            if record.get("claims_leader"):
                start = record["sent"] if start is None else start
                end = max(end or record["received"], record["received"])
            elif start is not None:
                out.append(Interval(who, start, end))
                start = end = None
        if start is not None:
            out.append(Interval(who, start, end))
    return sorted(out, key=lambda i: i.start)


def first_event(events: list[tuple[float, str]], kind: str, after: float) -> float | None:
    """The time of the first ``kind`` event at or after ``after``."""
    return next((stamp for stamp, k in sorted(events) if k == kind and stamp >= after), None)
