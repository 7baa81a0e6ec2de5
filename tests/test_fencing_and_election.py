"""Leader election and fenced writes against a real ZooKeeper server (in-process)."""

import logging

import pytest
from faults import expire_session
from kazoo.protocol.states import KazooState
from waiting import wait_for

from nimbus.master.cycle import Bell, NimbusCycle
from nimbus.master.elector import LeaderElector, NoLeaderError
from nimbus.state.cluster_state import NotLeaderError, StormClusterState
from nimbus.state.records import ACTIVE, KILLED, Assignment, StormBase

pytestmark = pytest.mark.zookeeper


class CodeFacts:
    """The code sync's side of the cycle: a check, and a count of the syncs asked for."""

    def __init__(self, check):
        self._check = check
        self.syncs_asked = 0

    def check_cluster(self):
        pass  # the root always holds this test's cluster

    def check_code(self, leading=False):
        return self._check()

    def resync(self):
        self.syncs_asked += 1


class Observer:
    def __init__(self, told):
        self._told = told

    def on_leadership(self, leader):
        self._told(leader)


class Candidate:
    """A nimbus's elector driven by the real cycle (no registration, view, duties or
    summary): what each test here queues."""

    def __init__(self, zk, state, address, has_code, on_change=None):
        self.bell = Bell()
        self.code = CodeFacts(has_code)
        self.elector = LeaderElector(zk, state, address, wake=self.bell.ring)
        self.cycle = NimbusCycle(self.bell, None, None, self.code, self.elector, None, None,
                                 Observer(on_change) if on_change else None)
        self.cycle.start()

    def __getattr__(self, name):
        return getattr(self.elector, name)

    def wake(self):
        self.cycle.wake()

    def stop(self):
        self.cycle.stop()
        self.elector.stop()


def make_elector(make_zk, zk_root, address, has_code=lambda: True, on_change=None):
    zk = make_zk()
    state = StormClusterState(zk, zk_root)
    state.setup()
    return zk, state, Candidate(zk, state, address, has_code, on_change)


def base(name="t", status=ACTIVE):
    return StormBase(storm_name=name, launch_time_secs=1, status=status)


@pytest.fixture
def electors():
    made = []
    yield made
    for e in made:
        e.stop()


def test_one_leader_and_failover_on_leave(make_zk, zk_root, electors):
    _, _, a = make_elector(make_zk, zk_root, "127.0.0.1:1")
    _, _, b = make_elector(make_zk, zk_root, "127.0.0.1:2")
    electors += [a, b]
    a.add_to_leader_lock_queue()
    wait_for(a.is_leader, 10, "a to lead")
    b.add_to_leader_lock_queue()
    wait_for(lambda: len(b._state.leader_queue()) == 2, 10, "b to queue")
    assert not b.is_leader()
    assert b.get_leader_address() == "127.0.0.1:1"
    with pytest.raises(NoLeaderError):
        b.fence()
    a.remove_from_leader_lock_queue()
    wait_for(b.is_leader, 10, "b to lead after a left")
    assert not a.is_leader()


def test_expired_leader_stops_at_once_and_requeues(zk_server, make_zk, zk_root, electors):
    zk_a, _, a = make_elector(make_zk, zk_root, "127.0.0.1:1")
    _, _, b = make_elector(make_zk, zk_root, "127.0.0.1:2")
    electors += [a, b]
    a.add_to_leader_lock_queue()
    wait_for(a.is_leader, 10, "a to lead")
    b.add_to_leader_lock_queue()
    expire_session(zk_a, zk_server.hosts)
    assert not a.is_leader()  # false as soon as the session is LOST
    wait_for(b.is_leader, 10, "b to take over")
    wait_for(lambda: [addr for _, addr in b._state.leader_queue()] ==
             ["127.0.0.1:2", "127.0.0.1:1"], 15, "a to re-queue behind b")


