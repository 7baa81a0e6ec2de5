"""TLS with client certificates for every port of the cluster: contexts, roles and the
caller's identity.

With ``storm.thrift.transport: tls`` every connection to a nimbus-ha daemon (the Thrift
port, the UI, /metrics, each supervisor's logviewer) is TLS, and a server accepts only
clients whose certificate the cluster's CA (``storm.thrift.tls.ca.file``) signed. Each
process presents its own ``storm.thrift.tls.cert.file`` / ``storm.thrift.tls.key.file``;
the caller's identity is its certificate's common name. A client without a valid
certificate is dropped during the handshake. Why TLS and not Storm's DIGEST-MD5 SASL
plugin: docs/security.md.

Roles (docs/security.md, "How to issue certificates"). A client accepts a server only if
its certificate has TLS Web Server Authentication (serverAuth) in its extended key usage,
so that a user's certificate (clientAuth only) cannot pose as a daemon (issue 19, T1.8).
OpenSSL refuses a server whose extended key usage lacks serverAuth, but accepts one
without the extension at all, hence the explicit check after the handshake
(:class:`ClusterClientContext`). A daemon does not start with a certificate its peers
would refuse. A server refuses a client whose certificate has no common name
(:func:`peer_identity`, T2.14): the empty identity must never match anything.

This module is on the ground floor (docs/architecture.md) so that every server and
client can use it: the Thrift service (:mod:`nimbus.thrift.tls` adds the caller of the
call being served), the HTTP servers (:mod:`nimbus.web.client_cert`) and the supervisors.
It keeps no state: each process builds its contexts once, in its one security object
(:class:`nimbus.cluster_security.ClusterSecurity`), and passes them to what needs them.
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from nimbus.config import Config, ConfigError

log = logging.getLogger(__name__)

TRANSPORT_KEY = "storm.thrift.transport"
TLS_NAMES = ("tls", "org.apache.storm.security.auth.tls.TlsTransportPlugin")
FILE_KEYS = ("storm.thrift.tls.ca.file", "storm.thrift.tls.cert.file",
             "storm.thrift.tls.key.file")

HOW_TO_ISSUE = 'docs/security.md, "How to issue certificates"'
SERVER_AUTH = "TLS Web Server Authentication (serverAuth)"
CLIENT_AUTH = "TLS Web Client Authentication (clientAuth)"
# OpenSSL's X509_V_ERR_INVALID_PURPOSE: a certificate's extended key usage forbids its use.
_X509_V_ERR_INVALID_PURPOSE = 26
_USAGE_NAMES = {ExtendedKeyUsageOID.SERVER_AUTH: "serverAuth",
                ExtendedKeyUsageOID.CLIENT_AUTH: "clientAuth"}

#: (CA, certificate, key): the PEM files of ``storm.thrift.tls.*``.
TlsFiles = tuple[str, str, str]


def tls_enabled(conf: Config) -> bool:
    return str(conf[TRANSPORT_KEY] or "") in TLS_NAMES


def tls_files(conf: Config) -> TlsFiles | None:
    """The PEM files of ``conf`` (CA, certificate, key), or None without TLS; a
    ConfigError when one of them is not a file."""
    return _files(conf) if tls_enabled(conf) else None


def _files(conf: Config) -> TlsFiles:
    paths = []
    for key in FILE_KEYS:
        value = conf[key]
        if not value or not Path(str(value)).is_file():
            raise ConfigError(f"{key} must name a PEM file when {TRANSPORT_KEY} is tls "
                              f"(got {value!r})")
        paths.append(str(value))
    return paths[0], paths[1], paths[2]


# -- roles: what a certificate's extended key usage allows -------------------------------
def _usages(cert: x509.Certificate) -> list[x509.ObjectIdentifier] | None:
    """The certificate's extended key usages; None when it has no such extension."""
    try:
        return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except x509.ExtensionNotFound:
        return None


def _usage_list(usages: list[x509.ObjectIdentifier]) -> str:
    return ", ".join(_USAGE_NAMES.get(u, u.dotted_string) for u in usages) or "empty"


def _subject(cert: x509.Certificate) -> str:
    return cert.subject.rfc4514_string() or "an empty subject"


def _own_certificate(path: str) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"storm.thrift.tls.cert.file ({path}) is not a PEM "
                          f"certificate: {exc}") from None


def _require_server_role(path: str) -> None:
    """ConfigError unless this process's certificate is marked for servers: every client
    of the cluster refuses a server whose certificate is not."""
    usages = _usages(_own_certificate(path))
    if usages is not None and ExtendedKeyUsageOID.SERVER_AUTH in usages:
        return
    problem = "it has no extended key usage extension" if usages is None else \
        f"its extended key usage ({_usage_list(usages)}) lacks {SERVER_AUTH}"
    raise ConfigError(
        f"storm.thrift.tls.cert.file ({path}) is not marked for servers: {problem}, so "
        "every client would refuse it; give each daemon (nimbus, supervisor, UI) a "
        "certificate with serverAuth and clientAuth in its extended key usage "
        f"({HOW_TO_ISSUE})")


