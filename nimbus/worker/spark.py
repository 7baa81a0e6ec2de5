"""The SparkSession of a pipeline worker: one per worker process, local to this host."""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from nimbus.redaction import redact
from nimbus.worker.exits import InvalidTopology
from nimbus.worker.spec import WorkerSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
# Keys with which a topology chooses the driver's address itself.
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


def build_session(spec: WorkerSpec) -> SparkSession:
    """Start the worker's SparkSession (master ``topology.spark.master``, app name
    ``<topology-id>-<port>``). Starts a JVM: 5-15 s."""
    from pyspark.sql import SparkSession

    settings = session_settings(spec)
    if not any(key in user_spark_conf(spec) for key in HOST_KEYS):
        # The JVM's own address lookup (before any conf is read) uses this variable.
        os.environ["SPARK_LOCAL_IP"] = LOOPBACK
    # Spark's Python workers (UDFs) must be this interpreter, and must import the bundle's
    # modules: cloudpickle sends functions of importable modules by reference.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    paths = [spec.code_dir, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))

    master = str(spec.conf.get("topology.spark.master") or "local[*]")
    builder = SparkSession.builder.master(master).appName(f"{spec.topology_id}-{spec.port}")
    for key, value in settings.items():
        builder = builder.config(key, value)
    log.info("starting SparkSession: master %s, conf %s", master, redact(settings))
    session = builder.getOrCreate()
    ignore_sigterm_in_jvm(session)
    return session


def ignore_sigterm_in_jvm(session: SparkSession) -> None:
    """Make the driver JVM ignore SIGTERM, so that the worker stops it, in order.

    The supervisor stops a worker with SIGTERM to its whole process group, which includes
    the JVM. Left alone, the JVM would run its shutdown hooks at once and stop the
    SparkContext under the worker's feet (query.stop() then fails). Ignoring it, the
    worker stops the queries and Spark itself; the JVM exits when the worker does (its
    stdin closes) and SIGKILL still reaches it (lease expiry, the supervisor's last resort).
    """
    try:
        jvm = session.sparkContext._jvm
        assert jvm is not None
        signal_class = jvm.sun.misc.Signal
        signal_class.handle(signal_class("TERM"), jvm.sun.misc.SignalHandler.SIG_IGN)
    except Exception as exc:  # not fatal: the stop is merely less orderly
        log.warning("cannot make the JVM ignore SIGTERM: %s", exc)
