"""A rolling upgrade of a 3-worker process topology: one worker at a time, each after the
one before passed its health check on the new version; a version whose health check never
passes is rolled back.

Process topologies need no Spark, so this module is quick: 1 nimbus, 3 supervisors with
one slot each, and a topology whose command writes its version and pid into its state
directory and beats a heartbeat file (the ``health: {file: ...}`` check). Each supervisor
keeps its checkpoints, and so its workers' state directories, under its own local
directory.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest
import yaml
from helpers import observer, run_cli
from waiting import wait_for

from nimbus.dev.cluster import LocalCluster
from nimbus.dev.feed import WORKER_MODULE, processes_with_arg
from nimbus.distribution.archive import pack_directory

pytestmark = [pytest.mark.slow, pytest.mark.integration]

NAME = "rolled"
# Beats its heartbeat file every 0.2 s (version "sick": never), after saying which
# version it is.
COMMAND = """
import os, pathlib, sys, time
state = pathlib.Path(os.environ["NIMBUS_HA_STATE_DIR"])
(state / "version").write_text(sys.argv[1])
while True:
    if sys.argv[1] != "sick":
        (state / "heartbeat").write_text(str(time.time()))
    time.sleep(0.2)
"""


def version_dir(work: Path, version: str) -> Path:
    source = work / f"rolled-{version}"
    source.mkdir(parents=True, exist_ok=True)
    (source / "run.py").write_text(COMMAND)
    (source / "topology.yaml").write_text(yaml.safe_dump({
        "command": [sys.executable, "run.py", version],
        "health": {"file": "heartbeat", "timeout": 3, "grace": 1}}))
    return source


def test_a_rolling_upgrade_switches_one_worker_at_a_time(tmp_path):
    with LocalCluster(tmp_path / "cluster", nimbuses=1, supervisors=3, slots_per_supervisor=1,
                      conf={"storm.zookeeper.session.timeout": 6000,
                            "nimbus.monitor.freq.secs": 1,
                            "supervisor.monitor.frequency.secs": 1,
                            "supervisor.heartbeat.frequency.secs": 1}) as cluster:
        state = observer(cluster)
        config = ("--config", str(cluster.config_file))
        topology_id = cluster.client().submit(NAME, pack_directory(version_dir(tmp_path, "1")),
                                              {"topology.workers": 3})
        wait_for(lambda: len(processes_with_arg(WORKER_MODULE, f"{topology_id}-")) == 3, 60,
                 "three workers")

        # What the leader asked for, sampled all along: at most one worker may be on its
        # way to the new version (asked to run it, not yet counted as switched) at a time.
        samples: list[tuple[int, list[str]]] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.1):
                assignment = state.assignment_info(topology_id)
                got = state.code_versions(topology_id)
                if assignment is None or got is None or not got[0].switch:
                    continue
                asked = [e for e in assignment.executor_node_port
                         if assignment.code_for(e)[0] == 2]
                switched = got[0].switch.get("switched", [])
                samples.append((len(set(asked) - set(switched)), list(switched)))

        sampler = threading.Thread(target=sample, name="switch-sampler")
        sampler.start()
        try:
            result = run_cli("upgrade", NAME, str(version_dir(tmp_path, "2")), "--strategy",
                             "rolling", "--timeout", "120", *config)
        finally:
            stop.set()
            sampler.join()
        assert result.returncode == 0, result.stdout + result.stderr
        assert samples, "the switch was seen under way"
        assert max(n for n, _ in samples) == 1, samples
        orders = [s for _, s in samples if s]
        # The switch ends in the write that counts the last worker: the last one seen
        # under way had the first two switched.
        assert orders[-1] == ["worker-0", "worker-1"]
        for earlier, later in zip(orders, orders[1:], strict=False):
            assert later[:len(earlier)] == earlier, "switched workers stay switched, in order"
        # Each worker's command says which version it is, in its state directory.
        states = [s.local_dir / "checkpoints" / topology_id / "state" / "version"
                  for s in cluster.supervisors]
        wait_for(lambda: [p.read_text() if p.exists() else "" for p in states] == ["2"] * 3,
                 30, "every worker's command to be version 2")
        history = json.loads(run_cli("history", NAME, "--json", *config).stdout)
        assert history["running"] == 2
        assert {v["version"]: v["state"] for v in history["versions"]} == {
            2: "running", 1: "previous"}
        wait_for(lambda: len(processes_with_arg(WORKER_MODULE, f"{topology_id}-")) == 3, 60,
                 "three workers again")

        # A version whose health check never passes goes back, on every worker.
        result = run_cli("upgrade", NAME, str(version_dir(tmp_path, "sick")), "--strategy",
                         "rolling", "--timeout", "120", *config)
        assert result.returncode == 1, result.stdout + result.stderr
        history = json.loads(run_cli("history", NAME, "--json", *config).stdout)
        assert history["running"] == 2
        sick = next(v for v in history["versions"] if v["version"] == 3)
        assert sick["state"] == "failed" and "health" in sick["error"].lower(), sick
        assignment = state.assignment_info(topology_id)
        assert {assignment.code_for(e)[0] for e in assignment.executor_node_port} == {2}
        state.zk.stop()
