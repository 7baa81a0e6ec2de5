"""What a supervisor and its workers share: the contract between two processes.

The supervisor (:mod:`nimbus.supervisor`) starts, feeds, takes over and ends worker
processes (:mod:`nimbus.worker`); neither imports the other. What both must agree on
lives here, one idea a module:

* :mod:`~nimbus.worker_protocol.spec`: ``worker.json`` (:class:`~nimbus.worker_protocol.
  spec.WorkerSpec`), written by the supervisor, read by the worker;
* :mod:`~nimbus.worker_protocol.exits`: the worker's exit codes, the error that means
  "exit 2" and the component its own errors are reported under;
* :mod:`~nimbus.worker_protocol.component_share`: which of a pipeline's components a
  worker runs;
* :mod:`~nimbus.worker_protocol.spark_settings`: the Spark settings a worker starts its
  session with, and whether a warm worker's session can take a topology;
* :mod:`~nimbus.worker_protocol.warm`: a warm worker's spec file and the line that hands
  it a slot;
* :mod:`~nimbus.worker_protocol.health`: what a process topology's worker says of its
  health check in its beats;
* :mod:`~nimbus.worker_protocol.takeover`: the socket a worker whose supervisor died
  waits on, and who is at its other end;
* :mod:`~nimbus.worker_protocol.frozen_cgroup`: a frozen worker's cgroup, its mark and
  its end, as every process of the host reads them.

Its layer is the one of :mod:`nimbus.state`, as its sibling: it imports only the ground
floor (``topology_paths``), never ``state`` nor anything above, and nothing below it
imports it (docs/architecture.md).
"""
