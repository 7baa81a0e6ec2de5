"""A plugin's test module as docs/plugins.md told authors to write it for 0.1, kept
unchanged (it is not collected here: test_written_for_0_1.py runs it in a pytest of its
own). It declares no replication_model, which 0.1 did not know."""

import pytest

from nimbus.testing.conformance import ConformanceHost, DistributorConformance, flip_byte
from nimbus.testing.hosts import SimulatedHosts

pytest_plugins = ["nimbus.testing.zookeeper"]


@pytest.fixture
def hosts(tmp_path, zk_server, zk_root):
    simulated = SimulatedHosts(tmp_path, zk_server.hosts, zk_root, "localfs",
                               topology_ids=(DistributorConformance.topology_id,))
    yield simulated.make
    simulated.close()


def corrupt_jar(host: ConformanceHost, topology_id: str) -> None:
    flip_byte(host.code_dir / topology_id / "stormjar.jar")


class TestLocalfsConformance(DistributorConformance):
    @pytest.fixture
    def tamper(self):
        return corrupt_jar
