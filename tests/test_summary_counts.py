"""The summary's replication counts at a nimbus's first load, against a real ZooKeeper:
every topology is shown at once, and the distributor is asked for at most
COUNTS_PER_LOAD counts per load (a restarted nimbus at 10,000 topologies showed nothing
for 15-20 s while it asked for every one)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from test_cluster_view import add, view  # noqa: F401 - the fixture
from waiting import wait_until

from nimbus.master.summary_cache import ClusterSummaryCache

STORE_COUNT = 5  # what the distributor says: unlike the registrations, as a store's


def counting(counted: list[str], lock: threading.Lock) -> SimpleNamespace:
    def get_replication_count(topology_id: str) -> int:
        with lock:
            counted.append(topology_id)
        return STORE_COUNT
    return SimpleNamespace(get_replication_count=get_replication_count)


def test_the_first_load_shows_every_topology_and_counts_a_batch(writer, fence, view):  # noqa: F811
    ids = sorted(add(writer, fence, i) for i in range(7))
    writer.begin_code(fence, ids[5])
    assert writer.register_replica(ids[5], "host1:6627", "x")
    view.start()
    counted: list[str] = []
    lock = threading.Lock()
    cache = ClusterSummaryCache(view.state, counting(counted, lock), view)
    cache.COUNTS_PER_LOAD = 3
    cache.SAFETY_INTERVAL_S = 3600
    shown: list[tuple[dict[str, int], list[str]]] = []

    def listener() -> None:
        with lock:
            shown.append((dict(cache.snapshot.replication), list(counted)))

    cache.listen(listener)
    cache.start()
    try:
        def loads() -> int:
            with lock:
                return len(shown)

        wait_until(lambda: loads() >= 3, 10)  # a load is shown after its last count
        first_replication, counted_then = shown[0]
        assert counted_then == ids[:3], "the first load asks for one batch, by id"
        assert first_replication == {
            **dict.fromkeys(ids[:3], STORE_COUNT), ids[3]: 0, ids[4]: 0, ids[5]: 1, ids[6]: 0}
        assert [c for _, c in shown[:3]] == [ids[:3], ids[:6], ids]
        wait_until(lambda: cache.snapshot.replication == dict.fromkeys(ids, STORE_COUNT), 10)
        assert sorted(counted) == ids, "each topology counted once"
    finally:
        cache.stop()


def test_what_changed_is_counted_before_what_waits(writer, fence, view):  # noqa: F811
    """A load counts the topologies that changed since the last one first, then those
    waiting from an earlier load; one removed meanwhile is never counted."""
    ids = sorted(add(writer, fence, i) for i in range(6))
    view.start()
    counted: list[str] = []
    cache = ClusterSummaryCache(view.state, counting(counted, threading.Lock()), view)
    cache.COUNTS_PER_LOAD = 2
    storms = dict(view.storms())
    cache._count_replicas(storms, stale=set(), changed=None, sweep=False)
    assert counted == ids[:2]
    added = add(writer, fence, 9)
    view.barrier()
    storms = dict(view.storms())
    del storms[ids[2]]  # removed meanwhile
    got = cache._count_replicas(storms, stale=set(), changed={added, ids[2]}, sweep=False)
    assert counted == [*ids[:2], *sorted([added, ids[3]])]  # each batch by id
    assert got == {**dict.fromkeys([*ids[:2], added, ids[3]], STORE_COUNT),
                   ids[4]: 0, ids[5]: 0}
    got = cache._count_replicas(storms, stale=set(), changed=set(), sweep=False)
    assert counted[4:] == ids[4:]
    assert got == dict.fromkeys([*ids[:2], added, *ids[3:]], STORE_COUNT)
    cache._count_replicas(storms, stale=set(), changed=set(), sweep=False)
    assert len(counted) == 6, "nothing left to count"


def test_a_failing_load_is_not_retried_at_once(writer, fence, view):  # noqa: F811
    """While topologies wait to be counted the next load follows at once, but not after
    a load that raised: that one would spin a core and flood the log."""
    for i in range(4):
        add(writer, fence, i)
    view.start()
    cache = ClusterSummaryCache(view.state, counting([], threading.Lock()), view)
    cache.COUNTS_PER_LOAD = 1
    cache._reload()
    assert cache._next_wait() == 0.0, "more to count: at once"

    def broken(*_args: object) -> dict:
        raise RuntimeError("a bug")

    cache._replica_hosts = broken
    with pytest.raises(RuntimeError, match="a bug"):
        cache._reload()
    assert cache._next_wait() > 0.0
