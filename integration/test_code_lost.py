"""Every nimbus lost the code at once (STORM-3664), with separate nimbus processes.

Storm deadlocks here: no nimbus may lead without the code, and none can fetch it. In
nimbus-ha, once a live topology's code has been on no nimbus and in no store for
``nimbus.code.lost.grace.secs``, a nimbus leads without it, degraded: it logs which code is
lost, refuses submissions naming it, and still lists, kills and (de)activates. When a copy
comes back (a nimbus's disk restored from a backup) the code sync fetches it and the
cluster leaves the degraded state by itself; nothing live is ever removed on the way.
"""

from __future__ import annotations

import shutil

import pytest
from helpers import leadership_claims, stormdist
from waiting import wait_for

from nimbus.thrift import storm

pytestmark = [pytest.mark.integration, pytest.mark.slow]

GRACE_S = 3


def statuses(client) -> dict[str, tuple[str, str]]:
    return {t.name: (t.id, t.status) for t in client.cluster_info().topologies}


def test_all_code_lost_leads_degraded_then_recovers_from_a_restored_disk(
        make_cluster, bundle, tmp_path):
    cluster = make_cluster(2, **{"nimbus.code.sync.freq.secs": 3600,
                                 "nimbus.code.lost.grace.secs": GRACE_S})
    client = cluster.client()
    kept = client.submit("kept", bundle, {"topology.min.replication.count": 2})
    doomed = client.submit("doomed", bundle, {"topology.min.replication.count": 2})
    first, second = cluster.nimbuses
    for nimbus in (first, second):
        wait_for(lambda n=nimbus: stormdist(n.local_dir) == {kept, doomed}, 30, "replication")

    # A backup of one disk, taken while both hold everything; then every disk is lost.
    backup = tmp_path / "backup"
    for nimbus in (first, second):
        nimbus.kill9()
    shutil.copytree(first.local_dir, backup)
    marks = {}
    for nimbus in (first, second):
        nimbus.wipe()
        marks[nimbus.index] = len(nimbus.log_text())  # the log goes on across restarts
        nimbus.start()

    # The leader is whichever nimbus logs a claim after the restart. (ZooKeeper can name
    # a killed nimbus's lock node until its session expires, so asking who leads right
    # after the restart could name the one that will not lead.)
    def claimed():
        for nimbus in (first, second):
            found = leadership_claims(nimbus.log_text()[marks[nimbus.index]:])
            if found:
                return nimbus, found
        return None

    leader, claims = wait_for(claimed, 60, "a leader's claim after the restart")
    wait_for(lambda: cluster.leader_address() == leader.address, 30, "the leader to be named")
    since_restart = lambda: leader.log_text()[marks[leader.index]:]  # noqa: E731
    assert claims == [(0, 2, {kept, doomed})]
    assert f"DEGRADED, code lost on every nimbus: [{','.join(sorted([kept, doomed]))}]" \
        in since_restart()
    assert "counted as lost" in since_restart()
    # Nothing live was removed: both topologies are listed, as they were.
    assert statuses(client) == {"kept": (kept, "ACTIVE"), "doomed": (doomed, "ACTIVE")}

    # Degraded: no submission, with the reason; kill and deactivate still work.
    with pytest.raises(storm.InvalidTopologyException, match="runs degraded") as refused:
        client.submit("new", bundle, {})
    assert kept in refused.value.msg and doomed in refused.value.msg
    client.deactivate("kept")
    client.kill("doomed", wait_secs=0)
    wait_for(lambda: set(statuses(client)) == {"kept"}, 30, "doomed to be removed")
    with pytest.raises(storm.InvalidTopologyException, match=kept):
        client.submit("new", bundle, {})

    # The lost code comes back: the follower's disk is restored from the backup.
    follower = next(n for n in cluster.nimbuses if n is not leader)
    follower.kill9()
    shutil.rmtree(follower.local_dir, ignore_errors=True)
    shutil.copytree(backup, follower.local_dir)
    follower.start()
    for nimbus in (first, second):
        wait_for(lambda n=nimbus: kept in stormdist(n.local_dir), 60,
                 "both nimbuses to hold the restored code")
    new_id = wait_for(lambda: _submitted(client, bundle), 60,
                      "a submission to be accepted again")
    assert statuses(client) == {"kept": (kept, "INACTIVE"), "new": (new_id, "ACTIVE")}


def _submitted(client, bundle) -> str | None:
    try:
        return client.submit("new", bundle, {})
    except storm.InvalidTopologyException as exc:
        if "runs degraded" in exc.msg:
            return None
        raise
