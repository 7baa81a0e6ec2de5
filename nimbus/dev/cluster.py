"""A cluster on loopback: one real ZooKeeper server, N nimbus and M supervisor processes.

Used by ``nimbus-ha dev-cluster``, by the integration tests and by the benchmarks, so all
three exercise the same separate processes: each nimbus is ``nimbus-ha nimbus`` and each
supervisor ``nimbus-ha supervisor``, in its own process group with its own
``storm.local.dir`` (a supervisor also has its own slot ports), and can be killed with
SIGKILL, stopped with SIGTERM, frozen with SIGSTOP, wiped and restarted. A supervisor's
workers run in process groups of their own, so signals to a supervisor never reach them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from nimbus.config import Config
from nimbus.dev.watch import DaemonWatch
from nimbus.dev.zookeeper import ZooKeeperServer, free_port, port_open
from nimbus.distribution.distributors import load_cluster_config
from nimbus.state.worker_logs import DEFAULT_ARTIFACTS, LOG_FILE, log_root
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


class DaemonProcess:
    """One ``nimbus-ha <daemon> --config FILE`` subprocess in its own process group."""

    DAEMON = ""
    # Its /metrics port when the cluster was made with metrics=True, else 0 (none).
    metrics_port = 0

    def __init__(self, index: int, local_dir: Path, config_file: Path, log_file: Path):
        self.index = index
        self.local_dir = local_dir
        self.config_file = config_file
        self.log_file = log_file
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.log_file, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "nimbus.cli", self.DAEMON, "--config", str(self.config_file)],
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

    @property
    def metrics_url(self) -> str:
        """``http://127.0.0.1:<metrics_port>/metrics`` (metrics_port must be set)."""
        return f"http://127.0.0.1:{self.metrics_port}/metrics"


class NimbusProcess(DaemonProcess):
    """One ``nimbus-ha nimbus`` subprocess."""

    DAEMON = "nimbus"

    def __init__(self, index: int, port: int, local_dir: Path, config_file: Path, log_file: Path):
        super().__init__(index, local_dir, config_file, log_file)
        self.port = port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


class SupervisorProcess(DaemonProcess):
    """One ``nimbus-ha supervisor`` subprocess with its own slot ports."""

    DAEMON = "supervisor"

    def __init__(self, index: int, ports: list[int], local_dir: Path, config_file: Path,
                 log_file: Path, logviewer_port: int = 0, log_root: Path | None = None):
        super().__init__(index, local_dir, config_file, log_file)
        self.ports = ports
        self.logviewer_port = logviewer_port   # its logviewer.port (0: none)
        # Where its workers' logs are (nimbus/state/worker_logs.py).
        self.log_root = log_root if log_root is not None else local_dir / DEFAULT_ARTIFACTS

    @property
    def id(self) -> str | None:
        """The supervisor id it persisted in its storm.local.dir (None before its start)."""
        path = self.local_dir / "supervisor" / "id"
        try:
            return path.read_text(encoding="utf-8").strip() or None
        except FileNotFoundError:
            return None

    def worker_dir(self, topology_id: str, port: int) -> Path:
        return self.local_dir / "workers" / f"{topology_id}-{port}"

    def worker_log(self, topology_id: str, port: int) -> Path:
        """The current log file of its slot ``port``'s worker of ``topology_id``."""
        return self.log_root / topology_id / str(port) / LOG_FILE

    @property
    def logviewer_url(self) -> str:
        """``http://127.0.0.1:<logviewer_port>`` (without TLS; logviewer_port must be set)."""
        return f"http://127.0.0.1:{self.logviewer_port}"

    def kill9_group(self) -> None:
        """SIGKILL the supervisor's process group (not its workers: they have their own)."""
        if self.alive():
            os.killpg(self.process.pid, signal.SIGKILL)
        if self.process is not None:
            self.process.wait(timeout=10)


class ExternalZooKeeper:
    """ZooKeeper servers that the caller runs (an ensemble, or proxies in front of one)."""

    def __init__(self, servers: list[str]):
        self.servers = list(servers)
        self.hosts = ",".join(self.servers)
        self.port = int(self.servers[0].rpartition(":")[2])

    def start(self) -> None:
        pass  # the caller's

    def stop(self) -> None:
        pass


