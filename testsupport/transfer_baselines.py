"""Baselines that code-transfer benchmarks are measured against, in the same run.

* :func:`loopback_tcp` — baseline (a): one process sends the file with
  ``socket.sendfile`` over 127.0.0.1, another process receives it, writes it to disk and
  hashes it with sha256. That is the least any verified transfer must do.
* :func:`sha256sum` — baseline (c): coreutils ``sha256sum`` of the file, the least an
  upload that hashes its bytes must do.
* :func:`rate_capped_server` / :func:`rate_capped_fetch` — a plain client-server transfer
  where one seeder's uplink is capped, for comparing with a rate-capped swarm.

Each function returns seconds. Everything listens on 127.0.0.1 only.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from nimbus.distribution.code_stream import receive_to_file


def write_random_file(path: Path, megabytes: int) -> int:
    """Write ``megabytes`` MiB of incompressible bytes; returns the size."""
    path.parent.mkdir(parents=True, exist_ok=True)
    block = os.urandom(1 << 20)
    with open(path, "wb") as fh:
        for _ in range(megabytes):
            fh.write(block)
    return megabytes << 20


# Run by a separate interpreter so that the sender has its own GIL and core.
_SENDER = (
    "import socket, sys\n"
    "with socket.create_connection(('127.0.0.1', int(sys.argv[1]))) as sock, "
    "open(sys.argv[2], 'rb') as fh:\n"
    "    sock.sendfile(fh)\n"
)


def loopback_tcp(source: Path, dest: Path) -> float:
    """Baseline (a): sendfile from a child process; this process writes and hashes."""
    size = source.stat().st_size
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        sender = subprocess.Popen([sys.executable, "-c", _SENDER, str(port), str(source)])
        try:
            conn, _ = server.accept()
            started = time.monotonic()
            with conn:
                receive_to_file(conn, dest, size)
            elapsed = time.monotonic() - started
        finally:
            sender.wait(30)
    return elapsed


def sha256sum(source: Path) -> float:
    """Baseline (c): coreutils ``sha256sum`` of the file."""
    started = time.monotonic()
    subprocess.run(["sha256sum", str(source)], check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - started


class RateCappedServer:
    """A plain seeder: sends one file to every client, all sharing one capped uplink.

    ``rate`` is bytes per second for the whole server (one host's uplink). Clients connect
    and receive the file; :func:`rate_capped_fetch` is the client side.
    """

    CHUNK = 64 * 1024

    def __init__(self, source: Path, rate: int):
        self.source = Path(source)
        self.rate = rate
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._bucket_lock = threading.Lock()
        self._next_free = time.monotonic()
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept, name="capped-seeder-accept",
                                          daemon=True)

    def __enter__(self) -> RateCappedServer:
        self._acceptor.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._sock.close()
        self._acceptor.join(5)
        for thread in self._threads:
            thread.join(5)

    def _take(self, n: int) -> None:
        """Reserve ``n`` bytes of the shared uplink, sleeping until they are due."""
        with self._bucket_lock:
            now = time.monotonic()
            start = max(now, self._next_free)
            self._next_free = start + n / self.rate
        if start > now:
            self._stop.wait(start - now)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,),
                                      name=f"capped-seeder-{len(self._threads)}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, open(self.source, "rb") as fh:
            while not self._stop.is_set() and (chunk := fh.read(self.CHUNK)):
                self._take(len(chunk))
                conn.sendall(chunk)


def rate_capped_fetch(port: int, dest: Path, size: int) -> float:
    """Fetch the whole file from a :class:`RateCappedServer`; returns seconds."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        receive_to_file(sock, dest, size)
    return time.monotonic() - started
