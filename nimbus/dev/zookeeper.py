"""Run a real ZooKeeper server on 127.0.0.1 (for development, tests and dev-cluster).

A standalone server may be bound to another local address instead (``host``): the
partition lab (integration/partition) runs one inside a network namespace of its own.

The server's jars come from Debian's ``zookeeper`` package (``/usr/share/java``) or from
``$NIMBUS_HA_ZOOKEEPER_CLASSPATH``; java must be on PATH. This is a single standalone
server with a short tick so tests can use session timeouts of a few seconds.
"""

from __future__ import annotations

import glob
import os
import random
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
QUORUM_MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"  # ensemble members
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


#: Ports free_port hands out start here and end below the kernel's ephemeral range.
PORT_FLOOR = 20000
_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()


def _ephemeral_low(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    try:
        with open(path) as ranges:
            return int(ranges.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768   # Linux's default


def free_port() -> int:
    """A port of 127.0.0.1 that is free now, for a server to bind soon after.

    Chosen below the kernel's ephemeral range, so that no outgoing connection (whose
    local port the kernel picks from that range) can take it before the server binds
    it, and never the same one twice in this process: an ensemble's nine ports are
    picked before its first server starts, and its servers connect to each other while
    the last ones start."""
    low = _ephemeral_low()
    with _handed_out_lock:
        for _ in range(200 if low - PORT_FLOOR >= 1000 else 0):
            port = random.randrange(PORT_FLOOR, low)
            if port in _handed_out:
                continue
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port
        while True:   # a host whose ephemeral range leaves no room below it
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            if port not in _handed_out:
                _handed_out.add(port)
                return port


def ruok(port: int, timeout_s: float = 1.0, host: str = "127.0.0.1") -> bool:
    """ZooKeeper's four-letter health check."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(b"ruok")
            return sock.recv(4) == b"imok"
    except OSError:
        return False


def server_mode(port: int, timeout_s: float = 1.0, host: str = "127.0.0.1") -> str | None:
    """The ``Mode:`` a server reports through ``srvr`` (standalone, leader, follower), or
    None when it does not serve (down, or a member outside any quorum)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(b"srvr")
            reply = b""
            while chunk := sock.recv(4096):
                reply += chunk
    except OSError:
        return None
    for line in reply.decode(errors="replace").splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return None


class ZooKeeperServer:
    """A standalone ZooKeeper server process listening on ``host``:``port`` only
    (127.0.0.1 unless told otherwise)."""

    def __init__(self, data_dir: Path, port: int | None = None, tick_ms: int = 200,
                 quorum: dict[int, tuple[int, int]] | None = None, server_id: int = 0,
                 host: str = "127.0.0.1"):
        """``quorum`` (ensemble members only): server id -> (peer port, election port) of
        every member, all on 127.0.0.1; ``server_id`` is this member's id. ``host``: the
        local address the client port binds (give ``port`` too unless it is loopback:
        a free port is looked for on 127.0.0.1)."""
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port or free_port()
        self.tick_ms = tick_ms
        self.quorum = quorum or {}
        self.server_id = server_id
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def hosts(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> ZooKeeperServer:
        """Start the server; returns once it serves requests."""
        self.start_process()
        self.wait_serving(timeout_s)
        return self

    def start_process(self) -> None:
        """Launch the JVM without waiting (ensemble members must all be launched before
        any of them can serve)."""
        if shutil.which("java") is None:
            raise ZooKeeperUnavailableError("java is not on PATH (apt-get install default-jre)")
        classpath = find_classpath()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cfg = self.data_dir / "zoo.cfg"
        cfg.write_text("\n".join([
            f"tickTime={self.tick_ms}",
            f"dataDir={self.data_dir / 'data'}",
            f"clientPort={self.port}",
            f"clientPortAddress={self.host}",
            "admin.enableServer=false",
            "4lw.commands.whitelist=ruok,srvr,stat,cons",
            # Let clients pick session timeouts from 2 ticks up to 60 s.
            f"minSessionTimeout={2 * self.tick_ms}",
            "maxSessionTimeout=60000",
            "maxClientCnxns=0",
            *self._quorum_lines(),
        ]) + "\n")
        log = open(self.data_dir / "zookeeper.out", "ab")
        self.process = subprocess.Popen(
            ["java", "-Xmx256m", f"-Dzookeeper.log.dir={self.data_dir}",
             "-Dzookeeper.admin.enableServer=false", "-cp", classpath,
             QUORUM_MAIN_CLASS if self.quorum else MAIN_CLASS, str(cfg)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        log.close()

    def serving(self) -> bool:
        """True when the server answers requests (a member: while it is in a quorum)."""
        if not self.quorum:
            return ruok(self.port, host=self.host)
        return server_mode(self.port, host=self.host) in ("leader", "follower")

    def wait_serving(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                code = None if self.process is None else self.process.returncode
                raise ZooKeeperUnavailableError(
                    f"ZooKeeper exited with {code}; see {self.data_dir / 'zookeeper.out'}")
            if self.serving():
                return
            time.sleep(0.1)  # polling a starting JVM; there is nothing to wait on
        self.stop()
        raise ZooKeeperUnavailableError(f"ZooKeeper did not answer on {self.hosts}")

    def _quorum_lines(self) -> list[str]:
        if not self.quorum:
            return []
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        (self.data_dir / "data" / "myid").write_text(f"{self.server_id}\n")
        return ["initLimit=10", "syncLimit=5",
                *(f"server.{sid}=127.0.0.1:{peer}:{election}"
                  for sid, (peer, election) in sorted(self.quorum.items()))]

    def kill9(self) -> None:
        """SIGKILL the server (a crash); :meth:`start` brings it back on its data."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

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


class ZooKeeperEnsemble:
    """``size`` ZooKeeper servers forming one ensemble on 127.0.0.1 (a quorum of
    ``size // 2 + 1``). Members can be killed and restarted one by one."""

    def __init__(self, data_dir: Path, size: int = 3, tick_ms: int = 200,
                 ports: list[int] | None = None):
        if size < 1:
            raise ValueError("an ensemble needs at least one server")
        quorum = {sid: (free_port(), free_port()) for sid in range(1, size + 1)}
        client_ports = ports or [free_port() for _ in range(size)]
        self.servers = [
            ZooKeeperServer(Path(data_dir) / f"server-{sid}", port=client_ports[sid - 1],
                            tick_ms=tick_ms, quorum=quorum, server_id=sid)
            for sid in range(1, size + 1)]

    @property
    def hosts(self) -> str:
        """The connection string naming every member."""
        return ",".join(server.hosts for server in self.servers)

    def start(self, timeout_s: float = 60.0) -> ZooKeeperEnsemble:
        """Start every member; returns once each answers (a member answers ``ruok`` only
        while it is part of a quorum, so this waits for the ensemble to form)."""
        try:
            for server in self.servers:
                server.start_process()
            for server in self.servers:
                server.wait_serving(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def __enter__(self) -> ZooKeeperEnsemble:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
