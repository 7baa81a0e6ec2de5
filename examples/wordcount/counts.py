"""Read what a Spark file sink has committed: only the files its ``_spark_metadata`` lists.

A file sink may leave files of a batch that never committed (a worker killed mid-batch);
readers must ignore them. The sink's log ``<output>/_spark_metadata/`` holds one file per
batch (``<batch-id>``) and, every ``spark.sql.streaming.fileSink.log.compactInterval``
batches, a compacted file (``<batch-id>.compact``) that holds everything up to it. Each
file is a version line (``v1``) followed by one JSON object per line with ``path`` and
``action`` (``add`` or ``delete``).

Usable without Spark: ``python counts.py <output-dir>`` prints the committed rows.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

METADATA_DIR = "_spark_metadata"


def _batch_files(metadata: Path) -> list[Path]:
    """The log files to read, in order: the newest compact file, then later batches."""
    batches: dict[int, Path] = {}
    compacts: dict[int, Path] = {}
    for entry in metadata.iterdir():
        name = entry.name
        if name.startswith("."):  # checksums (.0.crc) and temporary files
            continue
        stem, _, suffix = name.partition(".")
        if not stem.isdigit() or suffix not in ("", "compact"):
            continue
        (compacts if suffix else batches)[int(stem)] = entry
    start = max(compacts, default=-1)
    files = [compacts[start]] if start >= 0 else []
    files += [batches[b] for b in sorted(batches) if b > start]
    return files


def committed_files(output_dir: str | Path) -> list[Path]:
    """Local paths of the data files committed to ``output_dir``, in commit order."""
    metadata = Path(output_dir) / METADATA_DIR
    if not metadata.is_dir():
        return []
    live: dict[str, None] = {}  # an ordered set
    for log_file in _batch_files(metadata):
        lines = log_file.read_text(encoding="utf-8").splitlines()
        if not lines or not lines[0].startswith("v"):
            raise ValueError(f"{log_file}: no version line")
        if lines[0] != "v1":
            raise ValueError(f"{log_file}: unsupported sink log version {lines[0]!r}")
        for line in lines[1:]:
            if not line.strip():
                continue
            entry = json.loads(line)
            path = entry["path"]
            if entry.get("action", "add") == "delete":
                live.pop(path, None)
            else:
                live[path] = None
    return [Path(unquote(urlparse(p).path)) for p in live]


def committed_rows(output_dir: str | Path) -> list[dict[str, Any]]:
    """Every row of every committed JSON file of ``output_dir`` (JSON lines, maybe gzip)."""
    rows: list[dict[str, Any]] = []
    for path in committed_files(output_dir):
        data = path.read_bytes()
        if path.name.endswith(".gz"):
            data = gzip.decompress(data)
        rows.extend(json.loads(line) for line in data.decode("utf-8").splitlines()
                    if line.strip())
    return rows


if __name__ == "__main__":
    for row in committed_rows(sys.argv[1]):
        print(json.dumps(row, sort_keys=True))
