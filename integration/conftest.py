"""Fixtures for multi-process tests: a real ZooKeeper and separate nimbus processes."""

from __future__ import annotations

import pytest

from nimbus.archive import pack_directory
from nimbus.devcluster import LocalCluster, sample_topology


@pytest.fixture
def make_cluster(tmp_path):
    """Factory: make_cluster(n, **conf) starts ZooKeeper + n nimbuses; all stopped after."""
    clusters = []

    def make(n: int = 3, **conf) -> LocalCluster:
        cluster = LocalCluster(tmp_path / f"cluster-{len(clusters)}", n,
                               conf={k.replace("_", "."): v for k, v in conf.items()})
        clusters.append(cluster)
        try:
            return cluster.start()
        except BaseException:
            for nimbus in cluster.nimbuses:
                print(f"--- {nimbus.address} log ---\n{nimbus.log_text()[-4000:]}")
            raise

    yield make
    for cluster in clusters:
        cluster.stop()


@pytest.fixture
def bundle(tmp_path) -> bytes:
    return pack_directory(sample_topology(tmp_path / "topology", 32 * 1024))


