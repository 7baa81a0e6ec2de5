"""Broken topologies on a real cluster: each failure is an error an operator can read,
restarts back off, and the healthy topology beside them keeps running undisturbed."""

from __future__ import annotations

import json
import re
import sys

import pytest
import yaml
from helpers import observer, run_cli

from nimbus.devcluster import LocalCluster, wait_for
from nimbus.distribution.archive import pack_directory
from nimbus.testing.pipelines import WORKER_MODULE, processes_with_arg

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SPARK_CONF = {"spark.ui.enabled": "false", "spark.driver.memory": "512m",
              "spark.sql.shuffle.partitions": "2"}


def bundle(directory, files: dict[str, str]) -> bytes:
    directory.mkdir()
    for name, text in files.items():
        (directory / name).write_text(text)
    return pack_directory(directory)


def errors_of(cluster: LocalCluster, name: str) -> dict[str, list[dict]]:
    result = run_cli("errors", name, "--json", "--config", str(cluster.config_file),
                     check=True)
    return json.loads(result.stdout)


def texts(errors: dict[str, list[dict]]) -> list[str]:
    return [e["error"] for component in errors.values() for e in component]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    work = tmp_path_factory.mktemp("bad-input")
    with LocalCluster(work / "cluster", nimbuses=1, supervisors=1, slots_per_supervisor=5,
                      conf={"storm.zookeeper.session.timeout": 6000,
                            "nimbus.monitor.freq.secs": 1,
                            "supervisor.monitor.frequency.secs": 1,
                            "supervisor.heartbeat.frequency.secs": 1,
                            "topology.spark.master": "local[1]",
                            "topology.spark.conf": SPARK_CONF,
                            "topology.spark.checkpoint.dir": str(work / "ckpt")}) as cluster:
        yield cluster, work


def test_broken_topologies_report_errors_back_off_and_disturb_nothing(cluster):
    cluster, work = cluster
    client = cluster.client()
    sleeper = {"command": [sys.executable, "-c", "import time; time.sleep(3600)"]}
    healthy_id = client.submit("healthy", bundle(work / "healthy", {
        "topology.yaml": yaml.safe_dump(sleeper)}), {})
    state = observer(cluster)
    wait_for(lambda: len(processes_with_arg(WORKER_MODULE, healthy_id)) == 1, 60,
             "the healthy topology's worker")
    healthy_pid = processes_with_arg(WORKER_MODULE, healthy_id)

    client.submit("exits", bundle(work / "exits", {"topology.yaml": yaml.safe_dump(
        {"command": [sys.executable, "-c", "import sys; sys.exit(7)"]})}), {})
    client.submit("syntax", bundle(work / "syntax", {"topology.py": "def build(spark, conf)\n"}),
                  {})
    client.submit("nobuild", bundle(work / "nobuild", {"topology.py": "X = 1\n"}), {})
    client.submit("raises", bundle(work / "raises", {"topology.py": (
        "def build(spark, conf):\n    raise ValueError('no input configured')\n")}), {})

    expected = {"exits": "command exited with code 7",
                "syntax": "SyntaxError",
                "nobuild": "build",
                "raises": "build() raised ValueError: no input configured"}
    for name, needle in expected.items():
        wait_for(lambda n=name, w=needle: any(w in t for t in texts(errors_of(cluster, n))),
                 120, f"the error of {name!r} to be visible")

    # Restarts back off: at once, then 1 s, 2 s, 4 s, ... (the supervisor logs each delay).
    supervisor = cluster.supervisors[0]
    delays_line = re.compile(r"worker (exits-\S+):\d+ exited with code \d+; restart in (\d+)s")

    def delays() -> list[int]:
        return [int(d) for _, d in delays_line.findall(supervisor.log_text())]

    wait_for(lambda: len(delays()) >= 4, 60, "four restarts of the failing command")
    assert delays()[:4] == [0, 1, 2, 4]

    # The newest errors are kept, at most 10 per component.
    assert all(len(v) <= 10 for v in errors_of(cluster, "exits").values())
    # The healthy topology ran through all of it, in the same process.
    assert processes_with_arg(WORKER_MODULE, healthy_id) == healthy_pid
    assert errors_of(cluster, "healthy") == {}
    state.zk.stop()
