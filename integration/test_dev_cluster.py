"""`nimbus-ha dev-cluster` keeps going: a nimbus and a supervisor killed with kill -9 are
reported with their pids and how they ended, the rest serves on, and with --restart they
come back; SIGTERM still stops it all with exit 0."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers import process_bundle
from processes import frozen, running
from waiting import wait_for

from nimbus.dev.feed import WORKER_MODULE, processes_with_arg
from nimbus.dev.zookeeper import free_port, port_open
from nimbus.distribution.distributors import load_cluster_config
from nimbus.thrift.client import NimbusClient

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def two_free_ports() -> int:
    def pair() -> int | None:
        port = free_port()
        return port if not port_open(port + 1) else None

    return wait_for(pair, 10, "two consecutive free ports")


class Lines:
    """The process's output, line by line, read on a thread of its own."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(proc,), name="dev-lines",
                                        daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            self._queue.put(line)

    def until(self, pattern: str, timeout_s: float = 60) -> re.Match:
        def found() -> re.Match | None:
            while True:
                try:
                    self.seen.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            for line in self.seen:
                match = re.search(pattern, line)
                if match:
                    return match
            return None

        return wait_for(found, timeout_s, f"a line matching {pattern!r}")

    def join(self) -> None:
        """Wait for the end of the output, and keep every line of it in :attr:`seen`."""
        self._thread.join(timeout=30)
        while not self._queue.empty():
            self.seen.append(self._queue.get_nowait())


@pytest.mark.parametrize("restart", [False, True])
def test_a_killed_daemon_is_reported_and_the_cluster_goes_on(tmp_path, restart):
    work = tmp_path / "dev"
    base = two_free_ports()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nimbus.cli", "dev-cluster", "--nimbuses", "2",
         "--supervisors", "1", "--base-port", str(base), "--dir", str(work),
         *(["--restart"] if restart else [])],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = Lines(proc)
    try:
        lines.until(r"^Ctrl-C \(or SIGTERM\) stops the cluster")
        nimbus_pid = int(lines.until(rf"127\.0\.0\.1:{base} \(pid (\d+)\)").group(1))
        supervisor_pid = int(lines.until(r"^supervisor \S+ \(pid (\d+)\)").group(1))
        if not restart:
            # A worker on the supervisor about to be killed: it freezes at its lease's end,
            # waiting for a supervisor that never comes; stopping the cluster ends it.
            client = NimbusClient(load_cluster_config(work / "client.yaml"), deadline_s=60)
            topology_id = client.submit("sleeper", process_bundle(tmp_path / "sleeper"), {})
            [worker] = wait_for(lambda: processes_with_arg(WORKER_MODULE, topology_id) or None,
                                60, "the worker")
            # Running, not starting: it had its first lease and started its command (a
            # worker whose supervisor dies before its first lease exits instead).
            wait_for(lambda: Path(f"/proc/{worker}/task/{worker}/children").read_text()
                     .split(), 60, "the worker's command")
        os.kill(nimbus_pid, signal.SIGKILL)
        os.kill(supervisor_pid, signal.SIGKILL)
        lines.until(rf"^nimbus 0 127\.0\.0\.1:{base} \(pid {nimbus_pid}\) killed by "
                    r"SIGKILL \(signal 9\)")
        lines.until(rf"^supervisor 0 \(pid {supervisor_pid}\) killed by SIGKILL")
        assert proc.poll() is None, "dev-cluster goes on"
        # The file it says to use for clients: owner-only, without the daemons' keys.
        client_file = work / "client.yaml"
        assert lines.until(r"^try: nimbus-ha cluster-info --config (\S+)").group(1) == \
            str(client_file)
        assert client_file.stat().st_mode & 0o777 == 0o600
        # Its supervisors share one checkpoint directory, as a real cluster's must.
        assert load_cluster_config(work / "supervisor-0.yaml")["topology.spark.checkpoint.dir"] == \
            str(work / "checkpoints")
        assert "storm.local.dir" not in client_file.read_text()
        client = NimbusClient(load_cluster_config(client_file), deadline_s=60)
        survivor = f"127.0.0.1:{base + 1}"
        wait_for(lambda: [f"{n.host}:{n.port}" for n in client.cluster_info().nimbuses
                          if n.isLeader] == [survivor], 60, "the other nimbus to lead")
        if restart:
            lines.until(r"^restarted nimbus 0 .*\(pid (\d+)\)")
            lines.until(r"^restarted supervisor 0 \(pid (\d+)\)")
            wait_for(lambda: len(client.cluster_info().nimbuses) == 2, 60,
                     "the restarted nimbus to join")
        else:
            lines.until(r"the rest of the cluster goes on")
            wait_for(lambda: frozen(worker), 60, "the worker to freeze at its lease's end")
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=90)
        lines.join()
    assert code == 0, "".join(lines.seen)
    if not restart:
        assert "ended 1 workers left frozen by supervisors that were killed and not started " \
            "again\n" in lines.seen, "".join(lines.seen)
        assert not running(worker)
