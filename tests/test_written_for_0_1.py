"""A plugin test module written for 0.1 (tests/plugin_written_for_0_1/, unchanged) still
passes in a pytest of its own, with exactly one DeprecationWarning saying what to add."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

OLD = Path(__file__).parent / "plugin_written_for_0_1" / "old_localfs_tests.py"


def test_a_plugin_test_written_for_0_1_passes_with_one_deprecation_warning(tmp_path):
    module = tmp_path / "test_old_localfs.py"
    shutil.copyfile(OLD, module)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W",
         "always::DeprecationWarning", str(module)],
        cwd=tmp_path, capture_output=True, text=True, timeout=240)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    summary = out.strip().splitlines()[-1]
    assert re.match(r"\d+ passed, 1 warning in ", summary), summary
    assert "failed" not in summary and "error" not in summary
    assert out.count("DeprecationWarning: TestLocalfsConformance declares no "
                     "replication_model") == 1, out
    assert "add `replication_model = PER_HOST`" in out
