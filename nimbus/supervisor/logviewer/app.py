"""The logviewer's WSGI application: Storm logviewer's REST paths and parameters over
this supervisor's worker logs (docs/logs.md).

=================================================  ==========================================
``GET /api/v1/log?file=F&start=&length=``          a page of a file: HTML as Storm's, or
                                                   JSON with ``format=json`` (ours)
``GET /api/v1/download?file=F``                    the whole file; a ``Range`` header
                                                   (``bytes=N-``) gives part of it (206);
                                                   ``id=I`` (ours): 409 unless F is still
                                                   the file listed with that id
``GET /api/v1/search?file=F&search-string=S``      ``&num-matches=&start-byte-offset=``:
                                                   Storm's search in one file
``GET /api/v1/deepSearch/<topology-id>``           ``?search-string=&num-matches=&port=``
                                                   ``&start-file-offset=&start-byte-offset=``
                                                   ``&search-archived=``: across its slots
``GET /api/v1/listLogs?topoId=&port=``             Storm's list of ``<id>/<port>/<file>``;
                                                   ``detail=true`` (ours): each file's size,
                                                   time, identity, workers, and with
                                                   ``since-secs=S`` where its last S seconds
                                                   begin
=================================================  ==========================================

``F`` is ``<topology-id>/<port>/<file>`` under the log root; anything else (an absolute
path, ``..``, a NUL, a link, a long name) gets a 4xx answer, never a file outside the
root (nimbus/supervisor/logviewer/files.py). Errors are JSON, ``{"error": title,
"errorMessage": message}``, as the UI's; only GET is served. Who may read what:
nimbus/supervisor/logviewer/access.py.
"""

from __future__ import annotations

import html
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import urlencode

from werkzeug.exceptions import HTTPException
from werkzeug.http import HTTP_STATUS_CODES
from werkzeug.routing import Map, Rule
from werkzeug.wrappers import Request, Response

from nimbus.state.worker_logs import (
    META_FILE,
    check_topology_id,
    offset_since,
    parse_log_path,
    parse_port,
)
from nimbus.supervisor.log_dirs import LogMeta
from nimbus.supervisor.logviewer.access import LogAccess
from nimbus.supervisor.logviewer.files import LogFile, LogFileError, LogRoot, OpenLog
from nimbus.supervisor.logviewer.search import (
    DEFAULT_MATCHES,
    MAX_MATCHES,
    check_search,
    deep_search,
    search_file,
)
from nimbus.web.client_cert import IDENTITY_KEY

log = logging.getLogger(__name__)

DEFAULT_PAGE_BYTES = 51200        # Storm's DEFAULT_BYTES_PER_PAGE
MAX_PAGE_BYTES = 10 * 1024 * 1024  # Storm's largest page
STREAM_BYTES = 64 * 1024
MAX_SINCE_SECS = 10 * 366 * 24 * 3600
UNBOUNDED = 1 << 62   # an offset or a length has no other bound

URLS = Map([
    Rule("/api/v1/log", endpoint="log", methods=["GET"]),
    Rule("/api/v1/download", endpoint="download", methods=["GET"]),
    Rule("/api/v1/search", endpoint="search", methods=["GET"]),
    Rule("/api/v1/deepSearch/<topology_id>", endpoint="deep_search", methods=["GET"]),
    Rule("/api/v1/listLogs", endpoint="list_logs", methods=["GET"]),
], strict_slashes=False, merge_slashes=False)


class ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def json_response(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data, separators=(",", ":"), allow_nan=False), status=status,
                    mimetype="application/json",
                    headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})


def error_response(status: int, message: str) -> Response:
    return json_response({"error": HTTP_STATUS_CODES.get(status, "Error"),
                          "errorMessage": message}, status)


def _integer(request: Request, name: str, default: int | None, low: int,
             high: int) -> int | None:
    """An integer parameter within [low, high]; 400 saying so otherwise."""
    text = request.args.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text, 10)
    except ValueError:
        raise ApiError(400, f"{name} must be an integer, got {text[:40]!r}") from None
    if value < low or value > high:
        bounds = f"at least {low}" if high >= UNBOUNDED else f"between {low} and {high}"
        raise ApiError(400, f"{name} must be {bounds}, got {value}")
    return value


