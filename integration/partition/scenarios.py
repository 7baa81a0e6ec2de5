"""The lab's scenarios by name: each is ``run(name, seed, options) -> Report``.

====================  =============================================================
leader_cut_quiet      a. the leader cut from ZooKeeper, no client traffic
leader_cut_polled     b. the same, a client polling the cut leader once a second
leader_cut_activate   c. ``activate`` sent straight to the leader cut from ZooKeeper
supervisor_cut_zk     d. a supervisor running a pipeline cut from ZooKeeper
supervisor_cut_nimbus e. a supervisor cut from the nimbuses only
leader_flapping       f. the leader cut and healed at seeded intervals, under load
code_fetch_cut        g. a supervisor cut from the nimbuses while it must fetch code,
                         and the pipeline it runs deactivated and activated
peer_cut_replication  h. a nimbus cut from its peer during a replication wait
====================  =============================================================
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from checker import Report
from leader_scenarios import leader_cut, leader_flapping, peer_cut_during_replication
from runtime_scenarios import code_fetch_cut, supervisor_cut_nimbus, supervisor_cut_zk
from steps import Options

Scenario = Callable[[str, int, Options], Report]

SCENARIOS: dict[str, Scenario] = {
    "leader_cut_quiet": leader_cut,
    "leader_cut_polled": partial(leader_cut, polls=True),
    "leader_cut_activate": partial(leader_cut, activate=True),
    "supervisor_cut_zk": supervisor_cut_zk,
    "supervisor_cut_nimbus": supervisor_cut_nimbus,
    "leader_flapping": leader_flapping,
    "code_fetch_cut": code_fetch_cut,
    "peer_cut_replication": peer_cut_during_replication,
}


def run(name: str, seed: int, opts: Options) -> Report:
    """Run scenario ``name`` once; an unknown name raises KeyError listing the known."""
    try:
        scenario = SCENARIOS[name]
    except KeyError:
        raise KeyError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}") from None
    return scenario(name, seed, opts)
