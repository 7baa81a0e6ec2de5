"""Configuration: layering, Storm key names, and errors that name the key and the file."""

from pathlib import Path

import pytest

from nimbus.config import ConfigError, HostPort, builtin_defaults, load_config

REPO = Path(__file__).resolve().parents[1]


def test_defaults_file_is_the_packaged_one():
    assert (REPO / "conf" / "defaults.yaml").read_text() == (
        REPO / "nimbus" / "defaults.yaml").read_text()


def test_every_default_is_documented_by_a_comment():
    lines = (REPO / "nimbus" / "defaults.yaml").read_text().splitlines()
    keys = builtin_defaults()
    for key in keys:
        index = next(i for i, line in enumerate(lines) if line.startswith(f"{key}:"))
        above = lines[index - 1] if index else ""
        assert above.startswith("#") or lines[index - 1].startswith(("storm.", "nimbus.",
                                                                    "supervisor.", "ui.",
                                                                    "drpc.", "worker.",
                                                                    "java.", "  -")), key


def test_storm_defaults():
    conf = load_config()
    assert conf["storm.zookeeper.root"] == "/storm"
    assert conf["nimbus.thrift.port"] == 6627
    assert conf["topology.min.replication.count"] == 1
    assert conf["topology.max.replication.wait.time.sec"] == 60
    assert conf["storm.codedistributor.class"].endswith("LocalFileSystemCodeDistributor")


def test_layering_file_then_set(tmp_path):
    path = tmp_path / "storm.yaml"
    path.write_text("nimbus.thrift.port: 7000\nnimbus.seeds: ['a', 'b:7001']\n")
    conf = load_config(path, ["nimbus.thrift.port=7100", "storm.zookeeper.servers=[zk1, zk2]"])
    assert conf["nimbus.thrift.port"] == 7100
    assert conf.seeds == [HostPort("a", 7100), HostPort("b", 7001)]
    assert conf.zk_hosts == "zk1:2181,zk2:2181"


def test_an_existing_storm_yaml_loads(tmp_path):
    path = tmp_path / "storm.yaml"
    path.write_text(
        "storm.zookeeper.servers: [\"zk.example\"]\nnimbus.seeds: [\"n1\", \"n2\"]\n"
        "supervisor.slots.ports: [6700, 6701]\nui.port: 8080\nstorm.local.dir: /var/storm\n"
        "storm.codedistributor.class: org.apache.storm.codedistributor."
        "LocalFileSystemCodeDistributor\n")
    assert load_config(path)["ui.port"] == 8080


@pytest.mark.parametrize("text, needle", [
    ("nimbus.thrift.port: [unclosed", "malformed YAML"),
    ("- just\n- a list\n", "expected a mapping"),
    ("nimbus.thirft.port: 1\n",
     "unknown key 'nimbus.thirft.port' (did you mean 'nimbus.thrift.port'?)"),
    ("nimbus.thrift.port: '6627'\n", "key 'nimbus.thrift.port' must be an integer"),
    ("topology.min.replication.count: 0\n", "at least 1"),
    ("topology.max.replication.wait.time.sec: -5\n", ">= 0 or -1"),
    ("nimbus.seeds: ['host:notaport']\n", "nimbus.seeds"),
    ("storm.zookeeper.session.timeout: true\n", "must be an integer"),
])
def test_bad_files_name_key_and_file(tmp_path, text, needle):
    path = tmp_path / "storm.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert needle in str(err.value)
    if "unknown" in needle or "must be" in needle or "malformed" in needle:
        assert str(path) in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read configuration file"):
        load_config(tmp_path / "nope.yaml")


def test_bad_override():
    with pytest.raises(ConfigError, match="expected key=value"):
        load_config(overrides=["nimbus.thrift.port"])
    with pytest.raises(ConfigError, match="--set: unknown key 'no.such.key'"):
        load_config(overrides=["no.such.key=1"])


def test_wait_forever_is_allowed():
    assert load_config(overrides=["topology.max.replication.wait.time.sec=-1"])[
        "topology.max.replication.wait.time.sec"] == -1
