"""Secrets never leave the process: getNimbusConf, topology conf, CLI errors and logs."""

from __future__ import annotations

import json
import logging

import pytest
from click.testing import CliRunner

from nimbus.cli import main
from nimbus.config import ConfigError
from nimbus.distribution.distributors import load_cluster_config
from nimbus.redaction import REDACTED, SecretLogFilter, is_secret_key, redact, secret_values

SECRET = "s3cr3t-Value-42"


@pytest.mark.parametrize("key", [
    "nimbus.codedistributor.s3.secret.key", "storm.zookeeper.auth.payload",
    "storm.zookeeper.topology.auth.payload", "ui.http.creds.plugin.password",
    "topology.auth.token", "nimbus.some_secret", "java.keystore.password",
    # issue 19, T2.12/U13/U14: the common credential names, and the superACL digest
    "fs.s3a.aws_secret_access_key", "aws_secret_access_key", "openai.api.key",
    "nimbus.codedistributor.azure.account.key", "ssl.private.key",
    "storm.zookeeper.superACL", "tls.key.passphrase",
    # issue 30: by name wherever the secret sits, as Spark and Hadoop users pass them
    "spark.hadoop.fs.azure.account.key.acct.blob.core.windows.net",
    "fs.azure.sas.container.acct.blob.core.windows.net", "fs.s3a.access.key",
    "fs.s3a.secret.key", "fs.s3a.session.token", "fs.s3a.bucket.logs.secret.key",
    "fs.gs.auth.service.account.json.keyfile", "spark.hadoop.fs.gs.auth.service.account."
    "private.key", "nimbus.codedistributor.azure.connection.string",
    "nimbus.codedistributor.azure.sas", "nimbus.codedistributor.s3.access.key",
    "db.password.file", "mq.token_value"])
def test_secret_keys(key):
    assert is_secret_key(key)


@pytest.mark.parametrize("key", [
    "storm.zookeeper.servers", "nimbus.seeds", "topology.workers",
    "storm.zookeeper.auth.scheme", "storm.thrift.tls.key.file", "ui.https.key.file",
    "storm.zookeeper.connection.timeout", "topology.stall.timeout.secs",
    "x.keyring",
    "spark.sql.shuffle.partitions", "fs.s3a.endpoint"])
def test_ordinary_keys(key):
    assert not is_secret_key(key)


def test_redact_replaces_secrets_at_any_depth():
    conf = {"a.password": "x", "topology.spark.conf": {"fs.s3a.secret.key": "y", "n": 1},
            "empty.password": "", "plain": "z",
            "sinks": [{"name": "s", "auth.token": "t"}, "plain"]}
    assert redact(conf) == {"a.password": REDACTED,
                            "topology.spark.conf": {"fs.s3a.secret.key": REDACTED, "n": 1},
                            "empty.password": "", "plain": "z",
                            "sinks": [{"name": "s", "auth.token": REDACTED}, "plain"]}
    assert secret_values({"sinks": [{"auth.token": "abcdef"}], "x.password": "ghij"}) == \
        {"abcdef", "ghij"}


def test_secret_values_include_a_payloads_password_and_numbers():
    assert secret_values({"storm.zookeeper.auth.payload": "nimbus:pw-1234",
                          "x.secret.key": 12345678, "y.password": True, "z.token": "abc"}) \
        == {"nimbus:pw-1234", "pw-1234", "12345678"}


def test_get_nimbus_conf_redacts_the_s3_secret():
    from nimbus.thrift.handler import NimbusHandler

    conf = load_cluster_config(overrides={"nimbus.codedistributor.s3.secret.key": SECRET})
    handler = NimbusHandler.__new__(NimbusHandler)
    handler.conf = conf
    text = handler.getNimbusConf()
    assert SECRET not in text
    assert json.loads(text)["nimbus.codedistributor.s3.secret.key"] == REDACTED


def test_type_error_in_config_does_not_echo_the_secret():
    with pytest.raises(ConfigError) as err:
        load_cluster_config(overrides={"nimbus.codedistributor.s3.secret.key": [SECRET]})
    assert SECRET not in str(err.value)
    assert "nimbus.codedistributor.s3.secret.key" in str(err.value)


