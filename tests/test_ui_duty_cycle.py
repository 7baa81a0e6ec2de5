"""The leader's duty-cycle age in the UI: a UI inside the leader (nimbus.ui.enabled) shows
it on the leader's row (``dutyCycleAgeSecs``, REST and dashboard); a UI anywhere else
leaves the field out (nimbus.ui.local_nimbus)."""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest
from ui_fixtures import Harness, conf_for, write_cluster
from waiting import wait_for
from werkzeug.test import Client

from nimbus.config import load_config
from nimbus.dev.zookeeper import free_port
from nimbus.state.cluster_state import StormClusterState
from nimbus.ui.app import UIApp
from nimbus.ui.local_nimbus import LocalNimbus

pytestmark = pytest.mark.zookeeper

LEADER, FOLLOWER = "127.0.0.1:1", "127.0.0.1:2"   # as write_cluster registers them


@pytest.fixture
def ui(make_zk, zk_server, zk_root):
    state = StormClusterState(make_zk(), zk_root)
    state.setup()
    write_cluster(state)
    harness = Harness(conf_for(zk_server, zk_root), state)
    yield harness
    harness.close()


def client_inside(ui: Harness, local: LocalNimbus | None) -> Client:
    return Client(UIApp(ui.conf, ui.reader, ui.leader, local_nimbus=local))  # type: ignore[arg-type]


def ages(client: Client) -> tuple[dict[str, float | None], dict[str, float | None]]:
    """address -> dutyCycleAgeSecs (None: no such field), from the REST summary and the
    dashboard."""
    rest = client.get("/api/v1/nimbus/summary").json["nimbuses"]
    board = client.get("/api/v1/ui/dashboard").json["nimbuses"]
    return ({f"{n['host']}:{n['port']}": n.get("dutyCycleAgeSecs") for n in rest},
            {n["address"]: n.get("dutyCycleAgeSecs") for n in board})


def test_a_ui_inside_the_leader_shows_its_duty_cycle_age(ui):
    client = client_inside(ui, LocalNimbus(LEADER, lambda: 7.26))
    rest, board = ages(client)
    assert rest == board == {LEADER: 7.3, FOLLOWER: None}
    [row] = [n for n in client.get("/api/v1/nimbus/summary").json["nimbuses"]
             if n["status"] == "Leader"]
    assert row["dutyCycleAgeSecs"] == 7.3


def test_a_ui_inside_a_follower_or_a_nimbus_not_leading_shows_none(ui):
    # A follower's own cycle is not the leader's; a nimbus whose elector no longer
    # leads (the row may still say Leader for a moment) reports None.
    for local in (LocalNimbus(FOLLOWER, lambda: 1.0), LocalNimbus(LEADER, lambda: None)):
        assert ages(client_inside(ui, local)) == ({LEADER: None, FOLLOWER: None},) * 2


def test_a_ui_of_its_own_leaves_the_field_out(ui):
    assert ages(client_inside(ui, None)) == ({LEADER: None, FOLLOWER: None},) * 2


def test_a_nimbus_serving_the_ui_shows_its_duty_cycle_age_while_it_leads(
        zk_server, zk_root, tmp_path):
    from nimbus.daemons.nimbus import NimbusDaemon

    host, _, zk_port = zk_server.hosts.rpartition(":")
    ui_port, thrift_port = free_port(), free_port()
    conf = load_config(overrides={
        "storm.zookeeper.servers": [host], "storm.zookeeper.port": int(zk_port),
        "storm.zookeeper.root": zk_root, "nimbus.thrift.port": thrift_port,
        "nimbus.seeds": [f"127.0.0.1:{thrift_port}"],
        "storm.local.dir": str(tmp_path / "local"), "nimbus.ui.enabled": True,
        "ui.port": ui_port,
        # one cycle when leadership is won, then only those the test asks for
        "nimbus.monitor.freq.secs": 3600, "nimbus.leader.watchdog.secs": 0})
    before = {t.name for t in threading.enumerate()}
    daemon = NimbusDaemon(conf)
    daemon.start()
    try:
        def leader_row() -> dict | None:
            with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/api/v1/nimbus/summary",
                                        timeout=5) as reply:
                rows = json.load(reply)["nimbuses"]
            return next((n for n in rows if n["status"] == "Leader"
                         and "dutyCycleAgeSecs" in n), None)

        wait_for(lambda: daemon.master.cycles >= 1, 30, "the first duty cycle of the leadership")
        # No cycle runs meanwhile, so the age shown lies between two readings of it.
        cycles, earlier = daemon.master.cycles, daemon.master.watchdog.age_s()
        row = wait_for(leader_row, 30, "the UI to show the leader's duty-cycle age")
        later = daemon.master.watchdog.age_s()
        assert daemon.master.cycles == cycles
        assert row["port"] == thrift_port
        assert round(earlier, 1) <= row["dutyCycleAgeSecs"] <= round(later, 1)
    finally:
        daemon.stop()
    wait_for(lambda: {t.name for t in threading.enumerate()} == before or None, 15,
             "every thread of the nimbus and its UI to end")
