"""The supervisor: the one process of a host that talks to ZooKeeper for its workers.

It registers the host's slots, runs one worker per slot the leader assigned here, keeps
each worker alive only while its own ZooKeeper session is (the lease), and reports the
workers' heartbeats and errors. See docs/runtime.md for the contract.

* :mod:`nimbus.supervisor.policy`: the pure decisions (desired slots, restart backoff,
  slot port checks), unit-tested without processes or ZooKeeper;
* :mod:`nimbus.supervisor.code_cache`: this host's verified copies of topology code;
* :mod:`nimbus.supervisor.worker_handle`: one worker process and its two pipes;
* :mod:`nimbus.supervisor.lease`: the thread that renews leases after a ZooKeeper round trip;
* :mod:`nimbus.supervisor.daemon`: the lifecycle and the reconcile pass, whose parts are
  :mod:`~nimbus.supervisor.registration`, :mod:`~nimbus.supervisor.reporting`,
  :mod:`~nimbus.supervisor.starting`, :mod:`~nimbus.supervisor.ending`,
  :mod:`~nimbus.supervisor.adoption`, :mod:`~nimbus.supervisor.slots` and
  :mod:`~nimbus.supervisor.identity`;
* :mod:`nimbus.supervisor.code_transport`, :mod:`nimbus.supervisor.telemetry`: what its
  composition root (:mod:`nimbus.daemons.supervisor`) gives it: Thrift's code fetch and
  its metrics, layers above it.

What it shares with its workers (``worker.json``, exit codes, the take-over socket, ...)
is :mod:`nimbus.worker_protocol`; it imports nothing of :mod:`nimbus.worker`.
"""
