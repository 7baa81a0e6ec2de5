"""The environment a worker starts with: its supervisor's, without the supervisor's
credentials (a worker runs tenant code).

A variable is kept from workers when its name says it holds a credential, by the same
words and phrases that make a configuration key secret (:func:`nimbus.redaction.
is_secret_key`: ``AZURE_STORAGE_ACCOUNT_KEY``, ``*_CONNECTION_STRING``, ``*_SAS_TOKEN``
as well as ``AWS_SECRET_ACCESS_KEY`` and ``*_PASSWORD``), or when a secret setting of
the supervisor's configuration reads its value from it (``<key>.env: VARIABLE``),
whatever the variable is called.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

import nimbus
from nimbus.config import Config
from nimbus.redaction import is_secret_key

# Credential names that the key rule does not cover, spelled as variables are.
_SECRET_VARIABLE = re.compile(r"(API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|SESSION_?KEY|SECRET)",
                              re.IGNORECASE)


def is_secret_variable(name: str) -> bool:
    """True when an environment variable's name says it holds a credential."""
    return is_secret_key(name) or _SECRET_VARIABLE.search(name) is not None


def referenced_variables(conf: Config) -> set[str]:
    """The variables secret settings of ``conf`` read their values from."""
    return {reference for reference_key, reference in conf.indirect.values()
            if reference_key.endswith(".env")}


def worker_env(conf: Config, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default: this process's) without credentials (see the module doc),
    with this nimbus package importable by the worker, which runs in its own directory,
    even when it is not installed."""
    source = os.environ if environ is None else environ
    dropped = referenced_variables(conf)
    env = {name: value for name, value in source.items()
           if name not in dropped and not is_secret_variable(name)}
    source_root = str(Path(nimbus.__file__).resolve().parent.parent)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if source_root not in paths:
        env["PYTHONPATH"] = os.pathsep.join([source_root, *paths])
    return env
