"""Benchmark: failover time after kill -9 of the leader (as a ratio to the ZooKeeper
session timeout) and after SIGTERM (seconds), on a 3-nimbus loopback cluster.

    .venv/bin/python benchmarks/bench_failover.py [--trials 5] [--session-timeout-ms 4000] \
        [--topologies 100]

With ``--topologies N`` the cluster first runs N topologies (32 KB bundles, each on all 3
nimbuses), so that the new leader must verify that it holds all their code before it
leads; without it the cluster runs none. Failover time = from the signal until a
surviving nimbus reports itself leader over Thrift.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from nimbus.dev.cluster import LocalCluster, NimbusProcess, sample_topology, wait_for
from nimbus.distribution.archive import pack_directory
from nimbus.thrift.client import connect


def reports_itself_leader(nimbus: NimbusProcess) -> bool:
    with connect(nimbus.address, timeout_s=2) as raw:
        return any(n.isLeader and f"{n.host}:{n.port}" == nimbus.address
                   for n in raw.getClusterInfo().nimbuses)


def failover_once(cluster: LocalCluster, how: str) -> float:
    leader = cluster.wait_for_leader()
    others = [n for n in cluster.nimbuses if n is not leader]
    for n in others:  # every survivor queued, so the measurement starts from steady state
        wait_for(lambda n=n: n.address in {a for _, a in _queue(cluster)}, 30, "queueing")
    started = time.monotonic()
    if how == "kill9":
        leader.kill9()
    else:
        leader.signal(15)
    wait_for(lambda: any(reports_itself_leader(n) for n in others), 120, "a new leader",
             interval_s=0.01)
    elapsed = time.monotonic() - started
    if how != "kill9":
        leader.process.wait(timeout=30)
    leader.start()
    wait_for(lambda: leader.address in {a for _, a in _queue(cluster)}, 60, "rejoin")
    return elapsed


def _queue(cluster: LocalCluster):
    from kazoo.client import KazooClient

    from nimbus.state.cluster_state import StormClusterState

    zk = KazooClient(hosts=cluster.zk.hosts)
    zk.start(timeout=10)
    try:
        return StormClusterState(zk, "/storm").leader_queue()
    finally:
        zk.stop()
        zk.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--session-timeout-ms", type=int, default=4000)
    parser.add_argument("--topologies", type=int, default=0)
    args = parser.parse_args()
    timeout_s = args.session_timeout_ms / 1000
    with tempfile.TemporaryDirectory() as tmp, LocalCluster(
            Path(tmp), 3, conf={"storm.zookeeper.session.timeout": args.session_timeout_ms}
    ) as cluster:
        if args.topologies:
            directory = sample_topology(Path(tmp) / "topology", 32 * 1024)
            # submit refuses a bundle with neither topology.py nor topology.yaml
            (directory / "topology.yaml").write_text('command: ["sleep", "3600"]\n')
            bundle = pack_directory(directory)
            client = cluster.client()
            for i in range(args.topologies):
                client.submit(f"bench-{i}", bundle, {"topology.min.replication.count": 3})
            assert len(client.cluster_info().topologies) == args.topologies
        kills = [failover_once(cluster, "kill9") for _ in range(args.trials)]
        terms = [failover_once(cluster, "sigterm") for _ in range(args.trials)]
    print(f"session timeout: {timeout_s:.1f} s, {args.trials} trials each, 3 nimbuses, "
          f"{args.topologies} topologies")
    print(f"kill -9 failover: median {statistics.median(kills):.2f} s, "
          f"max {max(kills):.2f} s -> ratio to session timeout "
          f"{statistics.median(kills) / timeout_s:.2f} (max {max(kills) / timeout_s:.2f}; "
          f"target <= 1.2)")
    print(f"SIGTERM failover: median {statistics.median(terms):.3f} s, "
          f"max {max(terms):.3f} s (target < 0.5 s)")


if __name__ == "__main__":
    main()
