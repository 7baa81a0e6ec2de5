"""Markers match folders: `integration` (and `slow`) is every test of integration/ and
nothing else, so `-m integration` and `-m "not slow"` select by folder; a unit test that
starts a real ZooKeeper says `zookeeper`."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INTEGRATION_MARK = re.compile(r"mark\.integration\b")


def test_no_test_outside_integration_is_marked_integration():
    outside = [*(ROOT / "tests").rglob("*.py"), *(ROOT / "plugins").glob("*/tests/*.py"),
               *(ROOT / "testsupport").rglob("*.py")]
    assert [str(p.relative_to(ROOT)) for p in outside if p != Path(__file__).resolve()
            and INTEGRATION_MARK.search(p.read_text(encoding="utf-8"))] == []


def test_integration_marks_every_test_of_its_folder():
    conftest = (ROOT / "integration" / "conftest.py").read_text(encoding="utf-8")
    assert "def pytest_collection_modifyitems" in conftest
    assert "item.add_marker(pytest.mark.integration)" in conftest
    assert "item.add_marker(pytest.mark.slow)" in conftest
