"""The leader side of upgrades (nimbus/master/upgrades.py), against a real ZooKeeper: the
versions written and listed, the switch applied to the Assignment (all, and rolling step
by step), the automatic rollback (a failure before the first commit, a deadline), the
end states, the pruning, the refusals, the orphan removal, the code check and history.

No supervisor runs: what supervisors say of their workers is written into ZooKeeper as a
supervisor writes it (SupervisorInfo.workers entries with "version", "committed",
"failures"), and the leader's duty (Upgrades.advance) is called by the test.
"""

from __future__ import annotations

import io
import json
import logging
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from nimbus.config import ConfigError, load_config
from nimbus.distribution.distributors import CodeDistributor
from nimbus.distribution.hookspecs import hookimpl
from nimbus.distribution.local_code import LocalCodeStore
from nimbus.master.code_sync import CodeSync
from nimbus.master.lifecycle import (
    InvalidTopologyError,
    TopologyExistsError,
    TopologyLifecycle,
    TopologyNotFoundError,
)
from nimbus.master.upgrades import (
    AUTOMATIC,
    TICK_S,
    Upgrades,
    WorkerFacts,
    completed_versions,
    worker_facts,
)
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.cluster_view import ClusterView
from nimbus.state.code_versions import CodeVersions
from nimbus.state.records import INACTIVE, SupervisorInfo

ZOOKEEPER = pytest.mark.zookeeper
NOW = 1_700_000_000
SUPERVISORS = ("sup-a", "sup-b")
CONF = {"topology.workers": 2, "topology.spark.checkpoint.dir": "/data/checkpoints",
        "topology.submitter.user": "alice"}


# -- pure logic ------------------------------------------------------------------------------

def entry(version: int, state: str, error: str = "") -> dict:
    return {"version": version, "sha256": {"stormjar.jar": f"sha{version}"},
            "submitter": "alice", "created_secs": version, "state": state, "error": error,
            "conf": {}}


def switch(kind: str, frm: int, to: int) -> dict:
    return {"kind": kind, "from": frm, "to": to, "strategy": "all", "started_secs": 1,
            "deadline_secs": 2, "by": "bob", "switched": []}


def states(versions: CodeVersions) -> dict[int, str]:
    return {e["version"]: e["state"] for e in versions.versions}


@pytest.mark.parametrize("before, running, sw, after", [
    # an upgrade completes: the new one runs, the old one is the rollback target, and the
    # target before it becomes old
    ({1: "previous", 2: "running", 3: "switching"}, 2, ("upgrade", 2, 3),
     {1: "old", 2: "previous", 3: "running"}),
    # an automatic rollback completes: the failed version stays failed, what ran before
    # the running one is still its rollback target
    ({1: "previous", 2: "switching", 3: "failed"}, 2, ("rollback", 3, 2),
     {1: "previous", 2: "running", 3: "failed"}),
    # a rollback by hand: the version rolled back from says so
    ({1: "switching", 2: "running"}, 2, ("rollback", 2, 1), {1: "running", 2: "rolled back"}),
    # a rollback by hand to an older version during an upgrade's switch: what ran before
    # is the rollback target again
    ({1: "switching", 2: "running", 3: "rolled back"}, 2, ("rollback", 3, 1),
     {1: "running", 2: "previous", 3: "rolled back"}),
])
def test_completed_states(before, running, sw, after):
    versions = CodeVersions(versions=[entry(v, s) for v, s in before.items()],
                            running=running, switch=switch(*sw))
    done = completed_versions(versions)
    assert (states(done), done.running, done.switch) == (after, sw[2], {})


def test_worker_facts_read_only_well_formed_entries_of_the_topology():
    info = SupervisorInfo(time_secs=1, hostname="h", workers={
        "6700": {"topology_id": "t-1-1", "version": 2, "committed": True, "failures": 0,
                 "last_error": ""},
        "6701": {"topology_id": "t-1-1", "version": 2, "committed": False, "failures": 3,
                 "last_error": "ValueError: boom\n  at line 3"},
        "6702": {"topology_id": "t-1-1", "state": "running"},          # an earlier release
        "6703": {"topology_id": "t-1-1", "version": True, "committed": True},  # malformed
    })
    assert worker_facts(info, "t-1-1", 6700) == WorkerFacts(2, True, 0, "")
    assert worker_facts(info, "t-1-1", 6701) == WorkerFacts(2, False, 3, "ValueError: boom")
    assert [worker_facts(info, "t-1-1", p) for p in (6702, 6703, 6704)] == [None] * 3
    assert worker_facts(info, "other-1-1", 6700) is None


def test_the_two_keys_are_declared_with_their_defaults():
    conf = load_config()
    assert (conf["topology.code.versions.kept"], conf["topology.upgrade.timeout.secs"]) == (
        3, 300)
    with pytest.raises(ConfigError, match="'topology.code.versions.kept' must be at least 1"):
        load_config(overrides={"topology.code.versions.kept": 0})


# -- on a real ZooKeeper ---------------------------------------------------------------------

def make_bundle(path: Path, kind: str = "pipeline", text: str = "v1") -> Path:
    name = "topology.py" if kind == "pipeline" else "topology.yaml"
    data = (f"# {text}\n" if kind == "pipeline" else f'command: ["echo", "{text}"]\n').encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())
    return path


class Clock:
    def __init__(self) -> None:
        self.now = float(NOW)

    def __call__(self) -> float:
        return self.now


class Elector:
    def __init__(self, fence):
        self._fence = fence

    def fence(self):
        return self._fence

    def is_leader(self):
        return True


