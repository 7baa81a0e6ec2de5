"""The door of every HTTP server of nimbus-ha (the UI, /metrics, the supervisors'
logviewers): a connection reaches a worker thread only once its request's head (request
line and headers) is complete.

cheroot hands each new connection to one of its few worker threads at once, and the
worker then shakes hands (TLS) and reads the head with a timeout per read. So a client
that sends one byte of a ClientHello, or a header byte every few seconds, holds a
worker, and eight of them hold every worker (issue 19, U15/U16); and nothing bounds the
request line, which cheroot buffers to its end (U12).

:class:`RequestGate` takes the place of cheroot's connection manager, in the server's
serving thread. It accepts, shakes hands and reads heads without blocking, any number of
connections at once, and hands a connection to the workers when its head is complete,
with the bytes it read (nimbus/web/request_head.py; cheroot then parses them as usual).
On the way:

* a request line longer than :attr:`HeadLimits.line_bytes` is answered 414, a head
  longer than :attr:`HeadLimits.head_bytes` 431, as soon as the limit is passed: no
  more is buffered;
* a connection that has not completed its TLS handshake and its head
  :attr:`HeadLimits.timeout_s` after it connected (on a kept-alive connection: after
  the first byte of its next request) is dropped, with 408 if a request had begun;
* at most :data:`MAX_WAITING_PER_ADDRESS` connections of one address wait at once
  (more are closed on arrival), and at most :data:`MAX_WAITING` in all (then the one
  waiting longest goes).

With TLS, the caller's identity is taken once its handshake is done (the adapter's
``peer_environ``); a client the adapter refuses (:class:`PeerRefusedError`: a certificate
without a common name) has its request answered 403 with the reason, logged with its
address, and reaches no worker.

An answer to a bad head is followed by a lingering close: what the client still sends
is read and dropped for up to :data:`LINGER_S`, so that it reads the answer rather than
a connection reset.
"""

from __future__ import annotations

import logging
import selectors
import socket
import ssl
import threading
import time
from collections import Counter, deque
from typing import Any

from cheroot import wsgi

from nimbus.web.request_head import (
    COMPLETE,
    PLAIN_HTTP_ANSWER,
    READ_BYTES,
    HeadFirstReader,
    HeadLimits,
    error_answer,
    judge_head,
    replaying_makefile,
)

log = logging.getLogger(__name__)

MAX_WAITING = 512
MAX_WAITING_PER_ADDRESS = 64
# Kept-alive connections are parked at the gate; past this many waiting connections,
# answers say "Connection: close" instead.
MAX_KEPT_ALIVE = 128
LINGER_S = 1.0
SWEEP_S = 0.25
# Bytes of a lingering client read per turn, so that one fast sender cannot hold the
# gate's thread.
LINGER_READ_BYTES = 256 * 1024
STOP_WAIT_S = 5.0

_ACCEPT = object()
_WAKE = object()


class PeerRefusedError(Exception):
    """Raised by an adapter's ``peer_environ``: this client may not be served; the
    message, which says why and what to do, is its 403 answer."""


class _Waiting:
    """A connection at the gate: shaking hands, reading a head, or lingering."""

    __slots__ = ("sock", "fd", "address", "head", "deadline", "shaken", "idle",
                 "lingering", "events", "env", "refusal")

    def __init__(self, sock: socket.socket, address: Any, deadline: float, shaken: bool,
                 head: bytes = b"", idle: bool = False, env: dict[str, Any] | None = None):
        self.sock = sock
        self.fd = sock.fileno()
        self.address = address
        self.head = bytearray(head)
        self.deadline = deadline
        self.shaken = shaken
        self.idle = idle  # kept alive, no byte of its next request yet
        self.lingering = False
        self.events = 0
        self.env: dict[str, Any] = env or {}  # the adapter's, once the handshake is done
        self.refusal = ""  # why its request gets 403 (the adapter refused the peer)

    @property
    def host(self) -> str:
        return str(self.address[0]) if isinstance(self.address, tuple) else ""


