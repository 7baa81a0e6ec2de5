"""TLS with client certificates on the Thrift port: who is calling, for authorisation.

With ``storm.thrift.transport: tls`` every Thrift connection (CLI, peer nimbuses copying
code, supervisors fetching code, the UI) is TLS, and the server accepts only clients
whose certificate the cluster's CA (``storm.thrift.tls.ca.file``) signed. Each process
presents its own ``storm.thrift.tls.cert.file`` / ``storm.thrift.tls.key.file``; the
caller's identity is its certificate's common name. A client without a valid
certificate is dropped during the handshake, before any method is reached. Why TLS and
not Storm's DIGEST-MD5 SASL plugin: docs/security.md.
"""

from __future__ import annotations

import ssl
import threading
from pathlib import Path

from nimbus.config import Config, ConfigError

TRANSPORT_KEY = "storm.thrift.transport"
TLS_NAMES = ("tls", "org.apache.storm.security.auth.tls.TlsTransportPlugin")
FILE_KEYS = ("storm.thrift.tls.ca.file", "storm.thrift.tls.cert.file",
             "storm.thrift.tls.key.file")

_client_context: ssl.SSLContext | None = None
_caller = threading.local()


def tls_enabled(conf: Config) -> bool:
    return str(conf[TRANSPORT_KEY] or "") in TLS_NAMES


def _files(conf: Config) -> tuple[str, str, str]:
    paths = []
    for key in FILE_KEYS:
        value = conf[key]
        if not value or not Path(str(value)).is_file():
            raise ConfigError(f"{key} must name a PEM file when {TRANSPORT_KEY} is tls "
                              f"(got {value!r})")
        paths.append(str(value))
    return paths[0], paths[1], paths[2]


def server_context(conf: Config) -> ssl.SSLContext | None:
    """The Thrift server's context (client certificates required), or None without TLS."""
    if not tls_enabled(conf):
        return None
    ca, cert, key = _files(conf)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    context.load_verify_locations(ca)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(conf: Config) -> ssl.SSLContext | None:
    """A client's context (it presents its certificate, trusts only the cluster's CA)."""
    if not tls_enabled(conf):
        return None
    ca, cert, key = _files(conf)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_verify_locations(ca)
    context.load_cert_chain(cert, key)
    # Nimbuses are reached by the addresses they advertise in ZooKeeper, which need not be
    # in their certificates' names; a peer is trusted because the cluster's CA signed it.
    context.check_hostname = False
    return context


def configure_clients(conf: Config) -> None:
    """Make every Thrift client of this process (nimbus.thrift.client.connect) use the
    transport ``conf`` names. Called by each daemon and the CLI when they load ``conf``."""
    global _client_context
    _client_context = client_context(conf)


def current_client_context() -> ssl.SSLContext | None:
    return _client_context


def common_name(peer_cert: dict | None) -> str:
    """The subject common name of a certificate as ``SSLSocket.getpeercert`` gives it."""
    for rdn in (peer_cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return ""


def set_caller(identity: str | None) -> None:
    """Record who is calling on this connection's thread (the Thrift server does it)."""
    _caller.identity = identity


def caller() -> str | None:
    """The identity of the client of the call being served here; None without TLS."""
    return getattr(_caller, "identity", None)
