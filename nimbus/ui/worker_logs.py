"""The topology page's Logs panel: the tail of one worker's log, or the matches of a
search in it, read from the logviewer of the supervisor that runs the worker
(nimbus/web/logviewer_client.py, docs/logs.md) with the UI's own client certificate (the
client context of its process's security, which the UI passes as ``context``).

The caller has passed the topology's read rule before (nimbus/ui/app.py); the logviewer
applies it again to the UI's identity, so with ``nimbus.authorizer`` the UI's certificate
name must be in ``nimbus.ui.users`` or ``nimbus.admins``. Worker text is masked like every
other worker text the UI shows (secrets of the UI's own configuration).
"""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import quote

from nimbus.redaction import mask
from nimbus.state.cluster_snapshot import ClusterSnapshot
from nimbus.state.worker_logs import LOG_FILE
from nimbus.ui.actions import ApiError
from nimbus.web.logviewer_client import LogviewerClient, LogviewerError

#: The tail's default and largest size, in bytes.
TAIL_BYTES = 64 * 1024
MAX_TAIL_BYTES = 1024 * 1024
#: Matches a search returns at most.
SEARCH_MATCHES = 50
#: The longest search string accepted (the logviewer's own bound is larger).
MAX_NEEDLE_CHARS = 200


def worker_log_link(snap: ClusterSnapshot, supervisor_id: str, topology_id: str,
                    port: int) -> str:
    """Storm UI's ``workerLogLink``: the worker's log on its supervisor's logviewer
    (``/api/v1/log?file=<topology-id>/<port>/worker.log``), "" when it serves none."""
    supervisor = snap.supervisors.get(supervisor_id)
    if supervisor is None or not supervisor.logviewer_port:
        return ""
    scheme = "https" if supervisor.logviewer_https else "http"
    path = quote(f"{topology_id}/{port}/{LOG_FILE}", safe="")
    return (f"{scheme}://{supervisor.hostname}:{int(supervisor.logviewer_port)}"
            f"/api/v1/log?file={path}")


def _slot(snap: ClusterSnapshot, info: dict[str, Any], worker: int,
          context: ssl.SSLContext | None) -> tuple[LogviewerClient, str, dict[str, Any]]:
    """The logviewer that holds worker ``worker``'s log now, the log's path there, and
    the worker (from ``info``, runtime_view.topology_info)."""
    found = next((w for w in info["workers"] if w["index"] == worker), None)
    if found is None:
        placed = ", ".join(str(w["index"]) for w in info["workers"]) or "none"
        raise ApiError(404, "Not Found", f"topology {info['name']!r} has no worker {worker} "
                                         f"placed (its workers: {placed})")
    supervisor = snap.supervisors.get(found["supervisor_id"])
    if supervisor is None or not supervisor.logviewer_port:
        raise ApiError(404, "Not Found", f"worker {worker}'s supervisor "
                                         f"{found['supervisor_id']} serves no logs (no "
                                         "logviewer.port, or it is gone)")
    try:
        client = LogviewerClient(supervisor.hostname, int(supervisor.logviewer_port),
                                 bool(supervisor.logviewer_https),
                                 context=context)
    except LogviewerError as exc:
        raise ApiError(503, "Service Unavailable", exc.message) from None
    return client, f"{info['id']}/{found['port']}/{LOG_FILE}", found


def _refused(exc: LogviewerError) -> ApiError:
    status = exc.status if exc.status in (403, 404) else 502
    return ApiError(status, "Bad Gateway" if status == 502 else
                    ("Forbidden" if status == 403 else "Not Found"), exc.message)


def tail(snap: ClusterSnapshot, info: dict[str, Any], worker: int,
         size: int = TAIL_BYTES, context: ssl.SSLContext | None = None) -> dict[str, Any]:
    """The last ``size`` bytes of the worker's current log, as whole lines:
    ``{"worker", "host", "port", "file", "logviewer", "size", "start", "lines"}``
    (``lines`` empty while the worker has written nothing)."""
    client, path, found = _slot(snap, info, worker, context)
    size = max(1, min(size, MAX_TAIL_BYTES))
    try:
        files = client.list_files(info["id"], int(found["port"]))
        current = next((f for f in files if f.get("name") == LOG_FILE), None)
        total = int(current["size"]) if current is not None else 0
        start = max(0, total - size)
        data = b""
        if current is not None:
            for chunk in client.stream(path, start, file_id=current.get("id")):
                data += chunk
                if len(data) >= size:
                    break
    except LogviewerError as exc:
        raise _refused(exc) from None
    data = data[:size]
    if start > 0 and b"\n" in data:  # begin at a whole line
        data = data.split(b"\n", 1)[1]
    lines = data.decode("utf-8", "replace").splitlines()
    return {"worker": worker, "host": found["host"], "port": found["port"], "file": path,
            "logviewer": client.address, "size": total, "start": start,
            "lines": [mask(line) for line in lines]}


def search(snap: ClusterSnapshot, info: dict[str, Any], worker: int, needle: str,
           context: ssl.SSLContext | None = None) -> dict[str, Any]:
    """The first :data:`SEARCH_MATCHES` matches of ``needle`` in the worker's current
    log: ``{"worker", "file", "logviewer", "search", "matches": [{"byteOffset",
    "beforeString", "matchString", "afterString"}]}``."""
    if not needle or len(needle) > MAX_NEEDLE_CHARS:
        raise ApiError(400, "Bad Request", f"search must be 1 to {MAX_NEEDLE_CHARS} "
                                           "characters")
    client, path, _found = _slot(snap, info, worker, context)
    try:
        answer = client.search(path, needle, SEARCH_MATCHES)
    except LogviewerError as exc:
        raise _refused(exc) from None
    matches = [{"byteOffset": int(m.get("byteOffset", 0)),
                "beforeString": mask(str(m.get("beforeString", ""))),
                "matchString": mask(str(m.get("matchString", ""))),
                "afterString": mask(str(m.get("afterString", "")))}
               for m in answer.get("matches") or [] if isinstance(m, dict)]
    return {"worker": worker, "file": path, "logviewer": client.address, "search": needle,
            "matches": matches}