def test_write_by_deposed_leader_is_refused(zk_server, make_zk, zk_root, electors):
    zk_a, state_a, a = make_elector(make_zk, zk_root, "127.0.0.1:1")
    electors.append(a)
    a.add_to_leader_lock_queue()
    wait_for(a.is_leader, 10, "a to lead")
    fence = a.fence()
    state_a.activate_storm(fence, "t-1-1", base(), Assignment(master_code_dir="/x"))
    expire_session(zk_a, zk_server.hosts)
    # The old fence names a lock node that died with the session: every write is refused,
    # even one made before the elector has noticed anything.
    wait_for(lambda: zk_a.connected, 15, "reconnection with a new session")
    with pytest.raises(NotLeaderError):
        state_a.update_storm(fence, "t-1-1", base(status=KILLED), 0)
    with pytest.raises(NotLeaderError):
        state_a.remove_storm(fence, "t-1-1")
    assert state_a.storm_base("t-1-1").status == ACTIVE


def test_leader_without_code_gives_up_and_requeues_when_synced(make_zk, zk_root, electors):
    have = {"code": False}
    _, _, a = make_elector(make_zk, zk_root, "127.0.0.1:1",
                           has_code=lambda: have["code"])
    _, _, b = make_elector(make_zk, zk_root, "127.0.0.1:2")
    electors += [a, b]
    # a queues first and holds the head of the queue, then lacks code when it gets there.
    have["code"] = True
    a.add_to_leader_lock_queue()
    wait_for(a.is_leader, 10, "a to lead")
    a.remove_from_leader_lock_queue()
    have["code"] = False
    b.add_to_leader_lock_queue()
    wait_for(b.is_leader, 10, "b to lead")
    a.add_to_leader_lock_queue()
    assert not a.is_leader()
    b.remove_from_leader_lock_queue()  # a is now alone: it would win, but lacks code
    wait_for(lambda: a.code.syncs_asked, 10, "a to ask for a sync")
    assert not a.is_leader()
    assert a.waiting_for_code or not a._node
    have["code"] = True
    a.wake()  # what the code sync does after a run
    wait_for(a.is_leader, 10, "a to re-queue and lead once it has the code")


def test_activate_storm_is_atomic(make_zk, zk_root, electors):
    _, state, a = make_elector(make_zk, zk_root, "127.0.0.1:1")
    electors.append(a)
    a.add_to_leader_lock_queue()
    wait_for(a.is_leader, 10, "a to lead")
    fence = a.fence()
    state.zk.create(f"{zk_root}/workerbeats/t-2-2")  # a leftover blocks one of the creates
    from nimbus.state.cluster_state import ConcurrentChangeError

    with pytest.raises(ConcurrentChangeError):
        state.activate_storm(fence, "t-2-2", base(), Assignment(master_code_dir="/x"))
    assert state.storm_base("t-2-2") is None
    assert state.assignment_info("t-2-2") is None


def test_errors_keep_the_ten_newest(make_zk, zk_root):
    from nimbus.state.records import ErrorInfo

    state = StormClusterState(make_zk(), zk_root)
    state.setup()
    state.zk.create(f"{zk_root}/errors/t-1-1")  # made at submit; errors go only below it
    for i in range(13):
        state.report_error("t-1-1", "bolt", ErrorInfo(error=f"e{i}", error_time_secs=i))
    assert [e.error for e in state.errors("t-1-1", "bolt")] == [f"e{i}" for i in range(3, 13)]


def test_lock_node_with_lost_create_reply_is_adopted_not_left_blocking(make_zk, zk_root,
                                                                       electors):
    """A create that succeeded on the server but whose reply was lost leaves a node of ours
    ahead in the queue; it must be adopted (or removed), never left to block everyone."""
    zk, state, a = make_elector(make_zk, zk_root, "127.0.0.1:1")
    electors.append(a)
    orphan = zk.create(f"{zk_root}/leader-lock/nimbus-{a._token}-", b"127.0.0.1:1",
                       ephemeral=True, sequence=True)
    a.add_to_leader_lock_queue()
    wait_for(a.is_leader, 10, "a to lead")
    assert a.fence().lock_path == orphan, "the orphaned node was adopted"
    assert len(zk.get_children(f"{zk_root}/leader-lock")) == 1
    # A second stray node of ours (e.g. a failed delete) is removed on the next step.
    zk.create(f"{zk_root}/leader-lock/nimbus-{a._token}-", b"127.0.0.1:1", ephemeral=True,
              sequence=True)
    a.wake()
    wait_for(lambda: len(zk.get_children(f"{zk_root}/leader-lock")) == 1, 10,
             "the stray node to be removed")
    assert a.is_leader()


