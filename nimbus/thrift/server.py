"""A Thrift server for the Nimbus service: framed transport, binary protocol.

thriftpy2's own threaded server spawns anonymous threads it never joins; this one names
every thread, stops on an event and joins its threads on shutdown.

**Threads go to requests, not to connections.** One thread (``thrift-accept-<port>``)
accepts connections and watches every connection that is not in the middle of a request,
with a selector: it runs the TLS handshake (non-blocking) and reads the 4-byte header of
each frame. Only once a header is complete does a worker thread (``thrift-worker-<port>-
<n>``, at most ``max_connections``, Storm's ``nimbus.thrift.threads``) take the
connection, read the rest of the frame, run the call and answer; then the connection goes
back to the selector. So a peer that connects and says nothing, stalls in its handshake,
or keeps a connection open between calls holds no thread (Storm's nimbus serves with
Thrift's half-sync/half-async server for the same reason). Requests that find every
worker busy wait in a queue, in the order their headers arrived.

Bounds on what a peer can hold:

* a new connection must complete its TLS handshake and send its first frame's header
  within ``handshake_timeout_s`` (``nimbus.thrift.handshake.timeout.secs``), and the rest
  of that first frame must follow within it too; otherwise it is dropped;
* at most ``max_open_connections`` are open at once. At that cap the connection that has
  waited longest without a request in progress (handshaking first, then idle) is dropped
  to make room for a new one; only if every open connection is in a request does the
  server stop accepting, and new clients wait in the kernel's listen backlog;
* one address may hold at most ``max_connections_per_address`` open connections; more are
  closed as soon as they are accepted (logged at most once a minute per address).

Inbound frames are read here, not by thriftpy2's framed transport. That transport trusts
the 4-byte length a peer sends: it reserves that many bytes and then buffers whatever
arrives until the frame is complete, so a header of 1 GiB followed by a stream of bytes
makes the process grow without limit. (A header of exactly 2 GiB or more "fails" only
because it is a negative int32, and one just under 2 GiB because thriftpy2's buffer-size
arithmetic overflows int32: neither is a limit.) Here the header is checked first:

* a length above ``max_frame_bytes`` (Storm's ``nimbus.thrift.max_buffer_size``), zero
  or negative drops the connection before anything is allocated for it;
* a frame is decoded from its own bytes only: a request that claims more data than its
  frame holds (huge string or list lengths) fails to decode, and the connection is
  dropped, instead of reading on into the following frames;
* a connection with no request in progress is dropped after ``idle_timeout_s``; once a
  frame's header has arrived, all of the frame must arrive within ``frame_timeout_s``, so
  a half frame, or a peer that trickles a byte now and then, cannot hold a worker for
  ever.

A call that runs long (a submission waiting for replication) can ask :func:`client_gone`
whether its client has hung up meanwhile, and :func:`current_client` says who the client
is (its certificate's name with TLS, else its address) for per-client limits. With TLS, a
client whose certificate has no common name is dropped after its handshake, logged with
its address: it has no identity (issue 19, T2.14).

A connection whose first four bytes are ``code_stream.MAGIC`` (a length no frame may
have) asks for a code stream instead: the rest of a download session, sent raw
(:mod:`nimbus.distribution.code_stream`); one whose first bytes are
``code_stream.UPLOAD_MAGIC`` sends an upload session's bytes the same way. Either is
served by a worker, after the same TLS handshake, and the connection is closed afterwards.
"""

from __future__ import annotations

import collections
import ipaddress
import logging
import queue
import select
import selectors
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.thrift import (
    TApplicationException,
    TException,
    TMessageType,
    TProcessor,
    TType,
)
from thriftpy2.transport import (
    TBufferedTransport,
    TFramedTransport,
    TSocket,
    TTransportException,
)
from thriftpy2.utils import serialize

from nimbus.distribution import code_stream
from nimbus.thrift import nimbus_ha
from nimbus.thrift.tls import NoIdentityError, caller, peer_identity, set_caller

log = logging.getLogger(__name__)

