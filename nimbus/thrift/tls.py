"""TLS with client certificates on the Thrift port: who is calling, for authorisation.

The cluster's TLS (contexts, roles, identities) is :mod:`nimbus.cluster_tls`, shared by
every port of the cluster; its names are offered here too, where the Thrift service and
its clients have always imported them. What is the Thrift service's own: the identity of
the caller of the call being served on this thread (:func:`set_caller`, :func:`caller`).
The contexts a process uses are in its one security object
(:class:`nimbus.cluster_security.ClusterSecurity`), passed to its clients and servers.
"""

from __future__ import annotations

import threading

from nimbus.cluster_tls import (
    CLIENT_AUTH,
    FILE_KEYS,
    HOW_TO_ISSUE,
    SERVER_AUTH,
    TLS_NAMES,
    TRANSPORT_KEY,
    ClusterClientContext,
    NoIdentityError,
    client_context,
    common_name,
    peer_identity,
    server_context,
    tls_enabled,
)

__all__ = ["CLIENT_AUTH", "FILE_KEYS", "HOW_TO_ISSUE", "SERVER_AUTH", "TLS_NAMES",
           "TRANSPORT_KEY", "ClusterClientContext", "NoIdentityError", "caller",
           "client_context", "common_name", "peer_identity", "server_context", "set_caller",
           "tls_enabled"]

_caller = threading.local()


def set_caller(identity: str | None) -> None:
    """Record who is calling on this connection's thread (the Thrift server does it)."""
    _caller.identity = identity


def caller() -> str | None:
    """The identity of the client of the call being served here; None without TLS."""
    return getattr(_caller, "identity", None)
