"""``rebalance --wait S`` (Storm's REBALANCING): the rules of nimbus.master.rebalancing,
the StormBase fields that hold the timer (no server), and the transitions on one real
in-process nimbus and a real ZooKeeper (marked integration), with a fake clock for the
deadline.

Supervisors are not run: their records are written into ZooKeeper as a supervisor writes
them. The leader's duties run when the test calls ``run_cycle``, not on a timer.
"""

from __future__ import annotations

import io
import json
import tarfile

import pytest
from click.testing import CliRunner
from nimbus_fixtures import idle_nimbus_conf
from thriftpy2.thrift import TApplicationException
from ui_fixtures import Harness, conf_for, write_cluster
from waiting import wait_for

from nimbus import metrics
from nimbus.cli import main
from nimbus.config import load_config
from nimbus.daemons.nimbus import NimbusDaemon
from nimbus.master import rebalancing
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.records import (
    ACTIVE,
    INACTIVE,
    KILLED,
    REBALANCING,
    RecordError,
    StormBase,
    SupervisorInfo,
)
from nimbus.thrift import storm
from nimbus.thrift.client import NimbusClient, connect

PROCESS_YAML = 'command: ["sleep", "3600"]\n'
ZOOKEEPER = pytest.mark.zookeeper  # these run a real ZooKeeper (and a nimbus)
NOW = 1_700_000_000.25  # the fake clock's start, epoch seconds


def base(status: str = ACTIVE, workers: int = 2, **extra) -> StormBase:
    return StormBase(storm_name="wc", launch_time_secs=1, status=status,
                     num_workers=workers, **extra)


# -- the rules (no ZooKeeper) ------------------------------------------------------------------

def test_begin_without_a_wait_only_changes_the_count():
    assert rebalancing.begin(base(), 3, 0, NOW) == base(workers=3)
    assert rebalancing.begin(base(), 2, 0, NOW) is None  # nothing to write


@pytest.mark.parametrize("previous", [ACTIVE, INACTIVE])
def test_begin_with_a_wait_goes_rebalancing_and_remembers(previous):
    got = rebalancing.begin(base(previous), 5, 30, NOW)
    # the count applies only when the wait ends; the deadline is never early
    assert got == base(REBALANCING, prev_status=previous, rebalance_num_workers=5,
                       rebalance_at_secs=1_700_000_031)
    # the same count with a wait still goes REBALANCING, as in Storm
    assert rebalancing.begin(base(previous), 2, 1, NOW).status == REBALANCING


def test_due_and_finish():
    pending = rebalancing.begin(base(INACTIVE), 4, 10, NOW)
    assert not rebalancing.is_due(pending, NOW + 10)  # rounded up to a whole second
    assert rebalancing.is_due(pending, NOW + 10.75)
    assert rebalancing.finish(pending) == base(INACTIVE, workers=4)
    assert not rebalancing.is_due(base(), NOW + 1e9)  # not rebalancing at all


def test_a_damaged_rebalancing_record_is_never_stuck():
    """No deadline, no count, no previous status (hand-written, say): due at once, and
    completed to ACTIVE with the count it has."""
    damaged = base(REBALANCING, workers=3)
    assert rebalancing.is_due(damaged, NOW)
    assert rebalancing.finish(damaged) == base(ACTIVE, workers=3)
    assert rebalancing.finish(base(REBALANCING, prev_status=KILLED)).status == ACTIVE


def test_refusal_names_the_status_and_what_is_allowed():
    pending = rebalancing.begin(base(), 1, 30, NOW)
    assert rebalancing.refusal("wc", base(), "activate", NOW) is None
    assert rebalancing.refusal("wc", pending, "activate", NOW + 10) == (
        "topology 'wc' is REBALANCING (to 1 worker, back to ACTIVE in 21s): activate is "
        "refused until the rebalance completes; kill is allowed")


