"""Start order does not matter: a nimbus, a supervisor, the UI and a client, started in
every order after ZooKeeper (one cluster root per order, all six orders side by side).
Whatever comes before the first nimbus waits for the cluster's layout, says so once, and
works once a nimbus has set the cluster up; nothing prints a traceback."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml
from waiting import wait_for

from nimbus.dev.cluster import DaemonProcess, LocalCluster, sample_topology
from nimbus.dev.feed import WORKER_MODULE, processes_with_arg
from nimbus.dev.zookeeper import free_port
from nimbus.distribution.archive import pack_directory

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ORDERS = list(itertools.permutations(("nimbus", "supervisor", "ui")))
SUPERVISOR_WAITING = "no nimbus has set the cluster up under {root} yet"
UI_WAITING = "the UI shows no cluster: no nimbus has set the cluster up under {root} yet"
CLIENT_WAITING = "no nimbus answers yet via nimbus.seeds"


class UIProcess(DaemonProcess):
    DAEMON = "ui"

    def __init__(self, work_dir: Path, conf: dict) -> None:
        self.port = free_port()
        config_file = work_dir / "ui.yaml"
        config_file.write_text(yaml.safe_dump({**conf, "ui.port": self.port}))
        super().__init__(0, work_dir / "ui", config_file, work_dir / "ui.log")

    def get(self, path: str) -> requests.Response:
        return requests.get(f"http://127.0.0.1:{self.port}{path}", timeout=10)

    def answers(self, path: str = "/api/v1/cluster/summary") -> requests.Response | None:
        try:
            return self.get(path)
        except requests.ConnectionError:
            return None


class Order:
    """One cluster root and its daemons, started in ``order``."""

    def __init__(self, tmp: Path, index: int, order: tuple[str, ...], zk: LocalCluster):
        self.order = order
        self.root = f"/order-{index}"
        self.cluster = LocalCluster(
            tmp / f"order-{index}", 1, supervisors=1, slots_per_supervisor=1,
            zk_servers=[f"127.0.0.1:{zk.zk.port}"],
            conf={"storm.zookeeper.root": self.root, "supervisor.monitor.frequency.secs": 1,
                  "nimbus.client.wait.secs": 300})
        self.nimbus = self.cluster.nimbuses[0]
        self.supervisor = self.cluster.supervisors[0]
        self.ui = UIProcess(self.cluster.work_dir, self.cluster.conf_values)
        self.client: subprocess.Popen[str] | None = None
        self.client_err = self.cluster.work_dir / "client.err"
        self.started: list[str] = []

    def start_client(self) -> None:
        with open(self.client_err, "w") as err:
            self.client = subprocess.Popen(
                [sys.executable, "-m", "nimbus.cli", "list", "--config",
                 str(self.cluster.config_file)],
                stdout=subprocess.PIPE, stderr=err, text=True, stdin=subprocess.DEVNULL)

    def client_waits(self) -> bool:
        return CLIENT_WAITING in self.client_err.read_text()

    def start(self, step: int) -> None:
        daemon = self.order[step]
        {"nimbus": self.nimbus, "supervisor": self.supervisor, "ui": self.ui}[daemon].start()
        self.started.append(daemon)

    def settled(self) -> bool:
        """The daemon started last is up: working if a nimbus is, else waiting."""
        daemon = self.started[-1]
        nimbus_up = "nimbus" in self.started
        if daemon == "nimbus":
            return self.cluster.leader_address() is not None
        if daemon == "supervisor":
            if nimbus_up:
                return self.supervisor.id in self.cluster.registered_supervisors()
            return SUPERVISOR_WAITING.format(root=self.root) in self.supervisor.log_text()
        response = self.ui.answers()
        if nimbus_up:
            return response is not None and response.status_code == 200
        return response is not None and response.status_code == 503 and \
            UI_WAITING.format(root=self.root) in self.ui.log_text()

    def stop(self) -> None:
        if self.client is not None and self.client.poll() is None:
            self.client.kill()
            self.client.communicate()
        if self.ui.alive():
            self.ui.terminate()
        self.cluster.stop()


def test_every_start_order_ends_in_a_working_cluster(tmp_path):
    zk = LocalCluster(tmp_path / "zk", 0)
    zk.zk.start()
    orders = [Order(tmp_path, i, order, zk) for i, order in enumerate(ORDERS)]
    try:
        for o in orders:
            o.start_client()  # before anything: it waits for a nimbus
        for o in orders:
            wait_for(o.client_waits, 60, "the client to say it waits for a nimbus")
        for step in range(3):
            for o in orders:
                o.start(step)
            for o in orders:
                wait_for(o.settled, 90, f"{o.started[-1]} of order {o.order} to settle")
        for o in orders:
            wait_for(lambda o=o: o.supervisor.id in o.cluster.registered_supervisors(), 60,
                     f"the supervisor of order {o.order} to register")
            wait_for(lambda o=o: o.ui.get("/api/v1/cluster/summary").json()["supervisors"]
                     == 1, 60, f"the UI of order {o.order} to show the supervisor")
            assert o.ui.get("/api/v1/cluster/summary").json()["topologies"] == 0
            nimbuses = o.ui.get("/api/v1/nimbus/summary").json()["nimbuses"]
            assert [n["status"] for n in nimbuses] == ["Leader"], o.order
            assert o.client is not None
            out, _ = o.client.communicate(timeout=120)
            err = o.client_err.read_text()
            assert (o.client.returncode, out) == (0, "No topologies running.\n"), \
                (o.order, out, err)
            assert err.count(CLIENT_WAITING) == 1 and "Traceback" not in err, err
            for daemon, waiting in ((o.supervisor, SUPERVISOR_WAITING),
                                    (o.ui, UI_WAITING)):
                log = daemon.log_text()
                assert "Traceback" not in log, (o.order, log[-3000:])
                said = waiting.format(root=o.root)
                # Said once by whatever started before the nimbus, never by the others.
                before = o.order.index(daemon.DAEMON) < o.order.index("nimbus")
                assert log.count(said) == (1 if before else 0), (o.order, log[-3000:])
        # Work runs where the supervisor waited longest: started first of all.
        first = next(o for o in orders if o.order[0] == "supervisor")
        source = sample_topology(tmp_path / "sleeper", 16 << 10)
        (source / "topology.yaml").write_text(yaml.safe_dump(
            {"command": [sys.executable, "-c", "import time; time.sleep(3600)"]}))
        topology_id = first.cluster.client().submit("sleeper", pack_directory(source), {})
        wait_for(lambda: len(processes_with_arg(WORKER_MODULE, topology_id)) == 1, 60,
                 "its worker")
    except BaseException:
        for o in orders:
            for daemon in (o.nimbus, o.supervisor, o.ui):
                print(f"--- {o.order} {daemon.log_file.name} ---\n{daemon.log_text()[-2000:]}")
        raise
    finally:
        for o in orders:
            o.stop()
        zk.stop()
