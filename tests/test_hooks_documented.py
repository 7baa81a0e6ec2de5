"""The hook surface stays small, documented in one place and covered by the suite.

docs/hooks.md (the contract) and docs/plugins.md (the reference) must name every hook
with exactly its specification's arguments; plugins.md also with their types."""

import inspect
import re
from pathlib import Path

import pytest

from nimbus.distribution import hookspecs
from nimbus.testing import conformance

DOCS = Path(__file__).resolve().parents[1] / "docs"
DOC = DOCS / "hooks.md"
REFERENCE = DOCS / "plugins.md"


def spec_signature(hook: str) -> str:
    """``name(arg: Type, ...) -> Return`` as written in the specification's annotations."""
    sig = inspect.signature(getattr(hookspecs, hook))
    args = ", ".join(f"{name}: {p.annotation}" for name, p in sig.parameters.items())
    return f"{hook}({args}) -> {sig.return_annotation}"


def test_every_hook_is_documented():
    documented = set(re.findall(r"^## `(\w+)\(", DOC.read_text(), re.M))
    assert documented == set(hookspecs.ALL_HOOKS)


def test_hooks_md_names_each_hooks_arguments_exactly():
    documented = dict(re.findall(r"^## `(\w+)\(([^)]*)\)`", DOC.read_text(), re.M))
    for hook in hookspecs.ALL_HOOKS:
        spec = list(inspect.signature(getattr(hookspecs, hook)).parameters)
        assert [a.strip() for a in documented[hook].split(",") if a.strip()] == spec, hook


def test_the_reference_gives_every_hooks_exact_signature():
    documented = re.findall(r"^### `(\w+\(.*\) -> .+)`$", REFERENCE.read_text(), re.M)
    assert sorted(documented) == sorted(spec_signature(hook) for hook in hookspecs.ALL_HOOKS)


@pytest.mark.parametrize("hook", hookspecs.ALL_HOOKS)
def test_the_reference_says_whether_each_hook_is_optional(hook):
    text = REFERENCE.read_text()
    section = text.split(f"### `{hook}(", 1)[1].split("\n### ", 1)[0]
    optional = hook == "config_defaults" or hook in hookspecs.OPTIONAL_HOOKS
    first = section.split("\n", 2)[1]
    assert first.startswith("Optional" if optional else "Required"), (hook, first)


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