def test_seconds_until_next_ignores_past_deadlines():
    soon = rebalancing.begin(base(), 1, 5, NOW)
    later = rebalancing.begin(base(), 1, 50, NOW)
    assert rebalancing.seconds_until_next([base(), later, soon], NOW) == pytest.approx(5.75)
    # a deadline passed but not yet completed must not wake the duty loop in a spin
    assert rebalancing.seconds_until_next([soon], NOW + 6) is None


def test_storm_base_reads_records_with_and_without_the_new_fields():
    old = json.dumps({"format": 1, "storm_name": "wc", "launch_time_secs": 1,
                      "status": "ACTIVE", "num_workers": 2}).encode()
    assert StormBase.decode(old) == base()
    pending = rebalancing.begin(base(), 3, 30, NOW)
    assert StormBase.decode(pending.encode()) == pending
    with pytest.raises(RecordError, match="field 'rebalance_at_secs' must be an integer"):
        StormBase.decode(json.dumps({**json.loads(pending.encode()),
                                     "rebalance_at_secs": "soon"}).encode())


def test_metrics_report_the_rebalancing_status():
    assert REBALANCING in metrics.TOPOLOGY_STATUSES


# -- on a real nimbus ---------------------------------------------------------------------------

class FakeClock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def cluster(zk_server, zk_root, tmp_path, make_zk):
    """(daemon, conf, storm.yaml path, fake clock); two supervisors with two slots each
    are registered (sup-a, sup-b)."""
    conf_file = idle_nimbus_conf(zk_server, zk_root, tmp_path)
    conf = load_config(str(conf_file))
    daemon = NimbusDaemon(conf)
    clock = FakeClock()
    daemon.master.lifecycle.clock = clock
    daemon.start()
    try:
        wait_for(daemon.master.elector.is_leader, 30, "the nimbus to lead")
        sup_zk = make_zk()
        for supervisor_id in ("sup-a", "sup-b"):
            sup_zk.create(daemon.master.state.path("supervisors", supervisor_id), SupervisorInfo(
                time_secs=1, hostname=f"host-{supervisor_id[-1]}", meta=[6700, 6701],
                version="sup-1.0").encode(), ephemeral=True)
        yield daemon, conf, conf_file, clock
    finally:
        daemon.stop()


def submit(conf, name: str = "wc", active: bool = True) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo("topology.yaml")
        info.size = len(PROCESS_YAML)
        tf.addfile(info, io.BytesIO(PROCESS_YAML.encode()))
    return NimbusClient(conf).submit(name, buf.getvalue(), {}, active=active)


def placed(daemon: NimbusDaemon, topology_id: str) -> list[str]:
    return sorted(daemon.master.state.assignment_info(topology_id).executor_node_port)


def summary_status(daemon: NimbusDaemon) -> dict[str, tuple[str, int]]:
    with connect(daemon.address) as client:
        return {t.name: (t.status, t.num_workers) for t in client.getClusterInfo().topologies}


def cli(conf_file, *args: str):
    return CliRunner().invoke(main, [*args, "--config", str(conf_file)])


