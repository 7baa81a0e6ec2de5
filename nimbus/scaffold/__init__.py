"""``nimbus-ha new-plugin``: write a working code-distributor distribution.

The skeleton is a complete backend (code in a directory every nimbus reaches, every copy
verified by sha256 and renamed into place) that passes the kit as generated, so an
author starts from green tests and changes the storage calls (docs/plugins.md).
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,30}$")

# template file -> path in the distribution ({package} is the import package's name).
FILES = {
    "pyproject.toml.tmpl": "pyproject.toml",
    "README.md.tmpl": "README.md",
    "__init__.py.tmpl": "{package}/__init__.py",
    "distributor.py.tmpl": "{package}/distributor.py",
    "test_kit.py.tmpl": "tests/test_{name}.py",
}


class ScaffoldError(ValueError):
    """The plugin name is not usable, or the target directory is not empty."""


def names(name: str) -> dict[str, str]:
    """The placeholders of the templates for plugin ``name``."""
    if not NAME_RE.match(name):
        raise ScaffoldError(
            f"plugin name {name!r}: use lowercase letters and digits, starting with a letter "
            "(it becomes the entry-point name and the key prefix "
            f"nimbus.codedistributor.<name>.), e.g. 'nfs'")
    camel = name.capitalize()
    return {"__NAME__": name, "__DIST__": f"nimbus-ha-{name}",
            "__PACKAGE__": f"nimbus_ha_{name}", "__CLASS__": f"{camel}CodeDistributor",
            "__CAMEL__": camel}


def new_plugin(name: str, target: Path) -> list[Path]:
    """Write the distribution of plugin ``name`` into ``target`` (created; must be empty
    if it exists); return the files written."""
    values = names(name)
    target = Path(target)
    if target.exists() and any(target.iterdir()):
        raise ScaffoldError(f"{target} exists and is not empty: choose another --dir")
    written = []
    templates = resources.files("nimbus.scaffold")
    for template, relative in FILES.items():
        text = templates.joinpath(template).read_text(encoding="utf-8")
        for placeholder, value in values.items():
            text = text.replace(placeholder, value)
        path = target / relative.format(package=values["__PACKAGE__"], name=name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
