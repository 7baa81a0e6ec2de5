"""A test that needs a missing plugin fails with what to install (skipped only on request)."""

import sys

import pytest
from required_plugins import ALLOW_MISSING_ENV, missing_plugins_allowed, require_plugin


@pytest.fixture
def s3_missing(monkeypatch):
    monkeypatch.delenv(ALLOW_MISSING_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "nimbus_ha_s3", None)  # import raises ImportError


def test_installed_plugin_is_returned():
    assert require_plugin("localfs").__name__ == "nimbus_ha_localfs"


def test_missing_plugin_fails_naming_the_distribution(s3_missing):
    with pytest.raises(pytest.fail.Exception) as err:
        require_plugin("s3")
    message = str(err.value)
    assert "nimbus-ha-s3 is required: cannot import nimbus_ha_s3" in message
    assert "pip install -e plugins/nimbus-ha-s3" in message
    assert f"set {ALLOW_MISSING_ENV}=1 to skip" in message


def test_missing_plugin_is_skipped_only_when_allowed(s3_missing, monkeypatch):
    monkeypatch.setenv(ALLOW_MISSING_ENV, "1")
    with pytest.raises(pytest.skip.Exception, match="pip install -e plugins/nimbus-ha-s3"):
        require_plugin("s3")


def test_plugin_without_its_entry_point_fails(monkeypatch):
    import required_plugins as plugins

    monkeypatch.delenv(ALLOW_MISSING_ENV, raising=False)
    monkeypatch.setattr(plugins, "installed_distributors", lambda: {})
    with pytest.raises(pytest.fail.Exception, match="registers no 'localfs' code distributor"):
        require_plugin("localfs")


@pytest.mark.parametrize("value, allowed", [
    ("1", True), ("true", True), ("YES", True), ("0", False), ("", False), ("no", False)])
def test_opt_out_values(value, allowed):
    assert missing_plugins_allowed({ALLOW_MISSING_ENV: value}) is allowed
    assert missing_plugins_allowed({}) is False
