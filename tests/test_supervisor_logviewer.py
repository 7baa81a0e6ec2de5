"""A supervisor's logviewer as part of the supervisor (nimbus/supervisor/daemon.py): bound
before anything is registered, said in its record, stopped with it; a taken port stops
the start with the reason. Real ZooKeeper, a real supervisor in this process."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import requests
from waiting import wait_for

from nimbus.config import load_config
from nimbus.daemons.supervisor import build_supervisor
from nimbus.dev.zookeeper import free_port
from nimbus.state.cluster_state import StormClusterState


def _conf(tmp_path, zk_server, zk_root, **extra):
    return load_config(overrides={
        "storm.zookeeper.port": zk_server.port, "storm.zookeeper.root": zk_root,
        "storm.zookeeper.session.timeout": 4000, "storm.local.dir": str(tmp_path / "local"),
        "storm.local.hostname": "127.0.0.1", "supervisor.slots.ports": [free_port()],
        "supervisor.spark.class.archive": False, "supervisor.warm.workers": 0, **extra})


def test_the_supervisor_serves_its_logviewer_says_where_and_stops_it(
        tmp_path, zk_server, zk_root, make_zk):
    state = StormClusterState(make_zk(), zk_root)
    state.setup()
    port = free_port()
    sup = build_supervisor(_conf(tmp_path, zk_server, zk_root, **{"logviewer.port": port}))
    sup.start()
    try:
        info = wait_for(lambda: state.supervisor_info(sup.id), 10, "the registration")
        assert (info.logviewer_port, info.logviewer_https) == (port, False)
        assert sup.log_root == tmp_path / "local" / "workers-artifacts"
        answer = requests.get(f"http://127.0.0.1:{port}/api/v1/listLogs", timeout=10)
        assert answer.status_code == 200 and answer.json() == []
    finally:
        sup.stop()
    assert [t.name for t in threading.enumerate() if t.name.startswith(
        ("supervisor-logviewer", "supervisor-log-sweep"))] == []
    with socket.socket() as probe:   # nothing listens there any more (TIME_WAIT aside)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))


def test_logviewer_port_0_serves_none(tmp_path, zk_server, zk_root, make_zk):
    state = StormClusterState(make_zk(), zk_root)
    state.setup()
    sup = build_supervisor(_conf(tmp_path, zk_server, zk_root, **{"logviewer.port": 0}))
    sup.start()
    try:
        info = wait_for(lambda: state.supervisor_info(sup.id), 10, "the registration")
        assert (info.logviewer_port, sup.logviewer) == (0, None)
    finally:
        sup.stop()


def test_a_taken_logviewer_port_fails_the_start_saying_so(tmp_path, zk_server, zk_root):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "nimbus.cli", "supervisor",
             "--set", f"storm.zookeeper.port={zk_server.port}",
             "--set", f"storm.zookeeper.root={zk_root}",
             "--set", f"storm.local.dir={tmp_path / 'local'}",
             "--set", "storm.local.hostname=127.0.0.1",
             "--set", f"supervisor.slots.ports=[{free_port()}]",
             "--set", f"logviewer.port={port}"],
            capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"cannot serve the logviewer on 127.0.0.1:{port}" in done.stderr
    assert "is another daemon using logviewer.port?" in done.stderr
