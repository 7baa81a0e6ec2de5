"""The worker process: runs one slot of a topology under a supervisor's lease.

Started as ``python -m nimbus.worker <worker-dir>`` (see docs/runtime.md). Modules:

* :mod:`~nimbus.worker.spec`: ``worker.json`` (:class:`WorkerSpec`), written by the supervisor.
* :mod:`~nimbus.worker.lease`: the lease pipe and the watchdog that kills the process group.
* :mod:`~nimbus.worker.status`: the status pipe (beats and errors).
* :mod:`~nimbus.worker.pipeline`, :mod:`~nimbus.worker.spark`: pipeline topologies (PySpark).
* :mod:`~nimbus.worker.process`: process topologies (a command).
* :mod:`~nimbus.worker.exits`: exit codes.
"""

from nimbus.worker.spec import WorkerSpec

__all__ = ["WorkerSpec"]
