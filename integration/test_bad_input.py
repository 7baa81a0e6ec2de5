"""Bad input gets a clear error, a non-zero exit, and changes nothing in the cluster."""

from __future__ import annotations

import io
import re
import tarfile
import zipfile

import pytest
from helpers import observer, process_bundle, run_cli, stormdist

from nimbus.dev.cluster import LocalCluster
from nimbus.thrift import storm
from nimbus.thrift.client import connect

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def snapshot(cluster, state):
    """Everything bad input must leave alone: ZooKeeper state and every nimbus's disk."""
    return (
        sorted(state.active_storms()),
        sorted(state.code_topologies()),
        [sorted(stormdist(n.local_dir)) for n in cluster.nimbuses],
        [sorted(p.name for p in (n.local_dir / "nimbus" / "inbox").iterdir())
         for n in cluster.nimbuses],
    )


def _with_a_topology(cluster: LocalCluster, bundle: bytes) -> LocalCluster:
    # Replicated to both before any test looks at the disks.
    cluster.client().submit("existing", bundle, {"topology.min.replication.count": 2})
    return cluster


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory):
    """Two nimbuses and a replicated topology, shared by the tests that leave the cluster
    as they found it (each compares against its own snapshot) or only add to it."""
    base = tmp_path_factory.mktemp("bad-input")
    cluster = LocalCluster(base / "cluster", 2).start()
    try:
        yield _with_a_topology(cluster, process_bundle(base / "topology"))
    finally:
        cluster.stop()


@pytest.fixture
def cluster(make_cluster, bundle):
    """A cluster of its own, for a test that changes what others would snapshot."""
    return _with_a_topology(make_cluster(2), bundle)


def test_cli_bad_input(shared_cluster, tmp_path):
    cluster = shared_cluster
    state = observer(cluster)
    before = snapshot(cluster, state)
    conf = str(cluster.config_file)

    evil_tar = tmp_path / "evil.tgz"
    with tarfile.open(evil_tar, "w:gz") as tf:
        info = tarfile.TarInfo("../../outside.py")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"x"))
    abs_zip = tmp_path / "abs.jar"
    with zipfile.ZipFile(abs_zip, "w") as zf:
        zf.writestr("/etc/cron.d/evil", b"x")
    link_dir = tmp_path / "linky"
    link_dir.mkdir()
    (link_dir / "escape").symlink_to("/etc/passwd")
    not_archive = tmp_path / "notes.txt"
    not_archive.write_text("hello")
    good = tmp_path / "good"
    good.mkdir()
    (good / "main.py").write_text("print('hi')")
    (good / "topology.yaml").write_text('command: ["python", "main.py"]\n')
    no_kind = tmp_path / "plain-jar"  # what Storm's jars are: nothing a worker can run
    no_kind.mkdir()
    (no_kind / "main.py").write_text("print('hi')")

    cases = [
        (["submit", "../escape", str(good)], "invalid topology name"),
        (["submit", "a/b", str(good)], "invalid topology name"),
        (["submit", "evil", str(evil_tar)], "leaves its directory"),
        (["submit", "evil", str(abs_zip)], "absolute path"),
        (["submit", "evil", str(link_dir)], "symlink"),
        (["submit", "evil", str(not_archive)], "not a zip or tar archive"),
        (["submit", "existing", str(good)], "already alive"),
        (["submit", "evil", str(no_kind)], "bundle has neither topology.py (a pipeline) "
                                           "nor topology.yaml (a process topology)"),
        (["kill", "no-such-topology"], "no live topology named 'no-such-topology'"),
        (["activate", "no-such-topology"], "no live topology"),
    ]
    for args, message in cases:
        result = run_cli(*args, "--config", conf)
        assert result.returncode != 0, args
        assert message in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
    assert snapshot(cluster, state) == before
    state.zk.stop()


def test_server_refuses_bad_bundles_sent_directly(shared_cluster, tmp_path):
    """A Thrift client that skips the CLI's checks meets the same checks on the leader."""
    cluster = shared_cluster
    state = observer(cluster)
    before = snapshot(cluster, state)
    leader = cluster.wait_for_leader()
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w:gz") as tf:
        info = tarfile.TarInfo("/abs/path")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"x"))
    topology = storm.StormTopology(spouts={}, bolts={}, state_spouts={})
    with connect(leader.address) as raw:
        for data, message in ((payload.getvalue(), "absolute path"),
                              (b"not an archive at all", "not a zip or tar")):
            location = raw.beginFileUpload()
            raw.uploadChunk(location, data)
            raw.finishFileUpload(location)
            with pytest.raises(storm.InvalidTopologyException, match=message):
                raw.submitTopology("direct", location, "{}", topology)
        with pytest.raises(storm.InvalidTopologyException, match="not a finished upload"):
            raw.submitTopology("direct", "/etc/passwd", "{}", topology)
        with pytest.raises(storm.AuthorizationException):
            raw.beginFileDownload("/etc/passwd")
        with pytest.raises(storm.AuthorizationException):
            raw.beginFileDownload("../../../etc/passwd")
        with pytest.raises(storm.NotAliveException):
            raw.killTopology("nope")
        location = raw.beginFileUpload()
        raw.finishFileUpload(location)
        with pytest.raises(storm.InvalidTopologyException, match="not JSON"):
            raw.submitTopology("direct", location, "{bad json", topology)
    assert snapshot(cluster, state) == before
    assert leader.alive(), "bad input must never crash the daemon"
    state.zk.stop()


