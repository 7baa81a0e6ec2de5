"""nimbus-ha-hdfs through pyarrow's FileSystem interface.

No HDFS can be installed on the machines this project is built on, so the suite runs
the plugin with ``namenode: file:///dir`` (pyarrow's LocalFileSystem, the same calls the
plugin makes on HadoopFileSystem). ``test_real_hdfs_round_trip`` runs against a real
HDFS when HADOOP_HOME and NIMBUS_HA_TEST_HDFS_NAMENODE are set, and is skipped otherwise.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from nimbus_ha_hdfs.distributor import PREFIX, HDFSCodeDistributor

from nimbus.distribution.distributors import DistributorError, resolve_distributor_class
from nimbus.testing.conformance import (
    STORE,
    ConformanceHost,
    DistributorConformance,
    flip_byte,
    tree_digests,
    write_code,
)
from nimbus.testing.hosts import SimulatedHosts
from nimbus.testing.kit import DistributorKit

pytest_plugins = ["nimbus.testing.zookeeper"]
TOPOLOGY = DistributorConformance.topology_id


@pytest.fixture
def store_dir(tmp_path):
    return tmp_path / "hdfs"


@pytest.fixture
def hosts(tmp_path, store_dir, zk_server, zk_root):
    conf = {PREFIX + "namenode": f"file://{store_dir}"}
    simulated = SimulatedHosts(tmp_path / "hosts", zk_server.hosts, zk_root, "hdfs", conf)
    yield simulated.make
    simulated.close()


class TestHdfsConformance(DistributorKit):
    distributor = "hdfs"
    replication_model = STORE
    store_replication = 1  # a file:// namenode: one local copy
    store_setting = PREFIX + "namenode"

    @pytest.fixture
    def stop_store(self, store_dir):
        # No HDFS here (module docstring): the file:// namenode's directory moves away,
        # as an unmounted disk would, which is the local stand-in for a namenode that is down.
        return lambda: store_dir.rename(store_dir.with_name("hdfs-gone"))

    @pytest.fixture
    def settings(self, store_dir) -> dict:
        return {PREFIX + "namenode": f"file://{store_dir}"}

    @pytest.fixture
    def other_store(self, tmp_path) -> dict:
        return {PREFIX + "namenode": f"file://{tmp_path / 'other-hdfs'}"}

    @pytest.fixture
    def bad_settings(self) -> list:
        return [({PREFIX + "namenode": "ftp://somewhere"}, PREFIX + "namenode")]

    def corrupt(self, host: ConformanceHost, topology_id: str) -> None:
        store = Path(host.conf[PREFIX + "namenode"].removeprefix("file://"))
        flip_byte(store / "nimbus-ha" / "code" / topology_id / "stormjar.jar")


def test_storm_class_name_selects_hdfs():
    assert resolve_distributor_class(
        "org.apache.storm.hdfs.ha.codedistributor.HDFSCodeDistributor") is HDFSCodeDistributor


def test_local_directory_counts_one_copy(hosts):
    source, = hosts(1)
    write_code(source.code_dir / TOPOLOGY, big_bytes=1000)
    source.distributor.upload(source.code_dir / TOPOLOGY, TOPOLOGY)
    assert source.distributor.get_replication_count(TOPOLOGY) == 1
    source.distributor.cleanup(TOPOLOGY)  # this host's state only: the bundle is shared
    assert source.distributor.get_replication_count(TOPOLOGY) == 1
    source.distributor.delete_shared(TOPOLOGY)
    assert source.distributor.get_replication_count(TOPOLOGY) == 0


@pytest.mark.parametrize("namenode, message", [
    ("ftp://somewhere", "must be 'default', 'hdfs://host:port' or 'file:///dir'"),
    ("file://", "names no directory"),
    # Without libhdfs (as here) the error says how to provide it; with it, which setting.
    ("hdfs://127.0.0.1:1", "cannot load HDFS.s client|check nimbus.codedistributor.hdfs"),
])
def test_bad_namenode_is_a_clear_error(tmp_path, zk_server, zk_root, namenode, message):
    simulated = SimulatedHosts(tmp_path, zk_server.hosts, zk_root, "hdfs",
                               {PREFIX + "namenode": namenode})
    try:
        with pytest.raises(DistributorError, match=message):
            simulated.make(1)
    finally:
        simulated.close()


@pytest.mark.skipif(
    not (os.environ.get("HADOOP_HOME") and os.environ.get("NIMBUS_HA_TEST_HDFS_NAMENODE")),
    reason="needs a real HDFS: set HADOOP_HOME, CLASSPATH=$(hadoop classpath --glob) and "
           "NIMBUS_HA_TEST_HDFS_NAMENODE=hdfs://host:port (none can be installed here)")
def test_real_hdfs_round_trip(tmp_path, zk_server, zk_root):
    conf = {PREFIX + "namenode": os.environ["NIMBUS_HA_TEST_HDFS_NAMENODE"],
            PREFIX + "path": f"/tmp/nimbus-ha-test-{uuid.uuid4().hex[:8]}",
            PREFIX + "replication": 1}
    simulated = SimulatedHosts(tmp_path, zk_server.hosts, zk_root, "hdfs", conf)
    try:
        source, target = simulated.make(2)
        digests = write_code(source.code_dir / TOPOLOGY)
        metafile = source.distributor.upload(source.code_dir / TOPOLOGY, TOPOLOGY)
        target.distributor.download(target.code_dir / TOPOLOGY, TOPOLOGY, metafile)
        assert tree_digests(target.code_dir / TOPOLOGY) == digests
        assert source.distributor.get_replication_count(TOPOLOGY) == 1
        source.distributor.cleanup(TOPOLOGY)
    finally:
        simulated.close()
