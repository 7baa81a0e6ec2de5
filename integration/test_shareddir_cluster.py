"""nimbus-ha-shareddir in real clusters: picked through `dev-cluster --config/--set`, and
what happens (and how an operator recovers) when the share loses a topology's code."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import observer, stormdist
from required_plugins import require_plugin
from waiting import wait_for

from nimbus.dev.zookeeper import free_port, port_open
from nimbus.distribution.distributors import load_cluster_config
from nimbus.thrift.client import NimbusClient, NimbusUnavailableError

pytestmark = pytest.mark.slow
PREFIX = "nimbus.codedistributor.shareddir."


def two_free_ports() -> int:
    """A port p with p + 1 free too (dev-cluster numbers its nimbuses from --base-port)."""
    def pair() -> int | None:
        port = free_port()
        return port if not port_open(port + 1) else None

    return wait_for(pair, 10, "two consecutive free ports")


def test_dev_cluster_gives_config_and_set_to_every_daemon(tmp_path):
    """--config and --set reach every nimbus and supervisor: with shareddir selected
    that way, a submitted topology's code lands in the share."""
    require_plugin("shareddir")
    share = tmp_path / "share"
    share.mkdir()
    conf_file = tmp_path / "storm.yaml"
    conf_file.write_text(yaml.safe_dump({"storm.codedistributor.class": "shareddir",
                                         PREFIX + "replication.count": 2,
                                         "storm.zookeeper.port": 1}))  # dev-cluster's own
    work = tmp_path / "dev"
    base_port = two_free_ports()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nimbus.cli", "dev-cluster", "--nimbuses", "2",
         "--supervisors", "1", "--base-port", str(base_port), "--dir", str(work),
         "--config", str(conf_file), "--set", f"{PREFIX}path={share}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("Ctrl-C (or SIGTERM) stops the cluster") \
                    or proc.poll() is not None:
                break
        assert "Ctrl-C (or SIGTERM) stops the cluster\n" in lines, "".join(lines)
        assert ("dev-cluster sets storm.zookeeper.port itself: the configured value is "
                "ignored\n") in lines
        for name in ("nimbus-0.yaml", "nimbus-1.yaml", "supervisor-0.yaml"):
            daemon_conf = yaml.safe_load((work / name).read_text())
            assert daemon_conf["storm.codedistributor.class"] == "shareddir", name
            assert daemon_conf[PREFIX + "path"] == str(share), name
            assert daemon_conf[PREFIX + "replication.count"] == 2, name
        client = NimbusClient(load_cluster_config(work / "nimbus-0.yaml"))
        topology = tmp_path / "topology"
        topology.mkdir()
        (topology / "topology.yaml").write_text('command: ["sleep", "3600"]\n')
        topology_id = client.submit("shared", _pack(topology),
                                    {"topology.min.replication.count": 2})
        assert (share / topology_id / ".manifest.json").is_file()
        [summary] = client.cluster_info().topologies
        assert summary.replication_count == 2
    finally:
        proc.send_signal(signal.SIGTERM)   # SIGINT: ignored if pytest runs in the background
        output, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0, "".join(lines) + output


def _pack(directory: Path) -> bytes:
    from nimbus.distribution.archive import pack_directory

    return pack_directory(directory)


@pytest.mark.parametrize("recovery", ["restore the bundle", "delete the topology"])
def test_a_share_that_lost_the_code_leaves_no_leader_until_recovered(
        make_cluster, bundle, tmp_path, recovery):
    """The documented failure and both documented recoveries (docs/plugins.md, "When a
    store loses the code"), on a real cluster.

    Every nimbus restarts without its local copy and the share has lost the bundle: no
    nimbus can get the code, so none may lead and leader calls fail with "no leader".
    Putting the bundle back (from a backup) or deleting the topology's nodes from
    ZooKeeper each lets a nimbus lead again."""
    require_plugin("shareddir")
    share = tmp_path / "share"
    share.mkdir()
    cluster = make_cluster(2, **{"storm.codedistributor.class": "shareddir",
                                 PREFIX + "path": str(share)})
    client = cluster.client()
    topology_id = client.submit("lost", bundle, {"topology.min.replication.count": 1})
    backup = tmp_path / "backup"
    shutil.copytree(share / topology_id, backup)
    for nimbus in cluster.nimbuses:
        nimbus.kill9()
        nimbus.wipe()
    shutil.rmtree(share / topology_id)  # the share loses the code
    marks = [len(n.log_text()) for n in cluster.nimbuses]
    for nimbus in cluster.nimbuses:
        nimbus.start()
    wait_for(lambda: any("lacks topology code: giving it up" in n.log_text()[m:]
                         for n, m in zip(cluster.nimbuses, marks, strict=True)), 60,
             "a nimbus at the head of the queue to give the lock up")
    state = observer(cluster)
    wait_for(lambda: not state.leader_queue(), 20, "the queue to empty")
    with pytest.raises(NimbusUnavailableError, match="no leader"):
        cluster.client(deadline_s=2).kill("lost", 0)

    if recovery == "restore the bundle":
        # Back under its own name, complete: copy next to it, then rename (atomic).
        shutil.copytree(backup, share / f".restore-{topology_id}")
        (share / f".restore-{topology_id}").rename(share / topology_id)
        leader = cluster.wait_for_leader(timeout_s=120)
        wait_for(lambda: stormdist(leader.local_dir) == {topology_id}, 30, "the code")
        assert [t.name for t in client.cluster_info().topologies] == ["lost"]
    else:
        for sub in ("storms", "assignments", "workerbeats", "errors", "code-distributor"):
            state.zk.delete(f"/storm/{sub}/{topology_id}", recursive=True)
        cluster.wait_for_leader(timeout_s=120)
        assert client.cluster_info().topologies == []
        # And the name is free again: the topology can be submitted anew.
        assert client.submit("lost", bundle, {"topology.min.replication.count": 1})
    state.zk.stop()
