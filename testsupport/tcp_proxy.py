"""A loopback TCP proxy that can delay traffic, for network faults in front of ZooKeeper.

``DelayProxy(target_port)`` listens on 127.0.0.1 and forwards every connection to
``127.0.0.1:target_port``. While :attr:`delay_s` is above zero every chunk of bytes, in
either direction, is held that long before it is passed on (order is kept), as a slow or
congested link would. :meth:`cut` drops every connection at once (a partition of the
clients behind the proxy) and refuses new ones until :meth:`heal`. :meth:`drop` is the
silent kind of partition: connections stay open, but every byte in either direction is
thrown away (as a firewall's DROP rule does) until :meth:`heal`; nothing tells either side.

Each connection uses two named threads (one per direction); all stop on :meth:`stop`.
"""

from __future__ import annotations

import collections
import socket
import threading
import time

POLL_S = 0.05
CHUNK = 64 * 1024


class DelayProxy:
    """Forward 127.0.0.1:``port`` -> 127.0.0.1:``target_port``, optionally delayed."""

    def __init__(self, target_port: int, port: int = 0):
        self.target_port = target_port
        self.delay_s = 0.0
        self._sock = socket.create_server(("127.0.0.1", port))
        self._sock.settimeout(POLL_S * 4)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._cut = threading.Event()
        self._dropping = threading.Event()
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept_loop,
                                          name=f"proxy-accept-{self.port}", daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> DelayProxy:
        self._acceptor.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._acceptor.join(5)
        self._sock.close()
        self._drop_all()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(5)

    def cut(self) -> None:
        """Drop every connection and refuse new ones until :meth:`heal`."""
        self._cut.set()
        self._drop_all()

    def drop(self) -> None:
        """Silently discard all traffic, in both directions, of every connection (new
        ones are accepted, and their bytes discarded too) until :meth:`heal`."""
        self._dropping.set()

    def heal(self) -> None:
        self._cut.clear()
        self._dropping.clear()

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _drop_all(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    def _accept_loop(self) -> None:
        count = 0
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            if self._cut.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=2)
            except OSError:
                client.close()  # the server behind is down: so is the proxied address
                continue
            upstream.settimeout(None)
            count += 1
            with self._lock:
                self._conns += [client, upstream]
                self._threads = [t for t in self._threads if t.is_alive()]
                for source, sink, way in ((client, upstream, "up"), (upstream, client, "down")):
                    thread = threading.Thread(target=self._pump, args=(source, sink),
                                              name=f"proxy-{self.port}-{count}-{way}",
                                              daemon=True)
                    self._threads.append(thread)
                    thread.start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        """Copy ``source`` to ``sink``, holding each chunk for the delay in force when it
        arrived. Reading goes on while chunks wait, so the delay adds latency, not a
        bandwidth cap."""
        pending: collections.deque[tuple[float, bytes]] = collections.deque()
        try:
            while not self._stop.is_set():
                wait = POLL_S
                if pending:  # wake up in time to pass the next chunk on
                    wait = min(POLL_S, max(0.001, pending[0][0] - time.monotonic()))
                source.settimeout(wait)
                try:
                    data = source.recv(CHUNK)
                    if not data:
                        break
                    if not self._dropping.is_set():
                        pending.append((time.monotonic() + self.delay_s, data))
                except TimeoutError:
                    pass
                now = time.monotonic()
                while pending and pending[0][0] <= now:
                    sink.sendall(pending.popleft()[1])
            while pending and not self._stop.is_set():  # flush what was in flight
                due, data = pending.popleft()
                self._stop.wait(max(0.0, due - time.monotonic()))
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
