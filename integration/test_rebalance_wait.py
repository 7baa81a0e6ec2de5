"""`nimbus-ha rebalance --wait S` on real processes: the topology is REBALANCING, its
workers stopped, for S seconds; the leader is killed -9 in the middle, and the next one
completes the rebalance from the deadline stored in ZooKeeper (new worker count applied,
status back to ACTIVE). A rebalance without a wait leaves a process topology's worker
running on its slot, pid unchanged, and never shows REBALANCING."""

from __future__ import annotations

import sys

import pytest
import yaml
from helpers import observer, run_cli
from waiting import wait_for

from nimbus.dev.cluster import LocalCluster
from nimbus.dev.feed import WORKER_MODULE, processes_with_arg
from nimbus.distribution.archive import pack_directory
from nimbus.state.records import ACTIVE, REBALANCING

pytestmark = [pytest.mark.slow, pytest.mark.integration]

# Long enough to stop the workers and kill the leader well before it ends.
WAIT_S = 30


def test_rebalance_wait_survives_a_leader_killed_mid_wait(tmp_path):
    topology = tmp_path / "sleeper"
    topology.mkdir()
    (topology / "topology.yaml").write_text(yaml.safe_dump(
        {"command": [sys.executable, "-c", "import time; time.sleep(3600)"]}))
    with LocalCluster(tmp_path / "cluster", nimbuses=2, supervisors=2, slots_per_supervisor=2,
                      conf={"storm.zookeeper.session.timeout": 4000,
                            "nimbus.monitor.freq.secs": 1,
                            "supervisor.monitor.frequency.secs": 1}) as cluster:
        state = observer(cluster)
        conf = str(cluster.config_file)
        topology_id = cluster.client().submit("sleeper", pack_directory(topology), {})

        def workers() -> list[int]:
            return processes_with_arg(WORKER_MODULE, f"{topology_id}-")

        def placed() -> list[str]:
            return sorted(state.assignment_info(topology_id).executor_node_port)

        def listed_status() -> str:
            out = run_cli("list", "--config", conf, check=True).stdout
            return next(line.split()[1] for line in out.splitlines()
                        if line.startswith("sleeper "))

        wait_for(lambda: len(workers()) == 1, 60, "one worker")
        first_pid = workers()[0]

        # Without a wait, as before: at once, status unchanged, worker-0 runs on.
        done = run_cli("rebalance", "sleeper", "-n", "2", "--wait", "0", "--config", conf,
                       check=True)
        assert done.stdout == "rebalanced sleeper to 2 workers\n"
        assert state.storm_base(topology_id).status == ACTIVE
        wait_for(lambda: len(workers()) == 2, 60, "two workers")
        assert first_pid in workers(), "worker-0 ran on through the rebalance"

        # With a wait: REBALANCING (deactivated) until the deadline.
        leader = cluster.wait_for_leader()
        run_cli("rebalance", "sleeper", "-n", "3", "--wait", str(WAIT_S), "--config", conf,
                check=True)
        base = state.storm_base(topology_id)
        assert (base.status, base.prev_status, base.num_workers,
                base.rebalance_num_workers) == (REBALANCING, ACTIVE, 2, 3)
        wait_for(lambda: listed_status() == REBALANCING, 30, "REBALANCING in nimbus-ha list")
        wait_for(lambda: placed() == [] and workers() == [], 60,
                 "the workers to stop, as for a deactivated topology")

        leader.kill9()
        # Not completed by the leader that died: whoever leads next must do it.
        assert state.storm_base(topology_id).status == REBALANCING
        successor = cluster.wait_for_leader(exclude=leader.address)

        wait_for(lambda: state.storm_base(topology_id).status == ACTIVE, WAIT_S + 60,
                 "the new leader to complete the rebalance")
        base = state.storm_base(topology_id)
        assert (base.num_workers, base.prev_status, base.rebalance_at_secs) == (3, "", 0)
        # Logged just after the write the test saw.
        wait_for(lambda: f"rebalance of sleeper ({topology_id}) completed: 3 workers, ACTIVE"
                 in successor.log_text(), 30, "the new leader to log the completion")
        wait_for(lambda: placed() == ["worker-0", "worker-1", "worker-2"]
                 and len(workers()) == 3, 60, "three workers")
        wait_for(lambda: listed_status() == ACTIVE, 30, "ACTIVE in nimbus-ha list")
        info = run_cli("topology-info", "sleeper", "--json", "--config", conf, check=True)
        assert yaml.safe_load(info.stdout)["status"] == ACTIVE
        state.zk.stop()
