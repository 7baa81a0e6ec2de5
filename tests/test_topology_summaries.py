"""getClusterInfo's TopologySummary list, rebuilt by what changed: each list equals one
built from scratch, and an unchanged topology keeps its struct across seconds."""

from __future__ import annotations

import random
from types import SimpleNamespace

from nimbus.state.records import ACTIVE, INACTIVE, Assignment, StormBase
from nimbus.thrift import storm
from nimbus.thrift.topology_summaries import TopologySummaries


def from_scratch(snap, now):
    out = []
    for topology_id, base in sorted(snap.storms.items()):
        assignment = snap.assignments.get(topology_id)
        workers = len(assignment.executor_node_port) if assignment is not None else 0
        out.append(storm.TopologySummary(
            id=topology_id, name=base.storm_name, num_tasks=workers, num_executors=workers,
            num_workers=workers, uptime_secs=int(now) - base.launch_time_secs,
            status=base.status, owner=base.owner or None,
            replication_count=snap.replication.get(topology_id, 0)))
    return out


def assignment(workers: int) -> Assignment:
    return Assignment(master_code_dir="/x", executor_node_port={
        f"worker-{i}": ["node", 6700 + i] for i in range(workers)})


def test_each_list_equals_one_built_from_scratch():
    """Random submits, kills, status changes, moves, replica counts and seconds: after
    each, the list equals a fresh build. Fails if a changed record keeps its old struct,
    if a removed topology stays, or if an uptime is not brought up to date."""
    rng = random.Random(27)
    built = TopologySummaries()
    storms: dict = {}
    assignments: dict = {}
    replication: dict = {}
    now = 1_000_000.0
    for _ in range(400):
        topology_id = f"t{rng.randrange(30)}-1-1"
        action = rng.choice(["submit", "kill", "status", "move", "replicas", "tick"])
        # Each change makes new dicts, as the summary cache does.
        if action == "submit" and topology_id not in storms:
            storms = {**storms, topology_id: StormBase(
                storm_name=topology_id, launch_time_secs=int(now) - rng.randrange(99),
                status=ACTIVE, owner=rng.choice(["", "alice"]))}
        elif action == "kill" and topology_id in storms:
            storms = {k: v for k, v in storms.items() if k != topology_id}
        elif action == "status" and topology_id in storms:
            base = storms[topology_id]
            storms = {**storms, topology_id: StormBase(
                storm_name=base.storm_name, launch_time_secs=base.launch_time_secs,
                status=INACTIVE if base.status == ACTIVE else ACTIVE, owner=base.owner)}
        elif action == "move":
            assignments = {**assignments, topology_id: assignment(rng.randrange(4))}
        elif action == "replicas":
            replication = {**replication, topology_id: rng.randrange(3)}
        else:
            now += rng.choice([0.3, 1.0, 7.0])
        snap = SimpleNamespace(storms=storms, assignments=assignments,
                               replication=replication)
        assert built.at(snap, now) == from_scratch(snap, now), action


def test_a_new_second_keeps_each_unchanged_struct():
    base = StormBase(storm_name="a", launch_time_secs=100, status=ACTIVE)
    snap = SimpleNamespace(storms={"a-1-1": base, "b-1-1": base}, assignments={},
                           replication={})
    built = TopologySummaries()
    first = built.at(snap, 200.5)
    assert built.at(snap, 200.9) is first, "the same second and snapshot: the same list"
    again = built.at(snap, 201.0)
    assert [s.uptime_secs for s in again] == [101, 101]
    assert all(a is b for a, b in zip(first, again, strict=True))
    moved = SimpleNamespace(storms=snap.storms, assignments={"b-1-1": assignment(2)},
                            replication={})
    after = built.at(moved, 201.0)
    assert after[0] is first[0] and after[1] is not first[1]
    assert after[1].num_workers == 2


def test_the_spliced_reply_is_the_encoding_of_the_whole_reply():
    """The reply spliced from its fields' encodings is byte for byte the encoding of
    the whole getClusterInfo_result, and a decoder reads it back whole; also after a
    heartbeat (new supervisors, the same topology list)."""
    from thriftpy2.protocol import TBinaryProtocolFactory
    from thriftpy2.utils import deserialize, serialize

    from nimbus.thrift import nimbus_ha
    from nimbus.thrift.cluster_info import ClusterInfoReplies

    base = StormBase(storm_name="a", launch_time_secs=100, status=ACTIVE, owner="alice")
    wide = StormBase(storm_name="größe-流", launch_time_secs=90, status=ACTIVE)
    snap = SimpleNamespace(storms={"a-1-1": base, "b-1-1": wide},
                           assignments={"a-1-1": assignment(3)}, replication={"b-1-1": 2})
    nimbuses = [storm.NimbusSummary(host="n1", port=6627, uptime_secs=5, isLeader=True,
                                    version="1")]
    replies = ClusterInfoReplies()
    # A first reply, a heartbeat, a new second, a second long after (uptimes that need
    # more bytes' worth of value).
    for beat, now in ((1, 130.0), (2, 130.5), (3, 131.0), (4, 10.0**7)):
        supervisors = [storm.SupervisorSummary(host=f"h{i}", uptime_secs=beat,
                                               num_workers=4, num_used_workers=1,
                                               supervisor_id=f"s{i}") for i in range(3)]
        spliced = replies.encode(snap, now, supervisors, nimbuses, 77)
        whole = nimbus_ha.NimbusHa.getClusterInfo_result(success=storm.ClusterSummary(
            supervisors=supervisors, topologies=from_scratch(snap, now),
            nimbuses=nimbuses, nimbus_uptime_secs=77))
        assert spliced == serialize(whole, TBinaryProtocolFactory())
        back = deserialize(nimbus_ha.NimbusHa.getClusterInfo_result(), spliced,
                           TBinaryProtocolFactory())
        assert back == whole
        assert back.success.topologies[1].uptime_secs == int(now) - 90
    assert all(split is not None for _s, split in replies._split.values()), \
        "each struct was split at its uptime, none encoded whole"
    assert replies.encode(snap, 130.0, [], [], 0).count(b"a-1-1") == 1