def distributor_class():
    """A fresh distributor class: replica counts set by the test (1 by default), and
    the removals it was asked for."""

    class Recording:
        name = "recording"
        counts: dict[str, int] = {}
        cleaned: list[str] = []
        shared_deleted: list[str] = []

        @hookimpl
        def prepare(self, conf, context):
            pass

        @hookimpl
        def upload(self, dir_path, topology_id):
            meta = Path(dir_path).parent / f"{topology_id}.meta"
            meta.write_bytes(topology_id.encode())
            return meta

        @hookimpl
        def download(self, dest_dir, topology_id, metafile):
            raise RuntimeError("not expected in this test")

        @hookimpl
        def get_replication_count(self, topology_id):
            return Recording.counts.get(topology_id, 1)

        @hookimpl
        def cleanup(self, topology_id):
            Recording.cleaned.append(topology_id)

        @hookimpl
        def delete_shared(self, topology_id):
            Recording.shared_deleted.append(topology_id)

        @hookimpl
        def close(self, conf):
            pass

    return Recording


class Harness:
    """A leader's lifecycle and upgrades on the test's ZooKeeper root, a view on a
    session of its own, and supervisors whose heartbeats the test writes."""

    def __init__(self, writer: StormClusterState, fence, view: ClusterView, tmp_path: Path):
        self.state, self.fence, self.view, self.tmp = writer, fence, view, tmp_path
        self.clock = Clock()
        self.dist = distributor_class()
        self.store = LocalCodeStore(tmp_path / "local")
        self.lifecycle = TopologyLifecycle(
            load_config(), writer, self.store, CodeDistributor(self.dist), Elector(fence),
            "nimbus-1:6627", view=view, clock=self.clock)
        self.upgrades = Upgrades(self.lifecycle, view, clock=self.clock)
        self.woken = 0
        self.upgrades.add_wake_listener(self._wake)
        self.workers: dict[str, dict[str, dict]] = {s: {} for s in SUPERVISORS}
        for supervisor_id in SUPERVISORS:
            self._write_supervisor(supervisor_id)
        self.bundles = 0

    def _wake(self) -> None:
        self.woken += 1

    def bundle(self, kind: str = "pipeline") -> Path:
        self.bundles += 1
        return make_bundle(self.tmp / f"bundle-{self.bundles}.tar.gz", kind,
                           f"v{self.bundles}")

    def submit(self, name: str = "wc", conf: dict | None = None, kind: str = "pipeline",
               workers: int = 2) -> str:
        topology_id = self.lifecycle.submit(name, self.bundle(kind), json.dumps(
            {**CONF, "topology.workers": workers, **(conf or {})}))
        self.place(topology_id, workers)
        return topology_id

    def place(self, topology_id: str, workers: int) -> None:
        """Place the workers as the scheduler would: worker-i on alternate supervisors."""
        slots = {f"worker-{i}": [SUPERVISORS[i % 2], 6700 + i // 2] for i in range(workers)}
        assignment = self.state.assignment_info(topology_id)
        self.state.set_assignment(self.fence, topology_id, replace(
            assignment, executor_node_port=slots,
            node_host={s: f"host-{s[-1]}" for s in SUPERVISORS}))

    def slot(self, topology_id: str, executor: str) -> tuple[str, int]:
        supervisor_id, port = self.state.assignment_info(topology_id).executor_node_port[
            executor]
        return supervisor_id, port

    def beat(self, topology_id: str, executor: str, version: int, committed: bool = False,
             failures: int = 0, error: str = "", state: str = "running") -> None:
        """The supervisor of ``executor``'s slot says what its worker runs."""
        supervisor_id, port = self.slot(topology_id, executor)
        self.workers[supervisor_id][str(port)] = {
            "topology_id": topology_id, "state": state, "restarts": failures,
            "backoff_secs": 0, "last_error": error, "version": version,
            "committed": committed, "failures": failures}
        self._write_supervisor(supervisor_id)

    def _write_supervisor(self, supervisor_id: str) -> None:
        info = SupervisorInfo(time_secs=1, hostname=f"host-{supervisor_id[-1]}",
                              meta=[6700, 6701], workers=self.workers[supervisor_id])
        self.state.supervisor_heartbeat(supervisor_id, info)

    def versions(self, topology_id: str) -> CodeVersions:
        got = self.state.code_versions(topology_id)
        assert got is not None
        return got[0]

    def advance(self) -> bool:
        # The duty reads the view, a ZooKeeper client of its own: every write this test
        # made before must be in it first (else a heartbeat just written may be missed).
        self.view.barrier()
        return self.upgrades.advance()

    def upgrade(self, name: str = "wc", conf: dict | None = None, strategy: str = "all",
                kind: str = "pipeline", by: str = "bob") -> tuple[str, int]:
        return self.upgrades.upgrade(name, self.bundle(kind), json.dumps(conf or {}),
                                     strategy, by=by)

    def switch_all(self, topology_id: str, version: int, workers: int = 2) -> None:
        """Every worker runs ``version`` and committed; the switch completes."""
        self.advance()
        for i in range(workers):
            self.beat(topology_id, f"worker-{i}", version, committed=True)
        self.advance()
        assert not self.versions(topology_id).switch

    def code_node(self, code_key: str) -> bool:
        return self.state.zk.exists(self.state.code_path(code_key)) is not None


@pytest.fixture
def harness(make_zk, zk_root, writer, fence, tmp_path):
    view = ClusterView(StormClusterState(make_zk(), zk_root), name="upgrades-test")
    view.start()
    try:
        yield Harness(writer, fence, view, tmp_path)
    finally:
        view.close()


def upgrade_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "nimbus.master.upgrades"]


@ZOOKEEPER
def test_an_upgrade_writes_a_version_and_lists_it(harness, caplog):
    caplog.set_level(logging.INFO, "nimbus.master.upgrades")
    h = harness
    topology_id = h.submit()
    before = h.state.assignment_info(topology_id)
    assert h.upgrades.due_in_s() is None
    assert h.upgrades.running_key(topology_id) == topology_id
    assert h.upgrade(conf={"my.setting": 7}) == (topology_id, 2)
    key = f"{topology_id}.v2"
    # distributed and replicated as a submission's code, under its own key
    assert h.code_node(key) and h.state.code_meta(key).metafile == key.encode()
    stored = json.loads((h.store.path(key) / "stormconf.json").read_text())
    assert stored == {**CONF, "my.setting": 7}
    assert (h.store.path(key) / "stormjar.jar").read_bytes() == \
        (h.tmp / "bundle-2.tar.gz").read_bytes()
    versions = h.versions(topology_id)
    assert versions.running == 1
    assert [(e["version"], e["state"], e["submitter"], e["error"])
            for e in versions.versions] == [(1, "running", "alice", ""),
                                             (2, "switching", "bob", "")]
    assert versions.entry(1)["sha256"] == before.code_sha256
    assert versions.entry(2)["sha256"] == h.lifecycle.code_sha256(key)
    assert versions.entry(2)["created_secs"] == NOW
    assert versions.switch == {"kind": "upgrade", "from": 1, "to": 2, "strategy": "all",
                               "started_secs": NOW, "deadline_secs": NOW + 300,
                               "by": "bob", "switched": []}
    # nothing runs it before the duty applies it; the duties were woken for that
    assert h.state.assignment_info(topology_id) == before
    assert h.woken == 1
    assert h.upgrades.pending_keys() == set() and h.lifecycle.pending_ids() == set()
    assert upgrade_lines(caplog) == [
        f"upgrading wc to version 2 (all): {key}, 1 replicas, rolled back unless every "
        "worker runs it and committed within 300s"]
    # a switch under way makes the duties look again about every second
    h.advance()
    assert 0 < h.upgrades.due_in_s() <= TICK_S


@ZOOKEEPER
def test_strategy_all_switches_every_worker_then_completes(harness, caplog):
    caplog.set_level(logging.INFO, "nimbus.master.upgrades")
    h = harness
    topology_id = h.submit()
    _, version = h.upgrade()
    sha2 = h.versions(topology_id).entry(2)["sha256"]
    assert h.advance() is True
    assignment = h.state.assignment_info(topology_id)
    assert (assignment.code_version, assignment.code_sha256, assignment.worker_versions,
            assignment.version_sha256) == (2, sha2, {}, {})
    assert assignment.code_for("worker-1") == (2, sha2)
    assert h.advance() is False, "nothing new: nothing written"
    # worker-0 still runs version 1; then it runs version 2 but has not committed yet
    h.beat(topology_id, "worker-0", 1, committed=True)
    h.beat(topology_id, "worker-0", 2)
    assert h.advance() is False
    h.beat(topology_id, "worker-0", 2, committed=True)
    assert h.advance() is True
    assert h.versions(topology_id).switch["switched"] == ["worker-0"]
    h.beat(topology_id, "worker-1", 2, committed=True)
    assert h.advance() is True
    versions = h.versions(topology_id)
    assert (versions.running, versions.switch, states(versions)) == (
        2, {}, {1: "previous", 2: "running"})
    assignment = h.state.assignment_info(topology_id)
    assert (assignment.code_version, assignment.code_sha256, assignment.worker_versions,
            assignment.version_sha256) == (2, sha2, {}, {})
    h.view.barrier()   # due_in_s and running_key read the view: the switch's end first
    assert h.upgrades.due_in_s() is None
    assert h.upgrades.running_key(topology_id) == f"{topology_id}.v2"
    assert upgrade_lines(caplog)[1:] == [
        "wc: every worker assigned version 2 (upgrade)",
        "worker-0 of wc runs version 2 and committed (1 of 2 switched)",
        "worker-1 of wc runs version 2 and committed (2 of 2 switched)",
        "wc upgraded to version 2"]


@ZOOKEEPER
def test_strategy_rolling_switches_one_worker_at_a_time(harness, caplog):
    caplog.set_level(logging.INFO, "nimbus.master.upgrades")
    h = harness
    topology_id = h.submit(workers=3)
    h.upgrade(strategy="rolling")
    versions = h.versions(topology_id)
    sha1, sha2 = versions.entry(1)["sha256"], versions.entry(2)["sha256"]

    def assigned() -> dict[str, int]:
        a = h.state.assignment_info(topology_id)
        assert a.code_version == 2 and a.version_sha256 == {"1": sha1}
        return {e: a.code_for(e)[0] for e in sorted(a.executor_node_port)}

    h.advance()
    assert assigned() == {"worker-0": 2, "worker-1": 1, "worker-2": 1}
    assert h.state.assignment_info(topology_id).code_for("worker-1") == (1, sha1)
    h.beat(topology_id, "worker-0", 2)  # started, no commit yet: nobody else moves
    h.advance()
    assert assigned() == {"worker-0": 2, "worker-1": 1, "worker-2": 1}
    h.beat(topology_id, "worker-0", 2, committed=True)
    h.advance()
    assert assigned() == {"worker-0": 2, "worker-1": 2, "worker-2": 1}
    assert h.versions(topology_id).switch["switched"] == ["worker-0"]
    h.beat(topology_id, "worker-1", 2, committed=True)
    h.advance()
    assert assigned() == {"worker-0": 2, "worker-1": 2, "worker-2": 2}
    h.beat(topology_id, "worker-2", 2, committed=True)
    h.advance()
    assignment = h.state.assignment_info(topology_id)
    assert (assignment.code_version, assignment.code_sha256, assignment.worker_versions,
            assignment.version_sha256) == (2, sha2, {}, {})
    assert states(h.versions(topology_id)) == {1: "previous", 2: "running"}
    assert [line for line in upgrade_lines(caplog) if "assigned" in line] == [
        "wc: worker-0 assigned version 2 (upgrade, rolling), the others stay on version 1",
        "wc: worker-0, worker-1 assigned version 2 (upgrade, rolling), the others stay on "
        "version 1",
        "wc: every worker assigned version 2 (upgrade)"]


@ZOOKEEPER
def test_a_failure_before_the_first_commit_rolls_back_and_records_the_error(harness,
                                                                           caplog):
    caplog.set_level(logging.INFO, "nimbus.master.upgrades")
    h = harness
    topology_id = h.submit()
    h.upgrade()
    h.advance()
    h.beat(topology_id, "worker-0", 2, committed=True)
    h.beat(topology_id, "worker-1", 2, failures=1,
           error="build() raised ValueError: no such column 'x'\nTraceback ...")
    h.clock.now += 10
    assert h.advance() is True
    error = ("worker-1 on host-b:6700 exited before its first commit (1 time): build() "
             "raised ValueError: no such column 'x'")
    versions = h.versions(topology_id)
    assert (versions.entry(2)["state"], versions.entry(2)["error"]) == ("failed", error)
    assert versions.switch == {"kind": "rollback", "from": 2, "to": 1, "strategy": "all",
                               "started_secs": NOW + 10, "deadline_secs": NOW + 310,
                               "by": AUTOMATIC, "switched": []}
    assert versions.running == 1 and versions.entry(1)["state"] == "switching"
    assignment = h.state.assignment_info(topology_id)
    assert (assignment.code_version, assignment.code_sha256, assignment.worker_versions) == (
        1, versions.entry(1)["sha256"], {})
    [reported] = h.state.errors(topology_id, "__upgrade")
    assert reported.error == (f"version 2 failed before its first commit: {error}; "
                              "rolling back to version 1")
    assert reported.host == "nimbus-1"
    assert f"version 2 of wc failed before its first commit: {error}; rolling back to 1" \
        in upgrade_lines(caplog)
    # the workers are back on version 1 and committed: the rollback completes
    h.beat(topology_id, "worker-0", 1, committed=True)
    h.beat(topology_id, "worker-1", 1, committed=True)
    assert h.advance() is True
    versions = h.versions(topology_id)
    assert (versions.running, versions.switch, states(versions)) == (
        1, {}, {1: "running", 2: "failed"})
    assert versions.entry(2)["error"] == error
    assert upgrade_lines(caplog)[-1] == "wc rolled back to version 1"


@ZOOKEEPER
def test_a_deadline_that_passes_rolls_back(harness):
    h = harness
    topology_id = h.submit(conf={"topology.upgrade.timeout.secs": 60})
    h.upgrade()
    h.advance()
    h.beat(topology_id, "worker-0", 2, committed=True)
    h.clock.now += 59
    h.advance()
    assert h.versions(topology_id).switch["kind"] == "upgrade"
    h.clock.now += 1
    h.advance()
    versions = h.versions(topology_id)
    assert versions.entry(2)["error"] == ("not every worker ran version 2 and committed "
                                          "within 60s (topology.upgrade.timeout.secs): 1 "
                                          "of 2 did")
    assert (versions.entry(2)["state"], versions.switch["kind"], versions.switch["to"]) == (
        "failed", "rollback", 1)


@ZOOKEEPER
def test_at_the_deadline_a_worker_running_without_input_counts_as_switched(harness):
    h = harness
    topology_id = h.submit(conf={"topology.upgrade.timeout.secs": 60})
    h.upgrade()
    h.advance()
    h.beat(topology_id, "worker-0", 2, committed=True)
    h.beat(topology_id, "worker-1", 2)   # running, nothing committed: no input
    h.clock.now += 60
    h.advance()
    versions = h.versions(topology_id)
    assert (versions.running, versions.switch, states(versions)) == (
        2, {}, {1: "previous", 2: "running"})


@ZOOKEEPER
def test_at_the_deadline_a_worker_still_starting_fails_the_switch(harness):
    h = harness
    topology_id = h.submit(conf={"topology.upgrade.timeout.secs": 60})
    h.upgrade()
    h.advance()
    h.beat(topology_id, "worker-0", 2)
    h.beat(topology_id, "worker-1", 2, state="starting")
    h.clock.now += 60
    h.advance()
    versions = h.versions(topology_id)
    assert (versions.entry(2)["state"], versions.switch["kind"]) == ("failed", "rollback")


@ZOOKEEPER
def test_a_rolling_switch_of_idle_workers_gives_each_next_worker_its_own_timeout(harness):
    h = harness
    topology_id = h.submit(workers=3, conf={"topology.upgrade.timeout.secs": 60})
    h.upgrade(strategy="rolling")
    h.advance()
    h.beat(topology_id, "worker-0", 2)
    h.clock.now += 60
    h.advance()
    switch = h.versions(topology_id).switch
    assert (switch["switched"], switch["deadline_secs"]) == (["worker-0"], NOW + 120)
    assert h.state.assignment_info(topology_id).code_for("worker-1")[0] == 2
    h.beat(topology_id, "worker-1", 2, committed=True)
    h.advance()
    assert h.versions(topology_id).switch["switched"] == ["worker-0", "worker-1"]


@ZOOKEEPER
def test_a_rollback_that_fails_is_not_rolled_back_again(harness, caplog):
    caplog.set_level(logging.INFO, "nimbus.master.upgrades")
    h = harness
    topology_id = h.submit()
    h.upgrade()
    h.advance()
    h.beat(topology_id, "worker-0", 2, failures=2, error="Spark refused the checkpoint")
    h.advance()
    assert h.versions(topology_id).switch["kind"] == "rollback"
    h.beat(topology_id, "worker-0", 1, failures=1, error="crash")
    h.advance()
    versions = h.versions(topology_id)
    assert (versions.running, versions.switch, states(versions)) == (
        1, {}, {1: "failed", 2: "failed"})
    assert versions.entry(1)["error"] == ("rollback to it failed: worker-0 on host-a:6700 "
                                          "exited before its first commit (1 time): crash")
    assert h.state.assignment_info(topology_id).code_version == 1
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage().split(":")[0] for r in errors] == [
        "the rollback of wc to version 1 failed"]
    assert [e.error.split(":")[0] for e in h.state.errors(topology_id, "__upgrade")] == [
        "version 2 failed before its first commit", "rollback to version 1 failed"]


