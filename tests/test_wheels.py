"""What `pip install nimbus-ha-<backend>` will mean once published: wheels of the core and
of every plugin, installed into a fresh venv, work from there.

The wheels are built without build isolation and installed with ``--no-deps`` so that
nothing is downloaded; the fresh venv reaches the third-party packages (kazoo, pyspark,
...) of the venv running this test through a ``.pth`` file, but nimbus-ha itself and the
plugins are imported from the wheels' copies, which the test checks.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DISTRIBUTIONS = {
    "nimbus-ha": (REPO, "nimbus"),
    **{f"nimbus-ha-{name}": (REPO / "plugins" / f"nimbus-ha-{name}", f"nimbus_ha_{name}")
       for name in ("localfs", "s3", "hdfs", "torrent", "shareddir")},
}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("wheels")
    wheels = work / "wheels"
    for name, (source, package) in DISTRIBUTIONS.items():
        # Built from a copy: an in-tree build would leave build/ directories in the
        # checkout, whose stale files a later wheel could pick up.
        copy = work / "src" / name
        skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
        copy.mkdir(parents=True)
        for item in ("pyproject.toml", "README.md", package):
            if (source / item).is_dir():
                shutil.copytree(source / item, copy / item, ignore=skip)
            elif (source / item).exists():
                shutil.copy2(source / item, copy / item)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "-w", str(wheels), str(copy)],
                       check=True, timeout=300, cwd=work)
    built = sorted(p.name.split("-")[0] for p in wheels.glob("*.whl"))
    assert built == sorted(n.replace("-", "_") for n in DISTRIBUTIONS), built
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site_dir = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip()
    # Third-party packages from this venv, after the fresh venv's own site-packages.
    ours = sysconfig.get_paths()["purelib"]
    Path(site_dir, "zz-outer-packages.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    *map(str, sorted(wheels.glob("*.whl")))], check=True, timeout=300)
    return venv


def test_every_wheel_is_imported_from_the_fresh_venv(fresh_venv):
    python = fresh_venv / "bin" / "python"
    modules = [module for _, module in DISTRIBUTIONS.values()]
    out = subprocess.run([str(python), "-c", (
        "import importlib, sys\n"
        f"for m in {modules!r}:\n"
        "    print(importlib.import_module(m).__file__)\n")],
        check=True, capture_output=True, text=True, timeout=120,
        cwd=fresh_venv).stdout.split()  # not the repo: its nimbus/ would be on sys.path
    assert len(out) == len(modules)
    assert all(path.startswith(str(fresh_venv)) for path in out), out


def test_the_cli_runs_and_finds_every_plugin_from_the_wheels(fresh_venv):
    cli = fresh_venv / "bin" / "nimbus-ha"
    help_text = subprocess.run([str(cli), "--help"], check=True, capture_output=True,
                               text=True, timeout=120, cwd=fresh_venv).stdout
    assert "supervisor" in help_text and "submit" in help_text
    found = subprocess.run([str(fresh_venv / "bin" / "python"), "-c", (
        "from nimbus.distribution.distributors import installed_distributors\n"
        "print(' '.join(sorted(installed_distributors())))")],
        check=True, capture_output=True, text=True, timeout=120, cwd=fresh_venv).stdout.split()
    assert {"localfs", "s3", "hdfs", "torrent", "shareddir"} <= set(found)
    # Package data made it into the wheel: the defaults and the IDL load.
    subprocess.run([str(cli), "cluster-info", "--help"], check=True, capture_output=True,
                   timeout=120, cwd=fresh_venv)


def test_a_plugin_passes_its_kit_from_the_wheels(fresh_venv, tmp_path):
    """The shareddir plugin's own tests, run by the fresh venv's pytest against the
    installed wheels (the kit is the core wheel's pytest11 plugin)."""
    result = subprocess.run(
        [str(fresh_venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-m", "not slow", str(REPO / "plugins" / "nimbus-ha-shareddir" / "tests")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert " passed" in result.stdout.splitlines()[-1]
