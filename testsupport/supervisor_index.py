"""What a leader writes besides an assignment, for tests that play the leader by writing
ZooKeeper directly: each supervisor's index of its work (nimbus.master.assignment_index)."""

from __future__ import annotations

from kazoo.exceptions import NoNodeError

from nimbus.state.cluster_state import StormClusterState
from nimbus.state.records import SupervisorAssignments


def index_work(state: StormClusterState, topology_id: str, slots: dict[str, list]) -> None:
    """Add ``topology_id`` to the index of every supervisor that ``slots``
    (``{"worker-0": [supervisor id, port], ...}``) places work on."""
    for supervisor_id in {slot[0] for slot in slots.values()}:
        path = state.supervisor_index_path(supervisor_id)
        try:
            data, _ = state.zk.get(path)
            listed = set(SupervisorAssignments.decode(data).topologies)
        except NoNodeError:
            state.zk.create(path, SupervisorAssignments([topology_id]).encode(),
                            makepath=True)
            continue
        state.zk.set(path, SupervisorAssignments(sorted(listed | {topology_id})).encode())
