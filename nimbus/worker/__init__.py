"""The worker process: runs one slot of a topology under a supervisor's lease.

Started as ``python -m nimbus.worker <worker-dir>`` (see docs/runtime.md). What it shares
with its supervisor (``worker.json``, exit codes, the frozen cgroup's mark, the take-over
socket, the warm worker's words, the Spark settings) is :mod:`nimbus.worker_protocol`.
Modules:

* :mod:`~nimbus.worker.main`, :mod:`~nimbus.worker.run`: its start and its life.
* :mod:`~nimbus.worker.lease`: the lease pipe and the watchdog that kills the process group
  (or freezes it: :mod:`~nimbus.worker.frozen`).
* :mod:`~nimbus.worker.status`: the status pipe (beats and errors).
* :mod:`~nimbus.worker.pipeline`, :mod:`~nimbus.worker.spark`: pipeline topologies (PySpark).
* :mod:`~nimbus.worker.process`: process topologies (a command).
* :mod:`~nimbus.worker.takeover`, :mod:`~nimbus.worker.warm`: taken over by the
  supervisor's next process; started ahead of any topology.
"""
