"""Which topologies a warm worker's session can run, and the take line it waits for."""

from __future__ import annotations

import os
import threading

import pytest

from nimbus.worker.warm import SupervisorGone, wait_for_take
from nimbus.worker_protocol.spark_settings import warm_mismatch
from nimbus.worker_protocol.spec import WorkerSpec

BASE = {"topology.spark.master": "local[1]",
        "topology.spark.conf": {"spark.driver.memory": "512m",
                                "spark.sql.shuffle.partitions": "2"}}


def spec(conf: dict) -> WorkerSpec:
    return WorkerSpec(topology_id="t-1-1", port=1, supervisor_id="s", host="h",
                      code_dir="/code", lease_fd=0, status_fd=1, conf=conf)


def with_spark(**settings: str) -> dict:
    return {**BASE, "topology.spark.conf": {**BASE["topology.spark.conf"], **settings}}


def test_the_cluster_defaults_match():
    assert warm_mismatch(spec(BASE), spec({**BASE, "wordcount.input.dir": "/in"})) is None


def test_sql_settings_are_set_on_the_running_session():
    assert warm_mismatch(spec(BASE), spec(with_spark(**{
        "spark.sql.shuffle.partitions": "8", "spark.sql.session.timeZone": "UTC"}))) is None


def test_another_master_starts_cold():
    assert warm_mismatch(spec(BASE), spec({**BASE, "topology.spark.master": "local[2]"})) == (
        "topology.spark.master is local[2], the warm workers' local[1]")


@pytest.mark.parametrize("key,value", [("spark.driver.memory", "1g"),
                                       ("spark.jars.packages", "org.example:x:1"),
                                       ("spark.sql.warehouse.dir", "/w")])
def test_a_setting_fixed_at_start_that_differs_starts_cold(key, value):
    why = warm_mismatch(spec(BASE), spec(with_spark(**{key: value})))
    assert why is not None and why.startswith(f"Spark setting {key} is {value}, the warm ")


def test_a_setting_only_the_warm_session_has_starts_cold():
    wanted = {**BASE, "topology.spark.conf": {"spark.sql.shuffle.partitions": "2"}}
    assert warm_mismatch(spec(BASE), spec(wanted)) == (
        "Spark setting spark.driver.memory is (unset), the warm workers' 512m "
        "(fixed when Spark starts)")


def test_a_driver_address_chosen_by_the_topology_starts_cold():
    why = warm_mismatch(spec(BASE), spec(with_spark(**{"spark.driver.host": "10.0.0.1"})))
    assert why is not None and why.startswith("Spark setting spark.driver.bindAddress")


@pytest.fixture
def pipe():
    r, w = os.pipe()
    yield r, w
    for fd in (r, w):
        try:
            os.close(fd)
        except OSError:
            pass


def test_take_leaves_the_first_lease_in_the_pipe(pipe):
    r, w = pipe
    os.write(w, b"take /var/workers/t-1-1-6700\nlease 123.000\n")
    assert str(wait_for_take(r, threading.Event())) == "/var/workers/t-1-1-6700"
    assert os.read(r, 100) == b"lease 123.000\n"


@pytest.mark.parametrize("line", [b"lease 1.0\n", b"take relative/dir\n", b"take\n",
                                  b"x" * 5000 + b"\n"])
def test_anything_but_a_take_ends_the_wait(pipe, line):
    r, w = pipe
    os.write(w, line)
    assert wait_for_take(r, threading.Event()) is None


def test_a_supervisor_gone_ends_the_wait(pipe):
    r, w = pipe
    os.close(w)
    with pytest.raises(SupervisorGone):
        wait_for_take(r, threading.Event())
