"""A client of one supervisor's logviewer (nimbus/supervisor/logviewer): how
``nimbus-ha logs`` reads worker logs, and how anything else of nimbus-ha may.

Plain HTTP, or HTTPS with this process's client certificate when the logviewer says it
serves HTTPS (``SupervisorInfo.logviewer_https``). The context is the one every client
of the process uses, which its caller passes (``ClusterSecurity.client_context``,
nimbus/cluster_security.py): it trusts the cluster's CA only, and a server only if its
certificate is marked for servers.

A logviewer's refusal (a JSON ``{"error", "errorMessage"}`` with a 4xx status) and a
logviewer that cannot be reached are both :class:`LogviewerError`, saying which.
"""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlencode

READ_BYTES = 64 * 1024
TIMEOUT_S = 10.0


class LogviewerError(Exception):
    """A logviewer refused a request (``status``, its message), or could not be reached
    (``status`` 0)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class LogviewerClient:
    """The logviewer at ``host:port`` (``https`` as it serves)."""

    def __init__(self, host: str, port: int, https: bool,
                 context: ssl.SSLContext | None = None, timeout_s: float = TIMEOUT_S):
        if https and context is None:
            raise LogviewerError(0, f"the logviewer at {host}:{port} serves HTTPS with "
                                    "client certificates: this client has none "
                                    "(storm.thrift.transport: tls and its "
                                    "storm.thrift.tls.* files)")
        self.host = host
        self.port = port
        self.https = https
        self._context = context
        self._timeout_s = timeout_s

    @property
    def address(self) -> str:
        return f"{'https' if self.https else 'http'}://{self.host}:{self.port}"

    def list_files(self, topology_id: str, port: int | None = None,
                   since_secs: float | None = None) -> list[dict[str, Any]]:
        """The files of ``topology_id``'s slots here (``listLogs`` with ``detail``):
        each ``{"file", "topologyId", "port", "name", "generation", "size",
        "modified", "id", "workers"}``, and ``"sinceOffset"`` with ``since_secs``."""
        query: dict[str, Any] = {"topoId": topology_id, "detail": "true"}
        if port is not None:
            query["port"] = port
        if since_secs is not None:
            query["since-secs"] = int(since_secs)
        with self._request(f"/api/v1/listLogs?{urlencode(query)}") as response:
            data = _json(response.read(), self.address)
        if not isinstance(data, list):
            raise LogviewerError(0, f"{self.address}: listLogs answered no list")
        return [entry for entry in data if isinstance(entry, dict)]

    def stream(self, path: str, start: int = 0, file_id: str | None = None
               ) -> Iterator[bytes]:
        """The bytes of ``path`` (``<topology-id>/<port>/<file>``) from ``start`` to its
        end as the logviewer sees it now, in chunks (``download`` with a Range). With
        ``file_id`` (its ``id`` when listed): LogviewerError 409 if ``path`` names
        another file by now (rotated)."""
        headers = {"Range": f"bytes={start}-"} if start > 0 else {}
        query = {"file": path, **({"id": file_id} if file_id is not None else {})}
        with self._request(f"/api/v1/download?{urlencode(query, quote_via=quote)}",
                           headers) as response:
            while chunk := response.read(READ_BYTES):
                yield chunk

    def search(self, path: str, needle: str, num_matches: int = 20) -> dict[str, Any]:
        """Storm's answer to ``search`` in ``path``: ``{"searchString", "matches":
        [{"byteOffset", "beforeString", "matchString", "afterString", ...}], ...}``."""
        query = {"file": path, "search-string": needle, "num-matches": num_matches}
        with self._request(f"/api/v1/search?{urlencode(query, quote_via=quote)}") as response:
            data = _json(response.read(), self.address)
        if not isinstance(data, dict):
            raise LogviewerError(0, f"{self.address}: search answered no object")
        return data

    # -- the connection ------------------------------------------------------------------
    def _connection(self) -> http.client.HTTPConnection:
        if self.https:
            return http.client.HTTPSConnection(self.host, self.port, timeout=self._timeout_s,
                                               context=self._context)
        return http.client.HTTPConnection(self.host, self.port, timeout=self._timeout_s)

    def _request(self, target: str, headers: dict[str, str] | None = None) -> _Response:
        connection = self._connection()
        try:
            connection.request("GET", target, headers=headers or {})
            response = connection.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            raise LogviewerError(0, f"cannot reach the logviewer at {self.address}: "
                                    f"{exc}") from None
        if response.status >= 400:
            body = response.read(64 * 1024)
            connection.close()
            try:
                message = str(json.loads(body).get("errorMessage") or "")
            except (ValueError, AttributeError):
                message = body.decode("utf-8", "replace")[:200]
            raise LogviewerError(response.status, f"{self.address} answered "
                                                  f"{response.status}: {message}")
        return _Response(connection, response, self.address)


class _Response:
    """An answer being read; closes its connection when done (a context manager)."""

    def __init__(self, connection: http.client.HTTPConnection,
                 response: http.client.HTTPResponse, address: str):
        self._connection = connection
        self._response = response
        self._address = address

    def read(self, amount: int | None = None) -> bytes:
        try:
            return self._response.read(amount)
        except (OSError, http.client.HTTPException) as exc:
            raise LogviewerError(0, f"the logviewer at {self._address} stopped answering: "
                                    f"{exc}") from None

    def __enter__(self) -> _Response:
        return self

    def __exit__(self, *exc: object) -> None:
        self._connection.close()


def _json(body: bytes, address: str) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        raise LogviewerError(0, f"{address} answered something that is not JSON") from None
