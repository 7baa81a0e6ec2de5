"""The values stored in ZooKeeper: JSON objects that carry a format version.

Field meanings follow Storm's records (StormBase, Assignment, SupervisorInfo); every
znode value is ``{"format": 1, ...fields}`` so a later release can read old data.
"""

from __future__ import annotations

import base64
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, TypeVar

FORMAT_VERSION = 1

# Storm's topology statuses as TopologySummary.status reports them.
ACTIVE, INACTIVE, KILLED = "ACTIVE", "INACTIVE", "KILLED"

R = TypeVar("R", bound="Record")


class RecordError(ValueError):
    """A znode holds data this release cannot read."""


class Record:
    """Base of the JSON records: ``encode`` and ``decode`` with a format version."""

    def encode(self) -> bytes:
        return json.dumps({"format": FORMAT_VERSION, **asdict(self)}, sort_keys=True).encode()

    @classmethod
    def decode(cls: type[R], data: bytes) -> R:
        try:
            obj = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RecordError(f"{cls.__name__}: not JSON: {exc}") from None
        if not isinstance(obj, dict) or obj.get("format") != FORMAT_VERSION:
            raise RecordError(f"{cls.__name__}: unsupported format {obj!r:.80}")
        known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in obj.items() if k in known})


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


@dataclass
class Assignment(Record):
    """/assignments/<id>: where the code is and which worker runs which executor."""

    master_code_dir: str
    node_host: dict[str, str] = field(default_factory=dict)
    executor_node_port: dict[str, list[Any]] = field(default_factory=dict)
    executor_start_time_secs: dict[str, int] = field(default_factory=dict)
    # file name -> sha256 of the topology's code, so a supervisor can verify what it fetches
    code_sha256: dict[str, str] = field(default_factory=dict)


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
    #               "processed_rows_per_second", "timestamp"} (from Spark's lastProgress)
    components: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class NimbusInfo(Record):
    """/nimbuses/<host:port>: a live nimbus (ephemeral)."""

    host: str
    port: int
    start_time_secs: int
    version: str


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

    @staticmethod
    def pack(metafile: bytes) -> str:
        return base64.b64encode(metafile).decode("ascii")
