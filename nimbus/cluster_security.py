"""One process's security: its TLS contexts and its authorizer, built once from its
configuration and passed to whatever needs them (issue 28).

The root of each process builds one :class:`ClusterSecurity` when it has loaded its
configuration, and fails fast there on unusable settings:

* a nimbus (:mod:`nimbus.daemons.nimbus`): the client context of its code downloads from
  peers, the server context of its Thrift port and /metrics, the authorizer of its
  Thrift handler and of the UI it serves with ``nimbus.ui.enabled``;
* a supervisor (:mod:`nimbus.daemons.supervisor`): the client context of its code
  fetches, the server context of its logviewer and /metrics, the authorizer of its
  logviewer;
* a UI process of its own (:class:`nimbus.ui.server.UIServer`): the client context of
  its calls to the leader and to the logviewers, its authorizer;
* a command of the CLI: its client context only (:meth:`ClusterSecurity.for_client`).

Nothing of it is global: two identities in one process (a test acting as alice, then as
bob; a nimbus and a supervisor in one interpreter) are two objects, each passed to the
clients and servers that act for it. A client built from a configuration alone
(``NimbusClient(conf)``) gets :meth:`ClusterSecurity.for_client` of that
configuration: built once per process and TLS settings (the files' paths and contents,
so that a file written again is read again), never what some other code configured.

The errors are those of :mod:`nimbus.cluster_tls` and :mod:`nimbus.topology_acl`: a
ConfigError for a setting (a PEM file missing, a certificate not marked for its role, an
authorizer this release does not have or one without TLS), an OSError (ssl.SSLError is
one) or a ValueError for PEM files that cannot be loaded.
"""

from __future__ import annotations

import hashlib
import ssl
import threading
from dataclasses import dataclass, field
from typing import Any

from nimbus.cluster_tls import (
    FILE_KEYS,
    TlsFiles,
    client_context_of,
    server_context_of,
    tls_enabled,
    tls_files,
)
from nimbus.config import Config
from nimbus.topology_acl import SimpleAclAuthorizer, authorizer_from_conf

__all__ = ["ClusterSecurity"]

# Client securities kept per process (their TLS settings differ: a test's identities).
_CACHE_SIZE = 64
_cache: dict[tuple[Any, ...], ClusterSecurity] = {}
_cache_lock = threading.Lock()


@dataclass(frozen=True, eq=False)
class ClusterSecurity:
    """What one process presents and trusts, and whom it lets do what.

    ``client_context``: the context of every client of the cluster in this process (the
    Thrift clients, the code stream, the logviewer client), None without TLS.
    ``authorizer``: the topology rules of its servers (None: none configured, or a
    process that only calls). ``files``: the PEM files both contexts are made of (None
    without TLS). ``ClusterSecurity()`` is a plain process: no TLS, no authorizer.
    """

    client_context: ssl.SSLContext | None = None
    authorizer: SimpleAclAuthorizer | None = None
    files: TlsFiles | None = None
    _server: list[ssl.SSLContext] = field(default_factory=list, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @property
    def tls(self) -> bool:
        """Whether this process speaks TLS with client certificates."""
        return self.files is not None

    def server_context(self) -> ssl.SSLContext | None:
        """The context of this process's servers (the Thrift port, /metrics, the
        logviewer; client certificates required), None without TLS. Made the first time
        a server asks (a daemon that serves nothing needs no certificate marked for
        servers), then the same for every server of the process: a ConfigError when
        its certificate is not marked for servers, OSError or ValueError for PEM files
        that cannot be loaded."""
        if self.files is None:
            return None
        with self._lock:
            if not self._server:
                self._server.append(server_context_of(self.files))
            return self._server[0]

    @classmethod
    def for_client(cls, conf: Config) -> ClusterSecurity:
        """The security of a process that calls the cluster with ``conf``'s TLS
        settings (its client context, no authorizer): made once per process and
        settings, and checked then (a certificate no server accepts from a client is a
        ConfigError)."""
        key = _settings(conf)
        with _cache_lock:
            found = _cache.get(key)
        if found is not None:
            return found
        files = tls_files(conf)
        made = cls(client_context=None if files is None else client_context_of(files),
                   files=files)
        with _cache_lock:
            found = _cache.setdefault(key, made)
            while len(_cache) > _CACHE_SIZE:
                del _cache[next(iter(_cache))]
        return found

    @classmethod
    def for_daemon(cls, conf: Config, serves: bool = False) -> ClusterSecurity:
        """The security of a daemon of ``conf``: the client context of
        :meth:`for_client`, the authorizer (checked: a ConfigError for one this
        release does not have, or one without TLS) and, with ``serves``, the server
        context made now (else when a server first asks: :meth:`server_context`)."""
        clients = cls.for_client(conf)
        server = server_context_of(clients.files) if serves and clients.files else None
        made = cls(client_context=clients.client_context,
                   authorizer=authorizer_from_conf(conf), files=clients.files)
        if server is not None:
            made._server.append(server)
        return made


def _settings(conf: Config) -> tuple[Any, ...]:
    """What a client security is made of: the transport and, with TLS, each PEM file's
    path and the digest of its contents (a file written again since is another
    setting)."""
    if not tls_enabled(conf):
        return ("plain",)
    return ("tls", *(_stamp(conf[key]) for key in FILE_KEYS))


def _stamp(value: Any) -> tuple[str, str]:
    path = str(value or "")
    try:
        with open(path, "rb") as pem:
            return path, hashlib.sha256(pem.read()).hexdigest()
    except (OSError, ValueError):  # missing: tls_files says so, and nothing is kept
        return path, ""