@ZOOKEEPER
def test_old_versions_are_pruned_but_never_the_running_one_or_the_rollback_target(harness):
    h = harness
    topology_id = h.submit(conf={"topology.code.versions.kept": 2})
    h.upgrade()
    h.switch_all(topology_id, 2)
    assert states(h.versions(topology_id)) == {1: "previous", 2: "running"}
    h.upgrade()
    h.switch_all(topology_id, 3)
    # version 1 went: its code node, the shared store, this host's copies
    assert states(h.versions(topology_id)) == {2: "previous", 3: "running"}
    assert not h.code_node(topology_id) and not h.store.has(topology_id)
    assert (h.dist.cleaned, h.dist.shared_deleted) == ([topology_id], [topology_id])
    # version 4 fails: version 2, the rollback target, is kept beside the newest two
    h.upgrade()
    h.advance()
    h.beat(topology_id, "worker-0", 4, failures=1)
    h.advance()
    h.switch_all(topology_id, 3)
    assert states(h.versions(topology_id)) == {2: "previous", 3: "running", 4: "failed"}
    # rolled back by hand to version 2: it is older than the newest two, and runs: kept
    assert h.upgrades.rollback("wc", by="carol") == (topology_id, 2)
    h.switch_all(topology_id, 2)
    versions = h.versions(topology_id)
    assert (versions.running, states(versions)) == (
        2, {2: "running", 3: "rolled back", 4: "failed"})
    assert all(h.code_node(f"{topology_id}.v{n}") for n in (2, 3, 4))
    assert h.dist.cleaned == [topology_id]
    # one more upgrade: the newest two (5, 4) and the rollback target 2 stay; 3 goes
    h.upgrade()
    h.switch_all(topology_id, 5)
    assert states(h.versions(topology_id)) == {2: "previous", 4: "failed", 5: "running"}
    assert not h.code_node(f"{topology_id}.v3") and not h.store.has(f"{topology_id}.v3")
    assert h.dist.cleaned == [topology_id, f"{topology_id}.v3"]


