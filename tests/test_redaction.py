"""Secrets never leave the process: getNimbusConf, topology conf, CLI errors and logs."""

from __future__ import annotations

import json
import logging

import pytest
from click.testing import CliRunner

from nimbus.cli import main
from nimbus.config import ConfigError, load_config
from nimbus.redaction import REDACTED, SecretLogFilter, is_secret_key, redact, secret_values

SECRET = "s3cr3t-Value-42"


@pytest.mark.parametrize("key", [
    "nimbus.codedistributor.s3.secret.key", "storm.zookeeper.auth.payload",
    "storm.zookeeper.topology.auth.payload", "ui.http.creds.plugin.password",
    "topology.auth.token", "nimbus.some_secret", "java.keystore.password"])
def test_secret_keys(key):
    assert is_secret_key(key)


@pytest.mark.parametrize("key", [
    "nimbus.codedistributor.s3.access.key", "storm.zookeeper.servers", "nimbus.seeds",
    "topology.workers", "storm.zookeeper.auth.scheme"])
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


def test_get_nimbus_conf_redacts_the_s3_secret():
    from nimbus.thrift.handler import NimbusHandler

    conf = load_config(overrides={"nimbus.codedistributor.s3.secret.key": SECRET})
    handler = NimbusHandler.__new__(NimbusHandler)
    handler.conf = conf
    text = handler.getNimbusConf()
    assert SECRET not in text
    assert json.loads(text)["nimbus.codedistributor.s3.secret.key"] == REDACTED


def test_type_error_in_config_does_not_echo_the_secret():
    with pytest.raises(ConfigError) as err:
        load_config(overrides={"nimbus.codedistributor.s3.secret.key": [SECRET]})
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