# How often the accepting and worker threads look at the stop event.
ACCEPT_POLL_S = 0.5
ACCEPT_RETRY_S = 0.5
IDLE_CONNECTION_S = 900.0
# Once a frame has begun, all of it must arrive within this (1 MiB at 10 KB/s: 105 s).
FRAME_TIMEOUT_S = 120.0
# nimbus.thrift.handshake.timeout.secs: a new connection's TLS handshake and first frame.
HANDSHAKE_TIMEOUT_S = 5.0
LISTEN_BACKLOG = 128
# Storm's defaults for nimbus.thrift.max_buffer_size and nimbus.thrift.threads.
DEFAULT_MAX_FRAME_BYTES = 1048576
DEFAULT_MAX_CONNECTIONS = 64
# Each open connection costs a file descriptor (and, with TLS, a session's memory).
MAX_OPEN_CONNECTIONS = 512
# Without TLS every process of a one-host cluster shares an address: keep this generous.
MAX_CONNECTIONS_PER_ADDRESS = 128
REFUSAL_LOG_INTERVAL_S = 60.0
# Connections accepted per readiness of the listening socket, so that a flood of new
# connections cannot starve the handshakes and requests of the others.
ACCEPT_BATCH = 64
_TCP_ESTABLISHED = 1  # tcpi_state in Linux's struct tcp_info

_FRAME_HEADER = struct.Struct("!i")
_LISTEN, _WAKE = "listen", "wake"  # selector keys that are not connections

_serving = threading.local()  # .connection: the _Connection a worker is serving


def current_client() -> str:
    """Who sent the call being served on this thread, for per-client limits: its
    certificate's common name with TLS, otherwise its address; "" outside a call."""
    conn = getattr(_serving, "connection", None)
    if conn is None:
        return ""
    return conn.identity or conn.host


def call_context() -> Callable[[], None]:
    """A function that, run on another thread, makes it serve the same call as this one
    (its client for :func:`current_client`, :func:`client_gone` and the caller's
    identity): for work a call hands to a thread of its own."""
    conn = getattr(_serving, "connection", None)
    identity = caller()

    def install() -> None:
        _serving.connection = conn
        set_caller(identity)

    return install


def client_gone() -> bool:
    """True once the client of the call being served on this thread has closed or reset
    its connection; False outside a call. A client of this service sends nothing while
    it waits for a reply, so a connection its peer has closed has nobody to answer."""
    conn = getattr(_serving, "connection", None)
    return conn is not None and _peer_closed(conn.sock)


def _peer_closed(sock: socket.socket) -> bool:
    try:
        if hasattr(socket, "TCP_INFO"):
            # Linux: the connection's TCP state, whatever unread bytes (a TLS alert)
            # arrived before the peer's FIN.
            return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] \
                != _TCP_ESTABLISHED
        readable, _, _ = select.select([sock], [], [], 0)
        # The raw socket's recv: an SSLSocket's own refuses MSG_PEEK.
        return bool(readable) and socket.socket.recv(sock, 1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):  # ValueError: the socket is closed already
        return True


class FrameError(Exception):
    """A peer's frame header is out of bounds; it is dropped before any allocation."""


class BadRequestError(Exception):
    """A frame holds no request of the Nimbus service that decodes."""


# The arguments a Nimbus method may be called without (they are optional in Storm's
# clients too); a call missing any other is answered with an error, never run.
OPTIONAL_ARGUMENTS = frozenset({"topology", "options"})
# Per method: Storm UI asks getSupervisorPageInfo by id *or* host (the other null, so
# not sent), and a client may leave the page calls' window and is_include_sys unset.
OPTIONAL_ARGUMENTS_OF = {
    "getSupervisorPageInfo": frozenset({"id", "host", "is_include_sys"}),
    "getTopologyPageInfo": frozenset({"window", "is_include_sys"}),
    "getComponentPageInfo": frozenset({"window", "is_include_sys"}),
}