def write_private(path: Path, text: str) -> None:
    """Write a daemon's configuration readable by its owner only (mode 0600): it may hold
    credentials (a store's keys, ZooKeeper's digest)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)   # an existing file keeps its mode otherwise
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


class LocalCluster:
    """ZooKeeper plus ``n`` nimbuses under ``work_dir``; use as a context manager."""

    def __init__(self, work_dir: Path, nimbuses: int = 3, base_port: int | None = None,
                 conf: dict[str, Any] | None = None, zk_port: int | None = None,
                 supervisors: int = 0, slots_per_supervisor: int = 2,
                 metrics: bool = False, zk_servers: list[str] | None = None,
                 warm_workers: int = 0, class_archive: bool = False):
        """With ``metrics``, every daemon serves /metrics on a free port of its own
        (its ``metrics_port``): one shared ``conf`` cannot give each process its own.

        ``warm_workers`` is each supervisor's ``supervisor.warm.workers`` (unless ``conf``
        sets it): none by default, since every one is a JVM and all the daemons of a local
        cluster share one machine. ``class_archive`` is their
        ``supervisor.spark.class.archive`` (unless ``conf`` sets it): off by default, since
        each supervisor would build its own (a JVM's start, about 30 s of CPU)."""
        self.metrics = metrics
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        # Absolute: every path below goes to daemons and topologies that run elsewhere.
        self.work_dir = self.work_dir.resolve()
        # zk_servers ("host:port" each): an ensemble, or proxies, run by the caller.
        self.zk: ZooKeeperServer | ExternalZooKeeper = (
            ExternalZooKeeper(zk_servers) if zk_servers else
            ZooKeeperServer(self.work_dir / "zookeeper", port=zk_port))
        ports = [base_port + i if base_port else free_port() for i in range(nimbuses)]
        self.conf_values: dict[str, Any] = {
            "storm.zookeeper.servers": list(zk_servers) if zk_servers else ["127.0.0.1"],
            "storm.zookeeper.port": self.zk.port,
            "storm.zookeeper.session.timeout": 4000,
            "nimbus.seeds": [f"127.0.0.1:{p}" for p in ports],
            "nimbus.host": "127.0.0.1",
            "nimbus.monitor.freq.secs": 1,
            "supervisor.warm.workers": warm_workers,
            "supervisor.spark.class.archive": class_archive,
            **(conf or {}),
        }
        self.nimbuses = [self._make_nimbus(i, port) for i, port in enumerate(ports)]
        self.slots_per_supervisor = slots_per_supervisor
        self.supervisors: list[SupervisorProcess] = []
        for _ in range(supervisors):
            self.add_supervisor()
        self._observer: Any = None

    def _make_nimbus(self, index: int, port: int) -> NimbusProcess:
        local_dir = self.work_dir / f"nimbus-{index}"
        config_file = self.work_dir / f"nimbus-{index}.yaml"
        metrics_port = free_port() if self.metrics else 0
        write_private(config_file, yaml.safe_dump({
            **self.conf_values, "nimbus.thrift.port": port, "storm.local.dir": str(local_dir),
            **({"nimbus.metrics.port": metrics_port} if metrics_port else {})}))
        nimbus = NimbusProcess(index, port, local_dir, config_file,
                               self.work_dir / f"nimbus-{index}.log")
        nimbus.metrics_port = metrics_port
        return nimbus

    def add_nimbus(self) -> NimbusProcess:
        """Configure one more nimbus (not started; the seeds list stays as it was)."""
        nimbus = self._make_nimbus(len(self.nimbuses), free_port())
        self.nimbuses.append(nimbus)
        return nimbus

    def add_supervisor(self, ports: list[int] | None = None) -> SupervisorProcess:
        """Configure one more supervisor (not started) with ``ports`` as its slots, or
        ``slots_per_supervisor`` free ones."""
        index = len(self.supervisors)
        ports = list(ports) if ports is not None else [
            free_port() for _ in range(self.slots_per_supervisor)]
        local_dir = self.work_dir / f"supervisor-{index}"
        config_file = self.work_dir / f"supervisor-{index}.yaml"
        metrics_port = free_port() if self.metrics else 0
        # Each its own logviewer port (all share one host), unless the cluster has none.
        logviewer_port = 0 if self.conf_values.get("logviewer.port") == 0 else free_port()
        values = {**self.conf_values, "storm.local.dir": str(local_dir),
                  "storm.local.hostname": "127.0.0.1", "supervisor.slots.ports": ports,
                  "logviewer.port": logviewer_port,
                  **({"supervisor.metrics.port": metrics_port} if metrics_port else {})}
        write_private(config_file, yaml.safe_dump(values))
        supervisor = SupervisorProcess(index, ports, local_dir, config_file,
                                       self.work_dir / f"supervisor-{index}.log",
                                       logviewer_port=logviewer_port,
                                       log_root=log_root(values))
        supervisor.metrics_port = metrics_port
        self.supervisors.append(supervisor)
        return supervisor

    def registered_supervisors(self) -> set[str]:
        """Ids of the supervisors registered in ZooKeeper now (a client of the cluster's)."""
        from kazoo.exceptions import NoNodeError

        from nimbus.state.zk_client import make_zk_client

        if self._observer is None:
            # With the cluster's ZooKeeper credentials, when it has them.
            self._observer = make_zk_client(self.client_conf(), name="dev-cluster-observer")
        root = "/" + str(self.conf_values.get("storm.zookeeper.root", "/storm")).strip("/")
        try:
            return set(self._observer.get_children(f"{root}/supervisors"))
        except NoNodeError:
            return set()

    def start_supervisor(self, supervisor: SupervisorProcess, wait: bool = True,
                         timeout_s: float = 60) -> SupervisorProcess:
        """Start ``supervisor``; with ``wait``, until it has registered in ZooKeeper."""
        supervisor.start()
        if wait:
            def registered() -> bool:
                if not supervisor.alive():
                    raise RuntimeError(f"supervisor {supervisor.index} exited; log:\n"
                                       f"{supervisor.log_text()[-3000:]}")
                return supervisor.id is not None and \
                    supervisor.id in self.registered_supervisors()

            wait_for(registered, timeout_s, f"supervisor {supervisor.index} to register")
        return supervisor

    @property
    def config_file(self) -> Path:
        return self.nimbuses[0].config_file

    def client_conf(self, **overrides: Any) -> Config:
        values = {**self.conf_values, **overrides}
        return load_cluster_config(overrides=values)

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
        for supervisor in self.supervisors:
            self.start_supervisor(supervisor, wait=wait)
        return self

    def leader_address(self) -> str | None:
        """The leader as the nimbuses report it (None if they do not agree on one)."""
        try:
            info = self.client(deadline_s=0).cluster_info()  # one look: callers poll
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
        # Supervisors first: each stops its workers before its session ends. Each kind
        # stops all at once: a dozen sequential shutdowns add up.
        terminate_all(self.supervisors, timeout_s=30)
        if self._observer is not None:
            self._observer.stop()
            self._observer.close()
            self._observer = None
        terminate_all(self.nimbuses, timeout_s=15)
        self.zk.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def terminate_all(processes: Sequence[DaemonProcess], timeout_s: float) -> None:
    """SIGCONT and SIGTERM to every one of ``processes`` at once, then wait for each; one
    still running ``timeout_s`` after the signals is killed with SIGKILL."""
    for process in processes:
        process.signal(signal.SIGCONT)
        process.signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for process in processes:
        if process.process is None:
            continue
        try:
            process.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill9()


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


#: Keys a dev cluster sets for each daemon itself: they put it on loopback, on its own
#: ZooKeeper, ports and directories, whatever a configuration file says.
DEV_CLUSTER_KEYS = ("storm.zookeeper.servers", "storm.zookeeper.port", "nimbus.seeds",
                    "nimbus.host", "nimbus.thrift.port", "storm.local.dir",
                    "storm.local.hostname", "supervisor.slots.ports", "supervisor.warm.workers",
                    "logviewer.port")


def dev_cluster_conf(conf: Config) -> tuple[dict[str, Any], list[str]]:
    """(the keys of ``conf`` that differ from the defaults, to pass to every daemon; the
    keys among those that a dev cluster sets itself and so ignores)."""
    defaults = load_cluster_config(overrides={})
    changed = {k: v for k, v in conf.items() if k not in defaults or defaults[k] != v}
    ignored = sorted(k for k in changed if k in DEV_CLUSTER_KEYS)
    chosen = {k: v for k, v in changed.items() if k not in DEV_CLUSTER_KEYS}
    # A secret read from a file or a variable goes on as that reference, never in clear.
    for key, (reference_key, reference) in conf.indirect.items():
        chosen.pop(key, None)
        chosen[reference_key] = reference
    return chosen, ignored


#: Keys a client command never needs: the code distributor's (its secrets included) and
#: a daemon's own directories.
_DAEMON_ONLY_PREFIXES = ("nimbus.codedistributor.", "storm.local.dir")


def write_client_conf(cluster: LocalCluster) -> Path:
    """Write ``client.yaml`` (mode 0600) for client commands: the cluster's settings
    without the distributor's keys, so a secret the daemons read from a variable or a
    file (``<key>.env``, ``<key>.file``) need not be there for ``list`` or ``submit``."""
    path = cluster.work_dir / "client.yaml"
    values = {key: value for key, value in cluster.conf_values.items()
              if not key.startswith(_DAEMON_ONLY_PREFIXES)}
    write_private(path, yaml.safe_dump(values))
    return path


def run_dev_cluster(work_dir: Path, nimbuses: int, base_port: int,
                    demo: Callable[[LocalCluster, Path], bool] | None,
                    supervisors: int = 0, conf: dict[str, Any] | None = None,
                    warm_workers: int = 0, restart: bool = False) -> None:
    """Start a dev cluster, then run ``demo(cluster, work_dir)`` (False: exit 1; see
    :func:`nimbus.dev.demo.run_demos`) or wait for Ctrl-C. ``conf`` is given to
    every nimbus and supervisor (see :func:`dev_cluster_conf`)."""
    import click

    work_dir = Path(work_dir).expanduser().absolute()  # what daemons and topologies get
    cluster = LocalCluster(work_dir, nimbuses, base_port=base_port,
                           conf={"topology.min.replication.count": min(2, nimbuses),
                                 # Shared by its supervisors, as on a real cluster, where
                                 # it must be shared storage: a moved worker resumes.
                                 "topology.spark.checkpoint.dir": str(work_dir /
                                                                      "checkpoints"),
                                 **(conf or {})},
                           supervisors=supervisors, warm_workers=warm_workers)
    click.echo(f"starting ZooKeeper, {nimbuses} nimbuses and {supervisors} supervisors "
               f"under {work_dir} ...")
    # SIGTERM stops the cluster as Ctrl-C does: the daemons run in sessions of their own,
    # so the default (dying at once) would leave them all running. It is also the only
    # way to stop a dev cluster started in the background of a script, whose shell
    # makes it ignore SIGINT.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        _run(cluster, work_dir, demo, restart)
    finally:
        ended = end_left_workers(cluster)
        if ended:
            click.echo(f"ended {ended} workers left frozen by supervisors that were killed "
                       "and not started again")


def end_left_workers(cluster: LocalCluster) -> int:
    """End what the cluster's supervisors left in their cgroups once they are stopped: the
    workers of a supervisor killed and never started again stay frozen, waiting for a
    supervisor to take them over (docs/runtime.md), and the dev cluster is going away.
    Returns how many worker cgroups were ended."""
    from nimbus.supervisor.cgroups import unified_root
    from nimbus.supervisor.orphans import TREE
    from nimbus.worker_protocol.frozen_cgroup import REAPERS_CGROUP, end_cgroup

    root = unified_root()
    if root is None:
        return 0
    ended = 0
    for supervisor in cluster.supervisors:
        if supervisor.alive() or supervisor.id is None:
            continue
        base = root / TREE / supervisor.id
        try:
            left = [d for d in base.iterdir() if d.is_dir() and not d.name.startswith(".")]
        except OSError:
            continue
        for cgroup in left:  # the frozen workers' reapers too: nothing is left to reap
            try:
                held = bool((cgroup / "cgroup.procs").read_text().split())
            except OSError:
                continue
            # An empty one (its worker was killed with the supervisor) is only removed.
            if end_cgroup(cgroup) and held and cgroup.name != REAPERS_CGROUP:
                ended += 1
        with contextlib.suppress(OSError):  # the supervisor's own, once empty
            base.rmdir()
    return ended


def _run(cluster: LocalCluster, work_dir: Path,
         demo: Callable[[LocalCluster, Path], bool] | None, restart: bool) -> None:
    import click

    with cluster:
        leader = cluster.wait_for_leader()
        click.echo(f"ZooKeeper at {cluster.zk.hosts}; nimbuses: "
                   + ", ".join(f"{n.address} (pid {n.process.pid})" for n in cluster.nimbuses
                               if n.process))
        for supervisor in cluster.supervisors:
            pid = supervisor.process.pid if supervisor.process else "?"
            viewer = f"; logviewer on port {supervisor.logviewer_port}" \
                if supervisor.logviewer_port else ""
            click.echo(f"supervisor {supervisor.id} (pid {pid}): slots "
                       + ",".join(map(str, supervisor.ports)) + viewer)
        leader_pid = leader.process.pid if leader.process else "?"
        click.echo(f"leader: {leader.address} (pid {leader_pid})")
        client_file = write_client_conf(cluster)
        click.echo(f"try: nimbus-ha cluster-info --config {client_file}")
        if demo is not None:
            if not demo(cluster, work_dir):
                raise SystemExit(1)
            return
        click.echo("Ctrl-C (or SIGTERM) stops the cluster")
        watch = DaemonWatch(lambda: [*cluster.nimbuses, *cluster.supervisors], cluster.zk,
                            lambda line: click.echo(line, err=True), restart=restart)
        try:
            if not watch.run(threading.Event()):
                raise SystemExit(1)
        except KeyboardInterrupt:
            click.echo("stopping")


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt
