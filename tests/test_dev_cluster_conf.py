"""`dev-cluster --config/--set`: validated like every command, given to every daemon,
except the keys that put the dev cluster on loopback (those it sets itself).

The end-to-end run (a shared-directory distributor selected this way, a topology
submitted) is integration/test_shareddir_cluster.py."""

from __future__ import annotations

from click.testing import CliRunner

from nimbus.cli import main
from nimbus.dev.cluster import DEV_CLUSTER_KEYS, dev_cluster_conf
from nimbus.distribution.distributors import load_cluster_config


def test_only_changed_keys_are_passed_and_loopback_keys_are_ignored():
    conf = load_cluster_config(overrides={"nimbus.code.sync.freq.secs": 300,  # the default
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

    from nimbus.dev.cluster import LocalCluster

    cluster = LocalCluster(tmp_path / "dev", 2, supervisors=1,
                           conf={"nimbus.codedistributor.s3.secret.key": "s3cret"})
    files = [n.config_file for n in cluster.nimbuses] + \
        [s.config_file for s in cluster.supervisors]
    assert len(files) == 3
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_a_secret_on_the_command_line_is_warned_about_and_a_reference_is_not(
        tmp_path, monkeypatch):
    """`ps` shows dev-cluster's own command line: a secret given in clear with --set gets
    a warning that says how to pass it instead; a `.env` reference does not."""
    import nimbus.dev.cluster

    started = []
    monkeypatch.setattr(nimbus.dev.cluster, "run_dev_cluster",
                        lambda *args, **kwargs: started.append(kwargs["conf"]))
    monkeypatch.setenv("ZK_DIGEST", "ops:hunter2")
    result = CliRunner().invoke(main, [
        "dev-cluster", "--dir", str(tmp_path / "dev"),
        "--set", "storm.zookeeper.auth.payload=ops:hunter2",
        "--set", "storm.zookeeper.auth.scheme=digest"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "warning: storm.zookeeper.auth.payload is a secret and its value is on this "
        "command line, which ps shows to every user of the host: pass "
        "storm.zookeeper.auth.payload.env=VARIABLE or storm.zookeeper.auth.payload.file="
        "PATH instead (docs/security.md)"]
    result = CliRunner().invoke(main, [
        "dev-cluster", "--dir", str(tmp_path / "dev"),
        "--set", "storm.zookeeper.auth.payload.env=ZK_DIGEST",
        "--set", "storm.zookeeper.auth.scheme=digest"])
    assert (result.exit_code, result.output) == (0, "")
    # The daemons get the reference, never the value.
    assert started[1]["storm.zookeeper.auth.payload.env"] == "ZK_DIGEST"
    assert "storm.zookeeper.auth.payload" not in started[1]


def test_the_client_file_holds_no_distributor_key(tmp_path):
    import stat

    import yaml

    from nimbus.dev.cluster import LocalCluster, write_client_conf

    cluster = LocalCluster(tmp_path / "dev", 2, conf={
        "storm.codedistributor.class": "s3",
        "nimbus.codedistributor.s3.replication.count": 2})
    path = write_client_conf(cluster)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    values = yaml.safe_load(path.read_text())
    assert not [k for k in values if k.startswith("nimbus.codedistributor.")]
    assert values["nimbus.seeds"] == cluster.conf_values["nimbus.seeds"]
    assert load_cluster_config(path).seeds == load_cluster_config(cluster.config_file).seeds