class EncodedResult:
    """A method's result struct (``<method>_result``) already encoded in the binary
    protocol, which a handler may return instead of a value: the server then writes
    these bytes as they are. For a large answer that many calls share unchanged
    (getClusterInfo at thousands of topologies, whose encoding in Python costs more than
    the rest of the call), so that it is encoded once rather than once per call."""

    __slots__ = ("data",)

    def __init__(self, result: Any = None, *, data: bytes | None = None):
        """``result`` to encode, or ``data``: its encoding, made by the caller."""
        self.data = data if data is not None else serialize(result, TBinaryProtocolFactory())


class _Processor(TProcessor):
    """Tells failures to decode a request (the peer's fault) from the handler's own, and
    answers every call that decodes: with its result, a declared exception, or a
    TApplicationException, as Storm's (Java) servers do, so that an exception nobody
    declared never drops the connection."""

    def process_in(self, iprot: Any) -> Any:
        try:
            api, _type, seqid = iprot.read_message_begin()
            if api not in self._service.thrift_services:
                iprot.skip(TType.STRUCT)
                iprot.read_message_end()
                return api, seqid, TApplicationException(
                    TApplicationException.UNKNOWN_METHOD, f"unknown method {api[:100]!r}"), None
            args = getattr(self._service, api + "_args")()
            args.read(iprot)
            iprot.read_message_end()
        except Exception as exc:
            raise BadRequestError(f"{type(exc).__name__}: {exc}") from exc
        names = [spec[1] for spec in args.thrift_spec.values()]
        optional = OPTIONAL_ARGUMENTS | OPTIONAL_ARGUMENTS_OF.get(api, frozenset())
        missing = [n for n in names if getattr(args, n) is None and n not in optional]
        if missing:
            return api, seqid, TApplicationException(
                TApplicationException.PROTOCOL_ERROR,
                f"{api}: argument {missing[0]!r} is missing"), None
        return api, seqid, getattr(self._service, api + "_result")(), \
            lambda: getattr(self._handler, api)(*(getattr(args, n) for n in names))

    def process(self, iprot: Any, oprot: Any) -> None:
        api, seqid, result, call = self.process_in(iprot)
        if isinstance(result, TApplicationException):
            return self.send_exception(oprot, api, result, seqid)
        try:
            result.success = call()
        except TApplicationException as exc:
            return self.send_exception(oprot, api, exc, seqid)
        except Exception as exc:
            if not self.handle_exception(exc, result):
                # Not one this method declares. A refusal (a Thrift exception) is logged
                # briefly, and so is a call given up because its client hung up (nobody
                # is left to answer); anything else is a bug here, logged with its
                # traceback.
                message = getattr(exc, "msg", None) or str(exc)
                if client_gone():
                    log.info("%s not answered: its client closed the connection (%s)",
                             api, message)
                    return None
                if isinstance(exc, TException):
                    log.warning("%s: %s", api, message)
                else:
                    log.exception("%s failed", api)
                return self.send_exception(oprot, api, TApplicationException(
                    TApplicationException.INTERNAL_ERROR,
                    f"Internal error processing {api}: {type(exc).__name__}: {message}"),
                    seqid)
        if result.oneway:
            return None
        if isinstance(getattr(result, "success", None), EncodedResult):
            # Encoded with the binary protocol, this server's only one (_protocols).
            oprot.write_message_begin(api, TMessageType.REPLY, seqid)
            oprot.trans.write(result.success.data)
            oprot.write_message_end()
            oprot.trans.flush()
            return None
        self.send_result(oprot, api, result, seqid)


class _FrameReader:
    """What the protocol decodes from: the bytes of one frame and nothing after them."""

    def __init__(self, frame: bytearray):
        self._view = memoryview(frame)

    def read(self, sz: int) -> bytes:
        if not self._view:
            raise TTransportException(TTransportException.END_OF_FILE,
                                      "request runs past the end of its frame")
        out = bytes(self._view[:sz])
        self._view = self._view[sz:]
        return out


