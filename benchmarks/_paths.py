"""Imported first by the benchmark scripts: puts ``testsupport/`` (the tests' helpers,
which pytest finds through pyproject's ``pythonpath``) on ``sys.path`` when a script runs
on its own."""

import sys
from pathlib import Path

TESTSUPPORT = str(Path(__file__).resolve().parents[1] / "testsupport")
if TESTSUPPORT not in sys.path:
    sys.path.insert(0, TESTSUPPORT)
