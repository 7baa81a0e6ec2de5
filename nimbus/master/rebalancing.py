"""Storm's ``rebalance --wait S``: the REBALANCING status and its timer, as pure rules.

A rebalance with a wait of ``S > 0`` seconds is two fenced writes of the StormBase,
made by whoever leads at the time (:mod:`nimbus.master.lifecycle` applies these rules):

1. the request (:func:`begin`): status REBALANCING, the status to return to
   (``prev_status``, ACTIVE or INACTIVE), the new number of workers
   (``rebalance_num_workers``) and the deadline (``rebalance_at_secs``, epoch seconds,
   never before ``S`` seconds have passed). The scheduler runs workers only for an ACTIVE
   topology, so a REBALANCING one is deactivated exactly as an INACTIVE one is: its
   workers are stopped, its checkpoints stay;
2. the completion (:func:`finish`), by the leader's duty cycle once the deadline has
   passed: ``num_workers`` takes the new count, the status its previous value, and the
   three fields are cleared. The scheduler then places the workers as after a rebalance
   without a wait, in the same cycle.

The deadline is in ZooKeeper, not in a leader's memory, so a failover in the middle
loses nothing: the next leader completes the rebalance at the same deadline (at once if
it has passed). Storm's nimbus restarts the whole wait after a restart instead.

As in Storm's state machine, a REBALANCING topology may be killed (which ends the
rebalance), and activate, deactivate and another rebalance are refused until it
completes (:func:`refusal`). A wait of 0 (or none) changes the number of workers at once
and leaves the status alone, as before (Storm would wait ``topology.message.timeout.secs``
when none is given).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace

from nimbus.state.records import ACTIVE, INACTIVE, REBALANCING, StormBase


def due_at(now: float, wait_secs: int) -> int:
    """The deadline, in whole epoch seconds, of a wait of ``wait_secs`` from ``now``:
    rounded up, so the topology is never REBALANCING for less than the wait."""
    return math.ceil(now) + wait_secs


def begin(base: StormBase, num_workers: int, wait_secs: int, now: float) -> StormBase | None:
    """``base`` after a rebalance to ``num_workers`` with a wait of ``wait_secs``, asked
    for at ``now`` (epoch seconds); None when nothing changes. The caller has refused a
    KILLED or REBALANCING topology (:func:`refusal`).

    With a wait the topology goes REBALANCING even when the count is unchanged, as in
    Storm; without one only the count changes."""
    if wait_secs <= 0:
        return None if base.num_workers == num_workers else replace(base,
                                                                    num_workers=num_workers)
    return replace(base, status=REBALANCING, prev_status=base.status,
                   rebalance_num_workers=num_workers,
                   rebalance_at_secs=due_at(now, wait_secs))


def is_due(base: StormBase, now: float) -> bool:
    """Whether ``base`` is REBALANCING and its deadline has passed at ``now``. A
    deadline of 0 (a damaged or hand-written record) is due at once: a topology is never
    left REBALANCING for want of one."""
    return base.status == REBALANCING and base.rebalance_at_secs <= now


def finish(base: StormBase) -> StormBase:
    """``base`` with its rebalance completed: the new count, the previous status (ACTIVE
    if it names none this release knows), the rebalance fields cleared."""
    status = base.prev_status if base.prev_status in (ACTIVE, INACTIVE) else ACTIVE
    workers = base.rebalance_num_workers if base.rebalance_num_workers >= 1 \
        else base.num_workers
    return cleared(replace(base, status=status, num_workers=workers))


def cleared(base: StormBase) -> StormBase:
    """``base`` without rebalance fields (a kill ends a rebalance under way)."""
    return replace(base, prev_status="", rebalance_num_workers=0, rebalance_at_secs=0)


def refusal(name: str, base: StormBase, action: str, now: float) -> str | None:
    """Why ``action`` (activate, deactivate or rebalance) of topology ``name`` is refused
    while it is REBALANCING; None when it is not."""
    if base.status != REBALANCING:
        return None
    left = max(0, math.ceil(base.rebalance_at_secs - now))
    count = base.rebalance_num_workers
    return (f"topology {name!r} is {REBALANCING} (to {count} worker"
            f"{'' if count == 1 else 's'}, back to {base.prev_status or ACTIVE} in {left}s): "
            f"{action} is refused until the rebalance completes; kill is allowed")


def seconds_until_next(bases: Iterable[StormBase], now: float) -> float | None:
    """Seconds until the earliest deadline still to come (None: none), so the duty cycle
    can run then. Deadlines already passed are left out: the next cycle completes them,
    and a leader that cannot must not be woken in a loop."""
    ends = [base.rebalance_at_secs - now for base in bases
            if base.status == REBALANCING and base.rebalance_at_secs > now]
    return min(ends) if ends else None
