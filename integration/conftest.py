"""Fixtures for multi-process tests: a real ZooKeeper and separate nimbus processes."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import process_bundle, s3_store
from required_plugins import require_plugin

from nimbus.dev.cluster import LocalCluster

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Markers match folders: every test of integration/ is `integration` and `slow`,
    whatever its module says, and no other test is (tests/test_markers.py)."""
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def make_cluster(tmp_path):
    """Factory: make_cluster(n, **conf) starts ZooKeeper + n nimbuses; all stopped after."""
    clusters = []

    def make(n: int = 3, **conf) -> LocalCluster:
        cluster = LocalCluster(tmp_path / f"cluster-{len(clusters)}", n,
                               conf=dict(conf))
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
    """A small process-topology bundle (these tests run no supervisor: it never runs)."""
    return process_bundle(tmp_path / "topology")




@pytest.fixture(params=["localfs", "s3", "torrent"])
def backend(request, tmp_path):
    """(name, extra conf) of a code distributor, with any server it needs running.

    A backend whose plugin is not installed fails (see required_plugins): it is
    skipped only when NIMBUS_HA_ALLOW_MISSING_PLUGINS=1.
    """
    name = request.param
    require_plugin(name)
    if name == "localfs":
        yield name, {}
        return
    if name == "torrent":
        yield name, {"storm.codedistributor.class": "torrent"}
        return
    with s3_store(tmp_path / "seaweed") as conf:
        yield name, conf
