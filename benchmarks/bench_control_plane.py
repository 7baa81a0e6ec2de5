"""Benchmark: what one submission costs a nimbus's in-memory control plane at N topologies,
as a ratio to the same at ``--baseline`` topologies, measured in the same run.

    .venv/bin/python benchmarks/bench_control_plane.py [--topologies 10000] \
        [--baseline 100] [--supervisors 1000] [--trials 20] [--child-watches]

What runs: one real ZooKeeper and, in this process, the leader's own read side on a
session of its own, as in a nimbus: a :class:`ClusterView` of every directory, the
:class:`Scheduler`, the :class:`ClusterSummaryCache` and the name lookup of submit. The
topologies are written as a leader writes them (``activate_storm``: storm, assignment,
worker-beat and error nodes), INACTIVE; ``--supervisors`` supervisor nodes are written
on one session. What is timed, for each size, over ``--trials`` submissions of one more
topology:

* the CPU this process spends from the write until the view holds it, the name index
  answers, the summary has a new snapshot and a scheduler pass ran (``time.process_time``:
  the ZooKeeper server's share is not counted);
* the scheduler pass alone (wall time, median);
* the summary's reload alone (``refresh_now``, wall time, median);
* one supervisor heartbeat (a rewritten SupervisorInfo) until the summary shows it;
* the leader's code work after a submit: a code sync pass and the cycle's code check
  (``CodeSync``, over a local store holding every topology's copy), wall time, median;
* getClusterInfo's reply (``ClusterInfoReplies``) at a new second, and after a heartbeat
  within the second (the topology list's encoding kept); as a same-run baseline, the
  reply with every struct built and encoded afresh;
* at ``--topologies`` only, a restarted nimbus's first summary: a new
  :class:`ClusterSummaryCache` on the loaded view, counting replicas as localfs does (a
  listing of the code node in ZooKeeper each; none registered here, so one round trip),
  from its start until its first snapshot and until every topology is counted. The
  same-run baseline counts every topology before the first snapshot, as it did before
  ``COUNTS_PER_LOAD``. Each is run twice, in turns, and the faster kept.

The view's client holds recursive watches, as a nimbus's does; ``--child-watches`` puts it
on kazoo's own client instead, which lists a directory again for every new child (what
a ZooKeeper older than 3.6 makes the view do).

This isolates the nimbus's own per-submit work from the machine's other load, which
``bench_scale.py`` (the whole cluster, with Thrift, the code sync and 1,000 sessions)
cannot on two cores.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import _paths  # noqa: F401 - testsupport/ on sys.path
from kazoo.client import KazooClient
from stub_distributors import StubDistributor

from nimbus.config import load_config
from nimbus.dev.zookeeper import ZooKeeperServer
from nimbus.distribution.distributors import CodeDistributor
from nimbus.distribution.hookspecs import hookimpl
from nimbus.distribution.local_code import LocalCodeStore
from nimbus.master.code_sync import CodeSync
from nimbus.master.elector import LeaderElector
from nimbus.master.scheduler import Scheduler
from nimbus.master.summary_cache import ClusterSummaryCache
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.cluster_view import ClusterView
from nimbus.state.records import INACTIVE, Assignment, CodeMeta, StormBase, SupervisorInfo
from nimbus.state.recursive_watch import RecursiveWatchClient
from nimbus.state.zk_handler import PollingThreadingHandler
from nimbus.thrift import nimbus_ha, storm
from nimbus.thrift.cluster_info import ClusterInfoReplies
from nimbus.thrift.server import EncodedResult
from nimbus.thrift.topology_summaries import TopologySummaries

ROOT = "/storm"


class ZooKeeperReplicaCounter:
    """localfs's count on a nimbus: the registered replicas, listed in ZooKeeper."""

    def __init__(self, state: StormClusterState):
        self._state = state
        self.counted: set[str] = set()

    def get_replication_count(self, code_key: str) -> int:
        self.counted.add(code_key)
        return len(self._state.replica_endpoints(code_key))


