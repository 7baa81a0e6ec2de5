"""Benchmark: what one assignment change costs a supervisor that has no part in it.

A real ZooKeeper holds ``N`` topologies placed on other supervisors and one placed on
this one. Two readers of this supervisor's assignments run side by side on sessions of
their own: :class:`~nimbus.supervisor.own_assignments.OwnAssignments` (this release: its
index node and its own assignments) and a whole-directory
:class:`~nimbus.state.cluster_view.ClusterView` of ``/assignments`` (the earlier
release's supervisor). Then ``--submits`` new topologies are placed elsewhere, as the
leader does (the assignment, then the index), and each reader's ZooKeeper reads and the
children it was sent (directory listings) are counted, per submit, for ``N`` in
``--sizes``.

    .venv/bin/python benchmarks/bench_supervisor_reads.py [--sizes 100,1000,5000] \
        [--submits 50]
"""

from __future__ import annotations

import argparse
import posixpath
import tempfile
import time
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from nimbus.dev.zookeeper import ZooKeeperServer
from nimbus.state.cluster_state import Fence, StormClusterState
from nimbus.state.cluster_view import ClusterView
from nimbus.state.records import INACTIVE, Assignment, StormBase
from nimbus.supervisor.own_assignments import OwnAssignments


class Counted:
    """Reads a kazoo client sends, and the children its listings return."""

    def __init__(self, zk: KazooClient):
        self.reads = 0
        self.children = 0
        for name in ("get_async", "exists_async"):
            original = getattr(zk, name)

            def counted(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
                self.reads += 1
                return _original(*args, **kwargs)

            setattr(zk, name, counted)
        listing = zk.get_children_async

        def listed(*args: Any, **kwargs: Any) -> Any:
            self.reads += 1
            result = listing(*args, **kwargs)
            result.rawlink(lambda r: self._add(r))
            return result

        zk.get_children_async = listed

    def _add(self, result: Any) -> None:
        if result.successful():
            value = result.get()
            self.children += len(value[0] if isinstance(value, tuple) else value)


def client(zk: ZooKeeperServer) -> KazooClient:
    made = KazooClient(hosts=zk.hosts, timeout=10.0)
    made.start(timeout=30)
    return made


def place(state: StormClusterState, fence: Fence, topology_id: str, node: str) -> None:
    state.activate_storm(fence, topology_id, StormBase(topology_id, 1, INACTIVE, 1),
                         Assignment(master_code_dir="/code",
                                    executor_node_port={"worker-0": [node, 6700]}))


def settle(readers: list[Any], state: StormClusterState, expected: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if all(len(r.assignment_ids()) >= 1 for r in readers[:1]) and \
                len(readers[1].assignment_ids()) == expected:
            return
        time.sleep(0.05)
    raise SystemExit("the readers did not settle")


def run(zk: ZooKeeperServer, size: int, submits: int) -> dict[str, float]:
    root = f"/bench-{size}"
    writer = client(zk)
    state = StormClusterState(writer, root)
    state.setup()
    lock = writer.create(posixpath.join(state.leader_lock_path, "nimbus-"), b"",
                         ephemeral=True, sequence=True)
    fence = Fence(lock)
    for i in range(size):
        place(state, fence, f"t{i}-1-1", "elsewhere")
    place(state, fence, "mine-1-1", "me")
    state.write_supervisor_index(fence, {"me": ["mine-1-1"]}, set())
    own_zk, whole_zk = client(zk), client(zk)
    own = OwnAssignments(StormClusterState(own_zk, root), "me")
    whole = ClusterView(StormClusterState(whole_zk, root), ("assignments",))
    own.start()
    whole.start()
    try:
        settle([own, whole], state, size + 1)
        own_count, whole_count = Counted(own_zk), Counted(whole_zk)
        for i in range(submits):
            place(state, fence, f"new{i}-1-1", "elsewhere")
        settle([own, whole], state, size + 1 + submits)
        return {"own_reads": own_count.reads / submits,
                "own_children": own_count.children / submits,
                "whole_reads": whole_count.reads / submits,
                "whole_children": whole_count.children / submits}
    finally:
        own.close()
        whole.close()
        for made in (own_zk, whole_zk, writer):
            made.stop()
            made.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,5000")
    parser.add_argument("--submits", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-reads-") as tmp:
        zk = ZooKeeperServer(Path(tmp) / "zookeeper").start()
        try:
            print(f"per submit placed on another supervisor ({args.submits} submits):")
            for size in (int(s) for s in args.sizes.split(",")):
                got = run(zk, size, args.submits)
                print(f"N={size:<6} this release: {got['own_reads']:.2f} reads, "
                      f"{got['own_children']:.0f} children listed | whole directory: "
                      f"{got['whole_reads']:.2f} reads, {got['whole_children']:.0f} "
                      "children listed")
        finally:
            zk.stop()


if __name__ == "__main__":
    main()
