"""The README's first command, run as a newcomer runs it: a fresh clone, then
``scripts/demo.sh`` with no arguments, from the clone's root.

It covers everything the demo touches: the set-up script (a new ``.venv`` in the clone),
the default relative ``dev-cluster`` directory, the sample topology, the nimbus failover
and the word-count pipeline's move to another supervisor. The clone is made from this
checkout's HEAD, so uncommitted changes are not tested here (CI runs on a clean clone).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[1]
EXACTLY_ONCE = "0 lost, 0 duplicated - every record exactly once"


@pytest.mark.timeout(900)
def test_the_readme_demo_passes_on_a_fresh_clone(tmp_path):
    if not (REPO / ".git").exists():
        pytest.skip(f"{REPO} is not a git checkout: there is nothing to clone")
    if shutil.which("git") is None:
        pytest.fail("git is not installed: scripts/setup.sh's machine needs it to clone")
    clone = tmp_path / "nimbus-ha"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True,
                   timeout=120)
    # No arguments, from the clone's root: exactly the README's command.
    done = subprocess.run(["scripts/demo.sh"], cwd=clone, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=840)
    lines = done.stdout.rstrip().splitlines()
    assert done.returncode == 0, "\n".join(lines[-60:])
    assert lines[-1].startswith("output: 1000 records fed, 1000 committed, "), lines[-1]
    assert lines[-1].endswith(EXACTLY_ONCE), lines[-1]
    # The default directory is the clone's own dev-cluster, made absolute.
    assert (clone / "dev-cluster" / "wordcount-out").is_dir()
    assert f"under {clone / 'dev-cluster'} ..." in done.stdout
