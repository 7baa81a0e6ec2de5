"""Whether a worker runs, and if not, why: one rule for every reader.

``topology-info`` (text and ``--json``), Thrift ``getTopologyInfo``, the REST API, the
dashboard and ``top`` all show a worker through :func:`judge`, so no screen can call a
worker alive that another calls dead. A worker is in one of five states:

``starting``
    placed, and its supervisor is fetching its code, starting it, or waiting for its
    first beat (or has not yet said anything of it since the leader placed it);
``running``
    its beat is fresh: written within ``nimbus.task.timeout.secs``. The only state that
    counts as alive;
``frozen``
    its supervisor says it froze itself when its lease ran out (the supervisor was cut
    off from ZooKeeper for longer than the lease); a renewal thaws it;
``restarting``
    it exited (crashed, went silent) or could not be started (its code cannot be
    fetched, its command cannot be run), and its supervisor starts it again after
    ``backoff_secs``; ``last_error`` says what went wrong;
``dead``
    nothing says it runs: its supervisor is gone (the worker ended at the end of its
    lease, or froze there for a restarted supervisor to take over), or its beat is stale
    while its supervisor says nothing better of it.

What each state rests on, all read from ZooKeeper: the worker's beat node
(``/workerbeats/<id>/<supervisor-id>-<port>``, rewritten by its supervisor at each of the
worker's status beats), its supervisor's node (``/supervisors/<id>``: whether it exists,
and what its ``workers`` field says of the slot, see
:class:`~nimbus.state.records.SupervisorInfo`) and the topology's assignment node.

**Clocks.** Only ZooKeeper's clock is used. A node's ``mtime`` is stamped by the
ZooKeeper ensemble (its leader) when the node is written, whoever wrote it. "Now" is the
newest ``mtime`` among the nodes read together (the *reference*): no later than the
ensemble's now, and, while a supervisor of the worker lives, at most one
``supervisor.heartbeat.frequency.secs`` earlier, since every supervisor rewrites its node
that often. A beat's age is the reference less the beat node's ``mtime``. So neither the
worker's nor the supervisor's nor the reader's clock is compared with any other host's
(the beat's own ``time_secs``, the supervisor's wall clock, is not used); what is assumed
is only that the ZooKeeper servers' clocks agree, as they do when they run NTP. The cost:
a beat may be judged up to one supervisor heartbeat younger than it is, so a worker is
shown as no longer running at most ``nimbus.task.timeout.secs`` plus one supervisor
heartbeat after its last beat. A reader with write access could stamp a node of its own
to learn the server's time exactly, but readers are read-only clients (the CLI, the UI).

The same two nodes order a supervisor's statement and a beat: a statement written after
the newest beat (a worker that crashed after beating, a new process not yet beating)
wins over it; a beat written after the statement (a worker thawed, or restarted and
beating again) wins over the statement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nimbus.state.records import SupervisorInfo

STARTING, RUNNING, FROZEN, RESTARTING, DEAD = (
    "starting", "running", "frozen", "restarting", "dead")
STATES = (STARTING, RUNNING, FROZEN, RESTARTING, DEAD)
#: What a supervisor may say of a slot (DEAD is the readers' conclusion, never said).
SAID_STATES = (STARTING, RUNNING, FROZEN, RESTARTING)
#: ``nimbus.task.timeout.secs``' default: readers that are given no configuration.
DEFAULT_TIMEOUT_S = 30.0
#: The longest ``last_error`` a supervisor publishes (the full text is in /errors).
MAX_LAST_ERROR_CHARS = 300


@dataclass(frozen=True)
class Statement:
    """What a supervisor says of the worker of one of its slots.

    For upgrades (nimbus.state.code_versions): ``version``, the code version of the
    worker it speaks of (the one running, else the one the slot starts next);
    ``committed``, whether that worker proved that version (a pipeline committed a
    batch in that process; a process topology's health check passed, or it declares
    none and started); ``failures``, how many of the slot's workers on that version
    exited before they committed (reset when the slot's wanted version changes).
    Entries of earlier releases say none of them: version 1, not committed, none.
    """

    topology_id: str
    state: str
    restarts: int
    backoff_secs: int
    last_error: str
    version: int = 1
    committed: bool = False
    failures: int = 0

    def as_record(self) -> dict[str, Any]:
        """The entry of :attr:`SupervisorInfo.workers` for this statement."""
        return {"topology_id": self.topology_id, "state": self.state,
                "restarts": self.restarts, "backoff_secs": self.backoff_secs,
                "last_error": self.last_error, "version": self.version,
                "committed": self.committed, "failures": self.failures}


def first_line(text: str, limit: int = MAX_LAST_ERROR_CHARS) -> str:
    """The first non-empty line of ``text``, at most ``limit`` characters."""
    line = next((s.strip() for s in text.splitlines() if s.strip()), "")
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def statement(info: SupervisorInfo | None, topology_id: str, port: int) -> Statement | None:
    """What ``info`` says of the worker of ``topology_id`` on ``port``; None if it says
    nothing of it (an earlier release, another topology's worker there, or an entry this
    release cannot read: a supervisor's record is trusted only as far as it is well
    formed)."""
    if info is None or not isinstance(info.workers, dict):
        return None
    entry = info.workers.get(str(port))
    if not isinstance(entry, dict) or entry.get("topology_id") != topology_id:
        return None
    state = entry.get("state")
    restarts, backoff = _count(entry.get("restarts", 0)), _count(entry.get("backoff_secs", 0))
    error = entry.get("last_error", "")
    version, committed = _count(entry.get("version", 1)), entry.get("committed", False)
    failures = _count(entry.get("failures", 0))
    if state not in SAID_STATES or restarts is None or backoff is None or \
            not isinstance(error, str) or not version or not isinstance(committed, bool) \
            or failures is None:
        return None
    return Statement(topology_id, state, restarts, backoff, first_line(error), version,
                     committed, failures)


@dataclass(frozen=True)
class Judged:
    """A worker's state as :func:`judge` found it."""

    state: str
    beat_age_secs: int | None   # by ZooKeeper's clock; None: it has no beat node
    backoff_secs: int           # restarting: the delay its supervisor chose; else 0
    last_error: str             # why it does not run ("" when running, or unknown)
    restarts: int | None        # as its supervisor counts them; None: it says nothing

    @property
    def alive(self) -> bool:
        return self.state == RUNNING


def judge(*, supervisor_id: str, supervisor: tuple[SupervisorInfo | None, int] | None,
          said: Statement | None, beat_mtime_ms: int | None, assignment_mtime_ms: int,
          reference_ms: int, timeout_s: float) -> Judged:
    """The state of one worker (see the module docstring for the rule and its clock).

    ``supervisor``: (its record, or None if unreadable; its node's mtime), or None when
    its node does not exist. ``said``: what that record says of this worker
    (:func:`statement`). ``beat_mtime_ms``: its beat node's mtime, None without one.
    ``reference_ms``: the newest mtime among the nodes read with these (never older than
    any mtime passed here). All times are ZooKeeper mtimes in milliseconds.
    """
    age = None if beat_mtime_ms is None else max(0, reference_ms - beat_mtime_ms) // 1000
    if supervisor is None:
        return Judged(DEAD, age, 0, f"its supervisor {supervisor_id} is gone", None)
    _info, supervisor_ms = supervisor
    restarts = said.restarts if said is not None else None
    if said is not None and said.state != RUNNING and (
            beat_mtime_ms is None or supervisor_ms >= beat_mtime_ms):
        backoff = said.backoff_secs if said.state == RESTARTING else 0
        return Judged(said.state, age, backoff, said.last_error, restarts)
    fresh = beat_mtime_ms is not None and reference_ms - beat_mtime_ms <= timeout_s * 1000
    if fresh:
        return Judged(RUNNING, age, 0, "", restarts)
    if said is None and (beat_mtime_ms is None or supervisor_ms < assignment_mtime_ms):
        # Its supervisor has said nothing of it since it was placed (or is of a release
        # that says nothing) and it never beat there: on its way.
        return Judged(STARTING, age, 0, "", restarts)
    why = said.last_error if said is not None and said.last_error else (
        f"no beat for {age}s (nimbus.task.timeout.secs {timeout_s:g})" if age is not None
        else "no beat")
    return Judged(DEAD, age, 0, why, restarts)


def describe(state: str, backoff_secs: int) -> str:
    """A worker's state for people: ``running``, ``restarting (back-off 4s)``, ..."""
    return f"{state} (back-off {backoff_secs}s)" if state == RESTARTING else state


def count_states(states: list[str]) -> dict[str, int]:
    """state -> how many of ``states`` are in it; every state is a key."""
    return {s: states.count(s) for s in STATES}
