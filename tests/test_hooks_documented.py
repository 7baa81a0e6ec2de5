"""The hook surface stays small, documented in one place and covered by the suite."""

import inspect
import re
from pathlib import Path

from nimbus import hookspecs
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
