"""Configuration: layering, Storm key names, and errors that name the key and the file."""

import re
from importlib import resources
from pathlib import Path

import pytest
import yaml

from nimbus.config import ConfigError, HostPort, builtin_defaults, load_config

REPO = Path(__file__).resolve().parents[1]


def test_defaults_file_is_the_packaged_one():
    """nimbus/defaults.yaml is the source of truth; conf/defaults.yaml only points at it,
    and the defaults the loader uses are that file's, read back through the package."""
    packaged = REPO / "nimbus" / "defaults.yaml"
    alias = REPO / "conf" / "defaults.yaml"
    assert packaged.is_file() and not packaged.is_symlink()
    assert alias.is_symlink(), "conf/defaults.yaml must be a symlink, not a copy that drifts"
    assert alias.resolve() == packaged.resolve()
    loaded = resources.files("nimbus").joinpath("defaults.yaml").read_text(encoding="utf-8")
    assert loaded == packaged.read_text(encoding="utf-8")
    assert builtin_defaults() == yaml.safe_load(packaged.read_text(encoding="utf-8"))


_TOP_LEVEL_KEY = re.compile(r"^(?![#\s-])([^:]+):")


def undocumented_keys(text: str) -> list[str]:
    """Top-level keys of a defaults file whose line is not directly below a comment.

    A ``### Section`` heading is not a key's documentation: each key needs its own
    ``# ...`` line (a comment may document the key below it only).
    """
    lines = text.splitlines()
    missing = []
    for index, line in enumerate(lines):
        match = _TOP_LEVEL_KEY.match(line)
        if not match:
            continue
        above = lines[index - 1] if index else ""
        if not above.startswith("#") or above.startswith("###"):
            missing.append(match.group(1).strip().strip("\"'"))
    return missing


def test_the_documentation_check_finds_an_undocumented_key():
    text = ("### Section\n"
            "# Documented.\n"
            "a.documented: 1\n"
            "a.list:\n"
            "  - 1\n"
            "a.after.list: 2\n"
            "# Documented too.\n"
            "b.documented: [1, 2]\n"
            "\n"
            "c.after.blank: 3\n"
            "### Heading only\n"
            "d.under.heading: 4\n")
    assert undocumented_keys(text) == ["a.list", "a.after.list", "c.after.blank",
                                       "d.under.heading"]
    assert undocumented_keys("# Doc.\nkey: 1\n# Doc.\nother: 2\n") == []


def test_every_default_is_documented_by_a_comment():
    text = (REPO / "nimbus" / "defaults.yaml").read_text(encoding="utf-8")
    # The scan must see every key the loader sees, or an unseen key would pass unchecked.
    scanned = [_TOP_LEVEL_KEY.match(line).group(1).strip().strip("\"'")
               for line in text.splitlines() if _TOP_LEVEL_KEY.match(line)]
    assert sorted(scanned) == sorted(builtin_defaults())
    assert undocumented_keys(text) == []


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


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("nimbus.thrift.max_buffer_size", 65536, "must be at least 528384"),
    ("nimbus.thrift.threads", 0, "'nimbus.thrift.threads' must be at least 1"),
])
def test_thrift_limits_that_would_refuse_every_upload_are_errors(key, value, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(overrides={key: value}, extra_defaults={})


# -- secrets from a file or an environment variable (issue 30) ---------------------------
SECRET_KEY = "storm.zookeeper.auth.payload"


def test_a_secret_comes_from_an_owner_only_file(tmp_path):
    secret = tmp_path / "payload"
    secret.write_text("nimbus:s3cr3t\n")
    secret.chmod(0o600)
    conf = load_config(overrides=[f"{SECRET_KEY}.file={secret}"])
    assert conf[SECRET_KEY] == "nimbus:s3cr3t"
    assert conf.indirect == {SECRET_KEY: (f"{SECRET_KEY}.file", str(secret))}
    assert conf.redacted()[SECRET_KEY] != "nimbus:s3cr3t"


def test_a_secret_file_others_can_read_is_refused(tmp_path):
    secret = tmp_path / "payload"
    secret.write_text("nimbus:s3cr3t")
    secret.chmod(0o640)
    with pytest.raises(ConfigError, match=r"readable by its group or by everyone \(mode "
                                          r"0640\); chmod 600 it") as err:
        load_config(overrides=[f"{SECRET_KEY}.file={secret}"])
    assert "s3cr3t" not in str(err.value)


def test_a_secret_comes_from_an_environment_variable(monkeypatch):
    monkeypatch.setenv("ZK_PAYLOAD", "nimbus:from-env")
    conf = load_config(overrides={f"{SECRET_KEY}.env": "ZK_PAYLOAD"})
    assert conf[SECRET_KEY] == "nimbus:from-env"
    monkeypatch.delenv("ZK_PAYLOAD")
    with pytest.raises(ConfigError, match="environment variable ZK_PAYLOAD is not set"):
        load_config(overrides={f"{SECRET_KEY}.env": "ZK_PAYLOAD"})


def test_only_secret_keys_take_a_file():
    with pytest.raises(ConfigError, match="unknown key 'nimbus.seeds.file'"):
        load_config(overrides={"nimbus.seeds.file": "/etc/hosts"})


def test_dev_cluster_passes_the_reference_not_the_secret(tmp_path):
    from nimbus.dev.cluster import dev_cluster_conf

    secret = tmp_path / "payload"
    secret.write_text("nimbus:s3cr3t")
    secret.chmod(0o600)
    chosen, _ = dev_cluster_conf(load_config(overrides=[f"{SECRET_KEY}.file={secret}"]))
    assert chosen == {f"{SECRET_KEY}.file": str(secret)}


def test_the_logviewer_settings_answer_to_both_names():
    """Storm's names (logviewer.port, logviewer.cleanup.age.mins) and nimbus-ha's
    (supervisor.logviewer.port, supervisor.worker.log.retention.hours) set one setting."""
    conf = load_config(overrides={"supervisor.worker.log.retention.hours": 2,
                                  "supervisor.logviewer.port": 9001})
    assert (conf["logviewer.cleanup.age.mins"], conf["logviewer.port"]) == (120.0, 9001)
    assert load_config(overrides={"logviewer.port": 9002})["logviewer.port"] == 9002
    same = load_config(overrides={"supervisor.logviewer.port": 9003, "logviewer.port": 9003})
    assert same["logviewer.port"] == 9003
    with pytest.raises(ConfigError, match="name the same setting and disagree"):
        load_config(overrides={"supervisor.logviewer.port": 9001, "logviewer.port": 9002})
    with pytest.raises(ConfigError, match="'supervisor.worker.log.retention.hours' must be"):
        load_config(overrides={"supervisor.worker.log.retention.hours": -3})
