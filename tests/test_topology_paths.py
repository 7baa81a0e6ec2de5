"""Path-valued topology settings (nimbus.topology_paths): which values count as relative,
how the client resolves them, and what the leader refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from nimbus.dev.cluster import LocalCluster
from nimbus.topology_paths import (
    checkpoint_location,
    is_relative_path,
    relative_looking_values,
    relative_path_keys,
    resolve_path_keys,
)


@pytest.mark.parametrize(("value", "relative"), [
    ("dev-cluster/checkpoints", True), ("./x", True), ("~/ckpt", True), ("..", True),
    ("/data/ckpt", False), ("s3a://bucket/ckpt", False), ("hdfs://nn:8020/c", False),
    ("file:/tmp/c", False), ("", False), (None, False), (3, False), (["a"], False),
])
def test_is_relative_path(value, relative):
    assert is_relative_path(value) is relative


def test_resolve_path_keys_resolves_known_keys_only(tmp_path):
    conf = {"topology.spark.checkpoint.dir": "ckpt",
            "topology.spark.conf": {"spark.sql.warehouse.dir": "wh", "spark.app.x": "rel",
                                    "spark.sql.streaming.checkpointLocation": "s3a://b/c"},
            "wordcount.input.dir": "in", "topology.workers": 2}
    resolved = resolve_path_keys(conf, tmp_path)
    assert resolved == {"topology.spark.checkpoint.dir": str(tmp_path / "ckpt"),
                        "topology.spark.conf": {
                            "spark.sql.warehouse.dir": str(tmp_path / "wh"),
                            "spark.app.x": "rel",
                            "spark.sql.streaming.checkpointLocation": "s3a://b/c"},
                        "wordcount.input.dir": "in", "topology.workers": 2}
    assert conf["topology.spark.checkpoint.dir"] == "ckpt"  # a copy: the input is kept
    assert relative_path_keys(resolved) == []
    assert relative_path_keys(conf) == ["topology.spark.checkpoint.dir",
                                        "topology.spark.conf.spark.sql.warehouse.dir"]


def test_home_is_expanded_by_the_client():
    resolved = resolve_path_keys({"topology.spark.checkpoint.dir": "~/ckpt"}, Path("/x"))
    assert resolved["topology.spark.checkpoint.dir"] == str(Path("~/ckpt").expanduser())


def test_relative_looking_values_names_existing_relative_paths(tmp_path):
    (tmp_path / "in").mkdir()
    found = relative_looking_values([("a", "in"), ("b", "missing"), ("c", "/abs"),
                                     ("d", 5), ("e", "a\x00b"), ("f", "x" * 5000)], tmp_path)
    assert found == [("a", "in", tmp_path / "in")]


def test_a_dev_cluster_hands_out_absolute_paths(tmp_path, monkeypatch):
    """`nimbus-ha dev-cluster --dir dev-cluster` (the default is relative): every daemon's
    config names absolute directories."""
    monkeypatch.chdir(tmp_path)
    cluster = LocalCluster(Path("dev-cluster"), nimbuses=1, supervisors=1, zk_port=1)
    assert cluster.work_dir == tmp_path / "dev-cluster"
    for daemon in [*cluster.nimbuses, *cluster.supervisors]:
        assert daemon.local_dir.is_absolute() and daemon.config_file.is_absolute()
        assert str(daemon.config_file).startswith(str(tmp_path / "dev-cluster"))


def test_the_checkpoint_location_is_spelled_once_for_the_worker_and_the_page():
    assert checkpoint_location({"topology.spark.checkpoint.dir": "/ck/"}, "wc-1-1", "main") \
        == "/ck/wc-1-1/main"
    # A URI keeps its form (a Path would make s3a:// into s3a:/).
    assert checkpoint_location({"topology.spark.checkpoint.dir": "s3a://bucket/ck/"},
                               "wc-1-1", "main") == "s3a://bucket/ck/wc-1-1/main"
    assert checkpoint_location({"storm.local.dir": "/var/storm"}, "wc-1-1", "main") \
        == "/var/storm/checkpoints/wc-1-1/main"