@ZOOKEEPER
def test_a_second_upgrade_and_a_rebalance_are_refused_during_a_switch(harness):
    h = harness
    topology_id = h.submit()
    h.upgrade()
    refusal = ("topology 'wc' is already switching from version 1 to 2 (upgrade, all, "
               "started by bob): wait for it to end (`nimbus-ha history wc`) or roll it "
               "back (`nimbus-ha rollback wc`)")
    with pytest.raises(InvalidTopologyError) as refused:
        h.upgrade()
    assert str(refused.value) == refusal
    assert not h.code_node(f"{topology_id}.v3") and not h.store.has(f"{topology_id}.v3")
    with pytest.raises(InvalidTopologyError) as refused:
        h.lifecycle.rebalance("wc", num_workers=3)
    assert str(refused.value) == (
        "topology 'wc' is switching from code version 1 to 2 (upgrade, all): rebalance is "
        "refused until the switch ends; wait for it (see `nimbus-ha history wc`) or roll "
        "it back (`nimbus-ha rollback wc`); kill is allowed")
    assert h.state.storm_base(topology_id).num_workers == 2
    h.switch_all(topology_id, 2)
    h.lifecycle.rebalance("wc", num_workers=3)  # allowed again
    assert h.state.storm_base(topology_id).num_workers == 3


