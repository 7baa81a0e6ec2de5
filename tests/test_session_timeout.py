"""The negotiated session timeout (nimbus.state.session_timeout) against a real
ZooKeeper, which grants sessions of 2 ticks (400 ms) to 60 s (nimbus.dev.zookeeper)."""

from __future__ import annotations

import logging

import pytest
from kazoo.client import KazooClient
from waiting import wait_for

from nimbus.state.session_timeout import (
    SessionTimeout,
    session_timeout_of,
    track_negotiated_timeout,
)

pytestmark = pytest.mark.zookeeper


@pytest.mark.parametrize(("asked_s", "granted_s"), [(100.0, 60.0), (0.1, 0.4), (3.0, 3.0)])
def test_the_servers_clamp_is_seen(zk_server, asked_s, granted_s, caplog):
    zk = KazooClient(hosts=zk_server.hosts, timeout=asked_s)
    tracker = track_negotiated_timeout(zk, asked_s)
    assert tracker.seconds == asked_s and tracker.negotiated_s is None  # before a session
    caplog.set_level(logging.WARNING, "nimbus.state.session_timeout")
    zk.start(timeout=15)
    try:
        # kazoo reports CONNECTED from inside the connect step the tracker wraps, so
        # start() may return a moment before the value (and its log line) is in.
        wait_for(lambda: tracker.negotiated_s is not None and (
            granted_s == asked_s or any(r.name == "nimbus.state.session_timeout"
                                        for r in caplog.records)), 10, "the tracker")
        assert tracker.negotiated_s == granted_s
        assert tracker.seconds == granted_s
        assert session_timeout_of(zk, 99.0) is tracker
        warned = [r.getMessage() for r in caplog.records
                  if r.name == "nimbus.state.session_timeout"]
        if granted_s == asked_s:
            assert warned == []
        else:
            assert warned == [
                f"ZooKeeper negotiated a session timeout of {granted_s * 1000:.0f} ms, not "
                f"the {asked_s * 1000:.0f} ms asked for (storm.zookeeper.session.timeout; "
                "the server's min/maxSessionTimeout decide): leases and timings use "
                f"{granted_s * 1000:.0f} ms"]
    finally:
        zk.stop()
        zk.close()


def test_an_untracked_client_counts_the_configured_value(zk_server):
    zk = KazooClient(hosts=zk_server.hosts)
    assert session_timeout_of(zk, 6.0).seconds == 6.0


def test_observe_logs_only_a_new_value(caplog):
    timeout = SessionTimeout(4.0)
    caplog.set_level(logging.WARNING, "nimbus.state.session_timeout")
    timeout.observe(4.0)
    timeout.observe(2.0)
    timeout.observe(2.0)
    assert len(caplog.records) == 1 and timeout.seconds == 2.0
