"""Run a real ZooKeeper server on 127.0.0.1 (for development, tests and dev-cluster).

The server's jars come from Debian's ``zookeeper`` package (``/usr/share/java``) or from
``$NIMBUS_HA_ZOOKEEPER_CLASSPATH``; java must be on PATH. This is a single standalone
server with a short tick so tests can use session timeouts of a few seconds.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
DEBIAN_JAR = "/usr/share/java/zookeeper.jar"


class ZooKeeperUnavailableError(RuntimeError):
    """No java or no ZooKeeper jar on this machine, or the server did not start."""


def find_classpath() -> str:
    """The classpath of a ZooKeeper server; raises with install instructions if none."""
    env = os.environ.get("NIMBUS_HA_ZOOKEEPER_CLASSPATH")
    if env:
        return env
    if os.path.exists(DEBIAN_JAR):
        # Debian's jar names its dependencies in its manifest; add them explicitly too.
        return ":".join([DEBIAN_JAR, *sorted(glob.glob("/usr/share/java/zookeeper-jute.jar"))])
    raise ZooKeeperUnavailableError(
        "no ZooKeeper server found: run 'apt-get install -y zookeeper' or set "
        "NIMBUS_HA_ZOOKEEPER_CLASSPATH to the server's jars")


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ruok(port: int, timeout_s: float = 1.0) -> bool:
    """ZooKeeper's four-letter health check."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
            sock.sendall(b"ruok")
            return sock.recv(4) == b"imok"
    except OSError:
        return False


class ZooKeeperServer:
    """A standalone ZooKeeper server process listening on 127.0.0.1:``port`` only."""

    def __init__(self, data_dir: Path, port: int | None = None, tick_ms: int = 200):
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.tick_ms = tick_ms
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> ZooKeeperServer:
        if shutil.which("java") is None:
            raise ZooKeeperUnavailableError("java is not on PATH (apt-get install default-jre)")
        classpath = find_classpath()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cfg = self.data_dir / "zoo.cfg"
        cfg.write_text("\n".join([
            f"tickTime={self.tick_ms}",
            f"dataDir={self.data_dir / 'data'}",
            f"clientPort={self.port}",
            "clientPortAddress=127.0.0.1",
            "admin.enableServer=false",
            "4lw.commands.whitelist=ruok,srvr,stat,cons",
            # Let clients pick session timeouts from 2 ticks up to 60 s.
            f"minSessionTimeout={2 * self.tick_ms}",
            "maxSessionTimeout=60000",
            "maxClientCnxns=0",
        ]) + "\n")
        log = open(self.data_dir / "zookeeper.out", "ab")
        self.process = subprocess.Popen(
            ["java", "-Xmx256m", f"-Dzookeeper.log.dir={self.data_dir}",
             "-Dzookeeper.admin.enableServer=false", "-cp", classpath, MAIN_CLASS, str(cfg)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ZooKeeperUnavailableError(
                    f"ZooKeeper exited with {self.process.returncode}; see "
                    f"{self.data_dir / 'zookeeper.out'}")
            if ruok(self.port):
                return self
            time.sleep(0.1)  # polling a starting JVM; there is nothing to wait on
        self.stop()
        raise ZooKeeperUnavailableError(f"ZooKeeper did not answer on {self.hosts}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