def test_daemon_start_errors(tmp_path, shared_cluster):
    cluster = shared_cluster
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("nimbus.thrift.port: [oops\n")
    result = run_cli("nimbus", "--config", str(bad_yaml))
    assert result.returncode != 0 and f"{bad_yaml}: malformed YAML" in result.stderr

    result = run_cli("nimbus", "--config", str(cluster.config_file),
                     "--set", "storm.codedistributor.class=com.example.Missing")
    assert result.returncode != 0
    assert "unknown code distributor 'com.example.Missing'" in result.stderr
    assert re.search(r"installed: [a-z, ]*localfs", result.stderr)

    # Storm's HDFS class selects nimbus-ha-hdfs; with no HDFS client on this machine the
    # error says what to provide. (A backend that is not installed at all is covered by
    # tests/test_distributors.py: every backend is installed here.)
    result = run_cli("nimbus", "--config", str(cluster.config_file), "--set",
                     "storm.codedistributor.class="
                     "org.apache.storm.hdfs.ha.codedistributor.HDFSCodeDistributor")
    assert result.returncode != 0 and "code distributor 'hdfs' cannot start" in result.stderr
    assert "Traceback" not in result.stderr

    # An installed backend that is misconfigured: one line naming the setting.
    result = run_cli("nimbus", "--config", str(cluster.config_file),
                     "--set", "storm.codedistributor.class=s3")
    assert result.returncode != 0
    assert "code distributor 's3' cannot start: set nimbus.codedistributor.s3.bucket" \
        in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_commands_happy_path(cluster, tmp_path):
    conf = str(cluster.config_file)
    src = tmp_path / "t"
    src.mkdir()
    (src / "job.py").write_text("print(1)")
    (src / "topology.yaml").write_text('command: ["python", "job.py"]\n')
    out = run_cli("submit", "cli-topology", str(src), "--config", conf,
                  "--set", "topology.min.replication.count=2", check=True)
    topology_id = out.stdout.strip()
    assert topology_id.startswith("cli-topology-")
    assert "cli-topology" in run_cli("list", "--config", conf, check=True).stdout
    leader = run_cli("leader", "--config", conf, check=True).stdout.strip()
    assert leader == cluster.wait_for_leader().address
    assert run_cli("rebalance", "cli-topology", "-n", "2", "--config", conf,
                   check=True).stdout == "rebalanced cli-topology to 2 workers\n"
    run_cli("deactivate", "cli-topology", "--config", conf, check=True)
    import json

    view = json.loads(run_cli("topology-info", "cli-topology", "--json", "--config", conf,
                              check=True).stdout)
    # no supervisors in this cluster: nothing placed, nothing reported
    assert (view["id"], view["status"], view["num_workers"], view["workers"],
            view["errors"]) == (topology_id, "INACTIVE", 2, [], {})
    assert run_cli("errors", "cli-topology", "--config", conf, check=True).stdout == (
        "No errors reported by cli-topology.\n")

    info = json.loads(run_cli("cluster-info", "--json", "--config", conf, check=True).stdout)
    entry = next(t for t in info["topologies"] if t["name"] == "cli-topology")
    assert entry == {**entry, "id": topology_id, "status": "INACTIVE", "replication_count": 2}
    assert sum(n["isLeader"] for n in info["nimbuses"]) == 1
    assert {"host", "port", "uptime_secs", "isLeader", "version"} <= set(info["nimbuses"][0])
    run_cli("kill", "cli-topology", "--wait", "30", "--config", conf, check=True)
    info = json.loads(run_cli("cluster-info", "--json", "--config", conf, check=True).stdout)
    assert next(t for t in info["topologies"] if t["name"] == "cli-topology")["status"] == "KILLED"


def test_thrift_read_api_on_any_nimbus(shared_cluster, bundle):
    """What a Storm client or supervisor reads: topology info, conf, code download."""
    cluster = shared_cluster
    import json

    topology_id = cluster.client().submit(
        "readable", bundle, {"topology.min.replication.count": 2, "topology.workers": 3})
    for nimbus in cluster.nimbuses:
        with connect(nimbus.address) as raw:
            info = raw.getTopologyInfo(topology_id)
            assert (info.id, info.name, info.status) == (topology_id, "readable", "ACTIVE")
            assert info.replication_count == 2
            conf = json.loads(raw.getTopologyConf(topology_id))
            assert conf["topology.workers"] == 3
            assert raw.getTopology(topology_id).spouts == {}
            assert json.loads(raw.getNimbusConf())["nimbus.thrift.port"] == nimbus.port
            session = raw.beginFileDownload(f"{topology_id}/stormjar.jar")
            data = b""
            while chunk := raw.downloadChunk(session):
                data += chunk
            assert data == bundle
            with pytest.raises(storm.NotAliveException):
                raw.getTopologyInfo("missing-1-1")
