"""Broken topologies on a real cluster: each failure is an error an operator can read
(once, not once per try), restarts back off, every reader shows each worker's state
(restarting, with its back-off and why), and the healthy topology beside them keeps
running undisturbed."""

from __future__ import annotations

import json
import re
import sys
import urllib.request

import pytest
import yaml
from helpers import observer, run_cli
from waiting import wait_for

from nimbus.dev.cluster import LocalCluster
from nimbus.dev.feed import WORKER_MODULE, processes_with_arg
from nimbus.distribution.archive import pack_directory
from nimbus.thrift.client import connect

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


def workers_of(cluster: LocalCluster, name: str) -> list[dict]:
    """topology-info --json's workers of topology ``name`` (a CLI process, as people run
    it)."""
    result = run_cli("topology-info", name, "--json", "--config", str(cluster.config_file),
                     check=True)
    return json.loads(result.stdout)["workers"]


def backoff_after(restarts: int) -> int:
    """The delay before the next start of a crash loop's worker after its ``restarts``-th
    crash: at once, then 1 s doubling to 60 s (nimbus/supervisor/policy.py)."""
    return 0 if restarts <= 1 else min(2 ** (restarts - 2), 60)


def worker_states(cluster: LocalCluster) -> dict[tuple[str, str], float]:
    """(topology id, state) -> supervisor_worker_state of the supervisor's slots."""
    from prometheus_client.parser import text_string_to_metric_families

    supervisor = cluster.supervisors[0]
    with urllib.request.urlopen(supervisor.metrics_url, timeout=5) as response:
        text = response.read().decode()
    return {(s.labels["topology_id"], s.labels["state"]): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == "supervisor_worker_state"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    work = tmp_path_factory.mktemp("bad-input")
    with LocalCluster(work / "cluster", nimbuses=1, supervisors=1, slots_per_supervisor=7,
                      metrics=True,
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
    missing = str(work / "no-such-command")
    client.submit("nocommand", bundle(work / "nocommand", {
        "topology.yaml": yaml.safe_dump({"command": [missing]})}), {})
    # Code that cannot be used: the nimbus's copy is damaged before any supervisor
    # fetched it (submitted inactive: nothing is placed until it is activated).
    corrupt_id = client.submit("corrupt", bundle(work / "corrupt", {
        "topology.yaml": yaml.safe_dump(sleeper)}), {}, active=False)
    with open(cluster.nimbuses[0].local_dir / "nimbus" / "stormdist" / corrupt_id /
              "stormjar.jar", "ab") as jar:
        jar.write(b"damaged")
    client.activate("corrupt")

    expected = {"exits": "command exited with code 7",
                "syntax": "SyntaxError",
                "nobuild": "build",
                "raises": "build() raised ValueError: no input configured",
                "nocommand": f"cannot start command ['{missing}']: FileNotFoundError",
                "corrupt": "its code cannot be used here: "}
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

    # Issue 29: the crash loop showed as alive. topology-info shows it restarting, with
    # the back-off of its last crash and why; it is not alive and has no uptime.
    def restarting(name: str) -> dict | None:
        (worker,) = workers_of(cluster, name)
        return worker if worker["state"] == "restarting" and worker["restarts"] >= 4 \
            and worker["backoff_secs"] == backoff_after(worker["restarts"]) else None

    exits = wait_for(lambda: restarting("exits"), 60, "exits to show as restarting")
    assert (exits["alive"], exits["uptime_secs"], exits["last_error"]) == (
        False, 0, "command exited with code 7")
    # Its error is recorded once, not once per crash (and nocommand's likewise).
    assert [e["error"] for e in errors_of(cluster, "exits")["main"]] == [
        "command exited with code 7"]
    nocommand = wait_for(lambda: restarting("nocommand"), 60, "nocommand to restart")
    assert nocommand["last_error"] == texts(errors_of(cluster, "nocommand"))[0]
    assert len(texts(errors_of(cluster, "nocommand"))) == 1
    # The code that cannot be used: restarting, its fetch tried again after 5 s, then
    # 10 s, ... (each try logged with its delay); said once, not once per try; its worker
    # never ran.
    tries_line = re.compile(rf"cannot start worker {corrupt_id}:\d+: .* \(next try in "
                            r"(\d+)\.0s\)")

    def tries() -> list[int]:
        return [int(d) for d in tries_line.findall(supervisor.log_text())]

    def corrupt_shown() -> dict | None:
        before = tries()
        (worker,) = workers_of(cluster, "corrupt")
        # Exact only if no try came between: its back-off is the last logged delay.
        return worker if len(before) >= 2 and tries() == before and \
            worker["state"] == "restarting" and worker["backoff_secs"] == before[-1] \
            else None

    corrupt = wait_for(corrupt_shown, 60, "corrupt's second fetch to fail")
    assert tries()[:2] == [5, 10]
    corrupt_errors = errors_of(cluster, "corrupt")
    assert list(corrupt_errors) == ["worker-0"] and len(corrupt_errors["worker-0"]) == 1
    assert corrupt["last_error"] == corrupt_errors["worker-0"][0]["error"].splitlines()[0]
    assert "sha256" in corrupt["last_error"]
    # The healthy one runs; getTopologyInfo, top and the metrics agree.
    (healthy,) = workers_of(cluster, "healthy")
    assert (healthy["state"], healthy["alive"], healthy["last_error"]) == (
        "running", True, "")
    with connect(cluster.nimbuses[0].address) as thrift:
        info = thrift.getTopologyInfo(next(t.id for t in client.cluster_info().topologies
                                           if t.name == "corrupt"))
    assert [(e.component_id, e.uptime_secs) for e in info.executors] == [("__system", 0)]
    top = run_cli("top", "--once", "--config", str(cluster.config_file), check=True).stdout
    assert re.search(r"│ healthy +│ \S+ +│ ACTIVE +│ 1/1 +│", top), top
    assert re.search(r"│ corrupt +│ \S+ +│ ACTIVE +│ 0/1 \(1 restarting\) +│", top), top
    states = worker_states(cluster)
    assert states[(healthy_id, "running")] == 1.0
    assert states[(corrupt_id, "restarting")] == 1.0

    # The newest errors are kept, at most 10 per component.
    assert all(len(v) <= 10 for v in errors_of(cluster, "exits").values())
    # The healthy topology ran through all of it, in the same process.
    assert processes_with_arg(WORKER_MODULE, healthy_id) == healthy_pid
    assert errors_of(cluster, "healthy") == {}
    state.zk.stop()
