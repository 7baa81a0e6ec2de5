"""Versions of one small pipeline, and what its output says about them: for the upgrade
tests and benchmark.

Every version reads the records of :class:`nimbus.dev.feed.RecordFeed` (``{"id",
"text"}``) with Spark's file source, keeps state (``dropDuplicates`` on the id: the
state store holds every id seen), and writes ``{"id", "version"}`` rows with the file
sink. ``version`` is a constant in each version's code, so the committed output says
which version committed each batch. Bad versions fail the ways an upgrade can:

* ``raise``: ``build()`` raises;
* ``incompatible``: deduplicates on ``text`` instead, a state key of another schema,
  which Spark refuses on the existing checkpoint (STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE)
  at the first batch.

The sink's log is never compacted here (``SPARK_CONF``), so ``_spark_metadata/<batch>``
lists the files of each batch and :func:`batch_versions` can say which version wrote it.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path
from urllib.parse import unquote, urlparse

from nimbus.dev.feed import RecordFeed
from nimbus.distribution.archive import pack_directory

SPARK_CONF = {"spark.ui.enabled": "false", "spark.driver.memory": "512m",
              "spark.sql.shuffle.partitions": "2",
              # One log file per batch, so that each batch's version can be read back.
              "spark.sql.streaming.fileSink.log.compactInterval": "1000000"}

TOPOLOGY = '''"""Upgrade test pipeline, version {version} ({kind})."""
from pyspark.sql import functions as F

VERSION = {version}


def build(spark, conf):
    {body}
    records = (spark.readStream.schema("id LONG, text STRING")
               .option("maxFilesPerTrigger", 100).json(conf["upgrade.input.dir"]))
    kept = records.dropDuplicates([{key!r}])
    rows = kept.select(F.col("id"), F.lit(VERSION).alias("version"))
    return (rows.writeStream.format("json").outputMode("append")
            .option("path", conf["upgrade.output.dir"])
            .trigger(processingTime="500 milliseconds"))
'''

KINDS = ("good", "raise", "incompatible")
BUILD_ERROR = "this version cannot build: the lookup table it needs is missing"


def version_dir(work: Path, version: int, kind: str = "good") -> Path:
    """A directory holding ``version`` of the pipeline (see the module doc for ``kind``),
    made under ``work``."""
    if kind not in KINDS:
        raise ValueError(kind)
    source = work / f"pipeline-v{version}-{kind}"
    source.mkdir(parents=True, exist_ok=True)
    body = f"raise RuntimeError({BUILD_ERROR!r})" if kind == "raise" else "pass"
    key = "text" if kind == "incompatible" else "id"
    (source / "topology.py").write_text(TOPOLOGY.format(version=version, kind=kind,
                                                        body=body, key=key))
    return source


def version_bundle(work: Path, version: int, kind: str = "good") -> bytes:
    """The bundle of :func:`version_dir`."""
    return pack_directory(version_dir(work, version, kind))


def pipeline_conf(feed: RecordFeed, output_dir: Path) -> dict:
    return {"upgrade.input.dir": str(feed.input_dir), "upgrade.output.dir": str(output_dir),
            "topology.spark.conf": SPARK_CONF}


def batch_versions(output_dir: Path) -> dict[int, Counter]:
    """batch id -> Counter of the ``version`` of the rows that batch committed."""
    metadata = output_dir / "_spark_metadata"
    out: dict[int, Counter] = {}
    if not metadata.is_dir():
        return out
    for entry in metadata.iterdir():
        if not entry.name.isdigit():
            continue  # checksums, temporary files; no compact file is ever written here
        lines = entry.read_text(encoding="utf-8").splitlines()
        versions: Counter = Counter()
        for line in lines[1:]:
            if line.strip():
                path = Path(unquote(urlparse(json.loads(line)["path"]).path))
                for row in path.read_text(encoding="utf-8").splitlines():
                    if row.strip():
                        versions[json.loads(row)["version"]] += 1
        out[int(entry.name)] = versions
    return out


def version_sequence(output_dir: Path) -> list[tuple[int, int]]:
    """[(first batch, version)] of each run of batches committed by one version, in batch
    order, over batches that committed rows. Raises AssertionError if one batch holds rows
    of two versions."""
    runs: list[tuple[int, int]] = []
    for batch, versions in sorted(batch_versions(output_dir).items()):
        if not versions:
            continue
        assert len(versions) == 1, f"batch {batch} holds rows of versions {dict(versions)}"
        (version,) = versions
        if not runs or runs[-1][1] != version:
            runs.append((batch, version))
    return runs


class SteadyFeed:
    """Feeds ``count`` records every ``every_s`` seconds on a named thread, until
    stopped: records flowing while a test upgrades the pipeline."""

    def __init__(self, feed: RecordFeed, every_s: float = 0.4, count: int = 5):
        self.feed = feed
        self._every_s = every_s
        self._count = count
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steady-feed", daemon=True)

    def __enter__(self) -> SteadyFeed:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            self.feed.feed(self._count)
