"""The swarm's admission with TLS on: who may join (libtorrent's SSL torrents).

With ``storm.thrift.transport: tls`` every .torrent the leader writes carries the
cluster's CA (``storm.thrift.tls.ca.file``) as its root certificate, which its info hash
covers. Every host, nimbus or supervisor, presents its own cluster certificate
(``storm.thrift.tls.cert.file`` and ``...key.file``) to each peer, and accepts a peer only
if the peer's certificate is signed by that CA. libtorrent also requires a peer's
certificate to name the torrent (its name is the topology id) or ``*`` among its DNS
names, so cluster certificates used for the swarm carry ``DNS:*`` (docs/security.md, "How
to issue certificates"); :func:`swarm_identity` refuses one that does not, by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cryptography import x509

from nimbus.plugin_api import (
    DistributorError,
)
from nimbus_ha_torrent.swarm import SslIdentity

TRANSPORT_KEY = "storm.thrift.transport"
TLS_NAMES = ("tls", "org.apache.storm.security.auth.tls.TlsTransportPlugin")
CA_KEY, CERT_KEY, KEY_KEY = ("storm.thrift.tls.ca.file", "storm.thrift.tls.cert.file",
                             "storm.thrift.tls.key.file")

# RFC 7919's ffdhe2048 group. libtorrent requires a DH parameters file with each SSL
# certificate; a published group costs nothing to generate and is as good as any.
FFDHE2048_PEM = """-----BEGIN DH PARAMETERS-----
MIIBCAKCAQEA//////////+t+FRYortKmq/cViAnPTzx2LnFg84tNpWp4TZBFGQz
+8yTnc4kmz75fS/jY2MMddj2gbICrsRhetPfHtXV/WVhJDP1H18GbtCFY2VVPe0a
87VXE15/V8k1mE8McODmi3fipona8+/och3xWKE2rec1MKzKT0g6eXq8CrGCsyT7
YdEIqUuyyOP7uWrat2DX9GgdT0Kj3jlN9K5W7edjcrsZCwenyO4KbXCeAvzhzffi
7MA0BM0oNC9hkXL+nOmFg/+OTxIy7vKBg8P+OxtMb61zO7X8vC7CIAXFjvGDfRaD
ssbzSibBsu/6iGtCOGEoXJf//////////wIBAg==
-----END DH PARAMETERS-----
"""


def tls_on(conf: dict[str, Any]) -> bool:
    return str(conf.get(TRANSPORT_KEY) or "") in TLS_NAMES


def swarm_identity(conf: dict[str, Any], local_dir: Path) -> tuple[SslIdentity, str] | None:
    """(this host's identity in the swarm, the CA's PEM text) with TLS on, else None.

    Raises DistributorError naming the key when a file is missing or the certificate
    lacks the DNS name ``*``."""
    if not tls_on(conf):
        return None
    paths = {}
    for key in (CA_KEY, CERT_KEY, KEY_KEY):
        value = conf.get(key)
        if not value or not Path(str(value)).is_file():
            raise DistributorError(f"{key} must name a PEM file when {TRANSPORT_KEY} is tls "
                                   f"(the torrent swarm then admits cluster certificates "
                                   f"only); got {value!r}")
        paths[key] = str(value)
    try:
        cert = x509.load_pem_x509_certificate(Path(paths[CERT_KEY]).read_bytes())
    except ValueError as exc:
        raise DistributorError(f"{CERT_KEY} {paths[CERT_KEY]}: not a PEM certificate "
                               f"({exc})") from None
    try:
        names = cert.extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound:
        names = []
    if "*" not in names:
        raise DistributorError(
            f"{CERT_KEY} {paths[CERT_KEY]} has no subject alternative name DNS:* "
            f"(its DNS names: {', '.join(names) or 'none'}): libtorrent admits a peer to an "
            "SSL torrent only with that name or the topology's; issue this host's "
            'certificate with DNS:* (docs/security.md, "How to issue certificates")')
    local_dir.mkdir(parents=True, exist_ok=True)
    dh_params = local_dir / "dh-ffdhe2048.pem"
    dh_params.write_text(FFDHE2048_PEM)
    ca_pem = Path(paths[CA_KEY]).read_text(encoding="ascii", errors="replace")
    return SslIdentity(paths[CERT_KEY], paths[KEY_KEY], str(dh_params)), ca_pem


def same_certificate(pem_a: str, pem_b: str) -> bool:
    """True when two PEM texts hold the same (first) certificate."""
    try:
        return x509.load_pem_x509_certificate(pem_a.encode()) == \
            x509.load_pem_x509_certificate(pem_b.encode())
    except ValueError:
        return False
