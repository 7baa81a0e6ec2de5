"""Requiring a code-distributor plugin in tests: a missing plugin fails, it never vanishes.

``pytest.importorskip`` turns "the s3 plugin is not installed" into a skip, so a CI run
without it passes with a whole backend untested. :func:`require_plugin` fails instead,
naming what to install; a developer who means to run without some plugins sets
``NIMBUS_HA_ALLOW_MISSING_PLUGINS=1`` and the tests that need them are skipped.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from types import ModuleType

import pytest

from nimbus.distribution.distributors import KNOWN_DISTRIBUTIONS, installed_distributors

ALLOW_MISSING_ENV = "NIMBUS_HA_ALLOW_MISSING_PLUGINS"


def missing_plugins_allowed(environ: Mapping[str, str] | None = None) -> bool:
    """True if ``NIMBUS_HA_ALLOW_MISSING_PLUGINS`` is set to 1/true/yes."""
    value = (os.environ if environ is None else environ).get(ALLOW_MISSING_ENV, "")
    return value.strip().lower() in ("1", "true", "yes")


def require_plugin(name: str, environ: Mapping[str, str] | None = None) -> ModuleType:
    """Import the plugin of backend ``name`` (``s3``, ``torrent``...) and return it.

    If it cannot be imported, or does not register its entry point, the calling test
    fails with the ``pip install`` that fixes it, or is skipped when
    :data:`ALLOW_MISSING_ENV` is set.
    """
    distribution = KNOWN_DISTRIBUTIONS[name]
    module_name = distribution.replace("-", "_")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        problem = f"cannot import {module_name} ({type(exc).__name__}: {exc})"
    else:
        if name in installed_distributors():
            return module
        problem = f"{module_name} imports but registers no {name!r} code distributor"
    message = (f"{distribution} is required: {problem}; "
               f"pip install -e plugins/{distribution} (or pip install {distribution})")
    if missing_plugins_allowed(environ):
        pytest.skip(f"{message} [skipped: {ALLOW_MISSING_ENV} is set]")
    pytest.fail(f"{message}, or set {ALLOW_MISSING_ENV}=1 to skip the tests that need it",
                pytrace=False)
