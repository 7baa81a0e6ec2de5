"""A nimbus that cannot start releases what it took and says why (real ZooKeeper)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pytest
from waiting import wait_for

from nimbus.config import load_config

pytestmark = pytest.mark.zookeeper


@pytest.fixture
def taken_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


def conf_for(zk_server, zk_root, tmp_path, port, **extra):
    host, _, zk_port = zk_server.hosts.rpartition(":")
    return load_config(overrides={
        "storm.zookeeper.servers": [host], "storm.zookeeper.port": int(zk_port),
        "storm.zookeeper.root": zk_root, "nimbus.thrift.port": port,
        "storm.local.dir": str(tmp_path / "local"), **extra})


@pytest.mark.parametrize("distributor", ["localfs", "torrent"])
def test_taken_thrift_port_releases_zookeeper_and_distributor(zk_server, zk_root, tmp_path,
                                                              taken_port, distributor):
    from nimbus.daemons.nimbus import NimbusDaemon

    conf = conf_for(zk_server, zk_root, tmp_path, taken_port,
                    **{"storm.codedistributor.class": distributor})
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(OSError, match=rf"cannot serve Thrift on 127\.0\.0\.1:{taken_port}"):
        NimbusDaemon(conf)
    # kazoo's connection and event threads, the replica registry's and the libtorrent
    # session's alert thread are all gone again.
    wait_for(lambda: {t.name for t in threading.enumerate()} == before or None, 10,
             "every thread the failed start made to end")


def test_cli_exits_non_zero_with_the_reason(zk_server, zk_root, tmp_path, taken_port):
    host, _, zk_port = zk_server.hosts.rpartition(":")
    done = subprocess.run(
        [sys.executable, "-m", "nimbus.cli", "nimbus",
         "--set", f"storm.zookeeper.servers=['{host}']",
         "--set", f"storm.zookeeper.port={zk_port}", "--set", f"storm.zookeeper.root={zk_root}",
         "--set", f"nimbus.thrift.port={taken_port}",
         "--set", f"storm.local.dir={tmp_path / 'local'}"],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"cannot serve Thrift on 127.0.0.1:{taken_port}" in done.stderr
    assert "Address already in use" in done.stderr


def test_unreachable_zookeeper_is_a_clear_error():
    from nimbus.dev.zookeeper import free_port
    from nimbus.state.zk_client import make_zk_client

    closed_port = free_port()  # nothing listens there: connections are refused

    conf = load_config(overrides={"storm.zookeeper.port": closed_port,
                                  "storm.zookeeper.connection.timeout": 1000})
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(ConnectionError, match=rf"cannot connect to ZooKeeper at "
                                               rf"127\.0\.0\.1:{closed_port}"):
        make_zk_client(conf)
    wait_for(lambda: {t.name for t in threading.enumerate()} == before or None, 10,
             "kazoo's threads to end")


def test_the_ui_served_from_inside_a_nimbus(zk_server, zk_root, tmp_path):
    """nimbus.ui.enabled: the nimbus serves the REST API itself, and stops it on stop."""
    import json
    import urllib.request

    from nimbus.daemons.nimbus import NimbusDaemon
    from nimbus.dev.zookeeper import free_port

    ui_port = free_port()
    conf = conf_for(zk_server, zk_root, tmp_path, free_port(),
                    **{"nimbus.ui.enabled": True, "ui.port": ui_port})
    before = {t.name for t in threading.enumerate()}
    daemon = NimbusDaemon(conf)
    daemon.start()
    try:
        def summary() -> list[dict]:
            with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/api/v1/nimbus/summary",
                                        timeout=5) as reply:
                return json.load(reply)["nimbuses"]

        nimbuses = wait_for(lambda: [n for n in summary() if n["status"] == "Leader"], 30,
                            "the UI to show this nimbus leading")
        assert [n["port"] for n in nimbuses] == [conf["nimbus.thrift.port"]]
    finally:
        daemon.stop()
    wait_for(lambda: {t.name for t in threading.enumerate()} == before or None, 15,
             "every thread of the nimbus and its UI to end")


def test_a_taken_ui_port_fails_the_start_and_releases_everything(zk_server, zk_root,
                                                                 tmp_path, taken_port):
    from nimbus.daemons.nimbus import NimbusDaemon
    from nimbus.dev.zookeeper import free_port

    conf = conf_for(zk_server, zk_root, tmp_path, free_port(),
                    **{"nimbus.ui.enabled": True, "ui.port": taken_port})
    before = {t.name for t in threading.enumerate()}
    daemon = NimbusDaemon(conf)
    with pytest.raises(OSError, match=rf"cannot serve the UI on 127\.0\.0\.1:{taken_port}"):
        daemon.start()
    wait_for(lambda: {t.name for t in threading.enumerate()} == before or None, 15,
             "every thread the failed start made to end")