def _require_client_role(path: str) -> None:
    """ConfigError when this process's certificate is one no server accepts from a
    client: its extended key usage lacks clientAuth (none at all is accepted, as
    OpenSSL does)."""
    usages = _usages(_own_certificate(path))
    if usages is None or ExtendedKeyUsageOID.CLIENT_AUTH in usages:
        return
    raise ConfigError(
        f"storm.thrift.tls.cert.file ({path}) is not marked for clients: its extended key "
        f"usage ({_usage_list(usages)}) lacks {CLIENT_AUTH}, so every nimbus would refuse "
        "it; give daemons a certificate with serverAuth and clientAuth, users one with "
        f"clientAuth ({HOW_TO_ISSUE})")


def _not_a_server(peer: str, problem: str) -> ssl.SSLCertVerificationError:
    message = (f"refused the server at {peer}: {problem}; a nimbus must present a "
               f"certificate with {SERVER_AUTH} and {CLIENT_AUTH} in its extended key usage "
               f"({HOW_TO_ISSUE})")
    log.warning("%s", message)
    error = ssl.SSLCertVerificationError(ssl.SSL_ERROR_SSL, message)
    error.verify_code, error.verify_message = _X509_V_ERR_INVALID_PURPOSE, problem
    return error


def _peer(sock: ssl.SSLSocket) -> str:
    try:
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"
    except (OSError, ValueError):
        return "(address unknown)"


class _ServerCheckingSocket(ssl.SSLSocket):
    """A client's TLS socket that, once the handshake is done, accepts the server only
    if its certificate is marked for servers (serverAuth)."""

    def do_handshake(self, block: bool = False) -> None:
        try:
            super().do_handshake(block)
        except ssl.SSLCertVerificationError as exc:
            if self.server_side or exc.verify_code != _X509_V_ERR_INVALID_PURPOSE:
                raise
            # OpenSSL does not say which certificate: it is gone with the handshake.
            raise _not_a_server(_peer(self), (
                f"its certificate is not marked for servers (OpenSSL: {exc.verify_message})"
                f": its extended key usage lacks {SERVER_AUTH}")) from None
        if self.server_side:
            return
        der = self.getpeercert(binary_form=True)
        try:
            cert = x509.load_der_x509_certificate(der) if der else None
        except ValueError as exc:  # OpenSSL took it, cryptography's parser does not
            raise _not_a_server(_peer(self), f"its certificate cannot be parsed ({exc})") \
                from None
        usages = _usages(cert) if cert is not None else []
        if usages is not None and ExtendedKeyUsageOID.SERVER_AUTH in usages:
            return
        if cert is None:
            problem = "it presented no certificate"
        elif usages is None:
            problem = (f"its certificate ({_subject(cert)}) has no extended key usage "
                       "extension, so nothing marks it as a server's")
        else:
            problem = (f"its certificate ({_subject(cert)}) is not marked for servers: its "
                       f"extended key usage ({_usage_list(usages)}) lacks {SERVER_AUTH}")
        raise _not_a_server(_peer(self), problem)


class ClusterClientContext(ssl.SSLContext):
    """A client's context whose sockets refuse a server not marked for servers, whoever
    wraps them (thriftpy2's TSSLSocket, the code stream)."""

    sslsocket_class = _ServerCheckingSocket


# -- contexts ----------------------------------------------------------------------------
def server_context(conf: Config) -> ssl.SSLContext | None:
    """A server's context (client certificates required), or None without TLS: the
    Thrift port's, /metrics' and the logviewers', each with this process's certificate.
    A ConfigError when this process's certificate is not marked for servers."""
    files = tls_files(conf)
    return None if files is None else server_context_of(files)


def server_context_of(files: TlsFiles) -> ssl.SSLContext:
    """:func:`server_context` of these files."""
    ca, cert, key = files
    _require_server_role(cert)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    context.load_verify_locations(ca)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(conf: Config) -> ssl.SSLContext | None:
    """A client's context (it presents its certificate, trusts only the cluster's CA, and
    accepts only servers whose certificate is marked for servers), or None without TLS.
    A ConfigError when this process's certificate is one no server accepts from a
    client."""
    files = tls_files(conf)
    return None if files is None else client_context_of(files)


def client_context_of(files: TlsFiles) -> ssl.SSLContext:
    """:func:`client_context` of these files."""
    ca, cert, key = files
    _require_client_role(cert)
    context = ClusterClientContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_verify_locations(ca)
    context.load_cert_chain(cert, key)
    # Nimbuses are reached by the addresses they advertise in ZooKeeper, which need not be
    # in their certificates' names; a peer is trusted because the cluster's CA signed it.
    context.check_hostname = False
    return context


def common_name(peer_cert: dict | None) -> str:
    """The subject common name of a certificate as ``SSLSocket.getpeercert`` gives it."""
    for rdn in (peer_cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return ""


class NoIdentityError(ValueError):
    """A client's certificate names nobody: it has no (or an empty) common name."""


def peer_identity(sock: ssl.SSLSocket) -> str:
    """The identity of the client of a server-side ``sock`` whose handshake is done: its
    certificate's common name. NoIdentityError, saying what to do, when there is none,
    since an empty identity could match an empty owner (issue 19, T2.14)."""
    identity = common_name(sock.getpeercert())
    if identity.strip():
        return identity
    der = sock.getpeercert(binary_form=True)
    try:
        subject = _subject(x509.load_der_x509_certificate(der)) if der else "none"
    except ValueError:  # OpenSSL took it, cryptography's stricter parser does not
        subject = "a subject that cannot be parsed"
    raise NoIdentityError(
        f"the client certificate ({subject}) has no common name, which is the identity "
        f"nimbus-ha gives its holder: use a certificate whose subject has one "
        f"({HOW_TO_ISSUE})")