class RequestGate:
    """cheroot's connection manager for :class:`GatedServer` (see the module's
    docstring). cheroot calls :meth:`run` in the serving thread, :meth:`put` from its
    workers with a kept-alive connection, and :meth:`stop` then :meth:`close`."""

    def __init__(self, server: GatedServer):
        self.server = server
        self.limits = server.limits
        adapter = server.ssl_adapter
        self._context: ssl.SSLContext | None = getattr(adapter, "context", None)
        self._selector = selectors.DefaultSelector()
        self._waiting: dict[int, _Waiting] = {}  # by fd, the longest waiting first
        self._per_address: Counter[str] = Counter()
        self._returned: deque[Any] = deque()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        server.socket.setblocking(False)
        self._selector.register(server.socket, selectors.EVENT_READ, _ACCEPT)
        self._selector.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._idle.set()

    # -- cheroot's interface ----------------------------------------------------------
    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def can_add_keepalive_connection(self) -> bool:
        return len(self._waiting) < MAX_KEPT_ALIVE

    def put(self, conn: Any) -> None:
        """A worker gives back a kept-alive connection: its next request's head is read
        here too (in the serving thread)."""
        if self._stop.is_set():
            conn.close()
            return
        self._returned.append(conn)
        self._wake()

    def run(self, expiration_interval: float) -> None:
        """Serve until :meth:`stop`."""
        if self._stop.is_set():
            return
        self._idle.clear()
        try:
            while not self._stop.is_set():
                for key, _events in self._selector.select(SWEEP_S):
                    if key.data is _ACCEPT:
                        self._accept()
                    elif key.data is _WAKE:
                        self._drain_wake()
                    elif self._waiting.get(key.data.fd) is key.data:  # not closed
                        self._advance(key.data)
                self._take_returned()
                self._sweep(time.monotonic())
        finally:
            self._idle.set()

    def pause(self, seconds: float) -> None:
        """Wait ``seconds``, or less if :meth:`stop` comes first."""
        self._stop.wait(seconds)

    def stop(self) -> None:
        """End :meth:`run` and wait for it."""
        self._stop.set()
        self._wake()
        if not self._idle.wait(STOP_WAIT_S):
            log.warning("the HTTP server's gate did not stop within %s s", STOP_WAIT_S)

    def close(self) -> None:
        """Close every connection still at the gate."""
        for waiting in list(self._waiting.values()):
            self._close(waiting)
        while self._returned:
            self._returned.popleft().close()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    # -- the loop ---------------------------------------------------------------------
    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:  # full (a wake-up is pending anyway) or closed (stopped)
            pass

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass

    def _accept(self) -> None:
        for _ in range(64):  # a burst; the rest on the next turn
            try:
                sock, address = self.server.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors, or the socket closed by stop
                log.debug("accept failed: %s", exc)
                return
            sock.setblocking(False)
            host = str(address[0]) if isinstance(address, tuple) else ""
            if self._per_address[host] >= MAX_WAITING_PER_ADDRESS:
                log.debug("%s has %d connections waiting already: closing a new one",
                          host, MAX_WAITING_PER_ADDRESS)
                sock.close()
                continue
            if len(self._waiting) >= MAX_WAITING:
                self._close(next(iter(self._waiting.values())))
            if self._context is not None:
                try:
                    sock = self._context.wrap_socket(sock, server_side=True,
                                                     do_handshake_on_connect=False)
                except (OSError, ValueError):  # gone already
                    sock.close()
                    continue
            waiting = _Waiting(sock, address, time.monotonic() + self.limits.timeout_s,
                               shaken=self._context is None)
            self._add(waiting)
            self._watch(waiting, selectors.EVENT_READ)

    def _take_returned(self) -> None:
        while self._returned:
            conn = self._returned.popleft()
            rest = conn.rfile.unread() if isinstance(conn.rfile, HeadFirstReader) else b""
            sock = conn.socket
            sock.setblocking(False)
            wait_s = self.limits.timeout_s if rest else float(self.server.timeout)
            waiting = _Waiting(sock, (conn.remote_addr, conn.remote_port),
                               time.monotonic() + wait_s, shaken=True, head=rest,
                               idle=not rest, env=getattr(conn, "ssl_env", None))
            self._add(waiting)
            # TLS may hold decrypted bytes already, which select() would never report.
            self._advance(waiting)

    def _sweep(self, now: float) -> None:
        for waiting in [w for w in self._waiting.values() if w.deadline <= now]:
            if waiting.head and not waiting.lingering:
                self._refuse(waiting, error_answer(
                    "408 Request Timeout", "the request headers did not arrive within "
                    f"{self.limits.timeout_s:g} seconds"))
            else:
                self._close(waiting)

    # -- one connection ---------------------------------------------------------------
    def _advance(self, waiting: _Waiting) -> None:
        try:
            if waiting.lingering:
                self._linger(waiting)
                return
            if not waiting.shaken:
                try:
                    waiting.sock.do_handshake()  # type: ignore[attr-defined]
                except ssl.SSLWantReadError:
                    self._watch(waiting, selectors.EVENT_READ)
                    return
                except ssl.SSLWantWriteError:
                    self._watch(waiting, selectors.EVENT_WRITE)
                    return
                waiting.shaken = True
                if not self._identify(waiting):
                    return
            self._read(waiting)
        except ssl.SSLError as exc:
            if not waiting.shaken and "http request" in str(exc).lower():
                self._refuse(waiting, PLAIN_HTTP_ANSWER, raw=True)
            else:  # no certificate, another CA's, not TLS at all: no answer
                log.debug("TLS handshake with %s failed: %s", waiting.host, exc)
                self._close(waiting)
        except OSError:
            self._close(waiting)

    def _identify(self, waiting: _Waiting) -> bool:
        """Take the caller's identity from the handshake just done; a peer the adapter
        refuses gets 403 for its request (:meth:`_judge`). False: closed meanwhile."""
        try:
            waiting.env = self.server.ssl_adapter.peer_environ(waiting.sock)
        except PeerRefusedError as exc:
            waiting.refusal = str(exc)
            log.warning("%s: refused %s with 403: %s", self.server.name,
                        _address(waiting.address), exc)
        except (OSError, ValueError):
            self._close(waiting)
            return False
        return True

    def _read(self, waiting: _Waiting) -> None:
        if waiting.head and self._judge(waiting):  # a pipelined request, given back
            return
        while True:
            try:
                chunk = waiting.sock.recv(READ_BYTES)
            except (BlockingIOError, ssl.SSLWantReadError):
                self._watch(waiting, selectors.EVENT_READ)
                return
            except ssl.SSLWantWriteError:
                self._watch(waiting, selectors.EVENT_WRITE)
                return
            if not chunk:  # closed: between requests, or giving up on one
                self._close(waiting)
                return
            if waiting.idle:
                waiting.idle = False
                waiting.deadline = time.monotonic() + self.limits.timeout_s
            waiting.head += chunk
            if self._judge(waiting):
                return

    def _judge(self, waiting: _Waiting) -> bool:
        """Dispatch or refuse ``waiting`` if its head allows; False: read on."""
        verdict = judge_head(waiting.head, self.limits)
        if verdict is COMPLETE and waiting.refusal:
            self._refuse(waiting, error_answer("403 Forbidden", waiting.refusal))
            return True
        if verdict is COMPLETE:
            self._dispatch(waiting)
            return True
        if isinstance(verdict, bytes):
            self._refuse(waiting, verdict)
            return True
        return False

    def _dispatch(self, waiting: _Waiting) -> None:
        self._forget(waiting)
        sock = waiting.sock
        sock.settimeout(self.server.timeout)
        makefile = replaying_makefile(bytes(waiting.head))
        conn = self.server.ConnectionClass(self.server, sock, makefile)
        if isinstance(waiting.address, tuple):
            conn.remote_addr, conn.remote_port = waiting.address[0], waiting.address[1]
        conn.ssl_env = waiting.env
        conn.last_used = time.time()
        self.server.process_conn(conn)

    def _refuse(self, waiting: _Waiting, answer: bytes, raw: bool = False) -> None:
        """Send ``answer``, stop writing, and read what still comes for LINGER_S."""
        try:
            if raw:  # below TLS: the client speaks plain HTTP
                socket.socket.send(waiting.sock, answer)
            else:
                waiting.sock.send(answer)
            socket.socket.shutdown(waiting.sock, socket.SHUT_WR)
        except (OSError, ValueError):
            self._close(waiting)
            return
        waiting.lingering = True
        waiting.deadline = time.monotonic() + LINGER_S
        waiting.head = bytearray()
        self._watch(waiting, selectors.EVENT_READ)

    def _linger(self, waiting: _Waiting) -> None:
        for _ in range(LINGER_READ_BYTES // READ_BYTES):
            try:  # below TLS: these bytes are dropped unread
                if not socket.socket.recv(waiting.sock, READ_BYTES):
                    break
            except BlockingIOError:
                return
            except OSError:
                break
        else:
            return
        self._close(waiting)

    # -- bookkeeping ------------------------------------------------------------------
    def _add(self, waiting: _Waiting) -> None:
        self._waiting[waiting.fd] = waiting
        self._per_address[waiting.host] += 1

    def _watch(self, waiting: _Waiting, events: int) -> None:
        if waiting.events == events:
            return
        if waiting.events:
            self._selector.modify(waiting.sock, events, waiting)
        else:
            self._selector.register(waiting.sock, events, waiting)
        waiting.events = events

    def _forget(self, waiting: _Waiting) -> None:
        if self._waiting.pop(waiting.fd, None) is None:
            return
        self._per_address[waiting.host] -= 1
        if self._per_address[waiting.host] <= 0:
            del self._per_address[waiting.host]
        if waiting.events:
            try:
                self._selector.unregister(waiting.sock)
            except (KeyError, ValueError):
                pass
            waiting.events = 0

    def _close(self, waiting: _Waiting) -> None:
        self._forget(waiting)
        try:
            waiting.sock.close()
        except OSError:
            pass


def _address(address: Any) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address)


