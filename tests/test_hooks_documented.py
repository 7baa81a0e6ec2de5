"""The hook surface stays small, documented in one place and covered by the suite."""

import inspect
import re
from pathlib import Path

from nimbus.distribution import hookspecs
from nimbus.testing import conformance

DOC = Path(__file__).resolve().parents[1] / "docs" / "hooks.md"


def test_every_hook_is_documented():
    documented = set(re.findall(r"^## `(\w+)\(", DOC.read_text(), re.M))
    assert documented == set(hookspecs.ALL_HOOKS)


def test_hook_list_matches_specifications():
    specs = {name for name, obj in vars(hookspecs).items()
             if inspect.isfunction(obj) and hasattr(obj, "nimbus_ha_spec")}
    assert specs == set(hookspecs.ALL_HOOKS)


def test_every_distributor_hook_is_exercised_by_the_conformance_suite():
    source = inspect.getsource(conformance)
    for hook in hookspecs.DISTRIBUTOR_HOOKS:
        if hook in ("prepare", "close"):
            continue  # called by every plugin's `hosts` fixture
        assert f".{hook}(" in source, hook


def test_plugins_written_for_0_1_import_the_same_modules():
    """The plugin API moved under nimbus.distribution; the old names are the same modules,
    so a 0.1 plugin's ``@nimbus.hookspecs.hookimpl`` still marks hooks the core reads."""
    import importlib

    for name in ("hookspecs", "distributors", "local_code", "manifest_store", "transfer_meter"):
        old = importlib.import_module(f"nimbus.{name}")
        assert old is importlib.import_module(f"nimbus.distribution.{name}")