@ZOOKEEPER
def test_rebalance_with_a_wait_deactivates_then_completes(cluster):
    daemon, conf, conf_file, clock = cluster
    topology_id = submit(conf)
    daemon.master.run_cycle()
    assert placed(daemon, topology_id) == ["worker-0"]

    done = cli(conf_file, "rebalance", "wc", "-n", "3", "--wait", "30")
    assert (done.exit_code, done.output) == (
        0, "rebalancing wc to 3 workers in 30s (REBALANCING, deactivated, until then)\n")
    stored = daemon.master.state.storm_base(topology_id)
    assert (stored.status, stored.num_workers, stored.prev_status,
            stored.rebalance_num_workers, stored.rebalance_at_secs) == (
        REBALANCING, 1, ACTIVE, 3, 1_700_000_031)
    daemon.master.run_cycle()
    assert placed(daemon, topology_id) == [], "deactivated: its worker stops"
    # every place that shows a status shows it
    # The summary is refreshed after a pass that moved work, within a bounded wait: on a
    # loaded machine the refresh may come a moment after the pass returned.
    wait_for(lambda: summary_status(daemon) == {"wc": (REBALANCING, 0)}, 30,
             "the summary to show the stopped worker")
    with connect(daemon.address) as client:
        assert client.getTopologyInfo(topology_id).status == REBALANCING
    listed = cli(conf_file, "list")
    assert listed.exit_code == 0, listed.output
    assert listed.output.splitlines()[1].split()[:2] == ["wc", REBALANCING]
    # the duty loop runs when the wait ends, not a whole period later
    assert daemon.master.lifecycle.next_rebalance_s() == pytest.approx(30.75)

    clock.now += 30  # 30 s, but the deadline is rounded up to a whole second
    daemon.master.run_cycle()
    assert daemon.master.state.storm_base(topology_id).status == REBALANCING
    assert placed(daemon, topology_id) == []

    clock.now += 0.75
    daemon.master.run_cycle()
    assert daemon.master.state.storm_base(topology_id) == StormBase(
        storm_name="wc", launch_time_secs=stored.launch_time_secs, status=ACTIVE,
        num_workers=3, owner=stored.owner, submission_token=stored.submission_token)
    assert placed(daemon, topology_id) == ["worker-0", "worker-1", "worker-2"]
    wait_for(lambda: summary_status(daemon) == {"wc": (ACTIVE, 3)}, 30,
             "the summary to show the rebalanced topology")
    assert daemon.master.lifecycle.next_rebalance_s() is None


@ZOOKEEPER
def test_an_inactive_topology_returns_inactive(cluster):
    daemon, conf, _, clock = cluster
    topology_id = submit(conf, active=False)
    NimbusClient(conf).rebalance("wc", 2, 5)
    assert daemon.master.state.storm_base(topology_id).status == REBALANCING
    # the duty loop (period 3600 s here) runs when the wait ends; the view may lag
    wait_for(lambda: daemon.master.duties.due_in_s() == pytest.approx(5.8), 10,
             "the duty loop to wait for the deadline")
    clock.now += 5.75
    daemon.master.run_cycle()
    stored = daemon.master.state.storm_base(topology_id)
    assert (stored.status, stored.num_workers) == (INACTIVE, 2)
    assert placed(daemon, topology_id) == []


@ZOOKEEPER
def test_without_a_wait_nothing_changes_but_the_count(cluster):
    daemon, conf, conf_file, _ = cluster
    topology_id = submit(conf)
    done = cli(conf_file, "rebalance", "wc", "-n", "2", "--wait", "0")
    assert (done.exit_code, done.output) == (0, "rebalanced wc to 2 workers\n")
    stored = daemon.master.state.storm_base(topology_id)
    assert (stored.status, stored.num_workers, stored.rebalance_at_secs) == (ACTIVE, 2, 0)


@ZOOKEEPER
def test_only_kill_is_allowed_while_rebalancing(cluster):
    daemon, conf, conf_file, clock = cluster
    topology_id = submit(conf)
    client = NimbusClient(conf)
    client.rebalance("wc", 2, 60)
    refusal = ("topology 'wc' is REBALANCING (to 2 workers, back to ACTIVE in 61s): {} is "
               "refused until the rebalance completes; kill is allowed")
    with connect(daemon.address) as thrift:
        with pytest.raises(storm.InvalidTopologyException) as refused:
            thrift.rebalance("wc", storm.RebalanceOptions(num_workers=3, wait_secs=5))
        assert refused.value.msg == refusal.format("rebalance")
        # Storm's IDL declares no InvalidTopologyException for these two: the refusal
        # comes as an internal error that carries the message (Storm's does too).
        for action in ("activate", "deactivate"):
            with pytest.raises(TApplicationException) as failed:
                getattr(thrift, action)("wc")
            assert refusal.format(action) in failed.value.message
    done = cli(conf_file, "deactivate", "wc")
    assert done.exit_code == 1 and refusal.format("deactivate") in done.output, done.output
    assert daemon.master.state.storm_base(topology_id).status == REBALANCING

    client.kill("wc", 60)
    stored = daemon.master.state.storm_base(topology_id)
    assert (stored.status, stored.prev_status, stored.rebalance_at_secs) == (KILLED, "", 0)
    clock.now += 3600  # the old deadline passing changes nothing
    daemon.master.run_cycle()
    assert daemon.master.state.storm_base(topology_id).status == KILLED


