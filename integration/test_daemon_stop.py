"""A nimbus process sent SIGTERM half-way through its start exits: the stop waits for
the start to return. Before, the stop ran beside the start, closed the ZooKeeper client
a later step of the start then waited on for ever, and the process never exited."""

from __future__ import annotations

import signal

import pytest
from waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LISTENING = "Thrift server listening on"  # logged early in NimbusDaemon.start()


def test_a_nimbus_stopped_while_it_starts_exits(make_cluster):
    cluster = make_cluster(1)
    nimbus = cluster.nimbuses[0]
    nimbus.terminate(timeout_s=15)
    for attempt in range(3):
        seen = nimbus.log_text().count(LISTENING)
        nimbus.start()
        wait_for(lambda seen=seen: nimbus.log_text().count(LISTENING) > seen, 30,
                 "the start to be under way", interval_s=0.01)
        nimbus.signal(signal.SIGTERM)
        assert nimbus.process is not None
        assert nimbus.process.wait(timeout=20) == 0, f"attempt {attempt}"
    assert nimbus.log_text().count(f"nimbus {nimbus.address} stopped") >= 3
