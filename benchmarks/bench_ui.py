"""Benchmark of the UI: REST latency with 1,000 topologies, and the CPU an open dashboard
costs the serving process.

1,000 topologies (with assignments and a replica each) are written straight into a real
ZooKeeper as records, as the leader would; ``nimbus-ha ui`` then runs as its own process
and this script measures

* p99 latency of GET /api/v1/topology/summary (sequential requests, after a warm-up);
* the UI process's CPU time (utime + stime from /proc) over ``--seconds`` with nobody
  polling, then with one poller making the dashboard's request every second (what an
  open page does).

    .venv/bin/python benchmarks/bench_ui.py [--topologies 1000] [--seconds 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests
import yaml
from kazoo.client import KazooClient

from nimbus.dev.cluster import wait_for
from nimbus.dev.zookeeper import ZooKeeperServer, free_port
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.records import ACTIVE, Assignment, NimbusInfo, StormBase, SupervisorInfo


def write_cluster(state: StormClusterState, n: int) -> None:
    zk, now = state.zk, int(time.time())
    state.register_nimbus(NimbusInfo(host="127.0.0.1", port=1, start_time_secs=now,
                                     version="0.1.0"))
    zk.create(state.path("leader-lock", "nimbus-0000000001"), b"127.0.0.1:1", ephemeral=True)
    state.supervisor_heartbeat("sup-a", SupervisorInfo(
        time_secs=now, hostname="host-a", meta=list(range(6700, 6700 + n))))
    txn = None
    for i in range(n):
        if txn is None:
            txn = zk.transaction()
        tid = f"topo{i:04d}-{i}-{now}"
        txn.create(state.storm_path(tid), StormBase(
            storm_name=f"topo{i:04d}", launch_time_secs=now, status=ACTIVE).encode())
        txn.create(state.path("assignments", tid), Assignment(
            master_code_dir="/code", node_host={"sup-a": "host-a"},
            executor_node_port={"worker-0": ["sup-a", 6700 + i]}).encode())
        txn.create(state.code_path(tid), b"")
        txn.create(state.code_path(tid) + "/127.0.0.1:1", b"")
        if i % 50 == 49:
            txn.commit()
            txn = None
    if txn is not None:
        txn.commit()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_cpu(pid: int, seconds: float, poll_url: str | None) -> float:
    start_cpu, start = cpu_seconds(pid), time.monotonic()
    session = requests.Session()
    while time.monotonic() - start < seconds:
        tick = time.monotonic()
        if poll_url:
            session.get(poll_url, timeout=10).raise_for_status()
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    return (cpu_seconds(pid) - start_cpu) / (time.monotonic() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topologies", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--requests", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ui-") as tmp:
        server = ZooKeeperServer(Path(tmp) / "zk")
        server.start()
        ui = None
        try:
            zk = KazooClient(hosts=server.hosts)
            zk.start(timeout=15)
            state = StormClusterState(zk, "/storm")
            state.setup()
            started = time.monotonic()
            write_cluster(state, args.topologies)
            print(f"wrote {args.topologies} topologies in {time.monotonic() - started:.1f}s")
            port = free_port()
            conf_file = Path(tmp) / "ui.yaml"
            conf_file.write_text(yaml.safe_dump({
                "storm.zookeeper.servers": ["127.0.0.1"],
                "storm.zookeeper.port": server.port, "ui.port": port,
                "nimbus.seeds": ["127.0.0.1:1"]}))
            ui = subprocess.Popen([sys.executable, "-m", "nimbus.cli", "--log-level",
                                   "WARNING", "ui", "--config", str(conf_file)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            base = f"http://127.0.0.1:{port}"
            session = requests.Session()

            def count() -> bool:
                got = session.get(base + "/api/v1/topology/summary", timeout=10).json()
                return len(got["topologies"]) == args.topologies
            wait_for(count, 60, "the UI to list every topology", interval_s=0.2)
            for _ in range(20):
                session.get(base + "/api/v1/topology/summary", timeout=10)
            latencies = []
            for _ in range(args.requests):
                t0 = time.perf_counter()
                response = session.get(base + "/api/v1/topology/summary", timeout=10)
                latencies.append((time.perf_counter() - t0) * 1000)
                response.raise_for_status()
            latencies.sort()
            p50 = statistics.median(latencies)
            p99 = latencies[int(len(latencies) * 0.99) - 1]
            size = len(response.content)
            print(f"GET /api/v1/topology/summary, {args.topologies} topologies, "
                  f"{size / 1024:.0f} KiB: p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
                  f"max {latencies[-1]:.1f} ms (target p99 < 50 ms: "
                  f"{'OK' if p99 < 50 else 'MISSED'})")
            dash = session.get(base + "/api/v1/ui/dashboard", timeout=10).content
            time.sleep(12)  # let the demand from that request lapse
            idle = measure_cpu(ui.pid, args.seconds, None)
            polled = measure_cpu(ui.pid, args.seconds, base + "/api/v1/ui/dashboard")
            print(f"UI process CPU: idle {idle * 100:.2f}% of a core, with a 1 s dashboard "
                  f"poller ({len(dash) / 1024:.0f} KiB a refresh) {polled * 100:.2f}%: "
                  f"added {(polled - idle) * 100:.2f}% of a core (target < 5%: "
                  f"{'OK' if polled - idle < 0.05 else 'MISSED'})")
            zk.stop()
        finally:
            if ui is not None:
                ui.terminate()
                ui.wait(timeout=30)
            server.stop()


if __name__ == "__main__":
    main()