@ZOOKEEPER
def test_a_deadline_set_by_another_leader_is_completed(cluster):
    """The deadline is in ZooKeeper: whoever leads completes it, at once if it passed
    while nobody led (a failover in the middle)."""
    daemon, conf, _, clock = cluster
    topology_id = submit(conf)
    stored, version = daemon.master.state.storm_base_versioned(topology_id)
    other = rebalancing.begin(stored, 2, 10, clock.now - 60)  # set a minute ago
    daemon.master.state.zk.set(daemon.master.state.storm_path(topology_id), other.encode(), version)
    wait_for(lambda: daemon.master.view.storm_base(topology_id).status == REBALANCING, 10,
             "the leader's view to see it")
    daemon.master.run_cycle()
    stored = daemon.master.state.storm_base(topology_id)
    assert (stored.status, stored.num_workers) == (ACTIVE, 2)
    assert placed(daemon, topology_id) == ["worker-0", "worker-1"]


@ZOOKEEPER
def test_the_ui_shows_rebalancing_and_refuses_all_but_kill(make_zk, zk_server, zk_root):
    state = StormClusterState(make_zk(), zk_root)
    state.setup()
    (tid,) = write_cluster(state, topologies=1)
    stored, version = state.storm_base_versioned(tid)
    state.zk.set(state.storm_path(tid), rebalancing.begin(stored, 2, 60, NOW).encode(),
                 version)
    ui = Harness(conf_for(zk_server, zk_root), state)
    try:
        wait_for(lambda: ui.client.get("/api/v1/topology/summary").json["topologies"][0][
            "status"] == REBALANCING, 10, "REBALANCING in the summary")
        assert ui.client.get(f"/api/v1/topology/{tid}").json["status"] == REBALANCING
        for action in ("activate", "deactivate", "rebalance/0"):
            answer = ui.client.post(f"/api/v1/topology/{tid}/{action}",
                                    json={"rebalanceOptions": {"numWorkers": 3}})
            assert answer.status_code == 409, answer.text
            assert "REBALANCING" in answer.json["errorMessage"]
        assert ui.leader.calls == []
        assert ui.client.post(f"/api/v1/topology/{tid}/kill/0").status_code == 200
        assert ui.leader.calls == [("kill", "topo0", 0)]
    finally:
        ui.close()


@ZOOKEEPER
@pytest.mark.parametrize("message", [
    "topology 'x' is REBALANCING (to 2 workers, back to ACTIVE in 5s): rebalance is "
    "refused until the rebalance completes; kill is allowed",
])
def test_a_refusal_raced_in_the_ui_is_409(make_zk, zk_server, zk_root, message):
    """The topology went REBALANCING after the UI looked: the leader's refusal is 409
    whether it comes as InvalidTopologyException (rebalance) or as an internal error
    (activate, deactivate)."""
    state = StormClusterState(make_zk(), zk_root)
    state.setup()
    (tid,) = write_cluster(state, topologies=1)
    ui = Harness(conf_for(zk_server, zk_root), state)
    try:
        ui.leader.fail = storm.InvalidTopologyException(msg=message)
        answer = ui.client.post(f"/api/v1/topology/{tid}/rebalance/0",
                                json={"rebalanceOptions": {"numWorkers": 3}})
        assert answer.status_code == 409, answer.text
        ui.leader.fail = TApplicationException(
            TApplicationException.INTERNAL_ERROR,
            f"Internal error processing activate: InvalidTopologyException: {message}")
        answer = ui.client.post(f"/api/v1/topology/{tid}/activate")
        assert answer.status_code == 409, answer.text
    finally:
        ui.close()
