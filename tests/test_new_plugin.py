"""`nimbus-ha new-plugin NAME` writes a distribution that installs and passes the kit."""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from click.testing import CliRunner

from nimbus.cli import main


def test_the_skeleton_has_the_entry_point_and_a_settings_table_of_every_key(tmp_path):
    target = tmp_path / "nimbus-ha-nfs"
    result = CliRunner().invoke(main, ["new-plugin", "nfs", "--dir", str(target)])
    assert result.exit_code == 0, result.output
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*")
                  if p.is_file()) == ["README.md", "nimbus_ha_nfs/__init__.py",
                                      "nimbus_ha_nfs/distributor.py", "pyproject.toml",
                                      "tests/test_nfs.py"]
    pyproject = (target / "pyproject.toml").read_text()
    assert '\nname = "nimbus-ha-nfs"\n' in pyproject
    assert ('[project.entry-points."nimbus_ha.codedistributor"]\n'
            'nfs = "nimbus_ha_nfs:NfsCodeDistributor"\n') in pyproject
    # The README documents exactly the keys config_defaults declares.
    source = (target / "nimbus_ha_nfs" / "distributor.py").read_text()
    declared = set(re.findall(r'PREFIX \+ "([a-z.]+)"', source.split("def prepare")[0]))
    documented = set(re.findall(r"^\| `([a-z.]+)` \|", (target / "README.md").read_text(),
                                re.M))
    assert declared == documented == {"path", "replication.count", "fsync"}


@pytest.mark.parametrize("name, message", [
    ("My-Store", "Error: plugin name 'My-Store': use lowercase letters and digits, starting "
                 "with a letter (it becomes the entry-point name and the key prefix "
                 "nimbus.codedistributor.<name>.), e.g. 'nfs'"),
    ("nfs", "Error: {target} exists and is not empty: choose another --dir"),
])
def test_refusals_are_one_error_line(tmp_path, name, message):
    target = tmp_path / "taken"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    result = CliRunner().invoke(main, ["new-plugin", name, "--dir", str(target)])
    assert result.exit_code == 1
    assert result.output.splitlines() == [message.format(target=target)]
    assert [p.name for p in target.iterdir()] == ["keep.txt"]


@pytest.mark.slow
def test_the_skeleton_installs_into_a_fresh_venv_and_passes_the_kit(tmp_path):
    """The author's path: generate, `pip install -e`, run pytest, with nothing downloaded.

    The fresh venv sees the packages of the one running this test (nimbus-ha, pytest,
    kazoo, setuptools) through a .pth file: `--system-site-packages` alone would show
    the base interpreter's packages, not this venv's."""
    target = tmp_path / "nimbus-ha-nfs"
    subprocess.run([sys.executable, "-m", "nimbus.cli", "new-plugin", "nfs", "--dir",
                    str(target)], check=True, capture_output=True, timeout=60)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=120)
    python = venv / "bin" / "python"
    site_dir = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                               "['purelib'])"], check=True, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]
    Path(site_dir, "nimbus-ha-outer.pth").write_text(
        f"import site; site.addsitedir({ours!r})\n")
    install = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
         "--no-build-isolation", "-e", str(target)],
        capture_output=True, text=True, timeout=180)
    assert install.returncode == 0, install.stdout + install.stderr
    located = subprocess.run([python, "-c", "import nimbus_ha_nfs; print(nimbus_ha_nfs.__file__)"],
                             capture_output=True, text=True, timeout=30)
    assert located.stdout.strip() == str(target / "nimbus_ha_nfs" / "__init__.py")
    tests = subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=target, capture_output=True, text=True, timeout=240)
    assert tests.returncode == 0, tests.stdout[-4000:] + tests.stderr[-2000:]
    last = tests.stdout.splitlines()[-1]
    assert last.startswith("21 passed in") and "skipped" not in last, tests.stdout[-2000:]
