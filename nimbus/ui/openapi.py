"""The OpenAPI 3 description of the UI's REST API (served at /api/v1/openapi.json)."""

from __future__ import annotations

from typing import Any

from nimbus import __version__

_ID = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"},
       "description": "Topology id (from /api/v1/topology/summary)."}
_COMPONENT = {"name": "component", "in": "path", "required": True,
              "schema": {"type": "string", "pattern": "^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"},
              "description": "Component id (a pipeline's query, main, or worker-<i> for "
                             "errors of a worker itself)."}
_VERSION = {"name": "n", "in": "path", "required": True,
            "schema": {"type": "integer", "minimum": 1, "maximum": 999999},
            "description": "A kept code version of the topology (from its history)."}
_WAIT = {"name": "wait-time", "in": "path", "required": True,
         "schema": {"type": "integer", "minimum": 0}, "description": "Seconds."}


def _ok(description: str, schema_ref: str | None = None) -> dict[str, Any]:
    content = {"application/json": {"schema": {"$ref": schema_ref} if schema_ref
                                    else {"type": "object"}}}
    return {"description": description, "content": content}


def _errors(*codes: int) -> dict[str, Any]:
    reasons = {400: "Bad input",
               403: "Not allowed: nimbus.authorizer's rules refuse the caller (its client "
                    "certificate's common name), or a cross-origin POST",
               404: "Unknown topology",
               405: "Wrong method",
               409: "Wrong state (the topology is being killed or rebalanced; for a "
                    "version switch also: a switch under way, or a version not kept)",
               413: "Body larger than 1 MiB",
               502: "The worker's logviewer did not answer as it should",
               503: "No leader reachable, or ZooKeeper unreachable"}
    return {str(c): {"description": reasons[c], "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/Error"}}}} for c in codes}


def _get(summary: str, ref: str | None = None, *errors: int,
         params: list[Any] | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {
        "200": _ok(summary, ref), **_errors(405, 503, *errors)}}
    if params:
        op["parameters"] = params
    return {"get": op}


def _post(summary: str, params: list[Any], body: bool = False) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "parameters": params, "responses": {
        "200": _ok("Done", "#/components/schemas/Operation"),
        **_errors(400, 403, 404, 405, 409, 413, 503)}}
    if body:
        op["requestBody"] = {"required": False, "content": {"application/json": {
            "schema": {"type": "object", "properties": {"rebalanceOptions": {
                "type": "object", "properties": {"numWorkers": {"type": "integer",
                                                                "minimum": 1}}}}}}}}
        op["parameters"] = params + [{"name": "numWorkers", "in": "query",
                                      "schema": {"type": "integer", "minimum": 1}}]
    return {"post": op}


