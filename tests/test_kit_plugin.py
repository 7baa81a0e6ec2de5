"""The kit is a pytest plugin (entry point ``pytest11``) that coexists with the
``pytest_plugins = ["nimbus.testing.zookeeper"]`` lines of existing conftests and tests;
its check of credential-looking settings fails a plugin that leaves one unmarked."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from nimbus.plugin_api import ManifestStoreDistributor, Secret, hookimpl
from nimbus.testing.kit import STORE, DistributorKit, looks_like_credential


def test_the_entry_point_names_the_kit():
    [ep] = [ep for ep in entry_points(group="pytest11") if ep.name == "nimbus_ha"]
    assert ep.value == "nimbus.testing.pytest_plugin"
    assert ep.load().pytest_plugins == ["nimbus.testing.zookeeper", "nimbus.testing.kit"]


PROJECT_TEST = '''
pytest_plugins = ["nimbus.testing.kit"]


def test_fixtures_of_the_kit(zk_root, distributor_hosts):
    assert zk_root.startswith("/test-")
    assert callable(distributor_hosts)
'''


@pytest.mark.parametrize("options", [[], ["-p", "no:nimbus_ha"]])
def test_listing_the_kits_modules_again_is_no_clash(tmp_path: Path, options: list[str]):
    """Registered by the entry point and listed again by a conftest and a test module
    (as 0.1 plugins' tests do): pytest skips the second registration instead of refusing
    it. With the entry point disabled, the conftest's line loads them."""
    (tmp_path / "conftest.py").write_text(
        'pytest_plugins = ["nimbus.testing.zookeeper", "nimbus.testing.kit"]\n')
    (tmp_path / "test_project.py").write_text(PROJECT_TEST)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *options,
         str(tmp_path)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1].startswith("1 passed")


def test_a_kit_without_a_distributor_fails_clearly(tmp_path: Path):
    (tmp_path / "test_unnamed.py").write_text(
        "from nimbus.testing.kit import PER_HOST, DistributorKit\n\n\n"
        "class TestUnnamed(DistributorKit):\n    replication_model = PER_HOST\n")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k",
         "implements_every_hook", str(tmp_path)], cwd=tmp_path, capture_output=True,
        text=True, timeout=120)
    assert result.returncode == 1
    assert ("TestUnnamed must set distributor = the entry-point name of the code "
            "distributor under test") in result.stdout


# -- test_credential_looking_settings_are_secret -------------------------------------------
LEAKY_PLUGIN = '''
from nimbus.plugin_api import ManifestStoreDistributor, Secret, hookimpl

PREFIX = "nimbus.codedistributor.leaky."


class LeakyCodeDistributor(ManifestStoreDistributor):
    name = "leaky"
    PREFIX = PREFIX

    @hookimpl
    def config_defaults(self):
        return {PREFIX + "endpoint": "", PREFIX + "key.prefix": "code",
                PREFIX + "auth.header": "", PREFIX + "tls.key.file": "",
                PREFIX + "share.sig": Secret(None), PREFIX + "password": ""}
'''

LEAKY_TEST = '''
from nimbus.testing.kit import STORE, DistributorKit


class TestLeaky(DistributorKit):
    distributor = "plugin_leaky:LeakyCodeDistributor"
    replication_model = STORE
    store_replication = 1
'''


