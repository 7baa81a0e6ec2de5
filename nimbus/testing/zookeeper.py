"""pytest fixtures: one real ZooKeeper server per test session, a fresh root per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from nimbus.dev.zookeeper import ZooKeeperServer
from nimbus.state.recursive_watch import RecursiveWatchClient
from nimbus.state.zk_handler import PollingThreadingHandler


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    server = ZooKeeperServer(Path(tmp_path_factory.mktemp("zookeeper")))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def zk_root() -> str:
    """A root znode of its own, so tests never see each other's state."""
    return f"/test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def make_zk(zk_server: ZooKeeperServer) -> Iterator:
    """A factory of started kazoo clients (session timeout 4 s), of the kind nimbus-ha's
    daemons use (their handler, recursive watches); all stopped afterwards."""
    clients: list[KazooClient] = []

    def make(timeout_s: float = 4.0) -> KazooClient:
        client = RecursiveWatchClient(hosts=zk_server.hosts, timeout=timeout_s,
                                      handler=PollingThreadingHandler())
        client.start(timeout=15)
        clients.append(client)
        return client

    yield make
    for client in clients:
        try:
            client.stop()
            client.close()
        except Exception:
            pass
