"""The SparkSession of a pipeline worker: one per worker process, local to this host.

The settings it starts with, and whether a warm worker's session can take a topology,
are computed as its supervisor computes them: :mod:`nimbus.worker_protocol.spark_settings`.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING

from nimbus.redaction import redact
from nimbus.worker.class_archive import java_options
from nimbus.worker_protocol.spark_settings import (
    HOST_KEYS,
    LOOPBACK,
    session_settings,
    user_spark_conf,
    warm_mismatch,
)
from nimbus.worker_protocol.spec import WorkerSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

JAVA_OPTIONS_KEY = "spark.driver.extraJavaOptions"


class WarmMismatchError(Exception):
    """A warm session cannot take this topology; the message says which setting."""


def adopt_session(session: SparkSession, warm: WorkerSpec, wanted: WorkerSpec) -> None:
    """Make a session started for ``warm`` the one of ``wanted``: its SQL settings set or
    unset, the bundle on the Python path of this process and of Spark's Python workers.

    Raises WarmMismatchError, changing nothing, when a setting differs that Spark cannot
    change on a running session (Spark's ``isModifiable`` decides)."""
    reason = warm_mismatch(warm, wanted)
    if reason is not None:
        raise WarmMismatchError(reason)
    ours, theirs = session_settings(warm), session_settings(wanted)
    changes = {key: theirs.get(key) for key in set(ours) | set(theirs)
               if ours.get(key) != theirs.get(key)}
    for key in sorted(changes):
        if not session.conf.isModifiable(key):
            raise WarmMismatchError(f"Spark setting {key} is {changes[key] or '(unset)'}, "
                                    f"the warm session's {ours.get(key, '(unset)')} (Spark "
                                    "cannot change it on a running session)")
    for key, value in sorted(changes.items()):
        if value is None:
            session.conf.unset(key)
        else:
            session.conf.set(key, value)
    if changes:
        log.info("warm session adopted with %s", redact(changes))
    _put_bundle_on_path(wanted)
    # Spark's Python workers get their environment from the context's, per function
    # shipped: functions made from now on see the bundle (see build_session).
    session.sparkContext.environment["PYTHONPATH"] = os.environ["PYTHONPATH"]


def _put_bundle_on_path(spec: WorkerSpec) -> None:
    # Spark's Python workers (UDFs) must be this interpreter, and must import the bundle's
    # modules: cloudpickle sends functions of importable modules by reference.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    paths = [spec.code_dir, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in dict.fromkeys(paths) if p)


def build_session(spec: WorkerSpec, app_name: str = "") -> SparkSession:
    """Start the worker's SparkSession (master ``topology.spark.master``, app name
    ``<topology-id>-<port>`` unless given). Starts a JVM: 5-15 s."""
    from pyspark.sql import SparkSession

    settings = session_settings(spec)
    if not any(key in user_spark_conf(spec) for key in HOST_KEYS):
        # The JVM's own address lookup (before any conf is read) uses this variable.
        os.environ["SPARK_LOCAL_IP"] = LOOPBACK
    _put_bundle_on_path(spec)

    master = spec.spark_master
    builder = SparkSession.builder.master(master).appName(
        app_name or f"{spec.topology_id}-{spec.port}")
    for key, value in settings.items():
        builder = builder.config(key, value)
    log.info("starting SparkSession: master %s, conf %s", master, redact(settings))
    options = java_options(spec.class_archive, settings.get(JAVA_OPTIONS_KEY))
    if options is not None:
        # Not one of the session's settings (warm_mismatch compares those): how fast the
        # JVM starts, not what it runs.
        builder = builder.config(JAVA_OPTIONS_KEY, options)
        log.info("with the class archive %s", spec.class_archive)
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
