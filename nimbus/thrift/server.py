"""A Thrift server for the Nimbus service: framed transport, binary protocol.

thriftpy2's own threaded server spawns anonymous threads it never joins; this one names
every thread, stops on an event and joins its connection threads on shutdown.

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
* a peer that stops sending between frames is dropped after ``idle_timeout_s``; once a
  frame has begun, all of it must arrive within ``frame_timeout_s``, so a half frame, or
  a peer that trickles a byte now and then, cannot hold a connection thread for ever;
* at most ``max_connections`` connections (Storm's ``nimbus.thrift.threads``) are served
  at once, one thread each. Over that cap the server stops accepting: further clients
  wait in the kernel's listen backlog (no thread, no memory of ours) and are served as
  soon as a connection closes, as Storm's thread-pool server makes them wait for a worker.
  Once the backlog is full too, the kernel ignores new connection attempts until there is
  room, and the clients' connect timeouts apply.

A connection whose first four bytes are ``code_stream.MAGIC`` (a length no frame may
have) asks for a code stream instead: the rest of a download session, sent raw
(:mod:`nimbus.distribution.code_stream`). It is served on the connection's thread, after
the same TLS handshake, and the connection is closed afterwards.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import ssl
import struct
import threading
import time
from typing import Any

from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.thrift import TApplicationException, TException, TProcessor, TType
from thriftpy2.transport import (
    TBufferedTransport,
    TFramedTransport,
    TSocket,
    TTransportException,
)

from nimbus.distribution import code_stream
from nimbus.thrift import storm
from nimbus.thrift.tls import common_name, set_caller

log = logging.getLogger(__name__)

ACCEPT_POLL_S = 0.5
ACCEPT_RETRY_S = 0.5
IDLE_CONNECTION_S = 900.0
# Once a frame has begun, all of it must arrive within this (1 MiB at 10 KB/s: 105 s).
FRAME_TIMEOUT_S = 120.0
LISTEN_BACKLOG = 128
# Storm's defaults for nimbus.thrift.max_buffer_size and nimbus.thrift.threads.
DEFAULT_MAX_FRAME_BYTES = 1048576
DEFAULT_MAX_CONNECTIONS = 64

_FRAME_HEADER = struct.Struct("!i")


class FrameError(Exception):
    """A peer's frame header is out of bounds; it is dropped before any allocation."""


class BadRequestError(Exception):
    """A frame holds no request of the Nimbus service that decodes."""


# The arguments a Nimbus method may be called without (they are optional in Storm's
# clients too); a call missing any other is answered with an error, never run.
OPTIONAL_ARGUMENTS = frozenset({"topology", "options"})


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
        missing = [n for n in names if getattr(args, n) is None and n not in OPTIONAL_ARGUMENTS]
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
                # briefly; anything else is a bug here, logged with its traceback.
                message = getattr(exc, "msg", None) or str(exc)
                if isinstance(exc, TException):
                    log.warning("%s: %s", api, message)
                else:
                    log.exception("%s failed", api)
                return self.send_exception(oprot, api, TApplicationException(
                    TApplicationException.INTERNAL_ERROR,
                    f"Internal error processing {api}: {type(exc).__name__}: {message}"),
                    seqid)
        if not result.oneway:
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


