"""What a UI running inside a nimbus (``nimbus.ui.enabled``) knows beyond ZooKeeper.

The UI reads the cluster from ZooKeeper, and ZooKeeper holds no duty-cycle ages: how long
ago the leader last completed its duty cycle (what its watchdog watches,
:mod:`nimbus.master.leader_watchdog`) is known only inside the leader's process. Having
the leader write it to ZooKeeper after every cycle would add a write per cycle, and an
age computed from another host's clock. So a UI inside the leader shows it on the
leader's row (``dutyCycleAgeSecs``); a UI elsewhere (``nimbus-ha ui``, or inside a
follower) leaves the field out, and the leader's ``nimbus_leader_duty_cycle_age_seconds``
metric is the place to read it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class LocalNimbus:
    """The nimbus this UI runs inside: its ``host:port`` (as the nimbus summary lists
    it) and ``duty_cycle_age_s()``, the seconds since its last completed duty cycle
    while it leads, None while it does not (read at each request; never blocks)."""

    address: str
    duty_cycle_age_s: Callable[[], float | None]

    def duty_cycle_age_field(self, address: str, leads: bool) -> dict[str, float]:
        """``{"dutyCycleAgeSecs": age}`` for this nimbus's row while it leads (as both
        the row and the nimbus itself say), else ``{}``."""
        if address != self.address or not leads:
            return {}
        age = self.duty_cycle_age_s()
        return {} if age is None else {"dutyCycleAgeSecs": round(age, 1)}
