"""NeededCode against a real ZooKeeper: the code keys kept by change always equal those
computed from every topology, and each update tells exactly what entered and left."""

from __future__ import annotations

import random

import pytest

from nimbus.master.needed_code import NeededCode
from nimbus.master.version_rules import view_code_keys
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.cluster_view import ClusterView
from nimbus.state.code_versions import OLD, RUNNING, CodeVersions, version_key
from nimbus.state.records import ACTIVE, StormBase

pytestmark = pytest.mark.zookeeper


def versions_record(numbers: list[int]) -> bytes:
    entries = [{"version": n, "sha256": {}, "submitter": "t", "created_secs": 1,
                "state": RUNNING if n == numbers[-1] else OLD, "error": "", "conf": {}}
               for n in numbers]
    return CodeVersions(versions=entries, running=numbers[-1]).encode()


@pytest.fixture
def cluster(make_zk, zk_root):
    state = StormClusterState(make_zk(), zk_root)
    state.setup()
    view = ClusterView(state, name="needed-test")
    view.start()
    yield state, view
    view.close()


def test_keys_kept_by_change_equal_those_of_every_topology(cluster):
    """Random submits, kills, upgrades, prunes, unreadable /code-versions and version
    code nodes: after every step, the kept keys are view_code_keys of every topology,
    and (added, removed) is exactly the difference from the step before. Fails if a
    change is not applied, or a topology's old keys are not dropped."""
    state, view = cluster
    zk = state.zk
    rng = random.Random(27)
    needed = NeededCode(view)
    assert needed.update() is None, "the first update reads every topology"
    before: frozenset[str] = frozenset()
    ids = [f"t{n}-{n}-1" for n in range(12)]
    for _ in range(150):
        topology_id = rng.choice(ids)
        storm, versions = state.storm_path(topology_id), state.code_versions_path(topology_id)
        code_node = state.code_path(version_key(topology_id, rng.randint(2, 5)))
        action = rng.choice(["submit", "kill", "upgrade", "unreadable", "forget",
                             "code node", "drop code node"])
        if action == "submit" and not zk.exists(storm):
            zk.create(storm, StormBase(storm_name=topology_id, launch_time_secs=1,
                                       status=ACTIVE).encode())
        elif action == "kill" and zk.exists(storm):
            zk.delete(storm)
        elif action == "upgrade":
            first = rng.randint(1, 4)
            record = versions_record(list(range(first, first + rng.randint(1, 3))))
            zk.ensure_path(versions)
            zk.set(versions, record)
        elif action == "unreadable":
            zk.ensure_path(versions)
            zk.set(versions, b"\x00not json")
        elif action == "forget" and zk.exists(versions):
            zk.delete(versions)
        elif action == "code node":
            zk.ensure_path(code_node)
        elif action == "drop code node" and zk.exists(code_node):
            zk.delete(code_node, recursive=True)
        view.barrier()
        delta = needed.update()
        expected = frozenset(view_code_keys(view, view.active_storms()))
        assert needed.keys == expected, action
        assert delta == (expected - before, before - expected), action
        assert len(needed) == len(expected)
        before = expected
    assert before, "the walk left some topology live"


def test_a_view_read_again_is_read_whole(cluster):
    state, view = cluster
    needed = NeededCode(view)
    needed.update()
    state.zk.create(state.storm_path("a-1-1"), StormBase(
        storm_name="a", launch_time_secs=1, status=ACTIVE).encode())
    view.barrier()
    needed.everything()
    assert needed.update() is None
    assert needed.keys == {"a-1-1"}
    assert needed.update() == (set(), set())