def test_log_filter_masks_secret_values_in_messages_and_tracebacks():
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(self.format(record))

    handler = Keep()
    handler.addFilter(SecretLogFilter({SECRET}))
    logger = logging.getLogger("test.redaction")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("connecting with %s", SECRET)
        try:
            raise RuntimeError(f"refused: {SECRET}")
        except RuntimeError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    assert len(records) == 2
    assert records[0] == f"connecting with {REDACTED}"
    assert SECRET not in records[1] and f"refused: {REDACTED}" in records[1]


def test_cli_error_output_masks_secrets():
    result = CliRunner().invoke(main, [
        "list", "--set", f"nimbus.codedistributor.s3.secret.key=[{SECRET}]"])
    assert result.exit_code == 1
    assert "nimbus.codedistributor.s3.secret.key' must be a string" in result.output
    assert SECRET not in result.output


CARELESS_PLUGIN = '''
"""A careless code-distributor plugin: localfs, plus what plugins do wrong with secrets."""
import logging
import threading
import warnings

from nimbus.distribution.hookspecs import hookimpl
from nimbus_ha_localfs.distributor import LocalFileSystemCodeDistributor

log = logging.getLogger("careless_plugin")


class CarelessDistributor(LocalFileSystemCodeDistributor):
    name = "careless"

    @hookimpl
    def prepare(self, conf, context):
        super().prepare(conf, context)
        secret = conf["nimbus.codedistributor.s3.secret.key"]
        user, _, password = conf["storm.zookeeper.auth.payload"].partition(":")
        log.info("prepared with configuration %s", conf)
        try:
            raise PermissionError(f"the store refused key {secret}")
        except PermissionError:
            log.exception("first connection failed")
        warnings.warn(f"deprecated credential {secret}", stacklevel=1)

        def connect():
            raise ConnectionError(f"connect as {user} with password {password} refused")

        threading.Thread(target=connect, name="careless-connect", daemon=True).start()
'''
S3_SECRET = "s3-Secret-Key-8c1f2a"
ZK_PASSWORD = "zk-Pass-77e0d3"
TOPOLOGY_SECRET = "topo-Token-5b9e41"


def test_a_running_nimbus_never_logs_or_serves_its_secrets(zk_server, zk_root, tmp_path,
                                                            monkeypatch):
    """A real nimbus process, a real ZooKeeper with digest auth, a plugin that logs its
    configuration, an error, a warning and a crashing thread holding the secrets: the log
    shows none of them, and getNimbusConf/getTopologyConf over Thrift show them redacted."""
    import yaml
    from required_plugins import require_plugin
    from waiting import wait_for

    from nimbus.dev.cluster import NimbusProcess
    from nimbus.dev.zookeeper import free_port
    from nimbus.distribution.archive import pack_directory
    from nimbus.thrift.client import NimbusClient, connect

    require_plugin("s3")  # declares nimbus.codedistributor.s3.secret.key
    plugin_dir = tmp_path / "plugin"
    plugin_dir.mkdir()
    (plugin_dir / "careless_plugin.py").write_text(CARELESS_PLUGIN)
    monkeypatch.setenv("PYTHONPATH", str(plugin_dir))
    host, _, zk_port = zk_server.hosts.rpartition(":")
    port = free_port()
    conf = {"storm.zookeeper.servers": [host], "storm.zookeeper.port": int(zk_port),
            "storm.zookeeper.root": zk_root, "nimbus.thrift.port": port,
            "nimbus.seeds": [f"127.0.0.1:{port}"], "storm.local.dir": str(tmp_path / "local"),
            "storm.codedistributor.class": "careless_plugin:CarelessDistributor",
            "storm.zookeeper.auth.scheme": "digest",
            "storm.zookeeper.auth.payload": f"nimbus:{ZK_PASSWORD}",
            "nimbus.codedistributor.s3.secret.key": S3_SECRET}
    (tmp_path / "storm.yaml").write_text(yaml.safe_dump(conf))
    nimbus = NimbusProcess(0, port, tmp_path / "local", tmp_path / "storm.yaml",
                           tmp_path / "nimbus.log")
    nimbus.start()
    try:
        wait_for(lambda: "gained leadership" in nimbus.log_text() or not nimbus.alive(), 60,
                 "the nimbus to lead")
        assert nimbus.alive(), nimbus.log_text()
        client_conf = load_cluster_config(overrides={"nimbus.seeds": [f"127.0.0.1:{port}"]})
        topology = tmp_path / "topology"
        topology.mkdir()
        (topology / "topology.yaml").write_text('command: ["sleep", "3600"]\n')
        topology_id = NimbusClient(client_conf).submit(
            "guarded", pack_directory(topology),
            {"topology.auth.token": TOPOLOGY_SECRET, "wordcount.input.dir": "/data/in"})
        with connect(f"127.0.0.1:{port}") as raw:
            nimbus_conf = raw.getNimbusConf()
            topology_conf = raw.getTopologyConf(topology_id)
        # The crashing thread and the warning have reached the log.
        wait_for(lambda: "careless-connect" in nimbus.log_text()
                 and "deprecated credential" in nimbus.log_text(), 30,
                 "the plugin's thread crash and warning in the log")
    finally:
        nimbus.terminate()
    assert nimbus.process.returncode == 0
    served = json.loads(nimbus_conf)
    assert served["nimbus.codedistributor.s3.secret.key"] == REDACTED
    assert served["storm.zookeeper.auth.payload"] == REDACTED
    assert served["storm.zookeeper.auth.scheme"] == "digest"
    assert json.loads(topology_conf)["topology.auth.token"] == REDACTED
    assert json.loads(topology_conf)["wordcount.input.dir"] == "/data/in"
    text = nimbus.log_text()
    for secret in (S3_SECRET, ZK_PASSWORD, TOPOLOGY_SECRET):
        assert secret not in nimbus_conf + topology_conf
        assert secret not in text, f"{secret!r} leaked into the nimbus's log"
    # Each place a secret was put into the log is there, masked.
    configuration = [line for line in text.splitlines()
                     if "configuration, keys that differ from the defaults" in line]
    assert len(configuration) == 1
    logged = json.loads(configuration[0].split("(secrets redacted): ", 1)[1])
    assert logged["nimbus.codedistributor.s3.secret.key"] == REDACTED
    assert logged["storm.zookeeper.auth.payload"] == REDACTED
    assert logged["nimbus.thrift.port"] == port
    assert f"'nimbus.codedistributor.s3.secret.key': '{REDACTED}'" in text  # the plugin's
    assert f"PermissionError: the store refused key {REDACTED}" in text
    assert f"deprecated credential {REDACTED}" in text
    assert "uncaught exception in thread careless-connect" in text
    assert f"ConnectionError: connect as nimbus with password {REDACTED} refused" in text


