"""Word count per record: a pipeline topology for nimbus-ha (see README.md).

Reads JSON records ``{"id": <long>, "text": <string>}`` from the files that appear in
``wordcount.input.dir`` and writes one JSON row ``{"id", "words"}`` per record to
``wordcount.output.dir``. The file source replays from the checkpoint and the file sink
commits each batch once in its ``_spark_metadata`` log, so after any crash and restart
every record is in the committed output exactly once.

Configuration (topology keys):

* ``wordcount.input.dir`` (required): directory of input files. Add files atomically
  (write elsewhere on the same filesystem, then rename into it); never change a file
  once it is there.
* ``wordcount.output.dir`` (required): directory of the output and its ``_spark_metadata``.
* ``wordcount.trigger.secs`` (default 1): seconds between micro-batches.
* ``wordcount.max.files.per.trigger`` (default 100): input files per micro-batch.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter

SCHEMA = "id LONG, text STRING"


def build(spark: SparkSession, conf: dict[str, Any]) -> DataStreamWriter:
    """The unstarted writer; the worker adds the checkpoint location and starts it."""
    max_files = int(conf.get("wordcount.max.files.per.trigger", 100))
    trigger_ms = int(float(conf.get("wordcount.trigger.secs", 1)) * 1000)
    records = (spark.readStream.schema(SCHEMA)
               .option("maxFilesPerTrigger", max_files)
               .json(conf["wordcount.input.dir"]))
    text = F.trim(F.coalesce(F.col("text"), F.lit("")))
    # split("") yields [""], so blank text is counted as 0 words explicitly.
    words = F.when(text == "", F.lit(0)).otherwise(F.size(F.split(text, r"\s+")))
    counted = records.select(F.col("id"), words.alias("words"))
    return (counted.writeStream.format("json").outputMode("append")
            .option("path", conf["wordcount.output.dir"])
            .trigger(processingTime=f"{trigger_ms} milliseconds"))
