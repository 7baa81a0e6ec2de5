"""An in-process nimbus on the session's real ZooKeeper whose duties run only when a test
calls ``run_cycle`` (shared by the Thrift and rebalance tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from nimbus.dev.zookeeper import free_port


def idle_nimbus_conf(zk_server: Any, zk_root: str, tmp_path: Path) -> Path:
    """Write and return a storm.yaml for one nimbus on ``zk_server`` under ``zk_root``,
    on a free port, with no duty cycle of its own (so no watchdog on it either)."""
    host, _, zk_port = zk_server.hosts.rpartition(":")
    port = free_port()
    conf_file = tmp_path / "storm.yaml"
    conf_file.write_text(yaml.safe_dump({
        "storm.zookeeper.servers": [host], "storm.zookeeper.port": int(zk_port),
        "storm.zookeeper.root": zk_root, "storm.zookeeper.session.timeout": 4000,
        "nimbus.thrift.port": port, "nimbus.seeds": [f"127.0.0.1:{port}"],
        "storm.local.dir": str(tmp_path / "local"),
        "nimbus.monitor.freq.secs": 3600, "nimbus.leader.watchdog.secs": 0}))
    return conf_file
