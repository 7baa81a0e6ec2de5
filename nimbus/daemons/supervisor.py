"""One supervisor process's composition root: the supervisor (:mod:`nimbus.supervisor`)
with the Thrift transport it fetches code over and the metrics it is read by.

The supervisor is below both in the layers (docs/architecture.md): it is given Storm's
``fetch_file`` (:mod:`nimbus.thrift.client`) as a
:class:`~nimbus.supervisor.code_transport.FetchFile`, and its metrics
(:class:`nimbus.metrics.SupervisorMetrics`, served on ``supervisor.metrics.port``) as a
:data:`~nimbus.supervisor.telemetry.TelemetryFactory`, each with the process's one
:class:`~nimbus.cluster_security.ClusterSecurity` (made here, so that unusable security
settings fail before anything is taken). ``nimbus-ha supervisor`` and the tests build it
with :func:`build_supervisor`.
"""

from __future__ import annotations

import functools
from typing import Any

from nimbus.cluster_security import ClusterSecurity
from nimbus.config import Config
from nimbus.metrics import MetricsServer, SupervisorMetrics, serve_metrics
from nimbus.supervisor.daemon import Supervisor
from nimbus.supervisor.telemetry import Readings
from nimbus.supervisor.worker_handle import WORKER_COMMAND, WorkerHandle
from nimbus.thrift.client import file_fetcher

__all__ = ["SupervisorTelemetry", "build_supervisor"]


class SupervisorTelemetry:
    """A supervisor's :class:`~nimbus.metrics.SupervisorMetrics`, made from its
    readings, and their ``/metrics`` server."""

    def __init__(self, readings: Readings, security: ClusterSecurity | None = None):
        self.security = security
        self.metrics = SupervisorMetrics(
            readings.workers, readings.restarts, warm=readings.warm,
            code_fetches=readings.code_fetches, states=readings.states,
            frozen_orphans=readings.frozen_orphans)

    def observe(self, handle: WorkerHandle, components: dict[str, Any]) -> None:
        """One beat's component progress of ``handle``."""
        self.metrics.progress.observe(handle, components)

    def bind(self, conf: Config) -> MetricsServer | None:
        """The bound ``/metrics`` server of ``conf`` (None: ``supervisor.metrics.port``
        is 0); HTTPS with client certificates in a TLS cluster."""
        return serve_metrics(self.metrics.registry, conf["supervisor.metrics.bind.address"],
                             conf["supervisor.metrics.port"], "supervisor-metrics",
                             conf=conf, security=self.security)


def build_supervisor(conf: Config, worker_command: tuple[str, ...] = WORKER_COMMAND,
                     warm_command: tuple[str, ...] | None = None,
                     security: ClusterSecurity | None = None) -> Supervisor:
    """A supervisor of ``conf``, wired, not yet started (:meth:`Supervisor.start`).

    ``security``: the process's, by default made of ``conf`` here
    (:meth:`ClusterSecurity.for_daemon`: a ConfigError, OSError or ValueError for
    unusable TLS files or authorizer). Raises as
    :class:`~nimbus.supervisor.daemon.Supervisor` does: a ConfigError on unsafe
    settings, SlotPortInUseError when a slot port is taken, before anything is made.
    ``worker_command`` and ``warm_command``: see the Supervisor."""
    if security is None:
        security = ClusterSecurity.for_daemon(conf)
    return Supervisor(conf, fetch_file=file_fetcher(security),
                      telemetry=functools.partial(SupervisorTelemetry, security=security),
                      security=security, worker_command=worker_command,
                      warm_command=warm_command)