def openapi_document() -> dict[str, Any]:
    """Every path the UI serves, with Storm UI's field names."""
    return {
        "openapi": "3.0.3",
        "info": {"title": "nimbus-ha UI REST API (Storm UI compatible)",
                 "version": __version__},
        "paths": {
            "/api/v1/cluster/summary": _get("Cluster summary",
                                            "#/components/schemas/ClusterSummary"),
            "/api/v1/cluster/configuration": _get("Cluster configuration (secrets "
                                                  "redacted)"),
            "/api/v1/nimbus/summary": _get("Every nimbus: Leader, Not a Leader, Offline; "
                                           "dutyCycleAgeSecs on the leader's row when "
                                           "this UI runs inside the leader"),
            "/api/v1/supervisor/summary": _get("Every supervisor and its slots"),
            "/api/v1/topology/summary": _get("Every topology"),
            "/api/v1/topology/{id}": _get("One topology: workers, components (bolts), "
                                          "errors, replication count", None, 403, 404,
                                          params=[_ID]),
            "/api/v1/topology/{id}/component/{component}": _get(
                "One component (Storm UI's component page; a bolt with one executor per "
                "worker running it), with nimbus-ha's batchId, rates, Spark's newest "
                "progress, the charts' history (last 15 minutes), its checkpoint and "
                "Spark UI addresses", None, 403, 404, params=[_ID, _COMPONENT]),
            "/api/v1/topology/{id}/page": _get(
                "nimbus-ha's topology page data in one request: topology-info --json's "
                "shape (workers with state and placement history, components with "
                "progress, history and checkpoint, errors), may_change and generated_at",
                None, 403, 404, params=[_ID]),
            "/api/v1/topology/{id}/logs": _get(
                "nimbus-ha's Logs panel: the tail of one worker's log (whole lines, "
                "masked), or with search the logviewer's matches in it, read from its "
                "supervisor's logviewer (docs/logs.md)", None, 400, 403, 404, 502,
                params=[_ID, {"name": "worker", "in": "query", "required": True,
                              "schema": {"type": "integer", "minimum": 0}},
                        {"name": "bytes", "in": "query",
                         "schema": {"type": "integer", "minimum": 1,
                                    "maximum": 1048576, "default": 65536}},
                        {"name": "search", "in": "query",
                         "schema": {"type": "string", "maxLength": 200}}]),
            "/api/v1/topology/{id}/activate": _post("Activate", [_ID]),
            "/api/v1/topology/{id}/deactivate": _post("Deactivate", [_ID]),
            "/api/v1/topology/{id}/rebalance/{wait-time}": _post(
                "Rebalance to numWorkers workers; a wait-time above 0 keeps the topology "
                "REBALANCING (deactivated) for that many seconds first", [_ID, _WAIT],
                body=True),
            "/api/v1/topology/{id}/kill/{wait-time}": _post("Kill after wait-time",
                                                             [_ID, _WAIT]),
            "/api/v1/topology/{id}/history": _get(
                "nimbus-ha's code versions of the topology, as `nimbus-ha history NAME "
                "--json` prints them: running, the switch under way (or null) and the "
                "kept versions, newest first (version, sha256, submitter, created_secs, "
                "state: running, switching, previous, old, rolled back or failed; "
                "error)", "#/components/schemas/History", 403, 404, params=[_ID]),
            "/api/v1/topology/{id}/version/{n}": _post(
                "nimbus-ha's switch to kept code version n (`nimbus-ha rollback NAME "
                "--to n`): every worker stops at a batch boundary and starts version n "
                "from the same checkpoint; the answer's version is the target, the "
                "switch goes on after it (follow it in the history)", [_ID, _VERSION]),
            "/api/v1/ui/dashboard": _get("nimbus-ha's dashboard data (one request per "
                                         "refresh)"),
            "/api/v1/openapi.json": _get("This document"),
            "/": {"get": {"summary": "The dashboard page (and each topology's page, at "
                                     "#/topology/<id>)",
                          "responses": {"200": {"description": "HTML"}}}},
            "/static/{name}": {"get": {"summary": "The dashboard's script and style",
                                       "parameters": [{"name": "name", "in": "path",
                                                       "required": True,
                                                       "schema": {"type": "string"}}],
                                       "responses": {"200": {"description": "File"},
                                                     **_errors(404)}}},
        },
        "components": {"schemas": {
            "Error": {"type": "object", "required": ["error", "errorMessage"],
                      "properties": {"error": {"type": "string"},
                                     "errorMessage": {"type": "string"}}},
            "Operation": {"type": "object", "properties": {
                "topologyOperation": {"type": "string"}, "topologyId": {"type": "string"},
                "status": {"type": "string", "enum": ["success"]}}},
            "History": {"type": "object", "properties": {
                "topology_id": {"type": "string"}, "name": {"type": "string"},
                "running": {"type": "integer"},
                "switch": {"type": "object", "nullable": True, "properties": {
                    "kind": {"type": "string", "enum": ["upgrade", "rollback"]},
                    "from": {"type": "integer"}, "to": {"type": "integer"},
                    "strategy": {"type": "string", "enum": ["all", "rolling"]},
                    "started_secs": {"type": "integer"},
                    "deadline_secs": {"type": "integer"}, "by": {"type": "string"},
                    "switched": {"type": "array", "items": {"type": "string"}}}},
                "versions": {"type": "array", "items": {"type": "object", "properties": {
                    "version": {"type": "integer"}, "sha256": {"type": "string"},
                    "submitter": {"type": "string"}, "created_secs": {"type": "integer"},
                    "state": {"type": "string", "enum": [
                        "running", "switching", "previous", "old", "rolled back",
                        "failed"]},
                    "error": {"type": "string"}}}}}},
            "ClusterSummary": {"type": "object", "properties": {
                k: {"type": t} for k, t in [
                    ("stormVersion", "string"), ("supervisors", "integer"),
                    ("topologies", "integer"), ("slotsTotal", "integer"),
                    ("slotsUsed", "integer"), ("slotsFree", "integer"),
                    ("executorsTotal", "integer"), ("tasksTotal", "integer"),
                    ("schedulerDisplayResource", "boolean")]}},
        }},
    }
