"""`nimbus-ha rebalance` on real supervisors: workers are added spread over supervisors,
and removed, as real processes. Every worker of a process topology runs the same
command, so the workers that stay run on, untouched, on the slots they had (told their
new place; integration/test_rebalance_pipeline.py has a pipeline's rule)."""

from __future__ import annotations

import sys
from collections import Counter

import pytest
import yaml
from helpers import observer, run_cli
from waiting import wait_for

from nimbus.dev.cluster import LocalCluster
from nimbus.dev.feed import WORKER_MODULE, processes_with_arg
from nimbus.distribution.archive import pack_directory

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_rebalance_adds_spread_workers_and_removes_them(tmp_path):
    topology = tmp_path / "sleeper"
    topology.mkdir()
    (topology / "topology.yaml").write_text(yaml.safe_dump(
        {"command": [sys.executable, "-c", "import time; time.sleep(3600)"]}))
    with LocalCluster(tmp_path / "cluster", nimbuses=1, supervisors=2, slots_per_supervisor=2,
                      conf={"storm.zookeeper.session.timeout": 4000,
                            "nimbus.monitor.freq.secs": 1,
                            "supervisor.monitor.frequency.secs": 1}) as cluster:
        state = observer(cluster)
        topology_id = cluster.client().submit("sleeper", pack_directory(topology), {})

        def workers() -> list[int]:
            return processes_with_arg(WORKER_MODULE, f"{topology_id}-")

        def slots() -> dict[str, tuple[str, int]]:
            assignment = state.assignment_info(topology_id)
            return {e: (sid, port) for e, (sid, port) in assignment.executor_node_port.items()}

        def placement() -> Counter:
            return Counter(sid for sid, _ in slots().values())

        wait_for(lambda: len(workers()) == 1, 60, "one worker")
        first = slots()["worker-0"]
        first_pid = workers()[0]
        run_cli("rebalance", "sleeper", "--workers", "3", "--config", str(cluster.config_file),
                check=True)
        wait_for(lambda: len(workers()) == 3, 60, "three workers")
        assert sorted(placement().values()) == [1, 2], "spread over both supervisors"
        assert slots()["worker-0"] == first, "worker-0 kept its slot"
        assert first_pid in workers(), "worker-0 ran on through the rebalance"
        info = run_cli("topology-info", "sleeper", "--json", "--config",
                       str(cluster.config_file), check=True)
        assert [w["worker"] for w in yaml.safe_load(info.stdout)["workers"]] == \
            ["worker-0", "worker-1", "worker-2"]

        run_cli("rebalance", "sleeper", "-n", "1", "--config", str(cluster.config_file),
                check=True)
        # The assignment shrinks first, then the supervisors stop the extra workers (a
        # worker that merely restarts must not pass for a removed one).
        wait_for(lambda: len(slots()) == 1 and len(workers()) == 1, 60, "one worker again")
        assert slots() == {"worker-0": first}, "the lowest index stays where it was"
        assert workers() == [first_pid], "and ran on through both rebalances"
        state.zk.stop()
