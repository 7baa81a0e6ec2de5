"""A submit outlives client timeouts and leader changes: retries are recognised, never
turned into "already alive", and a leader deposed mid-submit redirects the client."""

from __future__ import annotations

import signal
import threading

import pytest
from helpers import observer
from waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def named(client, name: str) -> list[tuple[str, str]]:
    return [(t.id, t.status) for t in client.cluster_info().topologies if t.name == name]


def test_replication_wait_longer_than_the_client_timeout(make_cluster, bundle):
    # Session 4 s: the client's socket timeout is 8 s; the leader answers after 12 s,
    # when the replication wait for an unreachable 4 replicas (of 3 nimbuses) is over.
    cluster = make_cluster(3)
    client = cluster.client()
    assert client.timeout_s == 8.0
    topology_id = client.submit("slow-to-replicate", bundle, {
        "topology.min.replication.count": 4, "topology.max.replication.wait.time.sec": 12})
    assert named(client, "slow-to-replicate") == [(topology_id, "ACTIVE")]


def test_retried_submit_of_the_same_upload_returns_its_topology(make_cluster, bundle):
    cluster = make_cluster(1)
    client = cluster.client()
    conf = {"topology.submission.token": "token-1"}
    first = client.submit("once", bundle, conf)
    # The same submission again (what a retry sends): its own topology, not an error.
    assert client.submit("once", bundle, conf) == first
    assert named(client, "once") == [(first, "ACTIVE")]
    # A different submission under a live name is still refused, as in Storm.
    from nimbus.thrift import storm

    with pytest.raises(storm.AlreadyAliveException):
        client.submit("once", bundle, {"topology.submission.token": "token-2"})


def test_retry_arriving_while_the_first_submit_still_replicates(make_cluster, bundle):
    """The retry of a submit whose first attempt is still waiting for replication (the
    client gave up on it, say) waits for that attempt and answers with its topology."""
    cluster = make_cluster(3)
    state = observer(cluster)
    conf = {"topology.submission.token": "same-token",
            "topology.min.replication.count": 4,  # 3 nimbuses: waits the whole 8 s
            "topology.max.replication.wait.time.sec": 8}
    first: dict[str, object] = {}
    submitter = threading.Thread(
        target=lambda: first.setdefault("id", cluster.client().submit("twice", bundle, conf)),
        name="test-first-submit")
    submitter.start()
    try:
        wait_for(lambda: len(state.code_topologies()) == 1, 30,
                 "the first attempt to be waiting for replication")
        retried = cluster.client().submit("twice", bundle, conf)
    finally:
        submitter.join(timeout=60)
    assert retried == first["id"]
    assert named(cluster.client(), "twice") == [(retried, "ACTIVE")]
    assert len(state.code_topologies()) == 1, "the retry's own upload left no code behind"
    state.zk.stop()


def test_leader_deposed_during_the_replication_wait_redirects_the_client(make_cluster,
                                                                         bundle):
    cluster = make_cluster(3, **{"storm.zookeeper.session.timeout": 3000})
    state = observer(cluster)
    leader = cluster.wait_for_leader()
    second, third = [n for n in cluster.nimbuses if n is not leader]
    # With the third nimbus frozen only 2 of the 3 replicas asked for can exist: the
    # leader waits (forever, by the topology's setting).
    third.signal(signal.SIGSTOP)
    result: dict[str, object] = {}

    def submit() -> None:
        try:
            result["id"] = cluster.client(deadline_s=120).submit("redirected", bundle, {
                "topology.min.replication.count": 3,
                "topology.max.replication.wait.time.sec": -1})
        except Exception as exc:  # reported by the assertions below
            result["error"] = exc

    submitter = threading.Thread(target=submit, name="test-submit")
    try:
        submitter.start()
        wait_for(lambda: "gained leadership" in leader.log_text() and
                 len(state.code_topologies()) == 1, 30, "the submission to start waiting")
        # Freeze the leader past its session: on waking it is no longer the leader.
        leader.signal(signal.SIGSTOP)
        wait_for(lambda: cluster.leader_address() == second.address, 30,
                 "the second nimbus to lead")
        leader.signal(signal.SIGCONT)
        wait_for(lambda: "lost leadership" in leader.log_text(), 30,
                 "the old leader to notice")
        third.signal(signal.SIGCONT)  # now 3 replicas can exist: the new leader activates
        submitter.join(timeout=90)
    finally:
        third.signal(signal.SIGCONT)
        leader.signal(signal.SIGCONT)
    assert not submitter.is_alive()
    assert "error" not in result, result.get("error")
    client = cluster.client()
    assert named(client, "redirected") == [(result["id"], "ACTIVE")]
    assert f"submitted redirected as {result['id']}" in second.log_text()
    state.zk.stop()