class ThriftServer:
    """Serve ``handler`` on ``host:port`` (the bind address) until :meth:`stop`."""

    def __init__(self, handler: object, host: str, port: int, *,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 idle_timeout_s: float = IDLE_CONNECTION_S,
                 frame_timeout_s: float = FRAME_TIMEOUT_S,
                 advertised_host: str | None = None,
                 ssl_context: ssl.SSLContext | None = None,
                 downloads: code_stream.DownloadSource | None = None):
        if max_frame_bytes < 1:
            raise ValueError(f"nimbus.thrift.max_buffer_size must be positive, "
                             f"got {max_frame_bytes}")
        if max_frame_bytes > code_stream.MAX_FRAME_BYTES:
            raise ValueError(f"nimbus.thrift.max_buffer_size must be at most "
                             f"{code_stream.MAX_FRAME_BYTES} (longer frame lengths are "
                             f"reserved for the code stream), got {max_frame_bytes}")
        if max_connections < 1:
            raise ValueError(f"nimbus.thrift.threads must be at least 1, got {max_connections}")
        self.max_frame_bytes = max_frame_bytes
        self.max_connections = max_connections
        # With TLS (nimbus.thrift.tls): client certificates are required; the handshake
        # happens on the connection's own thread, bounded by frame_timeout_s.
        self._ssl = ssl_context
        # Serves code streams (a connection whose first bytes are code_stream.MAGIC).
        self._downloads = downloads
        self.idle_timeout_s = idle_timeout_s
        self.frame_timeout_s = frame_timeout_s
        self._processor = _Processor(storm.Nimbus, handler)
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
        self._sock.settimeout(ACCEPT_POLL_S)
        self.host = host
        self.port = self._sock.getsockname()[1]
        if advertised_host is not None and _is_loopback(host) \
                and not _is_loopback(advertised_host):
            log.warning("nimbus.host %s is advertised, but the Thrift server binds %s only: "
                        "other hosts cannot reach it (set nimbus.thrift.bind.address)",
                        advertised_host, host)
        self._stop = threading.Event()
        self._slots = threading.BoundedSemaphore(max_connections)
        self._conns: dict[threading.Thread, socket.socket] = {}
        self._conns_lock = threading.Lock()
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name=f"thrift-accept-{self.port}", daemon=True)
        self._count = 0

    @property
    def bound_address(self) -> tuple[str, int]:
        """(address, port) the listening socket is bound to."""
        return self._sock.getsockname()[:2]

    @property
    def active_connections(self) -> int:
        """Connections being served now (at most ``max_connections``)."""
        with self._conns_lock:
            return len(self._conns)

    def start(self) -> None:
        log.info("Thrift server listening on %s:%d (at most %d connections, frames up to "
                 "%d bytes)", self.host, self.port, self.max_connections, self.max_frame_bytes)
        self._accept_thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._accept_thread.ident is not None:  # started
            self._accept_thread.join(timeout=5)
        self._sock.close()
        with self._conns_lock:
            conns = dict(self._conns)
        for conn in conns.values():
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in conns:
            thread.join(timeout=5)

    # -- accepting --------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            # Over the cap, nothing is accepted: new clients wait in the listen backlog.
            if not self._slots.acquire(timeout=ACCEPT_POLL_S):
                continue
            conn = self._accept()
            if conn is None:
                self._slots.release()
                continue
            conn.settimeout(self.idle_timeout_s)
            self._count += 1
            thread = threading.Thread(target=self._serve, args=(conn,),
                                      name=f"thrift-conn-{self._count}", daemon=True)
            with self._conns_lock:
                self._conns[thread] = conn
            try:
                thread.start()
            except RuntimeError as exc:  # no thread to be had: refuse this one
                log.warning("cannot serve a Thrift connection: %s", exc)
                with self._conns_lock:
                    self._conns.pop(thread, None)
                conn.close()
                self._slots.release()

    def _accept(self) -> socket.socket | None:
        """The next connection, or None once stopping."""
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
                return conn
            except TimeoutError:
                continue
            except OSError as exc:
                if self._stop.is_set():
                    return None
                # e.g. EMFILE: keep serving once descriptors are free again.
                log.warning("accepting a Thrift connection failed: %s", exc)
                self._stop.wait(ACCEPT_RETRY_S)
        return None

    # -- serving ----------------------------------------------------------------------------
    def _read_frame(self, conn: socket.socket, first_frame: bool = False) -> bytearray | None:
        """The next inbound frame; None if the peer closed the connection between frames,
        or if the connection's first bytes asked for a code stream, which was served."""
        # Between frames a connection may idle (the socket's idle timeout applies); once
        # a frame has begun, all of it must arrive within frame_timeout_s.
        first = _recv_exactly(conn, 1, "a frame header")
        if first is None:
            return None
        deadline = time.monotonic() + self.frame_timeout_s
        rest = _recv_exactly(conn, _FRAME_HEADER.size - 1, "a frame header", deadline)
        if rest is None:
            raise EOFError("peer closed inside a frame header")
        header = first + rest
        if first_frame and header == code_stream.MAGIC and self._downloads is not None:
            code_stream.serve(conn, self._downloads, deadline)
            return None
        (size,) = _FRAME_HEADER.unpack(header)
        if size <= 0:
            raise FrameError(f"invalid frame length {size}")
        if size > self.max_frame_bytes:
            raise FrameError(f"frame of {size} bytes is over nimbus.thrift.max_buffer_size "
                             f"({self.max_frame_bytes})")
        frame = _recv_exactly(conn, size, "a frame", deadline)
        if frame is None:
            raise EOFError(f"peer closed after the header of a {size}-byte frame")
        conn.settimeout(self.idle_timeout_s)
        return frame

    def _handshake(self, conn: socket.socket, peer: str) -> socket.socket | None:
        """The TLS connection, its caller recorded; None (logged) if the peer has no
        certificate the cluster's CA signed, or no TLS at all."""
        assert self._ssl is not None
        conn.settimeout(self.frame_timeout_s)
        try:
            secure = self._ssl.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            log.warning("dropped Thrift connection from %s: TLS handshake failed (%s)",
                        peer, getattr(exc, "reason", None) or exc)
            conn.close()
            return None
        with self._conns_lock:  # stop() must shut down the socket that now owns the fd
            self._conns[threading.current_thread()] = secure
        set_caller(common_name(secure.getpeercert()))
        secure.settimeout(self.idle_timeout_s)
        return secure

    def _serve(self, conn: socket.socket) -> None:
        try:
            host, port = conn.getpeername()[:2]
            peer = f"{host}:{port}"
        except OSError:
            peer = "a peer"
        if self._ssl is not None:
            secured = self._handshake(conn, peer)
            if secured is None:
                with self._conns_lock:
                    self._conns.pop(threading.current_thread(), None)
                self._slots.release()
                return
            conn = secured
        else:
            set_caller(None)
        sock = TSocket(socket_family=self._family)
        sock.sock = conn
        out = TFramedTransport(sock)  # responses only; inbound frames are read above
        oprot = self._protocols.get_protocol(out)
        try:
            first_frame = True
            while not self._stop.is_set():
                frame = self._read_frame(conn, first_frame)
                first_frame = False
                if frame is None:
                    return
                iprot = self._protocols.get_protocol(TBufferedTransport(_FrameReader(frame)))
                self._processor.process(iprot, oprot)
        except FrameError as exc:
            log.warning("dropped Thrift connection from %s: %s", peer, exc)
        except BadRequestError as exc:
            log.warning("dropped Thrift connection from %s: undecodable request (%s)",
                        peer, exc)
        except TimeoutError:
            log.info("dropped Thrift connection from %s: nothing received for %ss",
                     peer, self.idle_timeout_s)
        except (TTransportException, OSError, EOFError):
            pass
        except Exception:
            log.exception("thrift connection from %s failed", peer)
        finally:
            try:
                conn.close()
            finally:
                with self._conns_lock:
                    self._conns.pop(threading.current_thread(), None)
                self._slots.release()