def first_summary(view: ClusterView, state: StormClusterState, topologies: int,
                  counts_per_load: int) -> tuple[float, float]:
    """Seconds from a new summary's start until its first snapshot, and until every
    topology was counted."""
    counter = ZooKeeperReplicaCounter(state)
    cache = ClusterSummaryCache(view.state, counter, view)
    cache.COUNTS_PER_LOAD = counts_per_load
    marks: list[float] = []  # when the first snapshot was shown, when all were counted
    done = threading.Event()

    def listener() -> None:  # on the summary's thread, after each snapshot
        if not marks:
            marks.append(time.perf_counter())
        if len(counter.counted) >= topologies and not done.is_set():
            marks.append(time.perf_counter())
            done.set()

    cache.listen(listener)
    started = time.perf_counter()
    cache.start()
    try:
        if not done.wait(600):
            raise RuntimeError("the summary never counted every topology")
    finally:
        cache.stop()
    return marks[0] - started, marks[-1] - started


class ReplicaCounter:
    """The one distributor call the summary makes: registered replicas (localfs's rule)."""

    def __init__(self, view: ClusterView):
        self._view = view

    def get_replication_count(self, code_key: str) -> int:
        return len(self._view.replica_hosts(code_key))


def topology_nodes(topology_id: str, index: int) -> tuple[StormBase, Assignment]:
    base = StormBase(storm_name=f"bench{index}", launch_time_secs=1_700_000_000 + index,
                     status=INACTIVE, num_workers=1)
    return base, Assignment(master_code_dir=f"/code/{topology_id}",
                            code_sha256={"stormjar.jar": "0" * 64})


META = CodeMeta(distributor="bench", metafile_b64=CodeMeta.pack(b"m"), uploaded_by="bench",
                created_secs=1).encode()


class NoDownloads(StubDistributor):
    """The leader's distributor in this benchmark: it holds every copy, fetches none."""

    name = "bench"

    @hookimpl
    def get_replication_count(self, topology_id):
        return 1


def grow(zk: KazooClient, state: StormClusterState, store: LocalCodeStore, upto: int,
         have: int) -> None:
    """Write topologies ``have``..``upto`` - 1 as a leader's submit does (the copy, the
    code node, then ``activate_storm``'s nodes), pipelined."""
    pending = []
    for index in range(have, upto):
        topology_id = f"bench{index}-{index}-1700000000"
        store.path(topology_id).mkdir()
        base, assignment = topology_nodes(topology_id, index)
        txn = zk.transaction()
        txn.create(state.code_path(topology_id), META)
        txn.create(state.storm_path(topology_id), base.encode())
        txn.create(state.path("assignments", topology_id), assignment.encode())
        txn.create(state.path("workerbeats", topology_id), b"")
        txn.create(state.path("errors", topology_id), b"")
        pending.append(txn.commit_async())
        if len(pending) >= 500:
            for result in pending:
                result.get(timeout=60)
            pending.clear()
    for result in pending:
        result.get(timeout=60)


def supervisor_summaries(snapshot) -> list:
    return [storm.SupervisorSummary(host=info.hostname, uptime_secs=info.uptime_secs,
                                    num_workers=4, num_used_workers=0, supervisor_id=sid)
            for sid, info in snapshot.supervisors.items()]


def encode_afresh(snapshot, now: float) -> None:
    """getClusterInfo's reply at ``now``, every struct built and encoded anew."""
    EncodedResult(nimbus_ha.NimbusHa.getClusterInfo_result(success=storm.ClusterSummary(
        supervisors=supervisor_summaries(snapshot),
        topologies=TopologySummaries().at(snapshot, now), nimbuses=[],
        nimbus_uptime_secs=1)))


