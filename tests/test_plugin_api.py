"""The plugin API is one module, documented name by name, and the docs name only code and
files that exist (issue 30: the README and the docs disagreed on names and paths)."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nimbus import plugin_api
from nimbus.config import load_config

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CODE_NAME = re.compile(r"`(nimbus(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_]\w*)?)(?:\(\))?`")
FILE_PATH = re.compile(r"(?<![\w/.-])((?:nimbus|tests|integration|plugins|docs|scripts|conf|"
                       r"testsupport|examples)/[\w/.-]*\w)")
# Files the tutorial's own plugin has, not this repository (docs/plugins.md, scaffold).
TUTORIAL_FILES = {"tests/test_nfs.py"}


def _resolves(name: str) -> bool:
    module, _, attr = name.partition(":")
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in [*parts[i:], *([attr] if attr else [])]:
            if not hasattr(obj, part):
                return False
            obj = getattr(obj, part)
        return True
    return False


def _is_code(name: str, keys: set[str]) -> bool:
    """A dotted name in backticks is code when it is not a configuration key (built in,
    a plugin's, or a Storm key the docs mention) and names a module of the package."""
    if name in keys or name.startswith("nimbus.codedistributor."):
        return False
    if any(key.startswith(name + ".") for key in keys):
        return False
    second = name.split(".")[1].split(":")[0]
    try:
        importlib.import_module(f"nimbus.{second}")
    except ImportError:
        return False   # nimbus.impersonation.acl and the like: Storm keys, not code
    return True


def test_every_code_name_in_the_docs_exists():
    keys = set(load_config(overrides={}).keys())
    missing = [(page.name, name) for page in PAGES
               for name in CODE_NAME.findall(page.read_text())
               if _is_code(name, keys) and not _resolves(name)]
    assert missing == []


def test_every_file_the_docs_name_exists():
    missing = sorted({(page.name, path) for page in PAGES
                      for path in FILE_PATH.findall(page.read_text())
                      if path not in TUTORIAL_FILES and not (ROOT / path).exists()})
    assert missing == []


def test_every_public_name_is_documented():
    section = (ROOT / "docs" / "plugins.md").read_text().split("## The plugin API", 1)[1]
    section = section.split("\n## ", 1)[0]
    undocumented = [name for name in plugin_api.__all__ if f"`{name}" not in section]
    assert undocumented == []
    for name in plugin_api.__all__:
        assert getattr(plugin_api, name) is not None


def test_the_plugin_api_does_not_import_pytest():
    code = "import sys, nimbus.plugin_api; print('pytest' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "False"


def test_path_helpers_raise_distributor_errors():
    with pytest.raises(plugin_api.DistributorError, match="not a valid topology id"):
        plugin_api.check_topology_id("../etc")
    with pytest.raises(ValueError):  # and still ValueError, as in 0.1
        plugin_api.safe_join(Path("/tmp"), "../x")
