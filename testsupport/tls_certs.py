"""A throw-away certificate authority for tests: a CA and certificates it signs (PEM).

Uses ``cryptography``. Each certificate's common name is the identity nimbus-ha sees
(``nimbus.thrift.tls.caller``); every certificate also names 127.0.0.1.

A certificate's roles are its extended key usage (docs/security.md, "How to issue
certificates"): :data:`DAEMON` (serverAuth and clientAuth) for nimbuses, supervisors and
the UI, which serve and call; :data:`USER` (clientAuth) for people and tools that only
call. ``roles=None`` leaves the extension out, as a careless CA would: such a
certificate may call, but is refused as a server.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVER = "server"
CLIENT = "client"
DAEMON = (SERVER, CLIENT)
USER = (CLIENT,)
_USAGES = {SERVER: ExtendedKeyUsageOID.SERVER_AUTH, CLIENT: ExtendedKeyUsageOID.CLIENT_AUTH}


@dataclass(frozen=True)
class Identity:
    """PEM files of one identity: its certificate, its key, and the CA that signed it."""

    cert: Path
    key: Path
    ca: Path

    def conf(self) -> dict[str, str]:
        """The configuration keys that make a process use this identity over TLS."""
        return {"storm.thrift.transport": "tls", "storm.thrift.tls.ca.file": str(self.ca),
                "storm.thrift.tls.cert.file": str(self.cert),
                "storm.thrift.tls.key.file": str(self.key)}


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _subject(name: str, with_common_name: bool) -> x509.Name:
    if with_common_name:
        return _name(name)
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "nimbus-ha tests"),
                      x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


class CertificateAuthority:
    """``CertificateAuthority(dir).issue("alice", USER)`` -> Identity signed by this CA."""

    def __init__(self, directory: Path, name: str = "nimbus-ha test CA"):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        self._cert = (x509.CertificateBuilder()
                      .subject_name(_name(name)).issuer_name(_name(name))
                      .public_key(self._key.public_key())
                      .serial_number(x509.random_serial_number())
                      .not_valid_before(now - datetime.timedelta(minutes=5))
                      .not_valid_after(now + datetime.timedelta(days=1))
                      .add_extension(x509.BasicConstraints(ca=True, path_length=0), True)
                      .sign(self._key, hashes.SHA256()))
        self.ca_file = self.dir / f"{name.replace(' ', '-')}.pem"
        self.ca_file.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, roles: Iterable[str] | None = DAEMON, *,
              with_common_name: bool = True, swarm: bool = True) -> Identity:
        """A certificate for ``name`` (its common name, and its files' names).

        ``roles``: :data:`DAEMON` (the default, so that a test's nimbus, supervisor or
        UI just works), :data:`USER`, ``(SERVER,)``, or None for no extended key usage.
        ``with_common_name=False`` issues one whose subject has no common name (its
        organisational unit is ``name``), which every server refuses. ``swarm`` adds the
        DNS name ``*`` that the torrent backend's SSL swarm requires (docs/security.md).
        """
        roles = None if roles is None else tuple(roles)
        if roles is not None and (not roles or not set(roles) <= set(_USAGES)):
            raise ValueError(f"roles must be None or a non-empty choice of "
                             f"{sorted(_USAGES)}, got {roles!r}")
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (x509.CertificateBuilder()
                   .subject_name(_subject(name, with_common_name))
                   .issuer_name(self._cert.subject)
                   .public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.SubjectAlternativeName(
                       [x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                        x509.DNSName("localhost"), *([x509.DNSName("*")] if swarm else [])]),
                       False))
        if roles is not None:
            builder = builder.add_extension(
                x509.ExtendedKeyUsage([_USAGES[role] for role in roles]), False)
        cert = builder.sign(self._key, hashes.SHA256())
        cert_file = self.dir / f"{name}.crt"
        key_file = self.dir / f"{name}.key"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, key_file)
        return Identity(cert=cert_file, key=key_file, ca=self.ca_file)
