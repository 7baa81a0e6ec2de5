"""Where users outgrow one machine: a worker drives a real Spark standalone cluster.

A Spark master and worker from the installed pyspark distribution run on 127.0.0.1; the
pipeline's `topology.spark.master` points at them, so its queries execute in the
standalone cluster's executor while the nimbus-ha worker only drives them.
"""

from __future__ import annotations

import sys

import pytest
from spark_standalone import SparkStandalone
from waiting import wait_for

from nimbus.dev.cluster import LocalCluster
from nimbus.dev.feed import WORDCOUNT, CommittedOutput, RecordFeed, exactly_once_report
from nimbus.distribution.archive import pack_directory

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_a_pipeline_runs_on_a_spark_standalone_cluster(tmp_path):
    feed, output = RecordFeed(tmp_path / "input"), CommittedOutput(tmp_path / "output")
    with SparkStandalone(tmp_path / "spark", worker_memory="768m") as spark, \
            LocalCluster(tmp_path / "cluster", nimbuses=1, supervisors=1,
                         slots_per_supervisor=1,
                         conf={"storm.zookeeper.session.timeout": 6000,
                               "nimbus.monitor.freq.secs": 1,
                               "supervisor.monitor.frequency.secs": 1,
                               "topology.spark.checkpoint.dir": str(tmp_path / "ckpt")}
                         ) as cluster:
        topology_id = cluster.client().submit("wordcount", pack_directory(WORDCOUNT), {
            "topology.spark.master": spark.master_url,
            "topology.spark.conf": {"spark.ui.enabled": "false",
                                    "spark.driver.memory": "512m",
                                    "spark.executor.memory": "512m",
                                    "spark.cores.max": "1",
                                    "spark.sql.shuffle.partitions": "2",
                                    # the executor's Python: this venv's, on this host
                                    "spark.pyspark.python": sys.executable},
            "wordcount.input.dir": str(feed.input_dir),
            "wordcount.output.dir": str(output.output_dir)})
        port = cluster.supervisors[0].ports[0]
        wait_for(lambda: [a["name"] for a in spark.status().get("activeapps", [])]
                 == [f"{topology_id}-{port}"], 180,
                 "the worker's application to run on the standalone master")
        ids = feed.feed(40)
        wait_for(lambda: output.holds(ids), 180, "the records to be committed")
        assert exactly_once_report(feed.fed, output.ids()) == {
            "lost": [], "duplicated": [], "unexpected": []}
        executors = spark.status()["activeapps"][0]
        assert executors["cores"] == 1, "the query ran in the standalone cluster's executor"
