"""Path-valued topology settings: absolute when stored, resolved where they were typed.

A worker runs in a directory of its own on a supervisor host, so a relative path in a
topology's conf names a place the submitter never meant (``dev-cluster/checkpoints``
becomes ``<worker-dir>/dev-cluster/checkpoints``). The rule, documented in
docs/runtime.md:

* the project's clients (``nimbus-ha submit``, :class:`nimbus.thrift.client.NimbusClient`)
  resolve the known path keys against the submitter's working directory before they send
  the conf (:func:`resolve_path_keys`);
* the leader refuses a submission whose known path keys still hold a relative path (a
  foreign client that sent one): :func:`relative_path_keys` names them;
* a topology's own keys (``--conf``) are not interpreted, but ``submit`` warns when a
  value looks like a relative path that exists on the client
  (:func:`relative_looking_values`).

URIs (``s3a://…``, ``hdfs://…``, ``file:/…``) are left alone: they are never relative.

Where a pipeline's checkpoints are (:func:`checkpoint_location`) is spelled here once, for
the worker that starts the query and for every screen that shows it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: Topology keys whose value the runtime treats as a filesystem path.
PATH_KEYS = ("topology.spark.checkpoint.dir",)
#: Keys inside ``topology.spark.conf`` that Spark treats as paths of the whole query
#: (a relative one would be resolved in the worker's directory).
SPARK_CONF_KEY = "topology.spark.conf"
SPARK_PATH_KEYS = ("spark.sql.streaming.checkpointLocation", "spark.sql.warehouse.dir")

# A scheme of two or more characters: "s3a:", "hdfs:", "file:" (a one-letter "c:" would
# be a Windows drive, which no supervisor runs on).
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")


#: The checkpoint root's key, and the root under ``storm.local.dir`` when it is unset.
CHECKPOINT_DIR_KEY = "topology.spark.checkpoint.dir"
DEFAULT_CHECKPOINTS = "checkpoints"


def is_uri(value: Any) -> bool:
    """Whether ``value`` is a string with a URI scheme (``s3a://…``, ``file:/…``)."""
    return isinstance(value, str) and _URI.match(value) is not None


def checkpoint_root_of(conf: dict[str, Any]) -> Path:
    """``topology.spark.checkpoint.dir`` of a worker's ``conf``, or
    ``<storm.local.dir>/checkpoints``, as a local path (a URI's ``//`` is lost: use
    :func:`checkpoint_location` for anything handed to Spark)."""
    configured = conf.get(CHECKPOINT_DIR_KEY)
    if configured:
        return Path(str(configured)).expanduser().absolute()
    local_dir = conf.get("storm.local.dir") or "storm-local"
    return Path(str(local_dir)).expanduser().absolute() / DEFAULT_CHECKPOINTS


def checkpoint_location(conf: dict[str, Any], topology_id: str, component: str) -> str:
    """Where the query of ``component`` keeps its checkpoint:
    ``<topology.spark.checkpoint.dir>/<topology-id>/<component>`` (``conf``: the worker's
    merged configuration, or a topology's own). A URI root keeps its form
    (``s3a://bucket/ckpt/<id>/<component>``); a path root is made absolute, and without
    one the root is ``<storm.local.dir>/checkpoints`` of the host that runs it."""
    configured = conf.get(CHECKPOINT_DIR_KEY)
    if is_uri(configured):
        return f"{str(configured).rstrip('/')}/{topology_id}/{component}"
    return str(checkpoint_root_of(conf) / topology_id / component)


def is_relative_path(value: Any) -> bool:
    """Whether ``value`` is a non-empty string naming a relative filesystem path (``~``
    counts as relative: the worker's account may have another home)."""
    if not isinstance(value, str) or not value or _URI.match(value):
        return False
    return not os.path.isabs(value)


def _resolve(value: Any, cwd: Path) -> Any:
    if not is_relative_path(value):
        return value
    return str((cwd / Path(value).expanduser()).resolve())


def resolve_path_keys(conf: dict[str, Any], cwd: Path | None = None) -> dict[str, Any]:
    """A copy of ``conf`` with every known path key made absolute against ``cwd`` (the
    current directory by default); other keys and URIs are kept as they are."""
    cwd = Path.cwd() if cwd is None else cwd
    out = dict(conf)
    for key in PATH_KEYS:
        if key in out:
            out[key] = _resolve(out[key], cwd)
    spark_conf = out.get(SPARK_CONF_KEY)
    if isinstance(spark_conf, dict):
        out[SPARK_CONF_KEY] = {k: _resolve(v, cwd) if k in SPARK_PATH_KEYS else v
                               for k, v in spark_conf.items()}
    return out


def relative_path_keys(conf: dict[str, Any]) -> list[str]:
    """The known path keys of ``conf`` that hold a relative path, as dotted names
    (``topology.spark.conf.spark.sql.warehouse.dir`` for one inside the Spark conf)."""
    found = [key for key in PATH_KEYS if is_relative_path(conf.get(key))]
    spark_conf = conf.get(SPARK_CONF_KEY)
    if isinstance(spark_conf, dict):
        found += [f"{SPARK_CONF_KEY}.{key}" for key in SPARK_PATH_KEYS
                  if is_relative_path(spark_conf.get(key))]
    return found


def relative_looking_values(pairs: Iterable[tuple[str, Any]],
                            cwd: Path | None = None) -> list[tuple[str, str, Path]]:
    """``(key, value, absolute path)`` for each value that is a relative path existing
    under ``cwd``: most likely a path the user meant on their own machine."""
    cwd = Path.cwd() if cwd is None else cwd
    found = []
    for key, value in pairs:
        if key in PATH_KEYS or not is_relative_path(value) or "\n" in value:
            continue
        candidate = cwd / Path(value).expanduser()
        try:
            exists = candidate.exists()
        except (OSError, ValueError):  # a name too long or with a NUL is no path
            exists = False
        if exists:
            found.append((key, value, candidate.resolve()))
    return found