def _recv_exactly(conn: socket.socket, size: int, what: str,
                  deadline: float | None = None) -> bytearray | None:
    """``size`` bytes from ``conn``; None if the peer closed before sending any.

    With a ``deadline`` (time.monotonic()) every byte must have arrived by then, so a
    peer that trickles a byte at a time cannot hold its connection thread for ever.
    """
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{what} took too long: {got} of {size} bytes arrived")
            conn.settimeout(remaining)
        n = conn.recv_into(view[got:])
        if n == 0:
            if got == 0:
                return None
            raise EOFError(f"peer closed after {got} of the {size} bytes of {what}")
        got += n
    return buf


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(eq=False)
class _Connection:
    """One accepted connection. Owned by the accepting thread while it waits (for its
    handshake, or for a frame header), by one worker while a request is served."""

    sock: socket.socket
    host: str
    peer: str  # host:port, for the log
    deadline: float  # time.monotonic() by which it must have sent a frame header
    handshaking: bool = False
    identity: str | None = None  # its certificate's common name, with TLS
    header: bytearray = field(default_factory=bytearray)
    served: int = 0  # requests answered on it
    events: int = 0  # what the selector watches it for; 0: not in the selector
    closed: bool = False
    oprot: Any = None


class _StreamSource:
    """Serves a code stream with the send timeout of a frame: the session id had to
    arrive within the first frame's short timeout, the file may take longer to drain
    (or, for an upload, to arrive)."""

    def __init__(self, source: code_stream.StreamEndpoint, timeout_s: float):
        self._source = source
        self._timeout_s = timeout_s

    def stream_download(self, session_id: str, conn: socket.socket, announce: Any) -> int:
        conn.settimeout(self._timeout_s)
        return self._source.stream_download(session_id, conn, announce)

    def stream_upload(self, location: str, conn: socket.socket, ready: Any) -> int:
        conn.settimeout(self._timeout_s)
        return self._source.stream_upload(location, conn, ready)


