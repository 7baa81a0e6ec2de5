"""`dev-cluster --config/--set`: validated like every command, given to every daemon,
except the keys that put the dev cluster on loopback (those it sets itself).

The end-to-end run (a shared-directory distributor selected this way, a topology
submitted) is integration/test_shareddir_cluster.py."""

from __future__ import annotations

from click.testing import CliRunner

from nimbus.cli import main
from nimbus.config import load_config
from nimbus.devcluster import DEV_CLUSTER_KEYS, dev_cluster_conf


def test_only_changed_keys_are_passed_and_loopback_keys_are_ignored():
    conf = load_config(overrides={"nimbus.code.sync.freq.secs": 300,  # the default
                                  "topology.min.replication.count": 3,
                                  "storm.zookeeper.servers": ["zk1.example.com"],
                                  "nimbus.thrift.port": 7000})
    chosen, ignored = dev_cluster_conf(conf)
    assert chosen == {"topology.min.replication.count": 3}
    assert ignored == ["nimbus.thrift.port", "storm.zookeeper.servers"]
    assert set(ignored) <= set(DEV_CLUSTER_KEYS)


def test_a_bad_set_fails_before_anything_starts(tmp_path):
    work = tmp_path / "dev"
    result = CliRunner().invoke(main, ["dev-cluster", "--dir", str(work), "--set",
                                       "topology.min.replication.cuont=2"])
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        "Error: --set: unknown key 'topology.min.replication.cuont' (did you mean "
        "'topology.min.replication.count'?)"]
    assert not work.exists()


def test_a_missing_config_file_fails_before_anything_starts(tmp_path):
    result = CliRunner().invoke(main, ["dev-cluster", "--dir", str(tmp_path / "dev"),
                                       "--config", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        f"Error: {tmp_path / 'nope.yaml'}: cannot read configuration file: "
        "No such file or directory"]


def test_the_daemons_config_files_are_private(tmp_path):
    """They may hold a store's keys or ZooKeeper's digest: mode 0600 (issue 30)."""
    import stat

    from nimbus.devcluster import LocalCluster

    cluster = LocalCluster(tmp_path / "dev", 2, supervisors=1,
                           conf={"nimbus.codedistributor.s3.secret.key": "s3cret"})
    files = [n.config_file for n in cluster.nimbuses] + \
        [s.config_file for s in cluster.supervisors]
    assert len(files) == 3
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
