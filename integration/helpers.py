"""Helpers shared by the integration tests and benchmarks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kazoo.client import KazooClient

from nimbus.cluster_state import StormClusterState
from nimbus.devcluster import LocalCluster


def observer(cluster: LocalCluster) -> StormClusterState:
    """A ZooKeeper client of the test's own, to look at cluster state directly."""
    zk = KazooClient(hosts=cluster.zk.hosts)
    zk.start(timeout=15)
    return StormClusterState(zk, "/storm")


def run_cli(*args: str, check: bool = False) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "nimbus.cli", *args], capture_output=True,
                            text=True, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"nimbus-ha {' '.join(args)} failed:\n{result.stderr}")
    return result


def stormdist(path: Path) -> set[str]:
    root = path / "nimbus" / "stormdist"
    return {p.name for p in root.iterdir() if not p.name.startswith(".")} if root.exists() \
        else set()
