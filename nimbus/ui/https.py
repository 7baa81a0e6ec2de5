"""HTTPS with client certificates for the UI: who is asking, as the Thrift port knows it.

With ``storm.thrift.transport: tls`` the UI serves HTTPS and requires a client
certificate that the cluster's CA (``storm.thrift.tls.ca.file``) signed, exactly as the
Thrift port does; the certificate's common name is the caller's identity
(:func:`nimbus.thrift.tls.common_name`, the same function). The WSGI environ carries it
as :data:`IDENTITY_KEY`; no header can set it. The UI presents ``ui.https.cert.file``
(default: ``storm.thrift.tls.cert.file``), so a certificate whose names match the
address browsers use can be given to the UI alone.

``ui.insecure.allow: true`` serves plain HTTP instead: every caller is then anonymous
(:func:`ui_transport` says which).

The TLS handshake runs in the worker thread that serves the connection, not in
cheroot's accepting thread (which is what cheroot's own adapter does): a client that
connects and never finishes its handshake holds one worker for the server's socket
timeout (10 s), not every new connection.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from cheroot import errors
from cheroot.ssl import Adapter
from cheroot.ssl.builtin import BuiltinSSLAdapter

from nimbus.config import Config, ConfigError
from nimbus.thrift.tls import TRANSPORT_KEY, common_name, tls_enabled

IDENTITY_KEY = "nimbus.ui.identity"
INSECURE_KEY = "ui.insecure.allow"
CA_KEY = "storm.thrift.tls.ca.file"
CERT_KEYS = (("ui.https.cert.file", "storm.thrift.tls.cert.file"),
             ("ui.https.key.file", "storm.thrift.tls.key.file"))


def ui_transport(conf: Config) -> str:
    """"https" (client certificates required) when the cluster's Thrift port uses TLS
    and ``ui.insecure.allow`` is not true, else "http"."""
    if tls_enabled(conf) and conf[INSECURE_KEY] is not True:
        return "https"
    return "http"


def _pem(conf: Config, key: str, fallback: str | None = None) -> str:
    value = conf[key] if conf[key] not in (None, "") else None
    name = key
    if value is None and fallback is not None:
        value, name = conf[fallback], fallback
    if not value or not Path(str(value)).is_file():
        raise ConfigError(f"{name} must name a PEM file for the UI's HTTPS "
                          f"({TRANSPORT_KEY} is tls; got {value!r})")
    return str(value)


def server_context(conf: Config) -> ssl.SSLContext:
    """TLS 1.2+, the UI's certificate, client certificates of the cluster's CA required."""
    cert = _pem(conf, *CERT_KEYS[0])
    key = _pem(conf, *CERT_KEYS[1])
    ca = _pem(conf, CA_KEY)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
        context.load_verify_locations(ca)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"the UI's HTTPS files ({cert}, {key}, {ca}): {exc}") from None
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def own_identity(conf: Config) -> str | None:
    """The common name of ``storm.thrift.tls.cert.file``: who the UI is when it calls
    the leader. None when it cannot be read."""
    path = conf["storm.thrift.tls.cert.file"]
    if not path:
        return None
    try:
        # The standard library's only certificate parser without a connection.
        decoded = ssl._ssl._test_decode_cert(str(path))  # type: ignore[attr-defined]
    except Exception:  # unreadable, not PEM, or the private helper gone: just unknown
        return None
    return common_name(decoded) or None


_PLAIN_HTTP_BODY = (b'{"error":"Bad Request","errorMessage":"this port speaks HTTPS '
                    b'only: use https://"}')
PLAIN_HTTP_ANSWER = (b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\nContent-Length: "
                     + str(len(_PLAIN_HTTP_BODY)).encode() + b"\r\n\r\n" + _PLAIN_HTTP_BODY)


class _WorkerHandshakeSocket(ssl.SSLSocket):
    """An SSLSocket that shakes hands on its first read, in the worker thread serving
    it. A failed handshake (no certificate, another CA's, a timeout) closes the
    connection quietly as cheroot's FatalSSLAlert; plain HTTP gets a plain 400 first."""

    _shaken = False

    def _shake(self) -> None:
        if self._shaken:
            return
        try:
            self.do_handshake()
        except ssl.SSLError as exc:
            if "http request" in str(exc).lower():
                try:  # below TLS: the client speaks plain HTTP
                    socket_send(self, PLAIN_HTTP_ANSWER)
                except OSError:
                    pass
            raise errors.FatalSSLAlert(*exc.args) from None
        except OSError as exc:  # reset, or timed out mid-handshake
            raise errors.FatalSSLAlert(*exc.args) from None
        self._shaken = True

    def recv(self, buflen: int = 1024, flags: int = 0) -> bytes:
        self._shake()
        return super().recv(buflen, flags)

    def recv_into(self, buffer: Any, nbytes: int | None = None, flags: int = 0) -> int:
        self._shake()
        return super().recv_into(buffer, nbytes, flags)  # type: ignore[arg-type]


def socket_send(sock: ssl.SSLSocket, data: bytes) -> None:
    """Send ``data`` on ``sock``'s TCP connection, around its TLS layer."""
    socket.socket.sendall(sock, data)


class _PeerEnviron(Mapping[str, Any]):
    """The environ entries of one TLS connection, read when cheroot builds a request's
    environ (the handshake is over by then: the request came through it)."""

    def __init__(self, sock: ssl.SSLSocket):
        self._sock = sock

    def _values(self) -> dict[str, Any]:
        try:
            identity = common_name(self._sock.getpeercert())
        except (ValueError, OSError):  # no handshake yet, or the socket closed
            identity = ""
        return {"wsgi.url_scheme": "https", "HTTPS": "on", IDENTITY_KEY: identity}

    def __getitem__(self, key: str) -> Any:
        return self._values()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(("wsgi.url_scheme", "HTTPS", IDENTITY_KEY))

    def __len__(self) -> int:
        return 3


class ClientCertAdapter(BuiltinSSLAdapter):
    """cheroot's builtin adapter with the UI's context, the handshake deferred to the
    worker thread, and the caller's identity in the environ."""

    def __init__(self, context: ssl.SSLContext):
        # Not BuiltinSSLAdapter.__init__: it builds its own context and parses the
        # certificate over a loopback connection in a thread of its own.
        Adapter.__init__(self, None, None)
        context.sslsocket_class = _WorkerHandshakeSocket
        self.context = context
        self._server_env: dict[str, Any] = {}

    def wrap(self, sock: Any) -> tuple[ssl.SSLSocket, Mapping[str, Any]]:
        wrapped = self.context.wrap_socket(sock, server_side=True,
                                           do_handshake_on_connect=False)
        return wrapped, _PeerEnviron(wrapped)
