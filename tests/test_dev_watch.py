"""dev-cluster's watch over its daemons (nimbus.dev.watch), with real child processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from nimbus.dev.watch import DaemonWatch, how_it_ended


class Daemon:
    DAEMON = "nimbus"

    def __init__(self, index: int, code: int):
        self.index, self.code = index, code
        self.address = f"127.0.0.1:{6627 + index}"
        self.log_file = Path(f"/tmp/nimbus-{index}.log")
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        self.process = subprocess.Popen(
            [sys.executable, "-c", f"import sys, time; time.sleep(0.05); sys.exit({self.code})"])
        self.process.wait()


class ZooKeeper:
    def __init__(self) -> None:
        self.alive = True
        self.process = None


def test_each_exit_is_reported_once_and_the_rest_goes_on():
    said: list[str] = []
    daemons = [Daemon(0, 3), Daemon(1, 0)]
    daemons[0].start()
    zk = ZooKeeper()
    watch = DaemonWatch(lambda: daemons, zk, said.append, restart=False)
    assert watch.look() is True
    assert watch.look() is True
    pid = daemons[0].process.pid
    assert said == [f"nimbus 0 127.0.0.1:6627 (pid {pid}) exited with code 3; its log: "
                    "/tmp/nimbus-0.log",
                    "the rest of the cluster goes on (--restart starts daemons that exit "
                    "again)"]
    zk.alive = False
    assert watch.look() is False
    assert said[-1] == "ZooKeeper is gone: the dev cluster cannot go on"


def test_restart_starts_an_exited_daemon_again():
    said: list[str] = []
    daemon = Daemon(2, 1)
    daemon.start()
    watch = DaemonWatch(lambda: [daemon], ZooKeeper(), said.append, restart=True)
    watch.look()
    assert daemon.starts == 2 and watch.restarts == 1
    assert said[-1] == f"restarted nimbus 2 127.0.0.1:6629 (pid {daemon.process.pid})"


def test_how_it_ended():
    assert how_it_ended(3) == "exited with code 3"
    assert how_it_ended(-9) == "killed by SIGKILL (signal 9)"
