"""The kit is a pytest plugin (entry point ``pytest11``) that coexists with the
``pytest_plugins = ["nimbus.testing.zookeeper"]`` lines of existing conftests and tests."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest


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
