"""Shared set-up of the fast UI tests: cluster records written straight into a real
ZooKeeper (as the leader, nimbuses and supervisors write them), a started ZooKeeperReader,
and the WSGI app under Werkzeug's test client with a fake leader client."""

from __future__ import annotations

import time
from typing import Any

from werkzeug.test import Client

from nimbus.config import load_config
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.records import (
    ACTIVE,
    Assignment,
    NimbusInfo,
    StormBase,
    SupervisorInfo,
)
from nimbus.ui.app import UIApp
from nimbus.ui.zk_reader import ZooKeeperReader


class FakeLeader:
    """Stands for NimbusClient: records calls, or raises ``fail`` for every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail: Exception | None = None
        self.histories: dict[str, dict[str, Any]] = {}

    def _call(self, *args: Any) -> None:
        if self.fail is not None:
            raise self.fail
        self.calls.append(args)

    def activate(self, name: str) -> None:
        self._call("activate", name)

    def deactivate(self, name: str) -> None:
        self._call("deactivate", name)

    def kill(self, name: str, wait_secs: int | None = None) -> None:
        self._call("kill", name, wait_secs)

    def rebalance(self, name: str, num_workers: int, wait_secs: int | None = None) -> None:
        self._call("rebalance", name, num_workers, wait_secs)

    # Code versions: ``histories`` holds what history(name) answers.
    def history(self, name: str) -> dict[str, Any]:
        self._call("history", name)
        return self.histories[name]

    def rollback(self, name: str, version: int | None = None) -> dict[str, Any]:
        self._call("rollback", name, version)
        return {"topology_id": self.histories.get(name, {}).get("topology_id", ""),
                "version": version or 1}


def conf_for(zk_server: Any, zk_root: str, **extra: Any):
    host, port = zk_server.hosts.split(",")[0].rsplit(":", 1)
    return load_config(overrides={
        "storm.zookeeper.servers": [host], "storm.zookeeper.port": int(port),
        "storm.zookeeper.root": zk_root, "nimbus.seeds": ["127.0.0.1:1", "127.0.0.1:2"],
        "nimbus.codedistributor.s3.secret.key": "hunter2-secret",
        **extra}, extra_defaults={"nimbus.codedistributor.s3.secret.key": ""})


def write_cluster(state: StormClusterState, topologies: int = 1) -> list[str]:
    """Two nimbuses (the first leads), one supervisor with 4 slots, ``topologies``
    ACTIVE topologies with one placed worker each (the first) and a replica on the
    leader. Returns the topology ids."""
    zk = state.zk
    now = int(time.time())
    for port in (1, 2):
        state.register_nimbus(NimbusInfo(host="127.0.0.1", port=port,
                                         start_time_secs=now - 100 * port, version="0.1.0"))
    zk.create(state.path("leader-lock", "nimbus-0000000001"), b"127.0.0.1:1",
              ephemeral=True)
    zk.create(state.path("leader-lock", "nimbus-0000000002"), b"127.0.0.1:2",
              ephemeral=True)
    state.supervisor_heartbeat("sup-a", SupervisorInfo(
        time_secs=now, hostname="host-a", meta=[6700, 6701, 6702, 6703], uptime_secs=65,
        version="0.1.0"))
    ids = []
    for i in range(topologies):
        topology_id = f"topo{i}-{i + 1}-{now}"
        ids.append(topology_id)
        assignment = Assignment(master_code_dir="/code")
        if i == 0:
            assignment = Assignment(master_code_dir="/code", node_host={"sup-a": "host-a"},
                                    executor_node_port={"worker-0": ["sup-a", 6700]},
                                    executor_start_time_secs={"worker-0": now - 5})
        zk.create(state.storm_path(topology_id), StormBase(
            storm_name=f"topo{i}", launch_time_secs=now - 10, status=ACTIVE,
            num_workers=1).encode())
        zk.create(state.path("assignments", topology_id), assignment.encode())
        zk.create(state.path("workerbeats", topology_id))
        zk.create(state.path("errors", topology_id))
        zk.create(state.code_path(topology_id), b"")
        zk.create(state.code_path(topology_id) + "/127.0.0.1:1", b"", ephemeral=True)
    return ids


class Harness:
    def __init__(self, conf: Any, state: StormClusterState,
                 fetch_replicas: Any = None):
        self.conf = conf
        self.state = state
        self.leader = FakeLeader()
        self.reader = ZooKeeperReader(conf, state.zk, fetch_conf=lambda tid: "{}",
                                      fetch_replicas=fetch_replicas)
        self.reader.start()
        assert self.reader.wait_ready(10)
        self.app = UIApp(conf, self.reader, self.leader)  # type: ignore[arg-type]
        self.client = Client(self.app)

    def close(self) -> None:
        self.reader.stop()
