"""The package's layers (docs/architecture.md), checked on every import of every module,
imports inside functions included: a module imports from its own package and from the
layers below, never from a layer above or from a sibling package of its own layer, and
no two modules import each other, directly or around a circle.

The crossings that the code still has are listed in KNOWN_CROSSINGS and KNOWN_CIRCLES,
each to be removed (issue 28). A new crossing fails this test, and so does an entry of
those lists that no longer occurs: they only shrink.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "nimbus"

# Bottom to top. The packages of one layer are siblings, which do not import one another,
# except in the two layers of single modules (OPEN_LAYERS).
GROUND = {"nimbus", "config", "redaction", "log_policy", "background_loop", "daemon_base",
          "read_your_writes", "heap_freeze", "gc_pauses",
          "timing", "topology_paths", "cluster_tls", "topology_acl", "cluster_security", "web"}
# Composition roots and entry points: they wire the rest; nothing imports them but one
# another.
ROOTS = {"cli", "daemons", "dev", "top", "scaffold", "plugin_api", "testing",
         "logs"}
LAYERS: list[set[str]] = [
    GROUND,
    {"state", "worker_protocol"},
    # The 0.1 names of the plugin API's modules are aliases of distribution's.
    {"distribution", "distributors", "hookspecs", "local_code", "manifest_store",
     "transfer_meter"},
    {"master", "supervisor", "worker"},
    {"thrift"},   # Storm's service and its client: the UI and the CLI are its clients
    {"ui", "metrics"},
    ROOTS,
]
OPEN_LAYERS = (0, len(LAYERS) - 1)
ALIASES = {"distributors", "hookspecs", "local_code", "manifest_store", "transfer_meter"}

# (importing module, imported module): crossings the code still has (issue 28).
KNOWN_CROSSINGS: set[tuple[str, str]] = set()
# Circles of modules (each as a sorted tuple) the code still has.
KNOWN_CIRCLES: set[tuple[str, ...]] = set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in ROOT.rglob("*.py")}


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the nimbus modules it imports (``from pkg import mod`` counts as
    ``pkg.mod`` when that is a module), wherever the import statement stands."""
    out: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [f"{node.module}.{alias.name}"
                           if f"{node.module}.{alias.name}" in modules else node.module
                           for alias in node.names]
            else:
                continue
            out[name].update(t for t in targets
                             if t.split(".")[0] == "nimbus" and t != name and t in modules)
    return out


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "nimbus"


def _layer(package: str) -> int:
    for index, layer in enumerate(LAYERS):
        if package in layer:
            return index
    raise AssertionError(f"nimbus/{package}: in no layer of tests/test_layers.py (add it, "
                         "and to docs/architecture.md)")


def _allowed(importer: str, imported: str) -> bool:
    source, target = _package(importer), _package(imported)
    if source == target or (source in ALIASES and target == "distribution"):
        return True
    if _layer(target) == _layer(source) and _layer(source) in OPEN_LAYERS:
        return True
    return _layer(target) < _layer(source)


def _crossings() -> set[tuple[str, str]]:
    return {(importer, imported)
            for importer, targets in _imports(_modules()).items()
            for imported in targets if not _allowed(importer, imported)}


def _circles() -> set[tuple[str, ...]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm)."""
    graph = _imports(_modules())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[tuple[str, ...]] = set()

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.add(tuple(sorted(group)))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_package_has_a_layer():
    for module in _modules():
        _layer(_package(module))


def test_no_import_runs_up_or_sideways():
    crossings = _crossings()
    new = sorted(crossings - KNOWN_CROSSINGS)
    assert new == [], (
        "imports against the layers (docs/architecture.md): move the shared name down, "
        f"or wire the two in a composition root: {new}")
    gone = sorted(KNOWN_CROSSINGS - crossings)
    assert gone == [], f"no longer crossings: remove them from KNOWN_CROSSINGS: {gone}"


def test_no_import_circle():
    circles = _circles()
    new = sorted(circles - KNOWN_CIRCLES)
    assert new == [], f"modules that import one another: {new}"
    gone = sorted(KNOWN_CIRCLES - circles)
    assert gone == [], f"no longer circles: remove them from KNOWN_CIRCLES: {gone}"


def test_the_checker_sees_an_upward_import_and_a_circle(tmp_path, monkeypatch):
    """The rules themselves: a state module importing master is a crossing, and two
    modules importing each other (inside a function) are a circle."""
    fake = tmp_path / "nimbus"
    (fake / "state").mkdir(parents=True)
    (fake / "master").mkdir()
    for package in ("", "state", "master"):
        (fake / package / "__init__.py").write_text("")
    (fake / "state" / "low.py").write_text("def f():\n    from nimbus.master import high\n")
    (fake / "master" / "high.py").write_text("from nimbus.state.low import f\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", fake)
    assert _crossings() == {("nimbus.state.low", "nimbus.master.high")}
    assert _circles() == {("nimbus.master.high", "nimbus.state.low")}


def test_the_thrift_client_loads_no_daemon_code():
    """The CLI, the UI and every script connect through nimbus.thrift.client: importing it
    must not load the master's or the supervisor's modules (a third of its import time
    once went to nimbus.master.lifecycle, for one constant)."""
    import subprocess
    import sys

    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, nimbus.thrift.client; print(' '.join(sorted("
         "m for m in sys.modules if m.startswith(('nimbus.master', 'nimbus.supervisor', "
         "'nimbus.daemons')))))"],
        capture_output=True, text=True, check=True, timeout=60).stdout.split()
    assert loaded == []