class LogviewerApp:
    """The WSGI callable. ``base_url()`` is this logviewer's own address
    (``http(s)://host:port``), for the links of search results."""

    def __init__(self, root: LogRoot, access: LogAccess, base_url: Callable[[], str],
                 clock: Callable[[], float] = time.time):
        self.root = root
        self.access = access
        self.base_url = base_url
        self._clock = clock

    def __call__(self, environ: dict[str, Any],
                 start_response: Callable[..., Any]) -> Iterable[bytes]:
        request = Request(environ)
        return self.dispatch(request)(environ, start_response)

    def dispatch(self, request: Request) -> Response:
        adapter = URLS.bind_to_environ(request.environ)
        try:
            endpoint, args = adapter.match()
            return getattr(self, f"on_{endpoint}")(request, **args)
        except ApiError as exc:
            return error_response(exc.status, exc.message)
        except LogFileError as exc:
            return error_response(exc.status, exc.message)
        except HTTPException as exc:  # no such path, a method other than GET
            return error_response(exc.code or 400, exc.description or exc.name)
        except Exception:
            log.exception("logviewer: %s %s failed", request.method, request.path[:200])
            return error_response(500, "the logviewer failed to answer; see the "
                                       "supervisor's log")

    # -- helpers -----------------------------------------------------------------------
    def _identity(self, request: Request) -> str | None:
        identity = request.environ.get(IDENTITY_KEY)
        return str(identity) if identity else None

    def _file(self, request: Request) -> tuple[str, int, str]:
        text = request.args.get("file")
        if not text:
            raise ApiError(400, "the file parameter is missing: file=<topology-id>/<port>/"
                                "<file>, e.g. file=wordcount-1-1700000000/6700/worker.log")
        try:
            topology_id, port, name = parse_log_path(text)
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        self.access.check(self._identity(request), topology_id)
        return topology_id, port, name

    def _page_url(self, path: str, offset: int) -> str:
        start = max(0, offset - DEFAULT_PAGE_BYTES // 2)
        return f"{self.base_url()}/api/v1/log?" + urlencode(
            {"file": path, "start": start, "length": DEFAULT_PAGE_BYTES})

    # -- endpoints ---------------------------------------------------------------------
    def on_log(self, request: Request) -> Response:
        topology_id, port, name = self._file(request)
        length = _integer(request, "length", DEFAULT_PAGE_BYTES, 1, UNBOUNDED)
        assert length is not None
        length = min(length, MAX_PAGE_BYTES)  # Storm's page has this ceiling too
        start = _integer(request, "start", None, 0, UNBOUNDED)
        form = request.args.get("format", "html")
        if form not in ("html", "json"):
            raise ApiError(400, f"format must be html or json, got {form[:20]!r}")
        opened = self.root.open(topology_id, port, name)
        try:
            if start is None:
                start = max(0, opened.size - length)
            data = opened.read(start, length) if start < opened.size else b""
        finally:
            opened.close()
        path = f"{topology_id}/{port}/{name}"
        text = data.decode("utf-8", "replace")
        if form == "json":
            return json_response({"file": path, "start": start, "length": len(data),
                                  "fileLength": opened.size, "text": text})
        return Response(_page(path, start, len(data), length, opened.size, text),
                        mimetype="text/html",
                        headers={"Cache-Control": "no-store",
                                 "X-Content-Type-Options": "nosniff",
                                 "Content-Security-Policy": "default-src 'none'"})

    def on_download(self, request: Request) -> Response:
        topology_id, port, name = self._file(request)
        opened = self.root.open(topology_id, port, name)
        expected = request.args.get("id")
        if expected is not None and expected != str(opened.inode):
            # Rotated since the client listed it: the name is another file's now. The
            # client finds the one it meant by its id (listLogs with detail).
            opened.close()
            raise ApiError(409, f"{topology_id}/{port}/{name} is another file now (id "
                                f"{opened.inode}, not {expected[:20]}): it was rotated")
        size = opened.size
        start, stop, status = 0, size, 200
        headers = {"Accept-Ranges": "bytes", "Cache-Control": "no-store",
                   "X-Content-Type-Options": "nosniff",
                   "Content-Disposition": f'attachment; filename="{topology_id}-{port}-'
                                          f'{name}"',
                   "X-Log-File-Id": str(opened.inode)}
        if request.headers.get("Range"):
            wanted = request.range
            bounds = wanted.range_for_length(size) if wanted is not None else None
            if bounds is None:
                opened.close()
                response = error_response(
                    416, f"the range {request.headers['Range'][:60]!r} is not within the "
                         f"file's {size} bytes (one range, bytes=N- or bytes=N-M)")
                response.headers["Content-Range"] = f"bytes */{size}"
                return response
            start, stop = bounds
            status = 206
            headers["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
        headers["Content-Length"] = str(stop - start)
        return Response(_stream(opened, start, stop), status=status,
                        mimetype="text/plain", headers=headers, direct_passthrough=True)

    def on_search(self, request: Request) -> Response:
        topology_id, port, name = self._file(request)
        needle = self._needle(request)
        matches = _integer(request, "num-matches", DEFAULT_MATCHES, 1, MAX_MATCHES)
        start = _integer(request, "start-byte-offset", 0, 0, UNBOUNDED)
        assert matches is not None and start is not None
        opened = self.root.open(topology_id, port, name)
        try:
            answer = search_file(opened.read, opened.size, f"{topology_id}/{port}/{name}",
                                 needle, matches, start, self._page_url)
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        finally:
            opened.close()
        return json_response(answer)

    def on_deep_search(self, request: Request, topology_id: str) -> Response:
        try:
            check_topology_id(topology_id)
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        self.access.check(self._identity(request), topology_id)
        needle = self._needle(request)
        matches = _integer(request, "num-matches", 1, 1, MAX_MATCHES)
        file_offset = _integer(request, "start-file-offset", 0, 0, 1 << 30)
        start = _integer(request, "start-byte-offset", 0, 0, UNBOUNDED)
        assert matches is not None and file_offset is not None and start is not None
        archived = request.args.get("search-archived", "false").lower() == "true"
        port_text = request.args.get("port", "")
        if port_text not in ("", "*"):
            port = self._port(port_text)
            files = self._searchable(topology_id, port, archived)
            return json_response(deep_search(self.root, files, needle, matches,
                                             file_offset if archived else 0, start,
                                             self._page_url))
        return json_response([
            deep_search(self.root, files, needle, matches, 0, 0, self._page_url)
            for files in (self._searchable(topology_id, p, archived)
                          for p in self.root.ports(topology_id)) if files])

    def on_list_logs(self, request: Request) -> Response:
        identity = self._identity(request)
        topology_id = request.args.get("topoId") or None
        port_text = request.args.get("port") or None
        port = self._port(port_text) if port_text is not None else None
        detail = request.args.get("detail", "false").lower() == "true"
        since = _integer(request, "since-secs", None, 0, MAX_SINCE_SECS)
        if topology_id is not None:
            try:
                check_topology_id(topology_id)
            except ValueError as exc:
                raise ApiError(400, str(exc)) from None
            self.access.check(identity, topology_id)
            topologies = [topology_id]
        else:
            topologies = [t for t in self.root.topologies()
                          if self.access.may_read(identity, t)]
        files = [f for t in topologies
                 for p in ([port] if port is not None else self.root.ports(t))
                 for f in self.root.files(t, p)]
        if not detail:
            return json_response(sorted(f.path for f in files))
        cutoff = self._clock() - since if since is not None else None
        metas = {t: LogMeta.load(self.root.root / t / META_FILE) for t in topologies}
        return json_response([self._detail(f, metas.get(f.topology_id), cutoff)
                              for f in files])

    # -- endpoint helpers --------------------------------------------------------------
    def _needle(self, request: Request) -> bytes:
        try:
            return check_search(request.args.get("search-string"))
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None

    def _port(self, text: str) -> int:
        try:
            return parse_port(text)
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None

    def _searchable(self, topology_id: str, port: int, archived: bool) -> list[LogFile]:
        """A slot's worker.log and, if ``archived``, its older files: newest first."""
        files = [f for f in self.root.files(topology_id, port) if f.generation is not None]
        return files if archived else files[:1]

    def _detail(self, log_file: LogFile, meta: LogMeta | None,
                cutoff: float | None) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "file": log_file.path, "topologyId": log_file.topology_id,
            "port": log_file.port, "name": log_file.name,
            "generation": log_file.generation, "size": log_file.size,
            "modified": log_file.modified, "id": str(log_file.inode),
            "workers": meta.ports.get(str(log_file.port), []) if meta else []}
        if cutoff is not None:
            entry["sinceOffset"] = self._since_offset(log_file, cutoff)
        return entry

    def _since_offset(self, log_file: LogFile, cutoff: float) -> int | None:
        try:
            opened = self.root.open(log_file.topology_id, log_file.port, log_file.name)
        except LogFileError:
            return None
        try:
            return offset_since(opened.index_fd, cutoff, opened.modified)
        except OSError:
            return 0  # an index that cannot be read: the whole file, never too little
        finally:
            opened.close()


def _stream(opened: OpenLog, start: int, stop: int) -> Iterator[bytes]:
    """The bytes [start, stop) of an open file, in chunks; closes it at the end or when
    the client goes away (the generator is closed)."""
    try:
        position = start
        while position < stop:
            chunk = opened.read(position, min(STREAM_BYTES, stop - position))
            if not chunk:
                break  # the file shrank meanwhile: what is there
            position += len(chunk)
            yield chunk
    finally:
        opened.close()


def _page(path: str, start: int, shown: int, length: int, size: int, text: str) -> str:
    """Storm's log page, reduced: the file's name, links to the pages around, the text."""
    def link(label: str, page_start: int | None) -> str:
        if page_start is None:
            return f"<span>{label}</span>"
        query = urlencode({"file": path, "start": page_start, "length": length})
        return f'<a href="/api/v1/log?{html.escape(query)}">{label}</a>'

    previous = max(0, start - length) if start > 0 else None
    following = start + shown if start + shown < size else None
    last = max(0, size - length)
    pager = " | ".join([link("First", 0 if start > 0 else None), link("Prev", previous),
                        link("Next", following),
                        link("Last", last if following is not None else None)])
    download = html.escape(urlencode({"file": path}))
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(path)} - nimbus-ha logviewer</title></head><body>"
            f"<h3>{html.escape(path)}</h3>"
            f"<p>bytes {start}-{start + shown} of {size} | {pager} | "
            f"<a href=\"/api/v1/download?{download}\">Download Full File</a></p>"
            f"<pre id=\"logContent\">{html.escape(text)}</pre></body></html>")