@ZOOKEEPER
def test_submit_of_a_live_name_names_upgrade(harness):
    h = harness
    h.submit()
    with pytest.raises(TopologyExistsError) as refused:
        h.submit()
    assert str(refused.value) == (
        "topology 'wc' is already alive; to change its code keep it running and use "
        "`nimbus-ha upgrade wc PATH` (same topology id, same checkpoints)")


@ZOOKEEPER
@pytest.mark.parametrize("change, message", [
    ({"topology.workers": 3},
     "it changes topology.workers from 2 to 3; an upgrade keeps the number of workers: "
     "change it with `nimbus-ha rebalance wc -n N`"),
    ({"topology.spark.checkpoint.dir": "/data/other"},
     "it changes topology.spark.checkpoint.dir from '/data/checkpoints' to '/data/other'; "
     "the new version would start from another checkpoint"),
    ("process", "version 1 is a pipeline topology and the new bundle a process one"),
    ({"topology.workers": "two"}, "topology conf: key 'topology.workers' must be"),
    ({"topology.spark.checkpoint.dir": "relative/dir"},
     "'topology.spark.checkpoint.dir' must be an absolute path"),
    ({"topology.upgrade.timeout.secs": 0}, "'topology.upgrade.timeout.secs' must be at least 1"),
])
def test_changes_an_upgrade_may_not_make_are_refused_with_nothing_written(harness, change,
                                                                          message):
    h = harness
    topology_id = h.submit()
    with pytest.raises(InvalidTopologyError) as refused:
        if change == "process":
            h.upgrade(kind="process")
        else:
            h.upgrade(conf=change)
    assert message in str(refused.value)
    assert h.state.code_versions(topology_id) is None
    assert h.state.version_code_keys(topology_id) == []
    assert h.store.topologies() == {topology_id}


@ZOOKEEPER
def test_a_version_not_replicated_in_time_is_removed_and_refused(harness):
    h = harness
    topology_id = h.submit(conf={"topology.min.replication.count": 2,
                                 "topology.max.replication.wait.time.sec": 0})
    h.dist.counts[f"{topology_id}.v2"] = 1
    with pytest.raises(InvalidTopologyError) as refused:
        h.upgrade()
    assert str(refused.value) == (
        "version 2 of 'wc' reached 1 of the 2 replicas topology.min.replication.count asks "
        "for within 0s: upgrade refused, the version removed and nothing switched (are "
        "the other nimbuses up? see `nimbus-ha list`)")
    assert not h.code_node(f"{topology_id}.v2") and not h.store.has(f"{topology_id}.v2")
    assert h.state.code_versions(topology_id) is None
    assert h.dist.shared_deleted == [f"{topology_id}.v2"]


@ZOOKEEPER
def test_a_retried_upgrade_is_answered_with_the_version_it_made(harness):
    h = harness
    topology_id = h.submit()
    token = {"topology.submission.token": "t-123"}
    assert h.upgrade(conf=token) == (topology_id, 2)
    assert h.upgrade(conf=token) == (topology_id, 2)
    assert len(h.versions(topology_id).versions) == 2