def measure(state: StormClusterState, elector: LeaderElector, view: ClusterView,
            scheduler: Scheduler, cache: ClusterSummaryCache, sync: CodeSync,
            store: LocalCodeStore, beat_zk: KazooClient, size: int,
            trials: int) -> dict[str, float]:
    cpu, passes, reloads, beats, code, kept, beat, fresh = [], [], [], [], [], [], [], []
    fence = elector.fence()
    scheduler.schedule(fence)  # warm: the first pass after growing reads everything
    sync.resync()
    sync.sync_once()  # warm: a pass over everything, as every LISTING_MAX_AGE_S
    sync.check_code(leading=True)
    for trial in range(trials):
        topology_id = f"probe{size}x{trial}-{trial}-1700000000"
        base, assignment = topology_nodes(topology_id, 10**7 + trial)
        base = StormBase(storm_name=f"probe{size}x{trial}", launch_time_secs=base.launch_time_secs,
                         status=INACTIVE, num_workers=1)
        started = time.process_time()
        store.path(topology_id).mkdir()
        state.zk.create(state.code_path(topology_id), META)
        state.activate_storm(fence, topology_id, base, assignment)
        view.barrier()
        if view.find_storm_by_name(base.storm_name) is None:
            raise AssertionError("the name index missed a topology")
        t0 = time.perf_counter()
        snapshot = cache.refresh_now()
        reloads.append(time.perf_counter() - t0)
        if topology_id not in snapshot.storms:
            raise AssertionError("the summary missed a topology")
        t0 = time.perf_counter()
        scheduler.schedule(fence)
        passes.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        sync.sync_once()
        if not sync.check_code(leading=True) or sync.missing_count:
            raise AssertionError("the code check missed a copy")
        code.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - started)
    replies, now, snapshot = ClusterInfoReplies(), time.time(), cache.snapshot
    replies.encode(snapshot, now, supervisor_summaries(snapshot), [], 1)
    for second in range(1, 6):
        t0 = time.perf_counter()  # a new second: the topology list is encoded again
        replies.encode(snapshot, now + second, supervisor_summaries(snapshot), [], 1)
        kept.append(time.perf_counter() - t0)
        t0 = time.perf_counter()  # a heartbeat within the second: it is not
        replies.encode(snapshot, now + second, supervisor_summaries(snapshot), [], 1)
        beat.append(time.perf_counter() - t0)
    for second in range(6, 11):  # apart: each built-afresh reply leaves 10,000 structs
        t0 = time.perf_counter()  # for the collector
        encode_afresh(snapshot, now + second)
        fresh.append(time.perf_counter() - t0)
    for trial in range(min(trials, 5)):
        info = SupervisorInfo(time_secs=trial + 2, hostname="host-0", meta=[6700],
                              uptime_secs=trial + 2)
        t0 = time.perf_counter()
        beat_zk.set(f"{ROOT}/supervisors/sup-0", info.encode())
        deadline = time.monotonic() + 10
        while cache.snapshot.supervisors.get("sup-0", info).uptime_secs != trial + 2:
            if time.monotonic() > deadline:
                raise AssertionError("the summary never showed a heartbeat")
            time.sleep(0.005)
        beats.append(time.perf_counter() - t0)
    return {"cpu_ms": statistics.median(cpu) * 1000,
            "pass_ms": statistics.median(passes) * 1000,
            "pass_max_ms": max(passes) * 1000,
            "reload_ms": statistics.median(reloads) * 1000,
            "beat_shown_ms": statistics.median(beats) * 1000,
            "code_ms": statistics.median(code) * 1000,
            "gci_second_ms": statistics.median(kept) * 1000,
            "gci_beat_ms": statistics.median(beat) * 1000,
            "gci_afresh_ms": statistics.median(fresh) * 1000}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topologies", type=int, default=10000)
    parser.add_argument("--baseline", type=int, default=100)
    parser.add_argument("--supervisors", type=int, default=1000)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--child-watches", action="store_true",
                        help="the view on kazoo's own client, which lists a directory "
                             "again on every new child (ZooKeeper before 3.6)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-control-plane-") as work:
        server = ZooKeeperServer(Path(work) / "zk").start()
        clients: list[KazooClient] = []
        try:
            def client(recursive: bool = True) -> KazooClient:
                # As a nimbus's own client (make_zk_client): its handler, and recursive
                # watches unless --child-watches.
                kind = RecursiveWatchClient if recursive else KazooClient
                zk = kind(hosts=server.hosts, timeout=10, handler=PollingThreadingHandler())
                zk.start(timeout=30)
                clients.append(zk)
                return zk

            state = StormClusterState(client(), ROOT)
            state.setup()
            elector = LeaderElector(state.zk, state, "127.0.0.1:1")
            elector.add_to_leader_lock_queue()
            deadline = time.monotonic() + 30
            while elector.step(True).leadership is None:
                if time.monotonic() > deadline:
                    raise RuntimeError("the benchmark's nimbus never led")
                time.sleep(0.05)
            sessions = client()
            for index in range(args.supervisors):
                sessions.create(f"{ROOT}/supervisors/sup-{index}", SupervisorInfo(
                    time_secs=1, hostname=f"host-{index}", meta=[6700, 6701, 6702, 6703],
                    uptime_secs=1).encode(), ephemeral=True)
            view = ClusterView(StormClusterState(client(not args.child_watches), ROOT),
                               name="bench")
            view.start()
            conf = load_config(overrides={}, extra_defaults={})
            scheduler = Scheduler(conf, state, view, quarantine_s=lambda: 0.0)
            cache = ClusterSummaryCache(view.state, ReplicaCounter(view), view)
            cache.start()
            store = LocalCodeStore(Path(work) / "stormdist")
            sync = CodeSync(state, store, CodeDistributor(NoDownloads), period_s=3600,
                            view=view)
            results = {}
            have = 0
            for size in (args.baseline, args.topologies):
                grow(sessions, state, store, size, have)
                have = size
                view.barrier(timeout_s=120)
                results[size] = measure(state, elector, view, scheduler, cache, sync, store,
                                        sessions, size, args.trials)
                have += args.trials
                print(f"at {size}: " + ", ".join(f"{k} {v:.2f}" for k, v in
                                                 results[size].items()), flush=True)
            cache.stop()
            topologies = len(view.storms())
            counting = StormClusterState(client(), ROOT)
            batch = ClusterSummaryCache.COUNTS_PER_LOAD
            # Each way twice, in turns (neither always meets the warmer caches); the
            # faster of each figure is kept.
            tries: dict[str, list[tuple[float, float]]] = {"in batches": [], "all first": []}
            for label, per_load in [("in batches", batch), ("all first", 10**9)] * 2:
                tries[label].append(first_summary(view, counting, topologies, per_load))
            restarted = {label: (min(t[0] for t in got), min(t[1] for t in got))
                         for label, got in tries.items()}
            view.close()
            elector.stop()
        finally:
            for zk in clients:
                zk.stop()
                zk.close()
            server.stop()
    small, large = results[args.baseline], results[args.topologies]
    print(f"\n{args.supervisors} supervisors; figure: at {args.baseline} / at "
          f"{args.topologies} = ratio")
    for key in small:
        ratio = large[key] / small[key] if small[key] else float("nan")
        print(f"  {key:14s} {small[key]:9.2f} / {large[key]:9.2f} = {ratio:5.2f}")
    (base_first, base_all), (first, counted) = restarted["all first"], restarted["in batches"]
    print(f"\na restarted nimbus's first summary at {topologies} topologies, seconds from its "
          f"start (replicas counted {ClusterSummaryCache.COUNTS_PER_LOAD} a load / all "
          f"before the first, the baseline):")
    print(f"  first snapshot {first:7.2f} / {base_first:7.2f} = {first / base_first:5.2f}")
    print(f"  all counted    {counted:7.2f} / {base_all:7.2f} = {counted / base_all:5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
