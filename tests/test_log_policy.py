"""Logs: other libraries at WARNING unless nimbus.log.levels says otherwise, JSON lines on
request, secrets masked in both (nimbus.log_policy)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from nimbus.log_policy import JsonLines, LibraryLevels, apply


def record(name: str, level: int, msg: str = "m") -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, None, None)


def test_libraries_are_kept_to_warnings_and_ours_pass():
    levels = LibraryLevels()
    assert not levels.filter(record("azure.core.pipeline", logging.INFO))
    assert levels.filter(record("azure.core.pipeline", logging.WARNING))
    assert not levels.filter(record("urllib3.connectionpool", logging.DEBUG))
    assert levels.filter(record("nimbus.supervisor.daemon", logging.INFO))
    assert levels.filter(record("nimbus_ha_s3.distributor", logging.INFO))


def test_configured_levels_win_the_most_specific_first():
    levels = LibraryLevels()
    levels.levels = {"azure": logging.INFO, "azure.core.pipeline": logging.ERROR,
                     "nimbus.master": logging.WARNING}
    assert levels.filter(record("azure.storage.blob", logging.INFO))
    assert not levels.filter(record("azure.core.pipeline.policies", logging.WARNING))
    assert not levels.filter(record("nimbus.master.daemon", logging.INFO))
    assert not levels.filter(record("azurefoo", logging.INFO)), "a prefix is a name, whole"


def test_json_lines():
    line = JsonLines().format(record("nimbus.x", logging.WARNING, "hello"))
    entry = json.loads(line)
    assert entry["level"] == "WARNING" and entry["logger"] == "nimbus.x"
    assert entry["message"] == "hello" and entry["time"].endswith("+00:00")


def test_a_bad_level_or_format_is_named():
    with pytest.raises(ValueError, match="'LOUD' .* is not a level"):
        apply({"azure": "LOUD"}, "text")
    with pytest.raises(ValueError, match="must be text or json"):
        apply({}, "xml")


def test_a_command_logs_json_with_secrets_masked(tmp_path):
    """A real command: its log lines are JSON, and a secret from the configuration is
    masked in them as in text."""
    code = (
        "import logging, sys\n"
        "from nimbus.cli import main\n"
        "@main.command('say')\n"
        "def say():\n"
        "    from nimbus.cli import _conf\n"
        "    _conf(None, ('nimbus.log.format=json', 'storm.zookeeper.auth.payload=u:SECRET'))\n"
        "    logging.getLogger('nimbus.t').warning('payload is u:SECRET')\n"
        "    logging.getLogger('azure.core').info('request sent')\n"
        "main(['say'], standalone_mode=False)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    lines = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    assert [(e["logger"], e["message"]) for e in lines] == [
        ("nimbus.t", "payload is ********")], result.stderr


def test_the_distributor_in_use_logs_like_our_own():
    from nimbus.log_policy import treat_as_own

    levels = LibraryLevels()
    assert not levels.filter(record("acme_store.client", logging.INFO))
    treat_as_own("acme_store.distributor")
    assert levels.filter(record("acme_store.client", logging.INFO))
