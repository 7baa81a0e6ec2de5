"""A rebalance keeps the pipeline workers whose components stay the same.

A pipeline of two components (``a`` and ``b``, each a rate source into Spark's no-op
sink) on one supervisor process with three slots and real Spark. Worker ``i`` of ``N``
runs the components whose index in sorted order is ``i mod N``:

* 1 -> 2 workers: worker-0 goes from [a, b] to [a]: it restarts, worker-1 starts with [b];
* 2 -> 3 workers: worker-0 keeps [a] and worker-1 keeps [b]: both run on, untouched (same
  processes), told their new place; worker-2 starts with nothing to run.
"""

from __future__ import annotations

import pytest
from helpers import observer, run_cli
from waiting import wait_for

from nimbus.dev.cluster import LocalCluster
from nimbus.dev.feed import WORKER_MODULE, processes_with_arg
from nimbus.distribution.archive import pack_directory

pytestmark = [pytest.mark.slow, pytest.mark.integration]

TOPOLOGY_PY = '''
def build(spark, conf):
    def query(rate):
        return (spark.readStream.format("rate").option("rowsPerSecond", rate).load()
                .writeStream.format("noop").trigger(processingTime="1 second"))
    return {"a": query(1), "b": query(2)}
'''
SPARK_CONF = {"spark.ui.enabled": "false", "spark.driver.memory": "512m",
              "spark.sql.shuffle.partitions": "1"}
SPARK_TIMEOUT_S = 180


def test_a_rebalance_keeps_the_workers_whose_components_stay(tmp_path):
    code = tmp_path / "two"
    code.mkdir()
    (code / "topology.py").write_text(TOPOLOGY_PY)
    with LocalCluster(tmp_path / "cluster", nimbuses=1, supervisors=1, slots_per_supervisor=3,
                      conf={"supervisor.monitor.frequency.secs": 1,
                            "topology.spark.master": "local[1]",
                            "topology.spark.conf": SPARK_CONF,
                            "topology.spark.checkpoint.dir": str(tmp_path / "ck")}) as cluster:
        state = observer(cluster)
        supervisor = cluster.supervisors[0]
        config = str(cluster.config_file)
        topology_id = cluster.client().submit("two", pack_directory(code), {})

        def slots() -> dict[str, int]:
            assignment = state.assignment_info(topology_id)
            return {e: int(p) for e, (_, p) in assignment.executor_node_port.items()}

        def pid_of(executor: str) -> int | None:
            port = slots().get(executor)
            if port is None:
                return None
            pids = processes_with_arg(WORKER_MODULE, str(supervisor.worker_dir(topology_id,
                                                                               port)))
            return pids[0] if len(pids) == 1 else None

        def runs(executor: str, components: list[str]) -> bool:
            """The worker's newest log says it runs ``components`` and started them."""
            port = slots().get(executor)
            log = supervisor.worker_log(topology_id, port) if port else None
            if log is None or not log.exists():
                return False
            text = log.read_text()
            return f"runs {components}" in text and all(
                f"started query {topology_id}.{c}" in text.rsplit("runs ", 1)[1]
                for c in components)

        wait_for(lambda: runs("worker-0", ["a", "b"]), SPARK_TIMEOUT_S, "worker-0 on a, b")
        first = pid_of("worker-0")

        run_cli("rebalance", "two", "-n", "2", "--config", config, check=True)
        wait_for(lambda: runs("worker-1", ["b"]) and pid_of("worker-0") not in (None, first)
                 and runs("worker-0", ["a"]), SPARK_TIMEOUT_S,
                 "worker-0 restarted on [a] and worker-1 on [b]")
        kept = {e: pid_of(e) for e in ("worker-0", "worker-1")}
        mark = len(supervisor.log_text())

        run_cli("rebalance", "two", "-n", "3", "--config", config, check=True)
        wait_for(lambda: runs("worker-2", []), SPARK_TIMEOUT_S, "worker-2 to start")
        assert {e: pid_of(e) for e in ("worker-0", "worker-1")} == kept, \
            "the workers whose components stayed run on, as the same processes"
        log = supervisor.log_text()[mark:]
        for executor, components in (("worker-0", ["a"]), ("worker-1", ["b"])):
            assert (f"as worker {executor[-1]} of 3 it runs {components}, as it did as "
                    f"worker {executor[-1]} of 2") in log
        assert "its place in the topology changed" not in log
        for executor in ("worker-0", "worker-1"):
            port = slots()[executor]
            text = supervisor.worker_log(topology_id, port).read_text()
            assert f"rebalanced: now worker {executor[-1]} of 3" in text