def test_leader_stops_at_once_on_suspended_and_leads_again_on_reconnect(make_zk, zk_root,
                                                                        electors):
    from faults import lose_connection
    from kazoo.protocol.states import KazooState

    zk, _, a = make_elector(make_zk, zk_root, "127.0.0.1:1")
    electors.append(a)
    a.add_to_leader_lock_queue()
    wait_for(a.is_leader, 10, "a to lead")
    lock_node = a.fence().lock_path
    seen: list[bool] = []

    def on_state(state: str) -> None:
        # Runs on kazoo's thread right after the elector's own listener.
        if state == KazooState.SUSPENDED:
            seen.append(a.is_leader())

    zk.add_listener(on_state)
    lose_connection(zk)
    assert seen == [False], "is_leader() is false the moment the connection is SUSPENDED"
    # The session survived: the same lock node is still at the head, and a leads again.
    wait_for(a.is_leader, 10, "a to lead again after reconnecting")
    assert a.fence().lock_path == lock_node


def gained_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "gained leadership" in r.getMessage()]


def test_leadership_is_logged_with_the_evidence_of_the_check_that_granted_it(
        make_zk, zk_root, electors, caplog, tmp_path):
    """The claim line is the reading the lock was taken on, not a second look: here a
    submission completes just after the check, and the line still shows what was checked."""
    from nimbus.distribution.local_code import LocalCodeStore
    from nimbus.master.code_sync import CodeSync

    zk = make_zk()
    state = StormClusterState(zk, zk_root)
    state.setup()
    store = LocalCodeStore(tmp_path)
    for topology_id in ("a-1-1", "b-2-2"):
        store.path(topology_id).mkdir()
    zk.create(state.storm_path("a-1-1"), base("a").encode())
    sync = CodeSync(state, store, distributor=None, period_s=3600)
    checks = []

    def check_code(leading=False):
        checks.append(sync.check_code())
        if len(checks) == 1:  # b's submission completes right after the first check
            zk.create(state.storm_path("b-2-2"), base("b").encode())
        return checks[-1]

    a = Candidate(zk, state, "127.0.0.1:1", check_code)
    electors.append(a)
    with caplog.at_level(logging.INFO, logger="nimbus.master.elector"):
        a.add_to_leader_lock_queue()
        wait_for(a.is_leader, 10, "a to lead")
    assert str(checks[0]) == "held 1 of 1 live topologies [a-1-1]"
    assert gained_lines(caplog) == [
        f"127.0.0.1:1 gained leadership as {a.fence().lock_path}; code held: "
        "held 1 of 1 live topologies [a-1-1]"]


def test_session_lost_while_a_claim_is_verified_leaves_no_stale_leader(
        zk_server, make_zk, zk_root, electors, caplog, monkeypatch):
    """The session ends after a step verified its node at the head of the queue and before
    the claim takes effect: that node died with the session, so nobody may lead on it."""
    changes: list[tuple[bool, bool]] = []
    zk, _, a = make_elector(make_zk, zk_root, "127.0.0.1:1",
                            on_change=lambda leader: changes.append((leader, a.is_leader())))
    electors.append(a)
    claim = a.elector._set_leader
    lost_on: list[str] = []
    leader_after_late_claim: list[bool] = []

    def lose_the_session_then_claim(head, *args, **kwargs):
        if head is None or lost_on:
            return claim(head, *args, **kwargs)
        lost_on.append(head)
        session = zk.client_id[0]
        expire_session(zk, zk_server.hosts)
        # CONNECTED again, with a new session: every listener saw LOST before this.
        wait_for(lambda: zk.state == KazooState.CONNECTED and zk.client_id is not None
                 and zk.client_id[0] != session, 15, "a new session")
        claim(head, *args, **kwargs)
        leader_after_late_claim.append(a.is_leader())
        return None

    monkeypatch.setattr(a.elector, "_set_leader", lose_the_session_then_claim)
    with caplog.at_level(logging.INFO, logger="nimbus.master.elector"):
        a.add_to_leader_lock_queue()
        wait_for(lambda: a.is_leader() and a.fence().lock_path != lost_on[0], 15,
                 "a to queue again in the new session and lead")
    node = a.fence().lock_path
    assert leader_after_late_claim == [False], "no leader on the dead node"
    assert changes == [(True, True)], "told it leads once, and only while it does"
    assert gained_lines(caplog) == [
        f"127.0.0.1:1 gained leadership as {node}; code held: (not reported)"]
