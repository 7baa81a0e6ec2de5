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


def _stop_a_ui(config_file, log, early: bool) -> None:
    import socket
    import subprocess
    import sys

    from nimbus.dev.zookeeper import free_port

    port = free_port()
    with open(log, "wb") as out:
        ui = subprocess.Popen(
            [sys.executable, "-m", "nimbus.cli", "ui", "--config", str(config_file),
             "--set", f"ui.port={port}"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        if early:   # its first line is logged by the start, before it serves
            wait_for(lambda: log.stat().st_size > 0 or ui.poll() is not None, 60,
                     "the UI's start to be under way", interval_s=0.005)
        else:
            wait_for(lambda: "UI serving on" in log.read_text(errors="replace"), 60,
                     "the UI to serve")
        ui.send_signal(signal.SIGTERM)
        ui.send_signal(signal.SIGTERM)
        assert ui.wait(timeout=30) == 0, log.read_text(errors="replace")
    finally:
        if ui.poll() is None:
            ui.kill()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), 1):
        pass


def test_a_ui_process_stops_once_on_sigterm_whenever_it_comes(make_cluster, tmp_path):
    """`nimbus-ha ui` runs in the foreground as the daemons do (nimbus.daemon_base): a
    SIGTERM during its start is carried out once the start has returned, a second one
    changes nothing, and the process exits 0 with its port closed."""
    cluster = make_cluster(1)
    for early in (True, False):
        _stop_a_ui(cluster.nimbuses[0].config_file, tmp_path / f"ui-{early}.log", early)
