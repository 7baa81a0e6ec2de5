"""The seed's failover scenario and the other HA behaviours, with separate processes."""

from __future__ import annotations

import shutil
import signal

import pytest
from helpers import observer, stormdist
from thriftpy2.thrift import TApplicationException

from nimbus.archive import pack_directory
from nimbus.client import connect
from nimbus.devcluster import sample_topology, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def statuses(client) -> dict[str, tuple[str, str]]:
    return {t.name: (t.id, t.status) for t in client.cluster_info().topologies}


def test_seed_scenario_leader_killed_and_wiped(make_cluster, tmp_path, backend):
    # Large bundles: when the leader's session expires, the nimbus without code is told
    # (by the same ZooKeeper event) both that it heads the queue and that replicas changed;
    # its download must take longer than its check of the code, so that it gives up.
    bundle = pack_directory(sample_topology(tmp_path / "big", 16 * 1024 * 1024))
    # The periodic sync is an hour away: all replication below happens through watches.
    backend_name, backend_conf = backend
    cluster = make_cluster(3, **{"nimbus.code.sync.freq.secs": 3600, **backend_conf})
    client = cluster.client()
    names = [f"pipeline-{i}" for i in range(4)]
    for name in names:
        client.submit(name, bundle, {"topology.min.replication.count": 2,
                                     "topology.max.replication.wait.time.sec": -1})
    before = statuses(client)
    assert {n: s for n, (_, s) in before.items()} == dict.fromkeys(names, "ACTIVE")
    assert all(t.replication_count >= 2 for t in client.cluster_info().topologies)
    state = observer(cluster)

    by_address = {n.address: n for n in cluster.nimbuses}
    queue = [by_address[address] for _, address in state.leader_queue()]
    leader, lacking, holder = queue
    wait_for(lambda: all(stormdist(n.local_dir) >= {t for t, _ in before.values()}
                         for n in queue), 30, "every nimbus to hold all code")
    # The next in line loses its code without noticing; the last one holds everything.
    # Renamed away first: a live BitTorrent session may still touch files under it.
    code_dir = lacking.local_dir / "nimbus" / "stormdist"
    code_dir.rename(code_dir.with_name("stormdist.lost"))
    shutil.rmtree(code_dir.with_name("stormdist.lost"))
    leader.kill9()
    leader.wipe()

    new_leader = cluster.wait_for_leader(exclude=leader.address, timeout_s=60)
    live = {t for t, _ in before.values()}
    if backend_name == "torrent":
        # A live BitTorrent session notices its seeded files vanish: the copy stops
        # counting at once and the nimbus re-fetches it before it can reach the lock.
        assert stormdist(new_leader.local_dir) == live, "the new leader holds all code"
    else:
        assert new_leader is holder, "the nimbus that holds all code must lead"
        wait_for(lambda: "lacks topology code: giving it up" in lacking.log_text(), 30,
                 "the nimbus without code to give up the lock")
    wait_for(lambda: stormdist(lacking.local_dir) == live, 60,
             "the nimbus without code to sync it")
    wait_for(lambda: lacking.address in [a for _, a in state.leader_queue()], 30,
             "the synced nimbus to re-queue")
    assert statuses(client) == before, "no topology lost, none resubmitted"

    client.deactivate("pipeline-0")
    client.kill("pipeline-1", wait_secs=0)
    client.deactivate("pipeline-2")
    client.activate("pipeline-2")
    def removed() -> dict | None:
        current = statuses(client)
        return current if "pipeline-1" not in current else None

    after = wait_for(removed, 30, "pipeline-1 to be removed")
    assert after["pipeline-0"][1] == "INACTIVE"
    assert after["pipeline-2"][1] == "ACTIVE"
    assert after["pipeline-3"][1] == "ACTIVE"

    # The killed nimbus comes back with an empty disk: it catches up and queues again.
    leader.start()
    live = {t for t, _ in after.values()}
    wait_for(lambda: stormdist(leader.local_dir) == live, 60, "the restarted nimbus to catch up")
    wait_for(lambda: leader.address in [a for _, a in state.leader_queue()], 30,
             "the restarted nimbus to become eligible")
    killed = before["pipeline-1"][0]
    wait_for(lambda: all(killed not in stormdist(n.local_dir) for n in cluster.nimbuses), 30,
             "the killed topology's code to be removed everywhere")
    state.zk.stop()


