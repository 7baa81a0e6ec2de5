"""Simulated nimbus hosts for distributor tests and benchmarks, on real servers.

Each host has its own prepared code distributor, its own code directory, its own
ZooKeeper session (on a real server) and a real Thrift server that serves its code the
way a nimbus does (``beginFileDownload``/``downloadChunk``, what localfs fetches over).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from nimbus.distribution.distributors import CodeDistributor, resolve_distributor_class
from nimbus.distribution.file_transfer import FileTransfers
from nimbus.distribution.hookspecs import ROLE_SUPERVISOR, DistributorContext
from nimbus.distribution.local_code import LocalCodeStore
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.records import Assignment, CodeMeta
from nimbus.testing.conformance import ConformanceHost
from nimbus.thrift.client import fetch_file
from nimbus.thrift.server import ThriftServer


class FileServer:
    """The part of the Nimbus service that serves code to peers."""

    def __init__(self, transfers: FileTransfers):
        self._transfers = transfers

    def beginFileDownload(self, file: str) -> str:
        return self._transfers.begin_download(file)

    def downloadChunk(self, id: str) -> bytes:  # noqa: A002 - Storm's argument name
        return self._transfers.download_chunk(id)


class SimulatedHosts:
    """A factory of :class:`ConformanceHost` sharing one ZooKeeper root and backend."""

    def __init__(self, work_dir: Path, zk_hosts: str, zk_root: str, distributor: str,
                 conf: dict[str, Any] | None = None, topology_ids: tuple[str, ...] = (),
                 code_stream: bool = True):
        self.work_dir = Path(work_dir)
        self.zk_hosts = zk_hosts
        self.zk_root = zk_root
        self.plugin_class = resolve_distributor_class(distributor)
        self.conf = dict(conf or {})
        self.topology_ids = topology_ids
        self.code_stream = code_stream  # False: serve like a nimbus without the code stream
        self._servers: list[ThriftServer] = []
        #: Each nimbus host's file transfers (``served_bytes``: its Thrift code egress).
        self.transfers: list[FileTransfers] = []
        #: Each nimbus host's ``host:port``, in the order made.
        self.addresses: list[str] = []
        self._distributors: list[CodeDistributor] = []
        self._clients: list[KazooClient] = []

    def code_node(self, topology_id: str) -> None:
        """Create a topology's code node, as the leader does before it uploads."""
        self._clients[0].ensure_path(f"{self.zk_root}/code-distributor/{topology_id}")

    def publish(self, topology_id: str, distributor: str, metafile: bytes) -> None:
        """Publish a topology's metafile in its code node, as the leader does after
        ``upload``: what supervisors and followers download with."""
        meta = CodeMeta(distributor=distributor, metafile_b64=CodeMeta.pack(metafile),
                        uploaded_by=self.addresses[0] if self.addresses else "",
                        created_secs=int(time.time()))
        self.code_node(topology_id)
        self._clients[0].set(f"{self.zk_root}/code-distributor/{topology_id}", meta.encode())

    def assign(self, topology_id: str, supervisor_ids: list[str],
               code_sha256: dict[str, str]) -> None:
        """Write the topology's Assignment as a leader would: worker ``i`` on supervisor
        ``supervisor_ids[i]`` (port 6700)."""
        assignment = Assignment(
            master_code_dir="", node_host={s: "127.0.0.1" for s in supervisor_ids},
            executor_node_port={f"worker-{i}": [s, 6700]
                                for i, s in enumerate(supervisor_ids)},
            code_sha256=dict(code_sha256))
        path = f"{self.zk_root}/assignments/{topology_id}"
        zk = self._clients[0]
        if zk.exists(path):
            zk.set(path, assignment.encode())
        else:
            zk.create(path, assignment.encode(), makepath=True)

    def make(self, n: int, conf: dict[str, Any] | None = None) -> list[ConformanceHost]:
        group = []
        for _ in range(n):
            index = len(self._servers)
            local = self.work_dir / f"host-{index}"
            store = LocalCodeStore(local)
            transfers = FileTransfers(local, store, 1 << 40)
            server = ThriftServer(FileServer(transfers), "127.0.0.1", 0,
                                  downloads=transfers if self.code_stream else None)
            server.start()
            self._servers.append(server)
            self.transfers.append(transfers)
            self.addresses.append(f"127.0.0.1:{server.port}")
            zk = KazooClient(hosts=self.zk_hosts, timeout=4.0)
            zk.start(timeout=15)
            self._clients.append(zk)
            StormClusterState(zk, self.zk_root).setup()
            for topology_id in self.topology_ids:
                self.code_node(topology_id)
            distributor = CodeDistributor(self.plugin_class)
            distributor.prepare({**self.conf, **(conf or {})}, DistributorContext(
                zk=zk, zk_root=self.zk_root, address=f"127.0.0.1:{server.port}",
                local_dir=local / "code-distributor" / distributor.name,
                code_dir=store.root, fetch_file=fetch_file))
            self._distributors.append(distributor)
            group.append(ConformanceHost(distributor, store.root, self.conf))
        return group

    def make_supervisor(self, conf: dict[str, Any] | None = None) -> ConformanceHost:
        """A simulated supervisor: the distributor prepared in the supervisor role
        (``DistributorContext.role``), on a ZooKeeper session of its own. Its copies go
        to ``code_dir``; it serves nothing over Thrift."""
        index = len(self._distributors)
        local = self.work_dir / f"supervisor-{index}"
        zk = KazooClient(hosts=self.zk_hosts, timeout=4.0)
        zk.start(timeout=15)
        self._clients.append(zk)
        distributor = CodeDistributor(self.plugin_class)
        code_dir = local / "supervisor" / "code"
        code_dir.mkdir(parents=True)
        distributor.prepare({**self.conf, **(conf or {})}, DistributorContext(
            zk=zk, zk_root=self.zk_root, address=f"supervisor-sim-{index}",
            local_dir=local / "supervisor" / "code-distributor" / distributor.name,
            code_dir=code_dir, fetch_file=fetch_file, role=ROLE_SUPERVISOR))
        self._distributors.append(distributor)
        return ConformanceHost(distributor, code_dir, self.conf)

    def close(self) -> None:
        for distributor in self._distributors:
            distributor.close({})
        for server in self._servers:
            server.stop()
        for zk in self._clients:
            zk.stop()
            zk.close()
