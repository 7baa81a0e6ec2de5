"""Spark's classes, pre-parsed: a JVM class-data sharing (AppCDS) archive per host.

Most of a SparkSession's start is the JVM loading, verifying and compiling some ten
thousand classes, the same ones every time. A *dynamic* class-data sharing archive (JDK
13 and later: ``-XX:ArchiveClassesAtExit`` to write one, ``-XX:SharedArchiveFile`` to use
it) keeps them parsed and verified, mapped from a file. On a 2-core host it cuts a
session's start from about 5 s to 2-3 s, and the JVM's CPU time to about half, which is
what a host restarting several pipelines at once is short of.

A supervisor builds one archive for its Spark and its JDK (``supervisor.spark.class.
archive``; :class:`nimbus.supervisor.class_archive.ClassArchive` chooses the file, named
for this host's Spark and JDK, and runs this module as a program, ``python -m
nimbus.worker.class_archive <file>``) and names it in every worker's ``worker.json``;
:func:`java_options` adds it to the driver's JVM options. The
JVM checks the archive against its own build and class path, and one that does not fit
(another JDK, another Spark, a damaged file) is ignored with a warning in the worker's
log: the session starts as it would have without it. The file is the supervisor's:
classes in it are loaded into every topology's JVM (docs/runtime.md says who may write
it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

LOOPBACK = "127.0.0.1"


def java_options(archive: str, configured: str | None) -> str | None:
    """``spark.driver.extraJavaOptions`` with ``archive`` in use: after the topology's
    own options (``configured``, which may turn it off with ``-Xshare:off``); None when
    there is no such file, or its path has white space (Spark splits the options there)."""
    if not archive or not Path(archive).is_file() or any(c.isspace() for c in archive):
        return None
    # -Xshare:auto, the JVM's default, ignores an archive that does not fit and says why.
    ours = f"-XX:SharedArchiveFile={archive}"
    return f"{configured} {ours}" if configured else ours


def build(out: Path) -> None:
    """Start a SparkSession that writes its classes to ``out`` when its JVM exits, run a
    batch query and a streaming one (so that the classes a pipeline needs are loaded),
    stop it and wait for the JVM to have written the file (then moved into place)."""
    os.environ["SPARK_LOCAL_IP"] = LOOPBACK
    from pyspark import SparkContext
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    partial = out.with_name(f".{out.name}.{os.getpid()}.partial")
    spark = (SparkSession.builder.master("local[1]").appName("nimbus-class-archive")
             .config("spark.ui.enabled", "false")
             .config("spark.driver.memory", "512m")
             .config("spark.sql.shuffle.partitions", "1")
             .config("spark.driver.host", LOOPBACK)
             .config("spark.driver.bindAddress", LOOPBACK)
             # The signed jars' classes cannot be archived; the JVM says so for each.
             .config("spark.driver.extraJavaOptions",
                     f"-XX:ArchiveClassesAtExit={partial} -Xlog:cds=error "
                     "-Xlog:cds+dynamic=error")
             .getOrCreate())
    with tempfile.TemporaryDirectory(prefix="nimbus-class-archive-") as work:
        source = Path(work) / "in"
        source.mkdir()
        (source / "0.txt").write_text("a b a\n", encoding="utf-8")
        spark.range(100).groupBy((F.col("id") % 3).alias("k")).count().collect()
        counts = (spark.readStream.text(str(source))
                  .select(F.explode(F.split("value", " ")).alias("word"))
                  .groupBy("word").count())
        query = (counts.writeStream.outputMode("complete").format("memory")
                 .queryName("nimbus_class_archive")
                 .option("checkpointLocation", str(Path(work) / "checkpoint"))
                 .trigger(once=True).start())
        query.awaitTermination()
        spark.stop()
    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None) if gateway is not None else None
    if proc is None:
        raise RuntimeError("cannot tell when the JVM has exited (no gateway process)")
    # The JVM exits when its stdin closes, and writes the archive as it does.
    proc.stdin.close()
    try:
        code = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()  # no JVM of a failed build is left to write the file later
        proc.wait()
        partial.unlink(missing_ok=True)
        raise RuntimeError("the JVM did not exit within 120 s of its gateway closing") from None
    if code != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"the JVM exited with code {code} without writing {partial}")
    partial.chmod(0o644)
    os.replace(partial, out)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m nimbus.worker.class_archive <archive file>", file=sys.stderr)
        return 2
    out = Path(args[0]).absolute()
    try:
        build(out)
    except Exception as exc:
        print(f"no class archive: {exc}", file=sys.stderr)
        return 1
    print(f"class archive written: {out} ({out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
