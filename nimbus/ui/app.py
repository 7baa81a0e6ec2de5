"""The UI's WSGI application: Storm UI's REST API, the dashboard's data and its page.

Every answer is JSON (the page and its static files aside), errors included:
``{"error": title, "errorMessage": message}`` as Storm's UI gives them, with a status that
fits; nothing a client sends yields a 500. Bodies are limited to :data:`MAX_BODY_BYTES`.
A POST that a browser sends from another origin is refused (cross-site request forgery:
a page elsewhere must not kill topologies through an operator's browser); scripts and
curl send no ``Origin`` and are not affected.

Who may do what (docs/security.md, "The web UI"): with ``nimbus.authorizer`` set, the
caller's identity (its client certificate's common name, see nimbus/ui/https.py) is
checked with the Thrift handler's own rules (nimbus/thrift/authorizer.py) before the UI
forwards an action: the summaries and the cluster configuration (secrets redacted) are
open to every caller the handshake let in, a topology's page to those who may read it,
an action to those who may change it; anyone else gets 403.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterable
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

from kazoo.exceptions import KazooException
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge
from werkzeug.routing import Map, Rule
from werkzeug.wrappers import Request, Response

from nimbus.cluster_security import ClusterSecurity
from nimbus.config import Config
from nimbus.redaction import mask
from nimbus.state.cluster_state import LayoutMissingError
from nimbus.state.component_ids import is_component_id
from nimbus.state.records import RecordError, StormBase
from nimbus.state.runtime_view import set_checkpoints
from nimbus.thrift.authorizer import (
    READONLY_USERS_KEY,
    read_refusal,
    refusal,
    topology_users,
)
from nimbus.thrift.client import NimbusClient
from nimbus.ui import storm_json, topology_page, worker_logs
from nimbus.ui.actions import (
    ApiError,
    forbidden,
    not_found,
    run_action,
    switch_version,
    topology_history,
)
from nimbus.ui.dashboard import dashboard_data, restrict_topology
from nimbus.ui.https import IDENTITY_KEY
from nimbus.ui.local_nimbus import LocalNimbus
from nimbus.ui.openapi import openapi_document
from nimbus.ui.reader import ClusterUnavailableError, UIReader

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1024 * 1024
# Topology ids are "<name>-<counter>-<launch secs>"; names allow these characters only
# (lifecycle.check_topology_name). Anything else (a slash, "..", a NUL) is no topology,
# and never reaches a ZooKeeper path.
TOPOLOGY_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,254}")
STATIC_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
ACTIONS = ("activate", "deactivate")
# A code version's number (nimbus.state.code_versions: at most 6 digits, from 1).
MAX_VERSION = 999_999
# A whole number in a path or a query: ASCII digits only, at most 9 of them.
# str.isdigit() is no test: it accepts '²', which int() refuses (a 500), and '٣', which
# int() reads as 3.
WHOLE_NUMBER = re.compile(r"[0-9]{1,9}")


def _is_whole(text: str, max_digits: int = 9) -> bool:
    """Whether ``text`` is a whole number in ASCII digits, of at most ``max_digits``."""
    return isinstance(text, str) and len(text) <= max_digits and \
        WHOLE_NUMBER.fullmatch(text) is not None
DASHBOARD_CACHE_USERS = 256

URLS = Map([
    Rule("/", endpoint="index", methods=["GET"]),
    Rule("/static/<name>", endpoint="static", methods=["GET"]),
    Rule("/api/v1/openapi.json", endpoint="openapi", methods=["GET"]),
    Rule("/api/v1/cluster/summary", endpoint="cluster_summary", methods=["GET"]),
    Rule("/api/v1/cluster/configuration", endpoint="cluster_configuration",
         methods=["GET"]),
    Rule("/api/v1/nimbus/summary", endpoint="nimbus_summary", methods=["GET"]),
    Rule("/api/v1/supervisor/summary", endpoint="supervisor_summary", methods=["GET"]),
    Rule("/api/v1/topology/summary", endpoint="topology_summary", methods=["GET"]),
    Rule("/api/v1/ui/dashboard", endpoint="dashboard", methods=["GET"]),
    Rule("/api/v1/topology/<topology_id>", endpoint="topology", methods=["GET"]),
    # The topology page's data: Storm's component resource, and nimbus-ha's /page.
    Rule("/api/v1/topology/<topology_id>/component/<component>", endpoint="component",
         methods=["GET"]),
    Rule("/api/v1/topology/<topology_id>/page", endpoint="topology_page", methods=["GET"]),
    Rule("/api/v1/topology/<topology_id>/logs", endpoint="topology_logs", methods=["GET"]),
    Rule("/api/v1/topology/<topology_id>/<any(activate, deactivate):action>",
         endpoint="action", methods=["POST"]),
    Rule("/api/v1/topology/<topology_id>/<any(rebalance, kill):action>/<wait_time>",
         endpoint="action", methods=["POST"]),
    # Code versions (nimbus-ha's: nimbus/state/code_versions.py, docs/runtime.md).
    Rule("/api/v1/topology/<topology_id>/history", endpoint="topology_history",
         methods=["GET"]),
    Rule("/api/v1/topology/<topology_id>/version/<version>", endpoint="switch_version",
         methods=["POST"]),
], strict_slashes=False, merge_slashes=False)


def json_response(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data, separators=(",", ":"), allow_nan=False), status=status,
                    mimetype="application/json",
                    headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})


def error_response(status: int, error: str, message: str) -> Response:
    return json_response({"error": error, "errorMessage": message}, status)


def _static_files() -> dict[str, tuple[bytes, str]]:
    """name -> (bytes, content type) of the files shipped in nimbus/ui/static, read once:
    only these names are ever served, whatever the path asks for."""
    out = {}
    for entry in resources.files("nimbus.ui").joinpath("static").iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1] if "." in entry.name else ""
        if entry.is_file() and suffix in STATIC_TYPES:
            out[entry.name] = (entry.read_bytes(), STATIC_TYPES[suffix])
    return out


class UIApp:
    """The WSGI callable; ``reader`` must be started, ``client`` reaches the leader,
    ``local_nimbus`` is the nimbus this UI runs inside (None: a UI process of its own).
    ``security``: its process's (the authorizer, the client certificate it reads the
    logviewers with); by default made of ``conf`` (:meth:`ClusterSecurity.for_daemon`)."""

    def __init__(self, conf: Config, reader: UIReader, client: NimbusClient,
                 own_identity: str | None = None, local_nimbus: LocalNimbus | None = None,
                 security: ClusterSecurity | None = None):
        self.conf = conf
        self.reader = reader
        self.client = client
        self.local_nimbus = local_nimbus
        self.security = security if security is not None else \
            ClusterSecurity.for_daemon(conf)
        self.authorizer = self.security.authorizer
        self.own_identity = own_identity  # the UI's certificate, for the leader's refusals
        self.static = _static_files()
        self._openapi = json.dumps(openapi_document(), separators=(",", ":"))
        self._dashboard_data: tuple[Any, dict[str, Any], dict[str, StormBase]] | None = None
        # identity -> (key, body): each caller's view serialised once per change.
        self._dashboard_cache: dict[str | None, tuple[Any, bytes]] = {}

    def __call__(self, environ: dict[str, Any],
                 start_response: Callable[..., Any]) -> Iterable[bytes]:
        request = Request(environ)
        request.max_content_length = MAX_BODY_BYTES
        return self.dispatch(request)(environ, start_response)

    def dispatch(self, request: Request) -> Response:
        adapter = URLS.bind_to_environ(request.environ)
        try:
            endpoint, args = adapter.match()
            handler = getattr(self, f"on_{endpoint}")
            return handler(request, **args)
        except ApiError as exc:
            return error_response(exc.status, exc.error, exc.message)
        except ClusterUnavailableError as exc:
            return error_response(503, "Service Unavailable", str(exc))
        except (KazooException, LayoutMissingError) as exc:
            return error_response(503, "Service Unavailable",
                                  f"ZooKeeper read failed: {exc or type(exc).__name__}")
        except HTTPException as exc:
            response = error_response(exc.code or 400, exc.name, exc.description or exc.name)
            if exc.code == 405 and hasattr(exc, "valid_methods") and exc.valid_methods:
                response.headers["Allow"] = ", ".join(exc.valid_methods)
            return response
        except Exception:  # a bug: say so in JSON, keep the traceback in the log
            log.exception("UI request %s %s failed", request.method, request.path)
            return error_response(500, "Internal Server Error", "see the UI's log")

    # -- page ---------------------------------------------------------------------------
    def on_index(self, request: Request) -> Response:
        body, ctype = self.static["index.html"]
        return Response(body, content_type=ctype, headers={"Cache-Control": "no-store"})

    def on_static(self, request: Request, name: str) -> Response:
        found = self.static.get(name)
        if found is None:
            raise ApiError(404, "Not Found", f"no static file {name!r}")
        return Response(found[0], content_type=found[1],
                        headers={"Cache-Control": "max-age=300"})

    def on_openapi(self, request: Request) -> Response:
        return Response(self._openapi, mimetype="application/json")

    # -- Storm UI's GETs ----------------------------------------------------------------
    def on_cluster_summary(self, request: Request) -> Response:
        return json_response(storm_json.cluster_summary(self.reader.snapshot()))

    def on_cluster_configuration(self, request: Request) -> Response:
        return json_response(self.conf.redacted())

    def on_nimbus_summary(self, request: Request) -> Response:
        return json_response(storm_json.nimbus_summary(self.reader.snapshot(), self.conf,
                                                       local=self.local_nimbus))

    def on_supervisor_summary(self, request: Request) -> Response:
        return json_response(storm_json.supervisor_summary(self.reader.snapshot()))

    def on_topology_summary(self, request: Request) -> Response:
        return json_response(storm_json.topology_summary(self.reader.snapshot()))

    def on_topology(self, request: Request, topology_id: str) -> Response:
        info, _base = self._page_info(request, topology_id)
        return json_response(storm_json.topology_detail(
            self.reader.snapshot(), info, self.reader.fetch_topology_conf(topology_id),
            int(self.conf["topology.message.timeout.secs"])))

    # -- the topology page (nimbus/ui/topology_page.py) ----------------------------------
    def on_topology_page(self, request: Request, topology_id: str) -> Response:
        info, base = self._page_info(request, topology_id)
        _may_read, may_change = self._rights(self._identity(request), topology_id, base)
        return json_response(topology_page.page_data(info, may_change))

    def on_topology_logs(self, request: Request, topology_id: str) -> Response:
        """The Logs panel (nimbus/ui/worker_logs.py): ``?worker=N`` the tail of worker N's
        log (``&bytes=``, default 64 KiB), or with ``&search=S`` the matches of S in it."""
        worker = _whole(request.args.get("worker"), "worker", 0, 1_000_000)
        size = _whole(request.args.get("bytes", str(worker_logs.TAIL_BYTES)), "bytes", 1,
                      worker_logs.MAX_TAIL_BYTES)
        info, _base = self._page_info(request, topology_id)
        snap = self.reader.snapshot()
        needle = request.args.get("search")
        if needle is not None:
            return json_response(worker_logs.search(snap, info, worker, needle,
                                                    self.security.client_context))
        return json_response(worker_logs.tail(snap, info, worker, size,
                                              self.security.client_context))

    def on_component(self, request: Request, topology_id: str, component: str) -> Response:
        if not is_component_id(component):
            raise ApiError(404, "Not Found", f"{component[:100]!r} is not a component id "
                                             "(letters, digits, '_', '.', '-'; at most 64)")
        info, _base = self._page_info(request, topology_id)
        detail = topology_page.component_detail(info, component)
        if detail is None:
            names = topology_page.known_components(info)
            raise ApiError(404, "Not Found",
                           f"topology {info['name']!r} has no component {component!r}; its "
                           f"components: {', '.join(names[:20]) or 'none yet'}")
        return json_response(detail)

    def _page_info(self, request: Request,
                   topology_id: str) -> tuple[dict[str, Any], StormBase]:
        """The topology's runtime_view.topology_info (read now, with its components'
        checkpoint locations, worker text masked) and StormBase, once the caller passed
        the read rule of /api/v1/topology/:id; 404 for an unknown id."""
        self.reader.snapshot()  # 503 while the UI cannot read the cluster
        self._check_id(topology_id)
        base = self._known_base(topology_id)
        self._check_read(request, topology_id, base)
        info = self.reader.topology_info(
            topology_id, timeout_s=float(self.conf["nimbus.task.timeout.secs"]))
        if info is None:
            raise not_found(topology_id)
        set_checkpoints(info, self.reader.fetch_topology_conf(topology_id))
        return topology_page.mask_info(info), base

    def on_dashboard(self, request: Request) -> Response:
        self.reader.demand()
        snap = self.reader.snapshot()
        now = int(time.time())
        key = (snap.version, self.reader.live_version, now)
        data = self._dashboard_data
        if data is None or data[0] != key:
            data = self._dashboard_data = (
                key, dashboard_data(self.reader, snap, self.conf, now, self.local_nimbus),
                snap.storms)
        who = self._identity(request)
        cached = self._dashboard_cache.get(who)
        if cached is None or cached[0] != key:
            # Serialised once per change (or second) and caller: a poller per open page
            # costs little.
            body = json.dumps(self._dashboard_for(who, data[1], data[2]),
                              separators=(",", ":")).encode()
            if len(self._dashboard_cache) >= DASHBOARD_CACHE_USERS:
                self._dashboard_cache.clear()
            cached = self._dashboard_cache[who] = (key, body)
        return Response(cached[1], mimetype="application/json",
                        headers={"Cache-Control": "no-store"})

    def _dashboard_for(self, who: str | None, data: dict[str, Any],
                       storms: dict[str, StormBase]) -> dict[str, Any]:
        """The dashboard as ``who`` may see it: a topology's own numbers and errors only
        where it may read the topology, its buttons only where it may change it."""
        topologies = []
        for entry in data["topologies"]:
            base = storms.get(entry["id"])
            may_read, may_change = self._rights(who, entry["id"], base)
            topologies.append(restrict_topology(entry, may_read, may_change))
        return {**data, "user": who, "topologies": topologies}

    # -- authorisation ------------------------------------------------------------------
    @staticmethod
    def _identity(request: Request) -> str | None:
        """The caller's certificate common name (HTTPS only; no header can set it)."""
        return request.environ.get(IDENTITY_KEY) or None

    def _rights(self, who: str | None, topology_id: str,
                base: StormBase | None) -> tuple[bool, bool]:
        """(may read, may change) the topology, from what the reader holds (the dashboard
        must not wait for a nimbus; a configuration not fetched yet counts as empty)."""
        if self.authorizer is None:
            return True, True
        if base is None or not who:
            return False, False
        if self.authorizer.permit(who, base.owner, ()):
            return True, True
        conf = self.reader.topology_conf(topology_id) or {}
        users = topology_users(conf)
        may_change = self.authorizer.permit(who, base.owner, users)
        return may_change or self.authorizer.permit_read(
            who, base.owner, users, topology_users(conf, READONLY_USERS_KEY)), may_change

    def _acl_conf(self, topology_id: str, name: str) -> dict[str, Any]:
        conf = self.reader.try_fetch_topology_conf(topology_id)
        if conf is None:
            raise ApiError(503, "Service Unavailable",
                           f"cannot check who may use {name}: no nimbus answered "
                           "getTopologyConf")
        return conf

    def _check_read(self, request: Request, topology_id: str, base: StormBase) -> None:
        """403 unless the caller may read the topology (Storm's read-only topology
        operations: admins, its submitter, topology.users, topology.readonly.users)."""
        if self.authorizer is None:
            return
        who = self._identity(request)
        if who and self.authorizer.permit(who, base.owner, ()):
            return
        if who:
            conf = self._acl_conf(topology_id, base.storm_name)
            if self.authorizer.permit_read(who, base.owner, topology_users(conf),
                                           topology_users(conf, READONLY_USERS_KEY)):
                return
        raise forbidden(read_refusal(who, base.storm_name))

    def _check_change(self, request: Request, action: str, topology_id: str,
                      base: StormBase) -> None:
        """403 unless the caller may ``action`` the topology: the leader's own decision
        (nimbus/thrift/handler.py), made here for the caller, since the leader sees the
        UI's certificate."""
        if self.authorizer is None:
            return
        who = self._identity(request)
        if who and self.authorizer.permit(who, base.owner, ()):
            return
        if who:
            conf = self._acl_conf(topology_id, base.storm_name)
            if self.authorizer.permit(who, base.owner, topology_users(conf)):
                return
        raise forbidden(refusal(who, action, base.storm_name))

    # -- Storm UI's POSTs ---------------------------------------------------------------
    def on_action(self, request: Request, topology_id: str, action: str,
                  wait_time: str | None = None) -> Response:
        self._check_origin(request)
        body = self._json_body(request)
        self._check_id(topology_id)
        wait_secs = None
        if wait_time is not None:
            if not _is_whole(wait_time):
                raise ApiError(400, "Bad Request",
                               f"wait-time must be a whole number of seconds, not "
                               f"{wait_time[:40]!r}")
            wait_secs = int(wait_time)
        num_workers = self._num_workers(request, body) if action == "rebalance" else None
        base = self.reader.storm_base(topology_id)
        if base is None:
            raise not_found(topology_id)
        self._check_change(request, action, topology_id, base)
        run_action(self.client, action, base.storm_name, base.status, wait_secs, num_workers,
                   self.own_identity)
        self.reader.refresh_now()
        return json_response(storm_json.operation(action, topology_id))

    # -- code versions (nimbus/state/code_versions.py) ------------------------------------
    def on_topology_history(self, request: Request, topology_id: str) -> Response:
        """The topology's code versions as the leader keeps them (``nimbus-ha history
        NAME --json``), for those who may read the topology."""
        self.reader.snapshot()  # 503 while the UI cannot read the cluster
        self._check_id(topology_id)
        base = self._known_base(topology_id)
        self._check_read(request, topology_id, base)
        history = topology_history(self.client, base.storm_name, self.own_identity)
        return json_response(_masked_history(history))

    def on_switch_version(self, request: Request, topology_id: str,
                          version: str) -> Response:
        """Switch the topology to its kept ``version`` (``nimbus-ha rollback NAME --to
        N``): the leader's rollbackTopology, for those who may change the topology."""
        self._check_origin(request)
        self._json_body(request)
        self._check_id(topology_id)
        if not _is_whole(version, 6) or not 1 <= int(version) <= MAX_VERSION:
            raise ApiError(400, "Bad Request", f"a code version is a whole number from 1, "
                                               f"not {version[:40]!r}")
        base = self._known_base(topology_id)
        self._check_change(request, "rollback", topology_id, base)
        answer = switch_version(self.client, base.storm_name, base.status, int(version),
                                self.own_identity)
        self.reader.refresh_now()
        return json_response({**storm_json.operation("version", topology_id),
                              "version": answer.get("version", int(version))})

    def _known_base(self, topology_id: str) -> StormBase:
        """The topology's StormBase now; 404 for an unknown id, 503 if unreadable."""
        try:
            base = self.reader.storm_base(topology_id)
        except RecordError as exc:
            raise ApiError(503, "Service Unavailable", f"cannot read this topology: "
                                                       f"{exc}") from None
        if base is None:
            raise not_found(topology_id)
        return base

    # -- input checks -------------------------------------------------------------------
    @staticmethod
    def _check_id(topology_id: str) -> None:
        if not TOPOLOGY_ID.fullmatch(topology_id):
            raise not_found(topology_id[:300])

    @staticmethod
    def _check_origin(request: Request) -> None:
        origin = request.headers.get("Origin")
        if origin is None:
            return
        if urlsplit(origin).netloc != request.host:
            raise ApiError(403, "Forbidden", "cross-origin POST refused")

    @staticmethod
    def _json_body(request: Request) -> dict[str, Any]:
        if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
            raise RequestEntityTooLarge(f"body larger than {MAX_BODY_BYTES} bytes")
        data = request.get_data(cache=True)  # bounded by max_content_length
        if not data.strip():
            return {}
        if request.mimetype == "application/x-www-form-urlencoded":
            return {}  # read as form fields (numWorkers=2) below
        try:
            body = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ApiError(400, "Bad Request", f"body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "Bad Request", "body must be a JSON object")
        return body

    @staticmethod
    def _num_workers(request: Request, body: dict[str, Any]) -> int:
        """numWorkers from Storm's body ``{"rebalanceOptions": {"numWorkers": N}}``, a
        top-level ``numWorkers``, a form field or the query string."""
        options = body.get("rebalanceOptions", {})
        if not isinstance(options, dict):
            raise ApiError(400, "Bad Request", "rebalanceOptions must be a JSON object")
        if options.get("executors"):
            raise ApiError(400, "Bad Request", "rebalance: executors are not supported "
                                               "(a worker runs whole components); give "
                                               "numWorkers")
        raw: Any = options.get("numWorkers", body.get("numWorkers"))
        if raw is None:
            raw = request.form.get("numWorkers") or request.args.get("numWorkers")
        if raw is None:
            raise ApiError(400, "Bad Request", "rebalance needs numWorkers (body "
                                               "rebalanceOptions.numWorkers or query)")
        if isinstance(raw, str) and _is_whole(raw.strip(), 6):
            raw = int(raw.strip())
        if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= 100000:
            raise ApiError(400, "Bad Request",
                           f"numWorkers must be a whole number >= 1, not {str(raw)[:40]!r}")
        return raw


def _masked_history(history: dict[str, Any]) -> dict[str, Any]:
    """``history`` with the text its versions carry (errors a worker raised, submitters)
    masked, as the page masks what workers wrote."""
    versions = [{**entry, "error": mask(str(entry.get("error") or "")),
                 "submitter": mask(str(entry.get("submitter") or ""))}
                for entry in history.get("versions") or []]
    return {**history, "versions": versions}


def _whole(text: str | None, name: str, low: int, high: int) -> int:
    """A query parameter that must be a whole number in [low, high]; 400 otherwise."""
    if text is None or not _is_whole(text) or not low <= int(text) <= high:
        raise ApiError(400, "Bad Request", f"{name} must be a whole number from {low} to "
                                           f"{high}, not {str(text)[:40]!r}")
    return int(text)
