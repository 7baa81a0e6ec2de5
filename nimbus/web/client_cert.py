"""HTTPS with client certificates: who is asking, as the Thrift port knows it.

With ``storm.thrift.transport: tls`` nimbus-ha's HTTP servers (the UI, /metrics, each
supervisor's logviewer) serve HTTPS and require a client certificate that the cluster's
CA signed, exactly as the Thrift port does; the certificate's common name is the
caller's identity (:func:`nimbus.cluster_tls.peer_identity`, the same function). The WSGI
environ carries it as :data:`IDENTITY_KEY`; no header can set it. A certificate without
a common name gets 403 for every request (it names nobody).

The TLS handshake runs in the server's gate (nimbus/web/gate.py), without blocking,
many at once: a client that connects and never finishes its handshake holds no worker
thread, and is dropped after the gate's header timeout.
"""

from __future__ import annotations

import ssl
from typing import Any

from cheroot.ssl import Adapter
from cheroot.ssl.builtin import BuiltinSSLAdapter

from nimbus.cluster_tls import NoIdentityError, peer_identity
from nimbus.web.gate import PeerRefusedError

IDENTITY_KEY = "nimbus.ui.identity"


class ClientCertAdapter(BuiltinSSLAdapter):
    """cheroot's builtin adapter holding the server's context. The handshake is the
    gate's (nimbus/web/gate.py), without blocking and with a deadline; once it is done
    the gate asks :meth:`peer_environ` for the caller's identity."""

    def __init__(self, context: ssl.SSLContext):
        # Not BuiltinSSLAdapter.__init__: it builds its own context and parses the
        # certificate over a loopback connection in a thread of its own.
        Adapter.__init__(self, None, None)
        self.context = context
        self._server_env: dict[str, Any] = {}

    def wrap(self, sock: Any) -> tuple[ssl.SSLSocket, dict[str, Any]]:
        return self.context.wrap_socket(sock, server_side=True,
                                        do_handshake_on_connect=False), {}

    @staticmethod
    def peer_environ(sock: ssl.SSLSocket) -> dict[str, Any]:
        """The environ entries of a connection whose handshake is done; PeerRefusedError
        (answered 403) when its certificate has no common name, since the empty identity
        must match nobody (issue 19, T2.14). OSError or ValueError when it is closed."""
        try:
            identity = peer_identity(sock)
        except NoIdentityError as exc:
            raise PeerRefusedError(str(exc)) from None
        return {"wsgi.url_scheme": "https", "HTTPS": "on", IDENTITY_KEY: identity}
