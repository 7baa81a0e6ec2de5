"""A Thrift server for the Nimbus service: framed transport, binary protocol.

thriftpy2's own threaded server spawns anonymous threads it never joins; this one names
every thread, stops on an event and joins its connection threads on shutdown.
"""

from __future__ import annotations

import logging
import socket
import threading

from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.thrift import TProcessor
from thriftpy2.transport import TFramedTransportFactory, TSocket, TTransportException

from nimbus.thrift import storm

log = logging.getLogger(__name__)

ACCEPT_RETRY_S = 0.5
IDLE_CONNECTION_S = 900.0


class ThriftServer:
    """Serve ``handler`` on ``host:port`` until :meth:`stop`."""

    def __init__(self, handler: object, host: str, port: int):
        self._processor = TProcessor(storm.Nimbus, handler)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self._sock.listen(128)
        self._sock.settimeout(0.5)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._conns: dict[threading.Thread, socket.socket] = {}
        self._conns_lock = threading.Lock()
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name=f"thrift-accept-{self.port}", daemon=True)
        self._count = 0

    def start(self) -> None:
        self._accept_thread.start()

    def stop(self) -> None:
        self._stop.set()
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

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if self._stop.is_set():
                    return
                # e.g. EMFILE: keep serving once descriptors are free again.
                log.warning("accepting a Thrift connection failed: %s", exc)
                self._stop.wait(ACCEPT_RETRY_S)
                continue
            # A client that goes silent this long is dropped, freeing its thread.
            conn.settimeout(IDLE_CONNECTION_S)
            self._count += 1
            thread = threading.Thread(target=self._serve, args=(conn,),
                                      name=f"thrift-conn-{self._count}", daemon=True)
            with self._conns_lock:
                self._conns[thread] = conn
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        sock = TSocket(socket_family=socket.AF_INET)
        sock.sock = conn
        trans = TFramedTransportFactory().get_transport(sock)
        proto = TBinaryProtocolFactory().get_protocol(trans)
        try:
            while not self._stop.is_set():
                self._processor.process(proto, proto)
        except (TTransportException, OSError, EOFError):
            pass
        except Exception:
            log.exception("thrift connection failed")
        finally:
            trans.close()
            with self._conns_lock:
                self._conns.pop(threading.current_thread(), None)