@ZOOKEEPER
def test_rollback_by_hand_targets_and_refusals(harness):
    h = harness
    topology_id = h.submit()
    with pytest.raises(InvalidTopologyError, match="has one code version only"):
        h.upgrades.rollback("wc")
    with pytest.raises(TopologyNotFoundError):
        h.upgrades.rollback("nope")
    h.upgrade()
    # during the upgrade's switch, the default target is what it switches from
    assert h.upgrades.rollback("wc", by="carol") == (topology_id, 1)
    versions = h.versions(topology_id)
    assert versions.switch["kind"] == "rollback" and versions.switch["by"] == "carol"
    assert (versions.entry(2)["state"], versions.entry(2)["error"]) == (
        "rolled back", "rolled back by carol during its switch")
    with pytest.raises(InvalidTopologyError, match="already rolling back to version 1"):
        h.upgrades.rollback("wc")
    with pytest.raises(InvalidTopologyError, match=r"version 9 of 'wc' is not kept \(kept: "
                                                   r"1, 2\)"):
        h.upgrades.rollback("wc", 9)
    h.switch_all(topology_id, 1)
    assert states(h.versions(topology_id)) == {1: "running", 2: "rolled back"}
    with pytest.raises(InvalidTopologyError, match="already runs version 1"):
        h.upgrades.rollback("wc", 1)
    with pytest.raises(InvalidTopologyError, match="has no previous version"):
        h.upgrades.rollback("wc")
    # back to the newer version by hand: an upgrade, as its kind says
    assert h.upgrades.rollback("wc", 2) == (topology_id, 2)
    assert h.versions(topology_id).switch["kind"] == "upgrade"
    h.switch_all(topology_id, 2)
    assert states(h.versions(topology_id)) == {1: "previous", 2: "running"}


@ZOOKEEPER
def test_an_inactive_topology_switches_at_once(harness):
    h = harness
    topology_id = h.submit()
    h.lifecycle.deactivate("wc")
    h.place(topology_id, 0)  # the scheduler takes the workers of an inactive topology off
    assert h.state.storm_base(topology_id).status == INACTIVE
    h.upgrade()
    h.advance()
    versions = h.versions(topology_id)
    assert (versions.running, versions.switch) == (2, {})
    assert h.state.assignment_info(topology_id).code_version == 2


@ZOOKEEPER
def test_an_active_topology_with_no_worker_placed_waits_for_its_workers(harness):
    """No worker placed (every supervisor gone for a moment, say) judges nothing: the
    switch of an ACTIVE topology waits, and its deadline still applies."""
    h = harness
    topology_id = h.submit(conf={"topology.upgrade.timeout.secs": 60})
    h.upgrade()
    h.place(topology_id, 0)
    h.advance()
    versions = h.versions(topology_id)
    assert (versions.running, versions.switch["kind"], versions.switch["to"]) == (
        1, "upgrade", 2), "not completed: nothing ran version 2"
    # the workers are back and run it: the switch completes as any other
    h.place(topology_id, 2)
    h.switch_all(topology_id, 2)
    assert states(h.versions(topology_id)) == {1: "previous", 2: "running"}
    # none placed until the deadline: rolled back, and the error says why
    h.upgrade()
    h.place(topology_id, 0)
    h.advance()
    h.clock.now += 60
    h.advance()
    versions = h.versions(topology_id)
    assert (versions.entry(3)["state"], versions.switch["kind"], versions.switch["to"]) == (
        "failed", "rollback", 2)
    assert versions.entry(3)["error"] == (
        "no worker was placed to run version 3 within 60s (topology.upgrade.timeout.secs): "
        "no free slot, or no supervisor?")


@ZOOKEEPER
def test_deactivate_is_refused_during_a_switch(harness):
    h = harness
    topology_id = h.submit()
    h.upgrade()
    with pytest.raises(InvalidTopologyError) as refused:
        h.lifecycle.deactivate("wc")
    assert str(refused.value) == (
        "topology 'wc' is switching from code version 1 to 2 (upgrade, all): deactivate is "
        "refused until the switch ends; wait for it (see `nimbus-ha history wc`) or roll "
        "it back (`nimbus-ha rollback wc`); kill is allowed")
    assert h.state.storm_base(topology_id).status == "ACTIVE"
    h.switch_all(topology_id, 2)
    h.lifecycle.deactivate("wc")  # allowed again
    assert h.state.storm_base(topology_id).status == INACTIVE


@ZOOKEEPER
def test_a_rolling_switch_gives_each_worker_its_own_timeout(harness):
    """Workers that each take 40 s of a 60 s timeout: the rolling switch completes, since
    each worker's deadline runs from the previous one's switch."""
    h = harness
    topology_id = h.submit(workers=3, conf={"topology.upgrade.timeout.secs": 60})
    h.upgrade(strategy="rolling")
    h.advance()
    for i in range(3):
        h.clock.now += 40
        h.beat(topology_id, f"worker-{i}", 2, committed=True)
        h.advance()
        versions = h.versions(topology_id)
        if i < 2:
            assert (versions.switch["switched"], versions.switch["deadline_secs"]) == (
                [f"worker-{n}" for n in range(i + 1)], int(h.clock.now) + 60)
    assert (versions.running, versions.switch) == (2, {})
    # the worker whose turn it is still has its own timeout
    h.upgrade(strategy="rolling")
    h.advance()
    h.clock.now += 40
    h.beat(topology_id, "worker-0", 3, committed=True)
    h.advance()
    h.clock.now += 59
    h.advance()
    assert h.versions(topology_id).switch["kind"] == "upgrade"
    h.clock.now += 1
    h.advance()
    versions = h.versions(topology_id)
    assert (versions.entry(3)["state"], versions.switch["kind"]) == ("failed", "rollback")
    assert versions.entry(3)["error"] == (
        "not every worker ran version 3 and committed within 60s of its turn "
        "(topology.upgrade.timeout.secs, rolling): 1 of 3 did")