class ThriftServer:
    """Serve ``handler`` on ``host:port`` (the bind address) until :meth:`stop`."""

    def __init__(self, handler: object, host: str, port: int, *,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 idle_timeout_s: float = IDLE_CONNECTION_S,
                 frame_timeout_s: float = FRAME_TIMEOUT_S,
                 handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
                 max_open_connections: int = MAX_OPEN_CONNECTIONS,
                 max_connections_per_address: int = MAX_CONNECTIONS_PER_ADDRESS,
                 advertised_host: str | None = None,
                 ssl_context: ssl.SSLContext | None = None,
                 downloads: code_stream.StreamEndpoint | None = None):
        if max_frame_bytes < 1:
            raise ValueError(f"nimbus.thrift.max_buffer_size must be positive, "
                             f"got {max_frame_bytes}")
        if max_frame_bytes > code_stream.MAX_FRAME_BYTES:
            raise ValueError(f"nimbus.thrift.max_buffer_size must be at most "
                             f"{code_stream.MAX_FRAME_BYTES} (longer frame lengths are "
                             f"reserved for the code stream), got {max_frame_bytes}")
        if max_connections < 1:
            raise ValueError(f"nimbus.thrift.threads must be at least 1, got {max_connections}")
        if handshake_timeout_s <= 0:
            raise ValueError(f"nimbus.thrift.handshake.timeout.secs must be positive, "
                             f"got {handshake_timeout_s}")
        if max_open_connections < 1:
            raise ValueError(f"the most open connections must be at least 1, "
                             f"got {max_open_connections}")
        if max_connections_per_address < 1:
            raise ValueError(f"the most connections per address must be at least 1, "
                             f"got {max_connections_per_address}")
        self.max_frame_bytes = max_frame_bytes
        self.max_connections = max_connections
        self.max_open_connections = max_open_connections
        self.max_connections_per_address = max_connections_per_address
        # With TLS (nimbus.thrift.tls): client certificates are required; the handshake
        # is run by the accepting thread, non-blocking, within handshake_timeout_s.
        self._ssl = ssl_context
        # Serves code streams (a connection whose first bytes are code_stream.MAGIC or,
        # for uploads, code_stream.UPLOAD_MAGIC).
        self._downloads = downloads
        self.idle_timeout_s = idle_timeout_s
        self.frame_timeout_s = frame_timeout_s
        self.handshake_timeout_s = handshake_timeout_s
        self._processor = _Processor(nimbus_ha.NimbusHa, handler)
        self._protocols = TBinaryProtocolFactory()
        host = host or "0.0.0.0"  # an empty bind address means every interface
        family, _, _, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        self._family = family
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind(address)
            self._sock.listen(LISTEN_BACKLOG)
        except OSError:
            self._sock.close()
            raise
        self._sock.setblocking(False)
        self.host = host
        self.port = self._sock.getsockname()[1]
        if advertised_host is not None and _is_loopback(host) \
                and not _is_loopback(advertised_host):
            log.warning("nimbus.host %s is advertised, but the Thrift server binds %s only: "
                        "other hosts cannot reach it (set nimbus.thrift.bind.address)",
                        advertised_host, host)
        self._stop = threading.Event()
        # Workers hand connections back through _returned and wake the selector.
        self._wake_in, self._wake_out = socket.socketpair()
        self._wake_in.setblocking(False)
        self._wake_out.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_in, selectors.EVENT_READ, _WAKE)
        self._listening = False
        self._resume_at = 0.0  # after an accept error, no accepting before this
        # The accepting thread's own, in the order their deadlines come:
        self._admitting: collections.OrderedDict[_Connection, None] = \
            collections.OrderedDict()  # handshake or first header under way
        self._idle: collections.OrderedDict[_Connection, None] = \
            collections.OrderedDict()  # between requests
        self._open = 0
        self._per_address: collections.Counter[str] = collections.Counter()
        self._refusals_logged: dict[str, float] = {}
        # Shared with the workers:
        self._ready: queue.Queue[_Connection] = queue.Queue()
        self._returned: collections.deque[tuple[_Connection, bool]] = collections.deque()
        self._lock = threading.Lock()  # the next three
        self._busy: set[_Connection] = set()
        self._workers: list[threading.Thread] = []
        self._waiting_workers = 0
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name=f"thrift-accept-{self.port}", daemon=True)

    @property
    def bound_address(self) -> tuple[str, int]:
        """(address, port) the listening socket is bound to."""
        return self._sock.getsockname()[:2]

    @property
    def active_connections(self) -> int:
        """Connections a worker is serving now (at most ``max_connections``)."""
        with self._lock:
            return len(self._busy)

    @property
    def open_connections(self) -> int:
        """Connections accepted and not closed yet (at most ``max_open_connections``)."""
        return self._open

    def start(self) -> None:
        log.info("Thrift server listening on %s:%d (at most %d requests at once, %d open "
                 "connections, frames up to %d bytes)", self.host, self.port,
                 self.max_connections, self.max_open_connections, self.max_frame_bytes)
        self._accept_thread.start()

    def stop(self) -> None:
        """Stop accepting, close every connection and join every thread (a call still
        running after the sockets are shut down is waited for up to 5 s)."""
        self._stop.set()
        self._wake()
        if self._accept_thread.ident is not None:  # started: it closes what it holds
            self._accept_thread.join(timeout=5)
        else:
            self._close_waiting()
        with self._lock:
            busy = list(self._busy)
            workers = list(self._workers)
        for conn in busy:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in workers:
            thread.join(timeout=5)
        # What no thread will take any more: queued requests, connections handed back.
        while True:
            try:
                self._ready.get_nowait().sock.close()
            except queue.Empty:
                break
        while self._returned:
            self._returned.popleft()[0].sock.close()

    # -- the accepting thread: new connections, handshakes, frame headers ---------------------
    def _accept_loop(self) -> None:
        try:
            while not self._stop.is_set():
                self._update_listening()
                for key, _ in self._selector.select(self._next_timeout()):
                    if key.data is _LISTEN:
                        self._accept_batch()
                    elif key.data is _WAKE:
                        self._drain_wake()
                    elif not key.data.closed:
                        self._advance(key.data)
                self._take_returned()
                self._expire()
        except Exception:
            log.exception("the Thrift server's accepting thread failed; it serves no more")
        finally:
            self._close_waiting()

    def _close_waiting(self) -> None:
        """Close the listening socket and every connection this thread holds."""
        for conn in [*self._admitting, *self._idle]:
            self._close(conn)
        self._take_returned()
        self._selector.close()
        self._sock.close()
        self._wake_in.close()
        self._wake_out.close()

    def _next_timeout(self) -> float:
        now = time.monotonic()
        due = [now + ACCEPT_POLL_S]
        for table in (self._admitting, self._idle):
            if table:
                due.append(next(iter(table)).deadline)
        if not self._listening and self._resume_at > now:
            due.append(self._resume_at)
        return max(0.0, min(due) - now)

    def _update_listening(self) -> None:
        """Listen while there is room, or a waiting connection to make room; not while
        an accept error is being waited out."""
        want = (self._open < self.max_open_connections or bool(self._admitting)
                or bool(self._idle)) and time.monotonic() >= self._resume_at
        if want == self._listening:
            return
        if want:
            self._selector.register(self._sock, selectors.EVENT_READ, _LISTEN)
        else:
            self._selector.unregister(self._sock)
        self._listening = want

    def _accept_batch(self) -> None:
        for _ in range(ACCEPT_BATCH):
            if self._open >= self.max_open_connections and not (self._admitting
                                                                  or self._idle):
                return  # every open connection is in a request: new ones wait in the backlog
            try:
                sock, address = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                # e.g. EMFILE: keep serving, and accept again once descriptors are free.
                log.warning("accepting a Thrift connection failed: %s", exc)
                self._resume_at = time.monotonic() + ACCEPT_RETRY_S
                return
            self._admit(sock, str(address[0]), int(address[1]))

    def _make_room(self) -> None:
        """Drop the connection that has waited longest without a request in progress
        (handshaking before idle)."""
        for table in (self._admitting, self._idle):
            if table:
                conn = next(iter(table))
                log.info("dropped Thrift connection from %s: %d connections are open, the "
                         "most this nimbus keeps, and it has waited longest", conn.peer,
                         self._open)
                self._close(conn)
                return

    def _admit(self, sock: socket.socket, host: str, port: int) -> None:
        if self._per_address[host] >= self.max_connections_per_address:
            self._log_refusal(host)
            sock.close()
            return
        if self._open >= self.max_open_connections:
            self._make_room()
        sock.setblocking(False)
        conn = _Connection(sock, host, f"{host}:{port}",
                           deadline=time.monotonic() + self.handshake_timeout_s)
        self._open += 1
        self._per_address[host] += 1
        if self._ssl is not None:
            try:
                conn.sock = self._ssl.wrap_socket(sock, server_side=True,
                                                  do_handshake_on_connect=False)
            except (ssl.SSLError, OSError) as exc:
                log.warning("dropped Thrift connection from %s: %s", conn.peer, exc)
                self._close(conn)
                return
            conn.handshaking = True
        self._admitting[conn] = None
        self._watch(conn, selectors.EVENT_READ)

    def _log_refusal(self, host: str) -> None:
        now = time.monotonic()
        if now - self._refusals_logged.get(host, -REFUSAL_LOG_INTERVAL_S) \
                < REFUSAL_LOG_INTERVAL_S:
            return
        if len(self._refusals_logged) > 1024:  # forget addresses not refused lately
            self._refusals_logged = {h: t for h, t in self._refusals_logged.items()
                                     if now - t < REFUSAL_LOG_INTERVAL_S}
        self._refusals_logged[host] = now
        log.warning("refused a Thrift connection from %s: it has %d open, the most one "
                    "address may have (further refusals of %s are logged once a minute)",
                    host, self._per_address[host], host)

    def _watch(self, conn: _Connection, events: int) -> None:
        if conn.events == events:
            return
        if conn.events:
            self._selector.modify(conn.sock, events, conn)
        else:
            self._selector.register(conn.sock, events, conn)
        conn.events = events

    def _unwatch(self, conn: _Connection) -> None:
        if conn.events:
            try:
                self._selector.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
            conn.events = 0

    def _advance(self, conn: _Connection) -> None:
        """Take a waiting connection as far as its bytes allow: through its TLS
        handshake, then its next frame header, which hands it to a worker."""
        if conn.handshaking:
            try:
                conn.sock.do_handshake()
            except ssl.SSLWantReadError:
                self._watch(conn, selectors.EVENT_READ)
                return
            except ssl.SSLWantWriteError:
                self._watch(conn, selectors.EVENT_WRITE)
                return
            except (ssl.SSLError, OSError) as exc:
                log.warning("dropped Thrift connection from %s: TLS handshake failed (%s)",
                            conn.peer, getattr(exc, "reason", None) or exc)
                self._close(conn)
                return
            conn.handshaking = False
            try:
                conn.identity = peer_identity(conn.sock)
            except NoIdentityError as exc:  # the empty identity must match nothing
                log.warning("dropped Thrift connection from %s: %s", conn.peer, exc)
                self._close(conn)
                return
            self._watch(conn, selectors.EVENT_READ)
        while len(conn.header) < _FRAME_HEADER.size:
            try:
                data = conn.sock.recv(_FRAME_HEADER.size - len(conn.header))
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
                self._watch(conn, selectors.EVENT_READ)
                return
            except ssl.SSLWantWriteError:  # TLS must send first (its peer does not read)
                self._watch(conn, selectors.EVENT_WRITE)
                return
            except OSError as exc:
                log.debug("Thrift connection from %s failed: %s", conn.peer, exc)
                self._close(conn)
                return
            if not data:  # the peer closed between requests
                self._close(conn)
                return
            conn.header += data
        self._unwatch(conn)
        self._admitting.pop(conn, None)
        self._idle.pop(conn, None)
        self._dispatch(conn)

    def _expire(self) -> None:
        now = time.monotonic()
        for table in (self._admitting, self._idle):
            while table:
                conn = next(iter(table))
                if conn.deadline > now:
                    break
                if table is self._admitting:
                    log.info("dropped Thrift connection from %s: no %srequest within %ss",
                             conn.peer, "TLS handshake and " if self._ssl else "",
                             self.handshake_timeout_s)
                else:
                    log.info("dropped Thrift connection from %s: nothing received for %ss",
                             conn.peer, self.idle_timeout_s)
                self._close(conn)

    def _close(self, conn: _Connection) -> None:
        """Close ``conn`` and forget it (the accepting thread only)."""
        if conn.closed:
            return
        conn.closed = True
        self._unwatch(conn)
        self._admitting.pop(conn, None)
        self._idle.pop(conn, None)
        conn.sock.close()
        self._open -= 1
        self._per_address[conn.host] -= 1
        if self._per_address[conn.host] <= 0:
            del self._per_address[conn.host]

    def _take_returned(self) -> None:
        """Connections the workers are done with: wait for their next request, or close."""
        while self._returned:
            conn, keep = self._returned.popleft()
            if not keep or self._stop.is_set():
                self._close(conn)
                continue
            try:
                conn.sock.setblocking(False)
                conn.deadline = time.monotonic() + self.idle_timeout_s
                self._idle[conn] = None
                self._watch(conn, selectors.EVENT_READ)
            except (OSError, ValueError):  # closed under the worker (stop)
                self._close(conn)

    def _wake(self) -> None:
        try:
            self._wake_out.send(b"\0")
        except OSError:  # full (a wake-up is pending anyway) or closed (stopped)
            pass

    def _drain_wake(self) -> None:
        try:
            while self._wake_in.recv(4096):
                pass
        except OSError:
            pass

    # -- workers: one request at a time ----------------------------------------------------------
    def _dispatch(self, conn: _Connection) -> None:
        self._ready.put(conn)
        with self._lock:
            if self._waiting_workers >= self._ready.qsize() \
                    or len(self._workers) >= self.max_connections:
                return
            thread = threading.Thread(
                target=self._work, name=f"thrift-worker-{self.port}-{len(self._workers) + 1}",
                daemon=True)
            self._workers.append(thread)
        try:
            thread.start()
        except RuntimeError as exc:  # no thread to be had: the others serve the queue
            log.warning("cannot start a Thrift worker thread: %s", exc)
            with self._lock:
                self._workers.remove(thread)

    def _work(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                self._waiting_workers += 1
            try:
                conn = self._ready.get(timeout=ACCEPT_POLL_S)
            except queue.Empty:
                continue
            finally:
                with self._lock:
                    self._waiting_workers -= 1
            self._serve(conn)

    def _serve(self, conn: _Connection) -> None:
        """Serve the request whose header the accepting thread read, then hand the
        connection back (or close it)."""
        with self._lock:
            self._busy.add(conn)
        _serving.connection = conn
        set_caller(conn.identity if self._ssl is not None else None)
        keep = False
        try:
            keep = self._serve_requests(conn)
        except FrameError as exc:
            log.warning("dropped Thrift connection from %s: %s", conn.peer, exc)
        except BadRequestError as exc:
            log.warning("dropped Thrift connection from %s: undecodable request (%s)",
                        conn.peer, exc)
        except TimeoutError:
            log.info("dropped Thrift connection from %s: a frame did not arrive in time",
                     conn.peer)
        except (TTransportException, OSError, EOFError):
            pass
        except Exception:
            log.exception("thrift connection from %s failed", conn.peer)
        finally:
            _serving.connection = None
            set_caller(None)
            with self._lock:
                self._busy.discard(conn)
            if not keep:
                conn.sock.close()  # at once, so the peer sees it; forgotten below
            self._returned.append((conn, keep))
            self._wake()

    def _serve_requests(self, conn: _Connection) -> bool:
        """Read the frame whose header is in ``conn.header``, run it and answer; True to
        keep the connection for its next request."""
        sock = conn.sock
        if conn.oprot is None:
            tsocket = TSocket(socket_family=self._family)
            tsocket.sock = sock
            # Responses only; inbound frames are read here.
            conn.oprot = self._protocols.get_protocol(TFramedTransport(tsocket))
        header = bytes(conn.header)
        conn.header.clear()
        # A new connection's first frame is held to the handshake's short timeout.
        timeout_s = self.frame_timeout_s if conn.served else \
            min(self.handshake_timeout_s, self.frame_timeout_s)
        while True:
            deadline = time.monotonic() + timeout_s
            if not conn.served and header == code_stream.MAGIC \
                    and self._downloads is not None:
                code_stream.serve(sock, _StreamSource(self._downloads, self.frame_timeout_s),
                                  deadline)
                return False
            if not conn.served and header == code_stream.UPLOAD_MAGIC \
                    and self._downloads is not None:
                code_stream.serve_upload(
                    sock, _StreamSource(self._downloads, self.frame_timeout_s), deadline)
                return False
            frame = self._read_frame(sock, header, deadline)
            sock.settimeout(self.frame_timeout_s)  # for the reply
            iprot = self._protocols.get_protocol(TBufferedTransport(_FrameReader(frame)))
            self._processor.process(iprot, conn.oprot)
            conn.served += 1
            if self._stop.is_set():
                return False
            # Bytes TLS has decrypted already are invisible to the selector: serve them.
            if not (isinstance(sock, ssl.SSLSocket) and sock.pending()):
                return True
            timeout_s = self.frame_timeout_s
            got = _recv_exactly(sock, _FRAME_HEADER.size, "a frame header",
                                time.monotonic() + timeout_s)
            if got is None:
                return False
            header = bytes(got)

    def _read_frame(self, sock: socket.socket, header: bytes, deadline: float) -> bytearray:
        """The frame ``header`` announces, checked before anything is allocated for it."""
        (size,) = _FRAME_HEADER.unpack(header)
        if size <= 0:
            raise FrameError(f"invalid frame length {size}")
        if size > self.max_frame_bytes:
            raise FrameError(f"frame of {size} bytes is over nimbus.thrift.max_buffer_size "
                             f"({self.max_frame_bytes})")
        frame = _recv_exactly(sock, size, "a frame", deadline)
        if frame is None:
            raise EOFError(f"peer closed after the header of a {size}-byte frame")
        return frame