class GatedServer(wsgi.Server):
    """cheroot's WSGI server with a :class:`RequestGate` in front of its workers.

    :meth:`bind_now` binds (a taken port fails there, and no thread starts);
    :meth:`prepare` binds if needed and starts the worker threads, named
    ``<name>-worker-<i>``; :meth:`serve` runs the gate until :meth:`stop`, which also
    joins the workers (and only closes the socket of a server never prepared). With
    ``ssl_adapter`` (an adapter with ``context`` and ``peer_environ(sock)``, see
    nimbus/web/client_cert.py) every connection is TLS, its handshake done by the gate.
    """

    def __init__(self, bind_addr: tuple[str, int], app: Any, *, name: str, threads: int,
                 limits: HeadLimits, ssl_adapter: Any = None, server_name: str | None = None):
        super().__init__(bind_addr, app, numthreads=threads, server_name=server_name,
                         shutdown_timeout=2, request_queue_size=128)
        self.name = name
        self.limits = limits
        self.ssl_adapter = ssl_adapter
        self.socket: socket.socket | None = None

    def bind_now(self) -> None:
        """Bind and listen on ``bind_addr`` (port 0: a free one, see ``bind_addr``)."""
        if self.socket is not None:
            return
        host, port = self.bind_addr
        failure: OSError | None = None
        for family, kind, proto, _name, _address in socket.getaddrinfo(
                host, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE):
            try:
                self.bind(family, kind, proto)
                break
            except OSError as exc:
                failure = exc
                if self.socket is not None:
                    self.socket.close()
                self.socket = None
        if self.socket is None:
            raise failure or OSError(f"no address to bind for {host}:{port}")
        self.socket.listen(self.request_queue_size)

    def prepare(self) -> None:
        """Bind (unless :meth:`bind_now` did) and start the workers; nothing is served
        before :meth:`serve`."""
        self.bind_now()
        if self.software is None:
            self.software = f"{self.version} Server"
        # In place of cheroot's ConnectionManager, which would hand connections to the
        # workers before anything was read from them.
        self._connections = RequestGate(self)
        self.requests.start()
        for i, worker in enumerate(getattr(self.requests, "_threads", ())):
            worker.name = f"{self.name}-worker-{i}"
        self.ready = True

    def serve(self) -> None:
        """Run the gate until :meth:`stop` (cheroot's own ``serve`` also starts an
        unnamed thread for a queue this server never fills)."""
        gate = self._connections
        while self.ready and not gate.stopping:
            try:
                gate.run(self.expiration_interval)
            except Exception:  # one bad turn must not end the serving: log it, go on
                log.exception("the HTTP server's gate failed a turn; serving on")
                gate.pause(SWEEP_S)

    def stop(self) -> None:
        if not self.ready:  # never prepared, or stopped already: no thread to stop
            if self.socket is not None:
                self.socket.close()
                self.socket = None
            return
        super().stop()
