"""The values stored in ZooKeeper: JSON objects that carry a format version.

Field meanings follow Storm's records (StormBase, Assignment, SupervisorInfo); every
znode value is ``{"format": 1, ...fields}`` so a later release can read old data.

Reading is strict about what this release relies on and lenient about what it does not
know, as Storm's Thrift-encoded records are:

* a field this release does not know (added by a newer release in the same format) is
  ignored, so additions never need a new format number;
* a *format* newer than :data:`FORMAT_VERSION` means a newer release changed the meaning
  of existing fields: the record is refused, since guessing could misplace work;
* anything else this release cannot use (not UTF-8, not JSON, not an object, no format,
  a required field missing, a field of the wrong type) is refused too.

Every refusal is a :class:`RecordError` naming the record type, the node (when the
reader passes it) and the problem; no other exception escapes :meth:`Record.decode`.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, ClassVar, TypeVar

FORMAT_VERSION = 1
# The executor keys of an Assignment (the scheduler's workers): worker-<i>.
WORKER_PREFIX = "worker-"
WORKER_KEY_RE = re.compile(r"^worker-[0-9]{1,9}$")

# Storm's topology statuses as TopologySummary.status reports them. REBALANCING: a
# rebalance with a wait (``rebalance --wait S``) is under way; see StormBase.
ACTIVE, INACTIVE, KILLED = "ACTIVE", "INACTIVE", "KILLED"
REBALANCING = "REBALANCING"

R = TypeVar("R", bound="Record")


class RecordError(ValueError):
    """A znode holds data this release cannot read; the message names the record type,
    the node (when known) and what is wrong."""


_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "an integer",
               float: "a number", bool: "a boolean", type(None): "null"}


def _json_type(value: Any) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _preview(value: Any) -> str:
    """The start of ``value`` as JSON, for an error message."""
    try:
        return json.dumps(value)[:40]
    except (RecursionError, ValueError):
        return "..."


def _is_text(value: str) -> bool:
    """False for a string JSON allows but UTF-8 cannot encode (a lone surrogate): it
    would make any reply that carries it (say, getClusterInfo) unwritable."""
    try:
        value.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _mismatch(value: Any, hint: Any) -> str | None:
    """Why ``value`` (decoded JSON) does not fit the annotation ``hint``, or None."""
    if hint is Any:
        return None
    origin = typing.get_origin(hint)
    if origin is None:
        if hint is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, hint)
        if not ok:
            return (f"must be {_JSON_TYPES.get(hint, hint.__name__)}, "
                    f"got {_json_type(value)} {_preview(value)}")
        if hint is str and not _is_text(value):
            return "must be text, got a string with a lone surrogate (\\ud800-\\udfff)"
        return None
    if origin is list:
        if not isinstance(value, list):
            return f"must be an array, got {_json_type(value)} {_preview(value)}"
        (item,) = typing.get_args(hint)
        for i, element in enumerate(value):
            problem = _mismatch(element, item)
            if problem:
                return f"[{i}] {problem}"
        return None
    if origin is dict:
        if not isinstance(value, dict):
            return f"must be an object, got {_json_type(value)} {_preview(value)}"
        _key, item = typing.get_args(hint)  # JSON object keys are always strings
        for name, element in value.items():
            if not _is_text(name):
                return "has a key with a lone surrogate (\\ud800-\\udfff)"
            problem = _mismatch(element, item)
            if problem:
                return f"[{name[:40]!r}] {problem}"
        return None
    raise TypeError(f"records.py: unsupported field annotation {hint!r}")  # a bug here


class Record:
    """Base of the JSON records: ``encode`` and ``decode`` with a format version."""

    _hints: ClassVar[dict[type, dict[str, Any]]] = {}

    def encode(self) -> bytes:
        return json.dumps({"format": FORMAT_VERSION, **asdict(self)}, sort_keys=True).encode()

    @classmethod
    def decode(cls: type[R], data: bytes, source: str = "") -> R:
        """The record in ``data``; ``source`` (the znode's path) goes into errors.

        Raises RecordError, and nothing else, for data this release cannot read (see the
        module docstring)."""
        where = f"{cls.__name__} at {source}" if source else cls.__name__

        def refuse(problem: str) -> RecordError:
            return RecordError(f"{where}: {problem}")

        if not isinstance(data, (bytes, bytearray)):
            raise refuse(f"expected bytes, got {type(data).__name__}")
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise refuse(f"not UTF-8 text (byte {exc.start} of {len(data)})") from None
        if not text.strip():
            raise refuse("empty (a node created but never written?)")
        try:
            obj = json.loads(text)
        except RecursionError:
            raise refuse("JSON nested too deeply") from None
        except ValueError as exc:  # JSONDecodeError, or an integer of too many digits
            raise refuse(f"not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise refuse(f"not a JSON object but {_json_type(obj)}")
        if "format" not in obj:
            raise refuse("no format version")
        version = obj["format"]
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise refuse(f"format {_preview(version)} is not a version number")
        if version > FORMAT_VERSION:
            raise refuse(f"format {version} is newer than this release reads "
                         f"({FORMAT_VERSION}): written by a newer nimbus-ha; upgrade this "
                         "host")
        hints = cls._hints.get(cls)
        if hints is None:
            hints = cls._hints[cls] = typing.get_type_hints(cls)
        values = {}
        for f in fields(cls):  # type: ignore[arg-type]
            if f.name not in obj:
                if f.default is MISSING and f.default_factory is MISSING:
                    raise refuse(f"field {f.name!r} is missing")
                continue  # a record of an earlier release: the default applies
            problem = _mismatch(obj[f.name], hints[f.name])
            if problem:
                sep = "" if problem.startswith("[") else " "
                raise refuse(f"field {f.name!r}{sep}{problem}")
            values[f.name] = obj[f.name]
        record = cls(**values)
        problem = record._invalid()
        if problem:
            raise refuse(problem)
        return record

    def _invalid(self) -> str | None:
        """What is wrong beyond the field types (a record type's own rules), or None."""
        return None


@dataclass
class StormBase(Record):
    """/storms/<id>: what a topology is and whether it runs."""

    storm_name: str
    launch_time_secs: int
    status: str
    num_workers: int = 1
    component_executors: dict[str, int] = field(default_factory=dict)
    owner: str = ""
    # Set when status is KILLED: the leader removes the topology at this time.
    kill_at_secs: int = 0
    # The client's token for this submission, so that a retried submit is recognised.
    submission_token: str = ""
    # Set while status is REBALANCING (Storm's prev_status and the RebalanceOptions of
    # its topology_action_options): the status to return to (ACTIVE or INACTIVE), the
    # number of workers to apply, and when, in epoch seconds. The leader completes the
    # rebalance once that time has passed (nimbus.master.rebalancing). All three are
    # absent (the defaults) in records of earlier releases, and when not rebalancing.
    prev_status: str = ""
    rebalance_num_workers: int = 0
    rebalance_at_secs: int = 0


@dataclass
class Assignment(Record):
    """/assignments/<id>: where the code is and which worker runs which executor."""

    master_code_dir: str
    node_host: dict[str, str] = field(default_factory=dict)
    executor_node_port: dict[str, list[Any]] = field(default_factory=dict)
    executor_start_time_secs: dict[str, int] = field(default_factory=dict)
    # file name -> sha256 of the topology's code, so a supervisor can verify what it fetches
    # (of version ``code_version``: see nimbus.state.code_versions)
    code_sha256: dict[str, str] = field(default_factory=dict)
    # The code version every worker runs unless ``worker_versions`` names its executor
    # (1, the submitted code, in records of earlier releases).
    code_version: int = 1
    # During a switch between versions: executor -> the version that worker runs, for the
    # workers that do not run ``code_version`` yet (rolling) or any more.
    worker_versions: dict[str, int] = field(default_factory=dict)
    # str(version) -> file name -> sha256, for each version ``worker_versions`` names.
    version_sha256: dict[str, dict[str, str]] = field(default_factory=dict)

    def code_for(self, executor: str) -> tuple[int, dict[str, str]]:
        """(version, file name -> sha256) of the code ``executor``'s worker runs."""
        version = self.worker_versions.get(executor, self.code_version)
        if version == self.code_version:
            return version, self.code_sha256
        return version, self.version_sha256.get(str(version), {})

    def _invalid(self) -> str | None:
        if self.code_version < 1:
            return f"field 'code_version' must be 1 or more, got {self.code_version}"
        for executor, version in self.worker_versions.items():
            if version < 1:
                return f"field 'worker_versions'[{executor[:40]!r}] must be 1 or more"
            if version != self.code_version and str(version) not in self.version_sha256:
                return (f"field 'worker_versions'[{executor[:40]!r}] names version "
                        f"{version}, whose sha256 is not in 'version_sha256'")
        for executor, slot in self.executor_node_port.items():
            if not WORKER_KEY_RE.fullmatch(executor):
                return (f"field 'executor_node_port' has key {executor[:40]!r}, not "
                        "worker-<index>")
            if len(slot) != 2 or not isinstance(slot[0], str) or not isinstance(
                    slot[1], int) or isinstance(slot[1], bool):
                return (f"field 'executor_node_port'[{executor[:40]!r}] must be "
                        f"[supervisor id, port], got {_preview(slot)}")
        return None


@dataclass
class SupervisorAssignments(Record):
    """/supervisor-assignments/<supervisor-id>: the topologies whose Assignment places
    work on that supervisor, kept by the leader, so that a supervisor watches its own
    assignments only (not every assignment of the cluster)."""

    topologies: list[str] = field(default_factory=list)


@dataclass
class SupervisorInfo(Record):
    """/supervisors/<supervisor-id>: a supervisor's heartbeat."""

    time_secs: int
    hostname: str
    assignment_id: str = ""
    used_ports: list[int] = field(default_factory=list)
    meta: list[int] = field(default_factory=list)
    scheduler_meta: dict[str, Any] = field(default_factory=dict)
    uptime_secs: int = 0
    version: str = ""
    # Warm workers (supervisor.warm.workers): ready, still starting, and the resident
    # bytes of them all (Python and JVM).
    warm_ready: int = 0
    warm_starting: int = 0
    warm_memory_bytes: int = 0
    # What it knows of the worker of each slot it is assigned, by port (a string: JSON
    # keys are): {"topology_id", "state" (starting, running, frozen or restarting),
    # "restarts", "backoff_secs", "last_error", and, for upgrades
    # (nimbus.state.code_versions), "version" (the code version of its worker),
    # "committed" (that worker has committed a batch, or passed its health check, on that
    # version) and "failures" (exits on that version before any commit)}. Written by
    # supervisors; read by nimbus.state.worker_state, which takes a malformed entry for
    # none. Empty in records of earlier releases, which said nothing of their workers.
    workers: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Where its logviewer serves its workers' logs (supervisor.logviewer.port; 0: none,
    # as in records of earlier releases), and whether over HTTPS (storm.thrift.transport
    # tls: client certificates required).
    logviewer_port: int = 0
    logviewer_https: bool = False


@dataclass
class WorkerBeat(Record):
    """/workerbeats/<id>/<supervisor-id>-<port>: a worker's heartbeat, written by its
    supervisor. The scheduler reads only the node's version; these fields are for people
    (``topology-info``, the UI)."""

    time_secs: int
    topology_id: str
    supervisor_id: str
    host: str
    port: int
    uptime_secs: int = 0
    restarts: int = 0
    # component -> {"batch_id", "num_input_rows", "input_rows_per_second",
    #               "processed_rows_per_second", "timestamp", "input_waiting"} (from
    # Spark's lastProgress), and "progress" (the full progress) and "history" (the
    # charts' last 15 minutes), as nimbus.state.beat_progress checks and bounds them:
    # absent in beats of earlier releases.
    components: dict[str, dict[str, Any]] = field(default_factory=dict)
    memory_bytes: int = 0      # resident bytes of the worker's processes (its JVM too)
    # The code version the worker runs (nimbus.state.code_versions; 1 in beats of
    # earlier releases).
    code_version: int = 1
    warm_start: bool = False   # it started as a warm worker (supervisor.warm.workers)
    # Its SparkSession's UI (sparkContext.uiWebUrl), an http(s) address checked by
    # nimbus.state.beat_progress.checked_url; "" when the UI is off, for a process
    # topology, and in beats of earlier releases.
    spark_ui_url: str = ""


@dataclass
class PlacementHistory(Record):
    """/placements/<id>: where each worker of a topology has run, written by the leader
    (fenced, in the transaction of the assignment it describes) whenever a placement
    changes, and removed with the topology (nimbus.master.placement_history).

    ``workers``: ``worker-<i>`` -> its placements, oldest first, each ``{"supervisor_id":
    str, "host": str, "port": int, "since_secs": int, "until_secs": int}``; ``since_secs``
    is the leader's clock when it placed the worker there, ``until_secs`` when it took
    it off (0 while it is still placed there). Bounded by the leader: at most 20 per
    worker, fewer for topologies of many workers."""

    workers: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def _invalid(self) -> str | None:
        for worker, placements in self.workers.items():
            if not WORKER_KEY_RE.fullmatch(worker):
                return f"field 'workers' has key {worker[:40]!r}, not worker-<index>"
            for entry in placements:
                if not (isinstance(entry.get("supervisor_id"), str)
                        and isinstance(entry.get("host"), str)
                        and all(isinstance(entry.get(k), int)
                                and not isinstance(entry.get(k), bool)
                                for k in ("port", "since_secs", "until_secs"))):
                    return (f"field 'workers'[{worker!r}] holds {_preview(entry)}, not "
                            "{supervisor_id, host, port, since_secs, until_secs}")
        return None


@dataclass
class NimbusInfo(Record):
    """/nimbuses/<host:port>: a live nimbus (ephemeral)."""

    host: str
    port: int
    start_time_secs: int
    version: str
    # The process that registered (nimbus.state.incarnation) and its leader-lock token:
    # they let the same nimbus, started again, remove the lock node of a predecessor that
    # is certainly dead. Empty (unknown) in records of earlier releases.
    boot_id: str = ""
    pid_namespace: str = ""
    pid: int = 0
    pid_started_ticks: int = 0
    lock_token: str = ""


@dataclass
class ErrorInfo(Record):
    """/errors/<id>/<component>/e<seq>: one error reported by a component."""

    error: str
    error_time_secs: int
    host: str = ""
    port: int = 0


@dataclass
class CodeMeta(Record):
    """/code-distributor/<id>: the distributor's metafile, published by the leader."""

    distributor: str
    metafile_b64: str
    uploaded_by: str
    created_secs: int

    @property
    def metafile(self) -> bytes:
        return base64.b64decode(self.metafile_b64)

    def _invalid(self) -> str | None:
        try:
            base64.b64decode(self.metafile_b64, validate=True)
        except (binascii.Error, ValueError):
            return "field 'metafile_b64' is not base64"
        return None

    @staticmethod
    def pack(metafile: bytes) -> str:
        return base64.b64encode(metafile).decode("ascii")