def test_the_kit_fails_a_plugin_whose_credential_looking_settings_are_not_secret(
        tmp_path: Path):
    """Run through pytest, as a plugin's suite runs: the kit's test fails, lists exactly
    the unmarked keys (not the Secret one, not the one redaction masks by name, not
    ``key.prefix``) and says what to do."""
    (tmp_path / "plugin_leaky.py").write_text(LEAKY_PLUGIN)
    (tmp_path / "test_leaky.py").write_text(LEAKY_TEST)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k",
         "credential_looking_settings_are_secret", str(tmp_path)], cwd=tmp_path,
        capture_output=True, text=True, timeout=120)
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert out.strip().splitlines()[-1].startswith("1 failed"), out
    prefix = "nimbus.codedistributor.leaky."
    assert (f"look like credentials but are not marked secret, so their values would be "
            f"shown by getNimbusConf, the CLI and the logs: {prefix}auth.header, "
            f"{prefix}tls.key.file. In config_defaults, wrap each default in Secret(...) "
            f"(from nimbus.plugin_api import Secret), e.g. '{prefix}auth.header': "
            f"Secret('')") in " ".join(out.split()), out
    assert f"TestLeaky.not_secret = ('{prefix}auth.header',)" in out


DECLARED: dict = {}


class DeclaringDistributor(ManifestStoreDistributor):
    """A store plugin that declares whatever :data:`DECLARED` holds."""

    name = "declaring"
    PREFIX = "nimbus.codedistributor.declaring."

    @hookimpl
    def config_defaults(self) -> dict:
        return dict(DECLARED)


def _secret_check(monkeypatch, declared: dict, not_secret: tuple = ()) -> None:
    """Run the kit's test_credential_looking_settings_are_secret on DECLARED settings."""
    monkeypatch.setattr(sys.modules[__name__], "DECLARED", declared)

    class Declaring(DistributorKit):
        distributor = f"{__name__}:DeclaringDistributor"
        replication_model = STORE
        store_replication = 1

    Declaring.not_secret = not_secret
    Declaring().test_credential_looking_settings_are_secret()


P = "nimbus.codedistributor.declaring."


@pytest.mark.parametrize("declared, not_secret", [
    ({P + "api.token": Secret("")}, ()),              # marked
    ({P + "admin.password": "", P + "secret.key": "", P + "account.key.acct": None,
      P + "tls.keyfile.path": "", P + "connection.string": ""}, ()),  # masked by name
    ({P + "auth.enabled": False, P + "sig.ttl.secs": 60}, ()),        # no credential type
    ({P + "key.prefix": "code", P + "region": "", P + "tls.cert.file": ""}, ()),  # no look
    ({P + "signature.version": "v4"}, (P + "signature.version",)),   # not_secret
], ids=["Secret", "by-name", "bool-and-number", "not-credential-looking", "not_secret"])
def test_the_secret_check_passes(monkeypatch, declared, not_secret):
    _secret_check(monkeypatch, declared, not_secret)


@pytest.mark.parametrize("declared, not_secret, named", [
    ({P + "client.key": ""}, (), P + "client.key"),
    ({P + "tls.key.pem": None}, (), P + "tls.key.pem"),
    ({P + "auth.header": "", P + "region": ""}, (), P + "auth.header"),
    ({P + "private.bucket.url": ""}, (), P + "private.bucket.url"),
    ({P + "region": ""}, (P + "regoin",), P + "regoin"),   # a stale or misspelt escape
], ids=["key", "key-file", "auth", "private", "undeclared-not_secret"])
def test_the_secret_check_fails(monkeypatch, declared, not_secret, named):
    with pytest.raises(pytest.fail.Exception) as err:
        _secret_check(monkeypatch, declared, not_secret)
    assert named in str(err.value)


@pytest.mark.parametrize("key, looks", [
    ("x.s3.access.key", True), ("x.s3.secret.key", True), ("x.passwd", True),
    ("x.oauth.bearer", True), ("x.azure.sas", True), ("x.share.sig", True),
    ("x.tls.keyfile.path", True), ("x.tls.key.file", True), ("x.client.key.pem", True),
    ("x.encryption.key", True), ("x.db.connection.string", True),
    ("x.account.key.acct.blob", True), ("x.key.prefix", False), ("x.key.format", False),
    ("x.tls.cert.file", False), ("x.kerberos.ticket.cache", False), ("x.path", False),
    ("x.keyspace", False), ("x.monkey", False)])
def test_looks_like_credential(key, looks):
    assert looks_like_credential(key) is looks
