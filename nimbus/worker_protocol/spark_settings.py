"""A worker's Spark session settings, as its supervisor and the worker both compute them.

The worker starts its SparkSession with :func:`session_settings` and
:func:`spark_master` (nimbus/worker/spark.py). A warm worker's session was started with
the cluster's defaults before any topology was known; whether it can run a topology is
:func:`warm_mismatch`: asked by the supervisor before it hands a warm worker to a slot
(nimbus/supervisor/warm_pool.py), and by the warm worker again when it adopts the
session (it refuses with exit 4 when it cannot).
"""

from __future__ import annotations

from typing import Any

from nimbus.worker_protocol.exits import InvalidTopology
from nimbus.worker_protocol.spec import WorkerSpec

#: The driver's address unless a topology chooses one (:data:`HOST_KEYS`).
LOOPBACK = "127.0.0.1"
#: Keys with which a topology chooses the driver's address itself.
HOST_KEYS = ("spark.driver.host", "spark.driver.bindAddress")


def _spark_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def user_spark_conf(spec: WorkerSpec) -> dict[str, str]:
    """``topology.spark.conf`` as Spark strings; raises InvalidTopology if not a mapping."""
    conf = spec.conf.get("topology.spark.conf") or {}
    if not isinstance(conf, dict):
        raise InvalidTopology("topology.spark.conf must be a mapping of Spark keys, "
                              f"got {type(conf).__name__}")
    return {str(k): _spark_value(v) for k, v in conf.items()}


def session_settings(spec: WorkerSpec) -> dict[str, str]:
    """Every builder setting, in the order applied: ours first, the topology's last.

    The driver binds to the loopback address unless the topology sets a driver host
    itself; nothing else (UI, memory, partitions) is decided here.
    """
    user = user_spark_conf(spec)
    settings: dict[str, str] = {}
    if not any(key in user for key in HOST_KEYS):
        settings.update({key: LOOPBACK for key in HOST_KEYS})
    settings.update(user)
    return settings


def spark_master(conf: dict[str, Any]) -> str:
    """``topology.spark.master`` of a worker's configuration (its supervisor writes it)."""
    return str(conf["topology.spark.master"])


def runtime_settable(key: str) -> bool:
    """Whether a Spark setting *may* be changed on a running session: only SQL settings
    can (Spark itself has the last word when a warm worker adopts its session:
    :func:`nimbus.worker.spark.adopt_session`); everything else (memory, cores, jars,
    the driver's address, ...) is fixed when the JVM starts."""
    return key.startswith("spark.sql.") and key not in STATIC_SQL_KEYS


#: SQL settings that Spark fixes at start all the same (StaticSQLConf's common ones).
STATIC_SQL_KEYS = frozenset({
    "spark.sql.warehouse.dir", "spark.sql.catalogImplementation", "spark.sql.extensions",
    "spark.sql.queryExecutionListeners", "spark.sql.streaming.streamingQueryListeners",
    "spark.sql.ui.retainedExecutions", "spark.sql.streaming.ui.enabled",
    "spark.sql.sources.schemaStringLengthThreshold", "spark.sql.event.truncate.length",
    "spark.sql.legacy.sessionInitWithConfigDefaults", "spark.sql.cache.serializer",
})


def warm_mismatch(warm: WorkerSpec, wanted: WorkerSpec) -> str | None:
    """Why a session started for ``warm`` cannot run ``wanted`` (None: it can).

    They must have the same master and the same settings fixed at start; SQL settings
    that differ are set on the session when it is taken
    (:func:`nimbus.worker.spark.adopt_session`)."""
    if spark_master(warm.conf) != spark_master(wanted.conf):
        return (f"topology.spark.master is {spark_master(wanted.conf)}, the warm workers' "
                f"{spark_master(warm.conf)}")
    ours, theirs = session_settings(warm), session_settings(wanted)
    for key in sorted(set(ours) | set(theirs)):
        if ours.get(key) != theirs.get(key) and not runtime_settable(key):
            return (f"Spark setting {key} is {theirs.get(key, '(unset)')}, the warm workers' "
                    f"{ours.get(key, '(unset)')} (fixed when Spark starts)")
    return None