@pytest.mark.parametrize("running, sw, target", [
    (2, ("upgrade", 2, 3), 2),   # an upgrade: what runs, which is also "from"
    (2, ("upgrade", 1, 3), 2),   # after `rollback --to 3` during a rollback to 1
    (2, ("upgrade", 1, 2), 1),   # the failing version is the running one: "from"
])
def test_the_automatic_rollback_target(running, sw, target):
    from nimbus.master.version_switches import VersionSwitches

    versions = CodeVersions(versions=[entry(1, "rolled back"), entry(2, "running"),
                                      entry(3, "switching")],
                            running=running, switch=switch(*sw))
    assert VersionSwitches.rollback_target(versions) == target


@ZOOKEEPER
def test_an_automatic_rollback_goes_back_to_the_version_that_last_completed(harness):
    """2 runs; during the upgrade to 3 a rollback by hand to 1, then `rollback --to 3`:
    version 3 failing goes back to 2, not to 1, which never completed a switch."""
    h = harness
    topology_id = h.submit()
    h.upgrade()
    h.switch_all(topology_id, 2)
    h.upgrade()
    h.advance()
    assert h.upgrades.rollback("wc", 1, by="carol") == (topology_id, 1)
    h.advance()
    assert h.upgrades.rollback("wc", 3, by="carol") == (topology_id, 3)
    assert {k: h.versions(topology_id).switch[k] for k in ("kind", "from", "to")} == {
        "kind": "upgrade", "from": 1, "to": 3}
    h.advance()
    h.beat(topology_id, "worker-0", 3, failures=1, error="boom")
    h.advance()
    versions = h.versions(topology_id)
    assert {k: versions.switch[k] for k in ("kind", "from", "to", "by")} == {
        "kind": "rollback", "from": 3, "to": 2, "by": AUTOMATIC}
    assert states(versions) == {1: "rolled back", 2: "switching", 3: "failed"}
    assert h.state.assignment_info(topology_id).code_version == 2
    h.switch_all(topology_id, 2)
    versions = h.versions(topology_id)
    assert (versions.running, states(versions)) == (
        2, {1: "rolled back", 2: "running", 3: "failed"})


@ZOOKEEPER
def test_orphan_code_of_versions(harness):
    """remove_orphan_code keeps a version listed or in flight, and removes one that
    /code-versions does not list or whose topology is gone."""
    h = harness
    topology_id = h.submit()
    h.upgrade()
    listed, unlisted, in_flight = (f"{topology_id}.v{n}" for n in (2, 5, 6))
    gone = "gone-1-1.v2"
    for key in (unlisted, in_flight, gone):
        h.state.begin_code(h.fence, key)
    h.upgrades._in_flight[in_flight] = topology_id  # an upload under way on this leader
    assert in_flight in h.lifecycle.pending_ids()
    h.lifecycle.remove_orphan_code()
    assert [h.code_node(k) for k in (topology_id, listed, unlisted, in_flight, gone)] == [
        True, True, False, True, False]
    assert sorted(h.dist.shared_deleted) == [gone, unlisted]
    del h.upgrades._in_flight[in_flight]  # the upload failed and its leader died
    h.lifecycle.remove_orphan_code()
    assert not h.code_node(in_flight)


@ZOOKEEPER
def test_the_code_check_requires_every_kept_version(harness):
    h = harness
    topology_id = h.submit(conf={"topology.code.versions.kept": 2})
    sync = CodeSync(h.state, h.store, CodeDistributor(h.dist), period_s=3600)
    check = sync.check_code()
    assert (check.live, check.held, bool(check)) == ({topology_id}, {topology_id}, True)
    assert str(check) == f"held 1 of 1 live topologies [{topology_id}]"
    h.upgrade()
    v2 = f"{topology_id}.v2"
    check = sync.check_code()
    assert (check.live, bool(check)) == ({topology_id, v2}, True)
    assert str(check) == (f"held 2 of 2 code versions of 1 live topologies "
                          f"[{topology_id},{v2}]")
    h.store.remove(v2)  # a follower that has not fetched the new version yet
    check = sync.check_code()
    assert (check.missing, bool(check)) == ({v2}, False)
    # once version 1 is pruned, it is no longer needed
    h.lifecycle.stage_code(v2, h.tmp / "bundle-2.tar.gz", {}, b"")
    h.switch_all(topology_id, 2)
    h.upgrade()
    h.switch_all(topology_id, 3)
    check = sync.check_code()
    assert (check.live, check.held) == ({v2, f"{topology_id}.v3"},) * 2


@ZOOKEEPER
def test_history(harness):
    h = harness
    topology_id = h.submit()
    sha1 = h.state.assignment_info(topology_id).code_sha256["stormjar.jar"]
    launched = h.state.storm_base(topology_id).launch_time_secs
    v1 = {"version": 1, "sha256": sha1, "submitter": "alice", "created_secs": launched,
          "state": "running", "error": ""}
    assert h.upgrades.history("wc") == {"topology_id": topology_id, "name": "wc",
                                        "running": 1, "switch": None, "versions": [v1]}
    h.upgrade()
    sha2 = h.lifecycle.code_sha256(f"{topology_id}.v2")["stormjar.jar"]
    history = h.upgrades.history("wc")
    assert history == {
        "topology_id": topology_id, "name": "wc", "running": 1,
        "switch": {"kind": "upgrade", "from": 1, "to": 2, "strategy": "all",
                   "started_secs": NOW, "deadline_secs": NOW + 300, "by": "bob",
                   "switched": []},
        "versions": [{"version": 2, "sha256": sha2, "submitter": "bob", "created_secs": NOW,
                      "state": "switching", "error": ""}, v1]}
    assert json.loads(json.dumps(history)) == history
    with pytest.raises(TopologyNotFoundError):
        h.upgrades.history("nope")


@ZOOKEEPER
def test_a_leftover_code_versions_node_of_a_removed_topology_is_deleted(harness):
    h = harness
    topology_id = h.submit()
    h.upgrade()
    path = h.state.code_versions_path(topology_id)
    data, _ = h.state.zk.get(path)
    h.state.remove_storm(h.fence, topology_id)
    h.state.zk.create(path, data)  # as an upgrade written just after the removal leaves it
    assert h.advance() is True
    assert h.state.zk.exists(path) is None


