"""HTTPS with client certificates for the UI: who is asking, as the Thrift port knows it.

With ``storm.thrift.transport: tls`` the UI serves HTTPS and requires a client
certificate that the cluster's CA (``storm.thrift.tls.ca.file``) signed, exactly as the
Thrift port does; the certificate's common name is the caller's identity
(:func:`nimbus.cluster_tls.peer_identity`, the same function). The WSGI environ carries
it as :data:`IDENTITY_KEY`; no header can set it. A certificate without a common name
gets 403 for every request (it names nobody). The UI presents ``ui.https.cert.file``
(default: ``storm.thrift.tls.cert.file``), so a certificate whose names match the
address browsers use can be given to the UI alone.

``ui.insecure.allow: true`` serves plain HTTP instead: every caller is then anonymous
(:func:`ui_transport` says which).

The TLS handshake runs in the server's gate (nimbus/web/gate.py), without blocking,
many at once: a client that connects and never finishes its handshake holds no worker
thread, and is dropped after ``ui.header.timeout.secs``.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from nimbus.config import Config, ConfigError
from nimbus.thrift.tls import TRANSPORT_KEY, common_name, tls_enabled
from nimbus.web.client_cert import IDENTITY_KEY, ClientCertAdapter

# Where the UI's callers and handshakes are served (nimbus/web/client_cert.py), offered
# here too, where the UI has always imported them.
__all__ = ["CA_KEY", "CERT_KEYS", "IDENTITY_KEY", "INSECURE_KEY", "ClientCertAdapter",
           "own_identity", "server_context", "ui_transport"]

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
