"""The partition lab's cluster: ZooKeeper, 2 nimbuses, 2 supervisors and a client node,
each in a network namespace of its own (:mod:`netlab`), each daemon bound to its node's
address.

The daemons are the same ``nimbus-ha nimbus|supervisor --config FILE`` processes as in
:mod:`nimbus.dev.cluster`, started with ``ip netns exec``, each in its own process group
and with its output in ``<work>/<name>.log``. The test process cannot reach the lab's
addresses, so whatever talks to the cluster (:mod:`probe` for one call, :mod:`workload`
for a recorded history) runs inside the client node; files and pids are shared, so
logs, output directories and /proc are read from here.

``NIMBUS_LAB_PYTHONPATH`` (or the ``pythonpath`` argument) is put first on the
PYTHONPATH of every daemon, probe and workload: the lab then runs another checkout of
nimbus-ha (an older commit, say) with this lab. ZooKeeper itself is always started from
this checkout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from labprocess import (
    THRIFT_PORT,
    LabError,
    LabNimbus,
    LabProcess,
    LabSupervisor,
    Workload,
    wait_until,
)
from leadership import current_leader, log_events, negotiated_timeouts_ms, session_expiries
from nemesis import Nemesis
from netlab import LabNetwork

PYTHON = sys.executable
LAB_DIR = Path(__file__).resolve().parent
REPO = LAB_DIR.parents[1]
ZK_PORT = 2181
FIRST_SLOT = 6700
PYTHONPATH_ENV = "NIMBUS_LAB_PYTHONPATH"
NODE_NAMES = ("zk", "nimbus-0", "nimbus-1", "supervisor-0", "supervisor-1", "client")
START_TIMEOUT_S = 90.0


class PartitionLab:
    """Network, ZooKeeper, nimbuses and supervisors of one run; a context manager."""

    def __init__(self, work: Path, session_ms: int = 6000, conf: dict[str, Any] | None = None,
                 slots: Sequence[int] = (2, 2), pythonpath: str | None = None,
                 start_supervisors: bool = True):
        """``slots``: how many worker slots each supervisor has. ``conf``: extra keys
        for every daemon. ``pythonpath``: the nimbus-ha checkout to run (default:
        ``$NIMBUS_LAB_PYTHONPATH``, else the installed one)."""
        self.work = Path(work).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.session_ms = session_ms
        self.network = LabNetwork(NODE_NAMES)
        self.nemesis = Nemesis(self.network)
        self.zk_node = self.network["zk"]
        self.client_node = self.network["client"]
        self.start_supervisors = start_supervisors
        path = pythonpath if pythonpath is not None else os.environ.get(PYTHONPATH_ENV, "")
        self.pythonpath = path
        self.conf = {
            "storm.zookeeper.servers": [self.zk_node.address],
            "storm.zookeeper.port": ZK_PORT,
            "storm.zookeeper.session.timeout": session_ms,
            "nimbus.seeds": [f"{self.network[f'nimbus-{i}'].address}:{THRIFT_PORT}"
                             for i in range(2)],
            "nimbus.thrift.port": THRIFT_PORT,
            "nimbus.monitor.freq.secs": 1,
            "nimbus.audit.leader.writes": True,
            "supervisor.monitor.frequency.secs": 1,
            "supervisor.heartbeat.frequency.secs": 1,
            # No warm workers and no class archive: every scenario's timings were measured
            # with cold starts, and an older release under comparison (PYTHONPATH) does not
            # know the keys.
            **({} if path else {"supervisor.warm.workers": 0,
                                "supervisor.spark.class.archive": False}),
            **(conf or {}),
        }
        self.client_config = self.work / "client.yaml"
        self.client_config.write_text(yaml.safe_dump(self.conf))
        env = self.product_env()
        self.zookeeper = LabProcess(
            "zookeeper", self.zk_node,
            [PYTHON, str(LAB_DIR / "zknode.py"), "--dir", str(self.work / "zookeeper"),
             "--host", self.zk_node.address, "--port", str(ZK_PORT)],
            self.work / "zknode.log", self._zk_env())
        self.nimbuses = [self._nimbus(i, env) for i in range(2)]
        self.supervisors = [self._supervisor(i, count, env) for i, count in enumerate(slots)]

    # -- environment and configuration -------------------------------------------------------
    def product_env(self) -> dict[str, str]:
        """The environment of a daemon, probe or workload: the lab's checkout first."""
        env = dict(os.environ)
        paths = [p for p in (self.pythonpath, env.get("PYTHONPATH", "")) if p]
        if paths:
            env["PYTHONPATH"] = os.pathsep.join(paths)
        else:
            env.pop("PYTHONPATH", None)
        return env

    def _zk_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO)  # nimbus.dev.zookeeper of this checkout (it can bind a host)
        return env

    def _nimbus(self, index: int, env: dict[str, str]) -> LabNimbus:
        node = self.network[f"nimbus-{index}"]
        config = self.work / f"nimbus-{index}.yaml"
        config.write_text(yaml.safe_dump({
            **self.conf, "nimbus.host": node.address,
            "nimbus.thrift.bind.address": node.address,
            "storm.local.dir": str(self.work / f"nimbus-{index}")}))
        return LabNimbus(f"nimbus-{index}", node,
                         [PYTHON, "-m", "nimbus.cli", "nimbus", "--config", str(config)],
                         self.work / f"nimbus-{index}.log", env)

    def _supervisor(self, index: int, slots: int, env: dict[str, str]) -> LabSupervisor:
        node = self.network[f"supervisor-{index}"]
        config = self.work / f"supervisor-{index}.yaml"
        local_dir = self.work / f"supervisor-{index}"
        ports = [FIRST_SLOT + i for i in range(slots)]
        config.write_text(yaml.safe_dump({
            **self.conf, "storm.local.hostname": node.address,
            "supervisor.slots.ports": ports, "storm.local.dir": str(local_dir)}))
        return LabSupervisor(f"supervisor-{index}", node,
                             [PYTHON, "-m", "nimbus.cli", "supervisor", "--config", str(config)],
                             self.work / f"supervisor-{index}.log", env, local_dir, ports)

    # -- bring-up and tear-down --------------------------------------------------------------
    def start(self) -> PartitionLab:
        try:
            self.network.up()
            self.zookeeper.start()
            wait_until(lambda: self._zk_serving(), START_TIMEOUT_S, "ZooKeeper to serve",
                       interval_s=0.2)
            for nimbus in self.nimbuses:
                nimbus.start()
            for nimbus in self.nimbuses:
                self._wait_log(nimbus, f"nimbus {nimbus.address} started")
            self.wait_leader(START_TIMEOUT_S)
            if self.start_supervisors:
                for supervisor in self.supervisors:
                    self.start_supervisor(supervisor)
        except BaseException:
            self.stop()
            raise
        return self

    def _zk_serving(self) -> bool:
        self.zookeeper.check_alive()
        return "serving " in self.zookeeper.log_text()

    def _wait_log(self, process: LabProcess, needle: str,
                  timeout_s: float = START_TIMEOUT_S) -> None:
        def logged() -> bool:
            process.check_alive()
            return needle in process.log_text()

        wait_until(logged, timeout_s, f"{process.name} to log {needle!r}", interval_s=0.2)

    def start_supervisor(self, supervisor: LabSupervisor) -> None:
        """Start ``supervisor`` and wait until it registered in ZooKeeper."""
        supervisor.start()

        def registered() -> bool:
            supervisor.check_alive()
            return supervisor.registered()

        wait_until(registered, START_TIMEOUT_S, f"{supervisor.name} to register",
                   interval_s=0.2)

    def stop(self) -> list[str]:
        """Heal, stop every process (workers go with their supervisors; anything left in
        the lab's namespaces is killed), delete the namespaces; returns problems met."""
        self.nemesis.heal()
        # Supervisors, then nimbuses, then ZooKeeper; each kind signalled all at once.
        for group, timeout_s in ((self.supervisors, 20.0), (self.nimbuses, 10.0),
                                 ([self.zookeeper], 10.0)):
            for process in group:
                try:
                    process.signal(signal.SIGCONT)
                    process.signal(signal.SIGTERM)
                except Exception as exc:
                    print(f"signalling {process.name}: {exc}", file=sys.stderr)
            for process in group:
                try:
                    process.stop(timeout_s=timeout_s)
                except Exception as exc:  # go on: the namespaces must go whatever happened
                    print(f"stopping {process.name}: {exc}", file=sys.stderr)
        return self.network.down()

    def __enter__(self) -> PartitionLab:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- reading the cluster from here --------------------------------------------------------
    def zookeeper_log(self) -> str:
        path = self.work / "zookeeper" / "zookeeper.out"
        return path.read_text(errors="replace") if path.exists() else ""

    @property
    def session_s(self) -> float:
        """The session timeout ZooKeeper granted the lab's clients (from its log; the
        requested one if the log does not say)."""
        granted = negotiated_timeouts_ms(self.zookeeper_log())
        return (max(granted) if granted else self.session_ms) / 1000.0

    def session_expiries(self) -> dict[str, list[float]]:
        """Node address -> when ZooKeeper expired a session of that node (its log)."""
        return session_expiries(self.zookeeper_log())

    def leader(self) -> LabNimbus | None:
        """The nimbus whose log says it leads now (gained, not lost since)."""
        name = current_leader({n.name: log_events(n.log_text()) for n in self.nimbuses})
        return next((n for n in self.nimbuses if n.name == name), None)

    def wait_leader(self, timeout_s: float, exclude: LabNimbus | None = None) -> LabNimbus:
        def found() -> LabNimbus | None:
            for nimbus in self.nimbuses:
                nimbus.check_alive()
            leader = self.leader()
            return leader if leader is not None and leader is not exclude else None

        return wait_until(found, timeout_s, "a leader (by the nimbus logs)")

    # -- talking to the cluster (from the client node) -----------------------------------------
    def probe(self, *args: str, timeout_s: float = 120.0) -> dict[str, Any]:
        """Run ``probe.py <args>`` in the client node; its JSON answer."""
        argv = self.client_node.argv([PYTHON, str(LAB_DIR / "probe.py"), "--conf",
                                      str(self.client_config), *args])
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                                env=self.product_env(), cwd=self.work)
        lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
        if result.returncode != 0 or not lines:
            raise LabError(f"probe {' '.join(args)} failed ({result.returncode}): "
                           f"{result.stderr.strip()[-2000:]}")
        return json.loads(lines[-1])

    def nimbus_checkout(self) -> str:
        """Where the lab's processes import nimbus from (run in the client node with
        their environment and working directory)."""
        argv = self.client_node.argv([PYTHON, "-c", "import nimbus; print(nimbus.__file__)"])
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                                env=self.product_env(), cwd=self.work)
        return result.stdout.strip() or result.stderr.strip()[-300:]

    def workload(self, name: str, spec: dict[str, Any]) -> Workload:
        """Start a recorded client workload (:mod:`workload`) in the client node."""
        go_file = self.work / f"{name}.go"
        spec_file = self.work / f"{name}.spec.json"
        spec_file.write_text(json.dumps({**spec, "go_file": str(go_file)}, indent=1))
        history = self.work / f"{name}.history.jsonl"
        process = LabProcess(
            name, self.client_node,
            [PYTHON, str(LAB_DIR / "workload.py"), "--conf", str(self.client_config),
             "--spec", str(spec_file), "--history", str(history)],
            self.work / f"{name}.log", self.product_env())
        return Workload(process, history, go_file)

    def topology_workers(self, topology_id: str) -> dict[int, str]:
        """Live worker processes of ``topology_id`` (pid -> supervisor name), from /proc."""
        from nimbus.dev.feed import WORKER_MODULE, processes_with_arg

        found = {}
        for pid in processes_with_arg(WORKER_MODULE, f"{topology_id}-"):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            owner = next((s.name for s in self.supervisors
                          if str(s.local_dir / "workers") in cmdline), "?")
            found[pid] = owner
        return found