@ZOOKEEPER
def test_a_switch_survives_a_new_leader(harness, make_zk, zk_root):
    """Everything is in ZooKeeper: another leader's Upgrades (a fresh view, nothing in
    memory) goes on with the switch where the first one left it."""
    h = harness
    topology_id = h.submit(workers=3)
    h.upgrade(strategy="rolling")
    h.advance()
    h.beat(topology_id, "worker-0", 2, committed=True)
    view = ClusterView(StormClusterState(make_zk(), zk_root), name="successor")
    view.start()
    try:
        lifecycle = TopologyLifecycle(load_config(), h.state, h.store,
                                      CodeDistributor(h.dist), Elector(h.fence),
                                      "nimbus-2:6627", view=view, clock=h.clock)
        successor = Upgrades(lifecycle, view, clock=h.clock)
        assert successor.advance() is True
        assert h.state.assignment_info(topology_id).worker_versions == {"worker-2": 1}
        h.beat(topology_id, "worker-1", 2, committed=True)
        h.beat(topology_id, "worker-2", 2, committed=True)
        successor.advance()
        assert states(h.versions(topology_id)) == {1: "previous", 2: "running"}
    finally:
        view.close()


def test_the_switches_errors_are_reported_under_a_component_id():
    from nimbus.master.upgrades import ERROR_COMPONENT
    from nimbus.state.component_ids import is_component_id

    assert is_component_id(ERROR_COMPONENT)


@ZOOKEEPER
def test_a_kill_removes_every_version_and_its_shared_code(harness):
    h = harness
    topology_id = h.submit()
    h.upgrade()
    h.switch_all(topology_id, 2)
    h.upgrade()
    h.advance()
    h.lifecycle.kill("wc", wait_secs=0)
    h.view.barrier()  # the duties' removal reads the view
    h.lifecycle.remove_due_kills()
    assert h.state.storm_base(topology_id) is None
    assert h.state.code_versions(topology_id) is None
    assert h.state.code_topologies() == []
    assert sorted(h.dist.shared_deleted) == [topology_id, f"{topology_id}.v2",
                                             f"{topology_id}.v3"]
    assert h.advance() is False


# -- the duties (fakes: only the order and the wait are under test) -----------------------

class _Calls:
    def __init__(self, calls: list[str], name: str, result=None, raises=None):
        self._calls, self._name, self._result, self._raises = calls, name, result, raises

    def __call__(self, *args, **kwargs):
        self._calls.append(self._name)
        if self._raises is not None:
            raise self._raises
        return self._result


class _Fake:
    def __init__(self, calls: list[str], **methods):
        for name, (result, raises) in methods.items():
            setattr(self, name, _Calls(calls, name, result, raises))


def _duties(calls, upgrades):
    from nimbus.master.duties import LeaderDuties
    from nimbus.master.elector import Leadership
    from nimbus.state.cluster_state import Fence

    leadership = Leadership("/l/n-1", 1)
    elector = _Fake(calls, fence=(Fence("/l/n-1"), None), leadership=(leadership, None))
    lifecycle = _Fake(calls, remove_due_kills=(None, None), complete_due_rebalances=(0, None),
                      remove_orphan_code=(None, None), next_rebalance_s=(None, None))
    scheduler = _Fake(calls, reset=(None, None), schedule=(False, None),
                      next_release_s=(None, None))
    cache = _Fake(calls, refresh_now=(None, None))
    index = _Fake(calls, reset=(None, None), sync=(None, None))
    return LeaderDuties(elector, lifecycle, scheduler, cache, period_s=60, index=index,
                        upgrades=upgrades), leadership


def test_the_duties_advance_switches_after_scheduling_and_look_again_soon():
    calls: list[str] = []
    upgrades = _Fake(calls, advance=(True, None), due_in_s=(0.4, None))
    duties, leadership = _duties(calls, upgrades)
    duties.run(leadership)
    order = [c for c in calls if c in ("schedule", "advance", "refresh_now", "sync")]
    assert order == ["schedule", "advance", "refresh_now", "sync"]
    assert duties.due_in_s() == pytest.approx(0.4)
    upgrades.due_in_s = _Calls(calls, "due_in_s", None)
    assert duties.due_in_s() == pytest.approx(60, abs=1)


def test_a_failure_of_the_upgrades_leaves_the_rest_of_the_duties_to_run(caplog):
    calls: list[str] = []
    upgrades = _Fake(calls, advance=(None, RuntimeError("bug")), due_in_s=(None, None))
    duties, leadership = _duties(calls, upgrades)
    duties.run(leadership)
    assert calls[-2:] == ["advance", "sync"]
    assert "advancing the switches of code version failed" in caplog.text


@ZOOKEEPER
def test_a_followers_sync_fetches_every_kept_version_and_drops_pruned_ones(harness,
                                                                          tmp_path):
    import shutil

    h = harness
    leader_store = h.store

    class Follower(distributor_class()):
        name = "follower"

        @hookimpl
        def download(self, dest_dir, topology_id, metafile):
            shutil.copytree(leader_store.path(topology_id), dest_dir)
            return list(Path(dest_dir).iterdir())

    store = LocalCodeStore(tmp_path / "follower")
    sync = CodeSync(h.state, store, CodeDistributor(Follower), period_s=3600, view=h.view)
    topology_id = h.submit(conf={"topology.code.versions.kept": 1})
    h.upgrade()
    sync.sync_once()
    assert store.topologies() == {topology_id, f"{topology_id}.v2"}
    assert sync.check_code()
    h.switch_all(topology_id, 2)
    h.upgrade()
    h.switch_all(topology_id, 3)
    assert states(h.versions(topology_id)) == {2: "previous", 3: "running"}
    sync.sync_once()
    assert store.topologies() == {f"{topology_id}.v2", f"{topology_id}.v3"}
    assert Follower.cleaned == [topology_id]
    assert sync.missing_count == 0
