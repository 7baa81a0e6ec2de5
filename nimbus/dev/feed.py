"""Driving a pipeline topology from outside: feed numbered records, read what committed.

Used by the demo (``dev-cluster --demo``, scripts/demo.sh), the runtime's integration
tests and its benchmark; it works from a checkout, where ``examples/`` is. Records are JSON
lines ``{"id": n, "text": ...}`` written to the example word-count pipeline's input
directory, one file per feed, each renamed into place whole (a file source must never see
a half-written file). The output is read through the file sink's commit log only
(``examples/wordcount/counts.py``), so a batch that a killed worker left half-written
is never counted.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
WORDCOUNT = REPO / "examples" / "wordcount"


def load_counts() -> ModuleType:
    """``examples/wordcount/counts.py``, imported by path (examples are not a package)."""
    spec = importlib.util.spec_from_file_location("wordcount_counts", WORDCOUNT / "counts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class RecordFeed:
    """Numbered records into ``input_dir``; remembers every id it fed."""

    def __init__(self, input_dir: Path):
        self.input_dir = Path(input_dir)
        self.input_dir.mkdir(parents=True, exist_ok=True)
        self.staging = self.input_dir.parent / (self.input_dir.name + ".staging")
        self.staging.mkdir(parents=True, exist_ok=True)
        self.fed: list[int] = []
        self.files = 0

    def feed(self, count: int, words: int = 3) -> list[int]:
        """Write ``count`` new records as one file; returns their ids."""
        start = len(self.fed)
        ids = list(range(start, start + count))
        lines = "".join(json.dumps({"id": i, "text": " ".join(["w"] * words)}) + "\n"
                        for i in ids)
        name = f"records-{self.files:06d}.json"
        tmp = self.staging / name
        tmp.write_text(lines, encoding="utf-8")
        os.replace(tmp, self.input_dir / name)  # same filesystem: atomic
        self.files += 1
        self.fed.extend(ids)
        return ids


class CommittedOutput:
    """The rows a file sink committed to ``output_dir``.

    Committed files never change, so each is parsed once: polling a large output costs
    a read of the small commit log, not a parse of every row (a poll that parsed
    everything would compete with the pipeline it measures for the CPU).
    """

    def __init__(self, output_dir: Path):
        self.output_dir = Path(output_dir)
        self._counts = load_counts()
        self._parsed: dict[Path, Counter] = {}
        self._total: Counter = Counter()

    def rows(self) -> list[dict[str, Any]]:
        return self._counts.committed_rows(self.output_dir)

    def ids(self) -> Counter:
        """id -> how many times it was committed (exactly once means every value is 1)."""
        files = self._counts.committed_files(self.output_dir)
        if set(self._parsed) - set(files):  # a file left the log: count afresh
            self._parsed.clear()
            self._total = Counter()
        for path in files:
            if path not in self._parsed:
                data = path.read_bytes()
                if path.name.endswith(".gz"):
                    data = gzip.decompress(data)
                counted = Counter(int(json.loads(line)["id"]) for line in
                                  data.decode("utf-8").splitlines() if line.strip())
                self._parsed[path] = counted
                self._total.update(counted)
        return Counter(self._total)

    def holds(self, ids: list[int]) -> bool:
        self.ids()
        return all(i in self._total for i in ids)


def exactly_once_report(fed: list[int], committed: Counter) -> dict[str, list[int]]:
    """``{"lost": [...], "duplicated": [...], "unexpected": [...]}``; all empty when every
    fed record was committed exactly once and nothing else was."""
    fed_set = set(fed)
    return {"lost": sorted(fed_set - set(committed)),
            "duplicated": sorted(i for i, n in committed.items() if n > 1),
            "unexpected": sorted(set(committed) - fed_set)}


WORKER_MODULE = "nimbus.worker"


def processes_with_arg(*needles: str) -> list[int]:
    """Pids of live processes whose command line contains every one of ``needles``
    (Linux /proc). A needle that is a module name matches that module only, not one of
    its submodules: ``nimbus.worker`` finds workers, not a frozen worker's reaper
    (``python -m nimbus.worker.frozen <the worker's cgroup>``)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
            continue
        cmdline = " ".join(argv)
        if state == "Z" or not all(n in cmdline for n in needles):
            continue
        if any(arg.startswith(n + ".") for n in needles for arg in argv):
            continue  # a submodule of a module asked for
        pids.append(int(entry.name))
    return sorted(pids)
