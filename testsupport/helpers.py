"""Helpers shared by the integration tests and benchmarks."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError, NotEmptyError
from waiting import wait_for

from nimbus.dev.cluster import LocalCluster, sample_topology
from nimbus.distribution.archive import pack_directory
from nimbus.state.cluster_state import StormClusterState

LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
# A process topology that only sleeps: what the bundles of these tests run, if anything.
PROCESS_TOPOLOGY_YAML = 'command: ["sleep", "3600"]\n'


def process_bundle(directory: Path) -> bytes:
    """A small process-topology bundle made in ``directory`` (submit refuses one without
    topology.yaml or topology.py at its root)."""
    source = sample_topology(directory, 32 * 1024)
    (source / "topology.yaml").write_text(PROCESS_TOPOLOGY_YAML)
    return pack_directory(source)


@contextlib.contextmanager
def s3_store(work_dir: Path) -> Iterator[dict[str, Any]]:
    """A real SeaweedFS S3 server with a bucket, for as long as the block runs: the
    settings that select the s3 distributor on it (replication count 2)."""
    from nimbus_ha_s3.distributor import PREFIX
    from nimbus_ha_s3.seaweed import SeaweedS3Server

    server = SeaweedS3Server(work_dir).start()
    try:
        server.create_bucket("topologies")
        yield {"storm.codedistributor.class": "s3",
               PREFIX + "endpoint": server.endpoint_url, PREFIX + "bucket": "topologies",
               PREFIX + "access.key": server.access_key,
               PREFIX + "secret.key": server.secret_key, PREFIX + "replication.count": 2}
    finally:
        server.stop()


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


CLAIM = re.compile(r"gained leadership as \S+; code held: held (\d+) of (\d+) live "
                   r"topologies \[([^\]]*)\]")


def leadership_claims(log_text: str) -> list[tuple[int, int, set[str]]]:
    """(held, live, live ids) of each time the nimbus whose log this is became leader.

    The elector logs what the code sync verified just before it took the lock: the
    design's rule is that held == live at that moment, on every backend.
    """
    return [(int(held), int(live), set(filter(None, ids.split(","))))
            for held, live, ids in CLAIM.findall(log_text)]


def log_time(line: str) -> float | None:
    """The wall-clock time a daemon's log line was written (its asctime), or None."""
    match = LOG_TIME.match(line)
    if not match:
        return None
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def leadership_events(text: str) -> list[tuple[float, bool]]:
    """(wall clock, True for gained / False for lost) from one nimbus's log."""
    out = []
    for line in text.splitlines():
        gained = "gained leadership as" in line
        if not gained and "lost leadership" not in line:
            continue
        stamp = log_time(line)
        if stamp is not None:
            out.append((stamp, gained))
    return out


def wipe(zk: KazooClient, path: str, timeout_s: float = 30) -> None:
    """Delete `path` and everything under it while live nimbuses may still be adding
    ephemeral children (their registration, election and lock nodes): a single recursive
    delete can meet a child created after it listed the parent, so it is repeated."""
    def gone() -> bool:
        try:
            zk.delete(path, recursive=True)
        except NotEmptyError:
            return False
        except NoNodeError:
            pass
        return zk.exists(path) is None
    wait_for(gone, timeout_s, f"{path} to be deleted")
