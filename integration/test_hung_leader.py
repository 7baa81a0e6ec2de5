"""A hung leader steps down (issue 20): a plugin hook that never returns inside a leader
duty. Separate nimbus processes; the leader's watchdog must log the stuck stack, give up
the lock and exit with code 70, and the other nimbus must lead."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers import leadership_events

from nimbus.master.leader_watchdog import EXIT_CODE

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PLUGINS = Path(__file__).resolve().parent / "plugins_for_tests"
WATCHDOG_S = 3


def test_a_leader_stuck_in_a_plugin_call_is_replaced(make_cluster, bundle, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(PLUGINS))  # the daemons import the plugin
    cluster = make_cluster(2, **{
        "storm.codedistributor.class": "hanging_distributor:HangingDistributor",
        "nimbus.leader.watchdog.secs": WATCHDOG_S,
        "topology.min.replication.count": 2})
    client = cluster.client()
    client.submit("hang", bundle, {})
    leader = cluster.wait_for_leader()
    other = next(n for n in cluster.nimbuses if n is not leader)
    killed_at = time.time()
    client.kill("hang", 0)  # its removal calls delete_shared, which never returns
    leader.process.wait(timeout=WATCHDOG_S + 60)
    assert leader.process.returncode == EXIT_CODE
    log = leader.log_text()
    fired = log.index("the leader's duty cycle has not completed for")
    assert "--- thread nimbus-cycle" in log[fired:] and "delete_shared" in log[fired:]
    assert "lost leadership" in log[fired:], "it gave the lock up before exiting"
    cluster.wait_for_leader(exclude=leader.address, timeout_s=60)
    took_over = [t for t, gained in leadership_events(other.log_text())
                 if gained and t >= killed_at]
    assert took_over, other.log_text()[-3000:]
