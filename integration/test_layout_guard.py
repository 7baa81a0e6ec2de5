"""An absent or foreign cluster layout is never read as "no topology is live".

Reproduces the review's finding with separate nimbus processes and a real ZooKeeper:
``/storm/storms`` is deleted with a plain ZooKeeper client while two nimbuses hold code.
Before the fix both deleted every local copy (and, on s3, every object in the store)
within seconds. Now each refuses and says why, and nothing is removed anywhere.
"""

from __future__ import annotations

import pytest
import yaml
from helpers import observer, stormdist, wipe
from waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REFUSAL = "code sync stopped, nothing fetched or removed: /storm/storms does not exist"


def store_objects(backend_conf: dict) -> list[str]:
    import s3fs
    from nimbus_ha_s3.distributor import PREFIX

    fs = s3fs.S3FileSystem(key=backend_conf[PREFIX + "access.key"],
                           secret=backend_conf[PREFIX + "secret.key"],
                           client_kwargs={"endpoint_url": backend_conf[PREFIX + "endpoint"]})
    return sorted(fs.find(backend_conf[PREFIX + "bucket"]))


def test_deleted_storms_directory_removes_nothing(make_cluster, bundle, backend):
    backend_name, backend_conf = backend
    cluster = make_cluster(2, **backend_conf)
    client = cluster.client()
    ids = {client.submit(f"kept-{i}", bundle, {"topology.min.replication.count": 2})
           for i in range(3)}
    wait_for(lambda: all(stormdist(n.local_dir) == ids for n in cluster.nimbuses), 30,
             "both nimbuses to hold all code")
    objects = store_objects(backend_conf) if backend_name == "s3" else []
    state = observer(cluster)
    marks = [len(n.log_text()) for n in cluster.nimbuses]
    wipe(state.zk, "/storm/storms")
    # The deletion fires the code sync's watch at once on both nimbuses.
    for nimbus, mark in zip(cluster.nimbuses, marks, strict=True):
        wait_for(lambda n=nimbus, m=mark: REFUSAL in n.log_text()[m:], 30,
                 f"{nimbus.address} to refuse the pass")
    for nimbus in cluster.nimbuses:
        assert stormdist(nimbus.local_dir) == ids, "no local copy was removed"
        assert nimbus.alive()
    if backend_name == "s3":
        assert len(objects) == 3 * 4  # 3 files and a manifest per topology
        assert store_objects(backend_conf) == objects, "no object was deleted"
    state.zk.stop()


def test_nimbus_pointed_at_another_cluster_keeps_its_code(make_cluster, bundle):
    cluster = make_cluster(2)
    client = cluster.client()
    topology_id = client.submit("elsewhere", bundle, {"topology.min.replication.count": 2})
    nimbus = next(n for n in cluster.nimbuses if n is not cluster.wait_for_leader())
    wait_for(lambda: stormdist(nimbus.local_dir) == {topology_id}, 30, "replication")
    nimbus.terminate()
    # A wrong storm.zookeeper.root: an empty layout, made anew for a new cluster id.
    conf = yaml.safe_load(nimbus.config_file.read_text())
    nimbus.config_file.write_text(yaml.safe_dump({**conf, "storm.zookeeper.root": "/other"}))
    mark = len(nimbus.log_text())
    nimbus.start()
    wait_for(lambda: f"not removing code of {topology_id}: " in nimbus.log_text()[mark:], 30,
             "the nimbus to refuse to clean up another cluster's code")
    assert "local code will not be cleaned up" in nimbus.log_text()[mark:]
    assert stormdist(nimbus.local_dir) == {topology_id}


def test_running_nimbus_keeps_its_code_when_zookeeper_is_set_up_anew(make_cluster, bundle):
    """ZooKeeper is wiped, then one nimbus restarts and sets up an empty layout under a
    new cluster id. The nimbus that kept running must not read the new, empty
    /storm/storms as "every topology was removed": it keeps its code and does not lead."""
    cluster = make_cluster(2, **{"nimbus.code.sync.freq.secs": 3600})
    client = cluster.client()
    ids = {client.submit(f"kept-{i}", bundle, {"topology.min.replication.count": 2})
           for i in range(2)}
    wait_for(lambda: all(stormdist(n.local_dir) == ids for n in cluster.nimbuses), 30,
             "both nimbuses to hold all code")
    state = observer(cluster)
    old_id = state.zk.get("/storm")[0].decode()
    restarted, running = cluster.nimbuses
    mark = len(running.log_text())
    restarted.terminate()
    wipe(state.zk, "/storm")
    restarted.start()
    wait_for(lambda: state.zk.exists("/storm/storms") is not None and
             state.zk.get("/storm")[0], 30, "the restarted nimbus to set up a new layout")
    new_id = state.zk.get("/storm")[0].decode()
    assert new_id != old_id
    wait_for(lambda: f"holds cluster {new_id}, not cluster {old_id}"
             in running.log_text()[mark:], 30, "the running nimbus to refuse the new layout")
    assert cluster.wait_for_leader(timeout_s=30) is restarted
    assert stormdist(running.local_dir) == ids, "the running nimbus removed nothing"
    assert stormdist(restarted.local_dir) == ids, "the restarted nimbus keeps its code aside"
    assert "local code will not be cleaned up" in restarted.log_text()
    # The elector checks the cluster id before every queue decision (every 2 s at most).
    wait_for(lambda: [a for _, a in state.leader_queue()] == [restarted.address], 10,
             "the running nimbus to stay out of the new cluster's queue")
    state.zk.stop()