def test_follower_refuses_leader_calls_and_names_the_leader(make_cluster, bundle):
    cluster = make_cluster(2)
    leader = cluster.wait_for_leader()
    follower = next(n for n in cluster.nimbuses if n is not leader)
    with connect(follower.address) as raw:
        for call in (lambda: raw.killTopology("x"), lambda: raw.activate("x"),
                     lambda: raw.beginFileUpload()):
            with pytest.raises(TApplicationException) as err:
                call()
            assert err.value.message == f"not a leader, current leader is {leader.address}"
        info = raw.getClusterInfo()
        assert [(f"{n.host}:{n.port}", n.isLeader) for n in info.nimbuses
                if n.isLeader] == [(leader.address, True)]
        assert len(info.nimbuses) == 2
        assert f"{raw.getLeader().host}:{raw.getLeader().port}" == leader.address
    # The project's client, seeded with the follower only, ends up on the leader.
    from nimbus.client import NimbusClient

    conf = cluster.client_conf(**{"nimbus.seeds": [follower.address]})
    NimbusClient(conf).submit("via-follower", bundle, {})
    assert "via-follower" in statuses(cluster.client())


def test_sigterm_fails_over_without_waiting_for_the_session(make_cluster):
    # With a 60 s session, only an explicit release can fail over within 20 s.
    cluster = make_cluster(2, **{"storm.zookeeper.session.timeout": 60000})
    leader = cluster.wait_for_leader()
    leader.terminate()
    assert leader.process.returncode == 0
    cluster.wait_for_leader(exclude=leader.address, timeout_s=20)


def test_expired_session_stops_leading_and_rejoins(make_cluster, bundle):
    cluster = make_cluster(3, **{"storm.zookeeper.session.timeout": 3000})
    client = cluster.client()
    topology_id = client.submit("survivor", bundle, {"topology.min.replication.count": 3})
    state = observer(cluster)
    leader = cluster.wait_for_leader()
    # A frozen process (a long GC pause, say) keeps its socket but misses its pings.
    leader.signal(signal.SIGSTOP)
    try:
        wait_for(lambda: leader.address not in state.replica_hosts(topology_id), 30,
                 "the frozen leader's session to expire")
        new_leader = cluster.wait_for_leader(exclude=leader.address, timeout_s=30)
    finally:
        leader.signal(signal.SIGCONT)
    with connect(leader.address) as raw:
        wait_for(lambda: not [n for n in raw.getClusterInfo().nimbuses
                              if f"{n.host}:{n.port}" == leader.address and n.isLeader],
                 30, "the old leader to report itself as follower")
        with pytest.raises(TApplicationException, match=new_leader.address):
            raw.killTopology("survivor")
    wait_for(lambda: leader.address in [a for _, a in state.leader_queue()], 30,
             "the old leader to rejoin the queue")
    wait_for(lambda: leader.address in state.replica_hosts(topology_id), 30,
             "its replica registration to come back")
    wait_for(lambda: leader.address in {f"{n.host}:{n.port}" for n in state.nimbuses()}, 30,
             "its nimbus registration to come back")
    assert statuses(client)["survivor"] == (topology_id, "ACTIVE")
    state.zk.stop()


def test_restart_with_disk_intact_reregisters_and_tampered_copy_is_refetched(
        make_cluster, bundle):
    cluster = make_cluster(2, **{"nimbus.code.sync.freq.secs": 3600})
    client = cluster.client()
    topology_id = client.submit("kept", bundle, {"topology.min.replication.count": 2})
    state = observer(cluster)
    follower = next(n for n in cluster.nimbuses if n is not cluster.wait_for_leader())
    jar = follower.local_dir / "nimbus" / "stormdist" / topology_id / "stormjar.jar"

    follower.terminate()
    wait_for(lambda: follower.address not in state.replica_hosts(topology_id), 30,
             "the stopped nimbus's registration to go")
    log_before = len(follower.log_text())
    follower.start()
    wait_for(lambda: follower.address in state.replica_hosts(topology_id), 30,
             "the restarted nimbus to register its copy again")
    assert "downloaded " not in follower.log_text()[log_before:], "no download was needed"

    follower.terminate()
    data = bytearray(jar.read_bytes())
    data[100] ^= 0xFF
    jar.write_bytes(bytes(data))
    follower.start()
    wait_for(lambda: "is not intact" in follower.log_text(), 30,
             "the tampered copy to be noticed")
    wait_for(lambda: jar.exists() and jar.read_bytes() == bundle, 30,
             "a good copy to be fetched again")
    wait_for(lambda: follower.address in state.replica_hosts(topology_id), 30,
             "the fetched copy to be registered")
    state.zk.stop()
