"""A cluster on loopback: one real ZooKeeper server and N nimbus processes.

Used by ``nimbus-ha dev-cluster``, by the integration tests and by the benchmarks, so all
three exercise the same separate processes: each nimbus is ``nimbus-ha nimbus`` in its
own process group with its own ``storm.local.dir``, and can be killed with SIGKILL,
stopped with SIGTERM, frozen with SIGSTOP, wiped and restarted.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from nimbus.config import Config, load_config
from nimbus.state.zkserver import ZooKeeperServer, free_port, port_open
from nimbus.thrift.client import NimbusClient

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout_s: float, what: str,
             interval_s: float = 0.05) -> T:
    """Poll ``condition`` until it returns a truthy value; raise TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except Exception as exc:  # the cluster may be mid-failover; keep asking
            last_error = exc
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}"
                       + (f" (last error: {last_error})" if last_error else ""))


class NimbusProcess:
    """One ``nimbus-ha nimbus`` subprocess."""

    def __init__(self, index: int, port: int, local_dir: Path, config_file: Path, log_file: Path):
        self.index = index
        self.port = port
        self.local_dir = local_dir
        self.config_file = config_file
        self.log_file = log_file
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        log = open(self.log_file, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "nimbus.cli", "nimbus", "--config", str(self.config_file)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        log.close()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.process.pid, sig)

    def kill9(self) -> None:
        self.signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait(timeout=10)

    def terminate(self, timeout_s: float = 30) -> None:
        self.signal(signal.SIGTERM)
        if self.process is not None:
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill9()

    def wipe(self) -> None:
        shutil.rmtree(self.local_dir, ignore_errors=True)

    def log_text(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""


class LocalCluster:
    """ZooKeeper plus ``n`` nimbuses under ``work_dir``; use as a context manager."""

    def __init__(self, work_dir: Path, nimbuses: int = 3, base_port: int | None = None,
                 conf: dict[str, Any] | None = None, zk_port: int | None = None):
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.zk = ZooKeeperServer(self.work_dir / "zookeeper", port=zk_port)
        ports = [base_port + i if base_port else free_port() for i in range(nimbuses)]
        self.conf_values: dict[str, Any] = {
            "storm.zookeeper.servers": ["127.0.0.1"],
            "storm.zookeeper.port": self.zk.port,
            "storm.zookeeper.session.timeout": 4000,
            "nimbus.seeds": [f"127.0.0.1:{p}" for p in ports],
            "nimbus.host": "127.0.0.1",
            "nimbus.monitor.freq.secs": 1,
            **(conf or {}),
        }
        self.nimbuses = [self._make_nimbus(i, port) for i, port in enumerate(ports)]

    def _make_nimbus(self, index: int, port: int) -> NimbusProcess:
        local_dir = self.work_dir / f"nimbus-{index}"
        config_file = self.work_dir / f"nimbus-{index}.yaml"
        config_file.write_text(yaml.safe_dump({
            **self.conf_values, "nimbus.thrift.port": port, "storm.local.dir": str(local_dir)}))
        return NimbusProcess(index, port, local_dir, config_file,
                             self.work_dir / f"nimbus-{index}.log")

    def add_nimbus(self) -> NimbusProcess:
        """Configure one more nimbus (not started; the seeds list stays as it was)."""
        nimbus = self._make_nimbus(len(self.nimbuses), free_port())
        self.nimbuses.append(nimbus)
        return nimbus

    @property
    def config_file(self) -> Path:
        return self.nimbuses[0].config_file

    def client_conf(self, **overrides: Any) -> Config:
        values = {**self.conf_values, **overrides}
        return load_config(overrides=values)

    def client(self, deadline_s: float = 60.0) -> NimbusClient:
        return NimbusClient(self.client_conf(), deadline_s=deadline_s)

    def start(self, wait: bool = True) -> LocalCluster:
        self.zk.start()
        for nimbus in self.nimbuses:
            nimbus.start()
        if wait:
            for nimbus in self.nimbuses:
                wait_for(lambda n=nimbus: port_open(n.port) or not n.alive() and _died(n),
                         60, f"nimbus {nimbus.address} to listen")
            self.wait_for_leader()
        return self

    def leader_address(self) -> str | None:
        """The leader as the nimbuses report it (None if they do not agree on one)."""
        try:
            info = self.client(deadline_s=5).cluster_info()
        except Exception:
            return None
        leaders = [f"{n.host}:{n.port}" for n in info.nimbuses if n.isLeader]
        return leaders[0] if len(leaders) == 1 else None

    def wait_for_leader(self, timeout_s: float = 60, exclude: str | None = None) -> NimbusProcess:
        def leader() -> NimbusProcess | None:
            address = self.leader_address()
            for nimbus in self.nimbuses:
                if nimbus.address == address and address != exclude and nimbus.alive():
                    return nimbus
            return None

        return wait_for(leader, timeout_s, "a leader")

    def stop(self) -> None:
        for nimbus in self.nimbuses:
            nimbus.signal(signal.SIGCONT)
            nimbus.terminate(timeout_s=15)
        self.zk.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _died(nimbus: NimbusProcess) -> bool:
    raise RuntimeError(f"nimbus {nimbus.address} exited; log:\n{nimbus.log_text()[-3000:]}")


def sample_topology(directory: Path, size_bytes: int = 64 * 1024) -> Path:
    """Write a small PySpark-style pipeline bundle into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "pipeline.py").write_text(
        '"""Sample pipeline: word counts over a stream of lines."""\n'
        "def run(spark, lines):\n"
        "    return lines.flatMap(str.split).map(lambda w: (w, 1)).reduceByKey(int.__add__)\n")
    (directory / "data.bin").write_bytes(os.urandom(size_bytes))
    return directory


def run_dev_cluster(work_dir: Path, nimbuses: int, base_port: int, demo: bool) -> None:
    """Start a dev cluster, optionally run the failover demo, then wait for Ctrl-C."""
    import click

    cluster = LocalCluster(work_dir, nimbuses, base_port=base_port,
                           conf={"topology.min.replication.count": min(2, nimbuses)})
    click.echo(f"starting ZooKeeper and {nimbuses} nimbuses under {work_dir} ...")
    with cluster:
        leader = cluster.wait_for_leader()
        click.echo(f"ZooKeeper at {cluster.zk.hosts}; nimbuses: "
                   + ", ".join(n.address for n in cluster.nimbuses))
        click.echo(f"leader: {leader.address}")
        click.echo(f"try: nimbus-ha cluster-info --config {cluster.config_file}")
        if demo:
            _demo(cluster, work_dir)
            return
        click.echo("Ctrl-C stops the cluster")
        try:
            while all(n.alive() for n in cluster.nimbuses if n.process):
                time.sleep(1)
        except KeyboardInterrupt:
            click.echo("stopping")


def _demo(cluster: LocalCluster, work_dir: Path) -> None:
    import click

    client = cluster.client()
    bundle = sample_topology(work_dir / "sample-topology")
    topology_id = client.submit("wordcount", _pack(bundle),
                                {"topology.min.replication.count": 2})
    click.echo(f"submitted wordcount as {topology_id}")
    click.echo(_topology_line(client))
    leader = cluster.wait_for_leader()
    click.echo(f"kill -9 the leader {leader.address} and delete its storm.local.dir ...")
    started = time.monotonic()
    leader.kill9()
    leader.wipe()
    new = cluster.wait_for_leader(exclude=leader.address, timeout_s=120)
    click.echo(f"new leader {new.address} after {time.monotonic() - started:.1f}s "
               f"(session timeout {cluster.conf_values['storm.zookeeper.session.timeout']} ms)")
    click.echo(_topology_line(client))
    client.deactivate("wordcount")
    click.echo("deactivated on the new leader: " + _topology_line(client))
    client.activate("wordcount")
    click.echo("activated on the new leader:   " + _topology_line(client))
    click.echo("demo done: the topology survived the failover without resubmission")


def _pack(directory: Path) -> bytes:
    from nimbus.distribution.archive import pack_directory

    return pack_directory(directory)


def _topology_line(client: NimbusClient) -> str:
    info = client.cluster_info()
    return "; ".join(f"{t.name} {t.status} replicas={t.replication_count}"
                     for t in info.topologies) or "(no topologies)"