def test_a_plugin_marks_a_setting_secret_whatever_its_name():
    """A plugin's config_defaults may wrap a default in Secret: the key is redacted."""
    from nimbus.distribution.distributors import CodeDistributor, resolve_distributor_class
    from nimbus.distribution.hookspecs import hookimpl
    from nimbus.redaction import Secret

    class Azure(resolve_distributor_class("localfs")):  # every other hook a real one
        @hookimpl
        def config_defaults(self):
            return {"nimbus.codedistributor.azuretest.sig": Secret(None),
                    "nimbus.codedistributor.azuretest.container": "code"}

    assert not is_secret_key("nimbus.codedistributor.azuretest.sig")
    defaults = CodeDistributor(Azure).config_defaults()
    assert defaults == {"nimbus.codedistributor.azuretest.sig": None,
                        "nimbus.codedistributor.azuretest.container": "code"}
    assert is_secret_key("nimbus.codedistributor.azuretest.sig")
    assert redact({"nimbus.codedistributor.azuretest.sig": "sv=2024&sig=abc"}) == {
        "nimbus.codedistributor.azuretest.sig": REDACTED}


def test_a_tenants_hadoop_credentials_in_its_spark_conf_are_redacted():
    """What getTopologyConf and the UI show of a topology's conf (issue 30: an Azure
    account key passed through topology.spark.conf was shown in clear)."""
    conf = {"topology.spark.conf": {
        "spark.hadoop.fs.azure.account.key.acct.blob.core.windows.net": "azure-key",
        "spark.hadoop.fs.s3a.access.key": "AKIA", "spark.hadoop.fs.s3a.secret.key": "s",
        "spark.hadoop.fs.s3a.session.token": "t", "spark.sql.shuffle.partitions": "2"}}
    assert redact(conf) == {"topology.spark.conf": {
        "spark.hadoop.fs.azure.account.key.acct.blob.core.windows.net": REDACTED,
        "spark.hadoop.fs.s3a.access.key": REDACTED,
        "spark.hadoop.fs.s3a.secret.key": REDACTED,
        "spark.hadoop.fs.s3a.session.token": REDACTED,
        "spark.sql.shuffle.partitions": "2"}}
