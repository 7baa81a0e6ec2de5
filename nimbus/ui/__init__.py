"""The UI (``nimbus-ha ui``, Storm's ``storm ui``): a Storm-compatible REST API and a
live dashboard, served from any process.

It shows the cluster's one read model, a
:class:`~nimbus.state.cluster_snapshot.ClusterSnapshot`, held by its reader
(:mod:`nimbus.ui.reader`): inside a nimbus the nimbus's own summary, else read from
ZooKeeper with a client of its own, or from a nimbus over Thrift. It sends actions to the
leader through :class:`nimbus.thrift.client.NimbusClient`, so it keeps working across
leader failovers without a restart.

Modules: ``reader`` (the snapshot and the live rates every request reads),
``summary_reader``, ``zk_reader`` and ``thrift_reader`` (where the snapshots come from),
``zk_reads`` and ``live_poll`` (pipelined ZooKeeper reads, heartbeats and errors),
``timeline`` (events seen while running), ``storm_json`` (Storm UI's JSON shapes),
``local_nimbus`` (what a UI inside a nimbus adds: the leader's duty-cycle age),
``actions`` (POSTs to the leader), ``app`` (the WSGI application), ``openapi`` (the
API's description), ``server`` (cheroot in a named thread), ``gate`` and
``request_head`` (TLS handshakes and request heads read before a worker thread sees a
connection, with limits and deadlines; /metrics uses it too), ``hosts`` (the Host names
it answers to), ``https`` (client certificates).
"""
