"""Start order does not matter to a supervisor: one started before any nimbus waits for
the cluster's layout, says so once, and registers and runs work once a nimbus is up."""

from __future__ import annotations

import sys

import pytest
import yaml

from nimbus.devcluster import LocalCluster, sample_topology, wait_for
from nimbus.distribution.archive import pack_directory
from nimbus.testing.pipelines import WORKER_MODULE, processes_with_arg

pytestmark = [pytest.mark.slow, pytest.mark.integration]

WAITING = "no nimbus has set the cluster up under /storm yet"


def test_a_supervisor_started_before_any_nimbus_waits_then_runs_work(tmp_path):
    c = LocalCluster(tmp_path / "cluster", 1, supervisors=1, slots_per_supervisor=1,
                     conf={"supervisor.monitor.frequency.secs": 1})
    try:
        c.zk.start()
        supervisor = c.supervisors[0]
        supervisor.start()
        wait_for(lambda: WAITING in supervisor.log_text(), 30, "the supervisor to wait")
        assert supervisor.alive()
        for nimbus in c.nimbuses:
            nimbus.start()
        c.wait_for_leader()
        wait_for(lambda: supervisor.id in c.registered_supervisors(), 30,
                 "the supervisor to register")
        wait_for(lambda: "the cluster's layout is there: reconciling" in supervisor.log_text(),
                 30, "its first complete reconcile pass")
        log = supervisor.log_text()
        # Said once, at start: its reconcile passes meanwhile did not repeat it.
        assert log.count(WAITING) == 1, log
        assert "Traceback" not in log
        source = sample_topology(tmp_path / "sleeper", 16 << 10)
        (source / "topology.yaml").write_text(yaml.safe_dump(
            {"command": [sys.executable, "-c", "import time; time.sleep(3600)"]}))
        topology_id = c.client().submit("sleeper", pack_directory(source), {})
        wait_for(lambda: len(processes_with_arg(WORKER_MODULE, topology_id)) == 1, 60,
                 "its worker")
    except BaseException:
        for daemon in [*c.nimbuses, *c.supervisors]:
            print(f"--- {daemon.log_file.name} ---\n{daemon.log_text()[-3000:]}")
        raise
    finally:
        c.stop()
