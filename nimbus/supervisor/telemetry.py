"""A supervisor's metrics, as the supervisor sees them: what they read of it, and the two
things it asks of them.

The metrics themselves (``SupervisorMetrics``, the ``/metrics`` server) are
:mod:`nimbus.metrics`, a layer above the supervisor. The supervisor does not import them:
its composition root (nimbus/daemons/supervisor.py) gives it a
:data:`TelemetryFactory`, which the supervisor calls once, while it is built, with its
:class:`Readings`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from nimbus.config import Config
    from nimbus.supervisor.warm_pool import WarmSummary
    from nimbus.supervisor.worker_handle import WorkerHandle


@dataclass(frozen=True)
class Readings:
    """What a supervisor's metrics read at scrape time (on the metrics server's threads):

    * ``workers()``: the handles of its running workers;
    * ``restarts()``: {(topology_id, port): restarts} of its slots;
    * ``warm()``: its warm workers' summary, or None when it keeps none;
    * ``code_fetches()``: {"distributor" | "nimbus": topologies fetched that way};
    * ``states()``: {(topology_id, port): state} of every assigned slot's worker
      (nimbus/state/worker_state.py);
    * ``frozen_orphans()``: the frozen workers of the host whose supervisor is gone.
    """

    workers: Callable[[], list[WorkerHandle]]
    restarts: Callable[[], Mapping[tuple[str, int], int]]
    warm: Callable[[], WarmSummary | None]
    code_fetches: Callable[[], Mapping[str, int]]
    states: Callable[[], Mapping[tuple[str, int], str]]
    frozen_orphans: Callable[[], int]


class MetricsEndpoint(Protocol):
    """A bound ``/metrics`` server: started with the supervisor, stopped with it."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


class Telemetry(Protocol):
    """A supervisor's metrics."""

    def observe(self, handle: WorkerHandle, components: dict[str, Any]) -> None:
        """Take one beat's component progress of ``handle`` (a status reader thread)."""

    def bind(self, conf: Config) -> MetricsEndpoint | None:
        """The ``/metrics`` server of the supervisor's ``conf``
        (``supervisor.metrics.port``, ``supervisor.metrics.bind.address``), bound and not
        yet started; None when it is off. Raises when its port is taken: the first thing
        a supervisor's start does, so that nothing is registered then."""


TelemetryFactory = Callable[[Readings], Telemetry]
