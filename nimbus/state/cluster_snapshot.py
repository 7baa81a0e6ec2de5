"""The one read model of the cluster: :class:`ClusterSnapshot`.

Every screen of the cluster reads a snapshot of this type. A nimbus builds it from its
watched view (:class:`nimbus.state.cluster_view.ClusterView`) in its summary
(:mod:`nimbus.master.summary_cache`), and serves it: getClusterInfo, getClusterRecords,
getSupervisorPageInfo, ``top``'s rows and the metrics read it, and so does a UI running
inside that nimbus. A UI of its own builds the same type from its own reads: of
ZooKeeper (:mod:`nimbus.ui.zk_reader`) or of a nimbus's records over Thrift
(:mod:`nimbus.ui.thrift_reader`).

A snapshot never changes, and its dicts are shared between readers (and with the next
snapshot, for the parts that did not change): read them, never change them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nimbus.state.records import Assignment, NimbusInfo, StormBase, SupervisorInfo


@dataclass(frozen=True)
class ClusterSnapshot:
    """The cluster as of ``taken_at``.

    ``storms``: every topology whose StormBase this release can read, by id;
    ``assignments``: the readable Assignments of those topologies; ``supervisors``: every
    live supervisor whose heartbeat this release can read. ``leader`` is the
    ``host:port`` at the head of the leader queue (None: no leader). ``replication``:
    each topology's replication count as the nimbuses report it (the distributor's
    ``get_replication_count``: the only count of store-backed distributors, like s3,
    which register no replica in ZooKeeper); ``replica_hosts``: the nimbuses registered
    under ``/code-distributor/<id>`` (host-based distributors: localfs, torrent), sorted;
    empty when the builder cannot see them (a UI reading through Thrift).
    ``running_versions``: the code version each upgraded topology runs (the ``running``
    of its ``/code-versions`` node, :mod:`nimbus.state.code_versions`); a topology not
    listed runs version 1 (never upgraded), or its node cannot be read, or the builder
    does not know (a nimbus of an earlier release answering a Thrift UI).

    ``taken_at`` is ``time.monotonic()`` of the process that built it (an age, not a
    date); ``version`` grows by one with every snapshot its builder makes, 0 for none
    read yet (:attr:`loaded`).
    """

    nimbuses: list[NimbusInfo] = field(default_factory=list)
    leader: str | None = None
    storms: dict[str, StormBase] = field(default_factory=dict)
    assignments: dict[str, Assignment] = field(default_factory=dict)
    supervisors: dict[str, SupervisorInfo] = field(default_factory=dict)
    replication: dict[str, int] = field(default_factory=dict)
    replica_hosts: dict[str, list[str]] = field(default_factory=dict)
    running_versions: dict[str, int] = field(default_factory=dict)
    taken_at: float = 0.0
    version: int = 0

    @property
    def loaded(self) -> bool:
        """Whether this is a snapshot read from the cluster (not the empty first one)."""
        return self.version > 0

    def placed_workers(self, topology_id: str) -> int:
        """How many workers the topology's assignment places (0 without one)."""
        assignment = self.assignments.get(topology_id)
        return len(assignment.executor_node_port) if assignment is not None else 0

    def running_version(self, topology_id: str) -> int:
        """The code version ``topology_id`` runs (1 when not known to be another)."""
        return self.running_versions.get(topology_id, 1)

    def used_ports(self) -> dict[str, list[int]]:
        """supervisor id -> sorted ports that the assignments give workers on it.

        This, not ``SupervisorInfo.used_ports``, is what counts as used: the supervisor's
        own list lags behind the leader's decisions by up to a heartbeat.
        """
        used: dict[str, set[int]] = {}
        for assignment in self.assignments.values():
            for supervisor_id, port in assignment.executor_node_port.values():
                used.setdefault(str(supervisor_id), set()).add(int(port))
        return {sid: sorted(ports) for sid, ports in used.items()}
