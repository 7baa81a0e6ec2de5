"""What of its supervisor's environment a worker gets (nimbus/supervisor/worker_env.py);
tests/test_supervisor.py checks a real worker's /proc/<pid>/environ."""

from __future__ import annotations

import pytest

from nimbus.config import Config, load_config
from nimbus.supervisor.worker_env import is_secret_variable, worker_env


@pytest.mark.parametrize("name", [
    "AWS_SECRET_ACCESS_KEY", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_STORAGE_SAS_TOKEN", "GITHUB_TOKEN", "PGPASSWORD", "DB_PASSWD", "OPENAI_API_KEY",
    "MY_APIKEY", "SSH_PRIVATE_KEY", "AWS_SESSION_KEY", "GOOGLE_APPLICATION_CREDENTIALS",
    "GPG_PASSPHRASE", "CLIENT_SECRET", "HDFS_KEYFILE"])
def test_credential_names_are_kept_from_workers(name):
    assert is_secret_variable(name)
    assert name not in worker_env(load_config(overrides={}), {name: "x", "HOME": "/root"})


@pytest.mark.parametrize("name", ["HOME", "PATH", "LANG", "JAVA_HOME", "SPARK_HOME",
                                  "KEYBOARD_LAYOUT", "MONKEY_ISLAND", "TOKENIZERS_PARALLELISM"])
def test_ordinary_names_reach_workers(name):
    assert not is_secret_variable(name), name
    assert worker_env(load_config(overrides={}), {name: "x"})[name] == "x"


def test_a_variable_a_secret_setting_reads_is_kept_whatever_its_name():
    conf = Config(load_config(overrides={}).as_dict(), indirect={
        "storm.zookeeper.auth.payload": ("storm.zookeeper.auth.payload.env", "ZK_LOGIN")})
    env = worker_env(conf, {"ZK_LOGIN": "ops:hunter2", "OTHER": "kept"})
    assert "ZK_LOGIN" not in env and env["OTHER"] == "kept"


def test_the_package_stays_importable():
    env = worker_env(load_config(overrides={}), {"PYTHONPATH": "/opt/lib"})
    assert env["PYTHONPATH"].split(":")[-1] == "/opt/lib"
    assert len(env["PYTHONPATH"].split(":")) == 2
