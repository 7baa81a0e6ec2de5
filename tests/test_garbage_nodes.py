"""Garbage in every /storm node type, against a real ZooKeeper and a real nimbus (in this
process, with its real Thrift server), and a real supervisor facing a garbage assignment.

For each node, ``fuzzing.check_node_case`` writes the garbage, lets every
reader of the nimbus run twice (summary cache, code sync, duty cycle), and checks: the
nimbus still serves getClusterInfo and getTopologyInfo and lists the healthy topology
beside the garbage, no exception escaped anywhere (no traceback logged), the garbage
node is neither deleted nor overwritten, the healthy topology's nodes and code are
unchanged; then it removes the garbage. Here each case also checks the exact error that
names the node. ``benchmarks/fuzz.py --targets nodes`` runs random cases of the same.
"""

from __future__ import annotations

import json
import shutil
import socket
import threading
import uuid

import pytest
from fuzzing import HEALTHY, STAND_IN_PORT, STAND_IN_SUPERVISOR, FuzzNimbus, NodeCase
from fuzzing import check_node_case as run_case
from test_supervisor import STUB_WORKER, _beat, _code, _sha, _submit_directly, _supervisor, _tar
from waiting import wait_for

from nimbus.config import load_config
from nimbus.daemons.nimbus import NimbusDaemon
from nimbus.dev.zookeeper import free_port
from nimbus.state.cluster_state import LayoutMissingError, StormClusterState
from nimbus.state.records import Assignment, StormBase

pytestmark = pytest.mark.zookeeper

NEWER = {"format": 2, "storm_name": "from-the-future", "launch_time_secs": 1,
         "status": "ACTIVE", "placement": {"rack": "r1"}}
NEWER_PROBLEM = ("format 2 is newer than this release reads (1): written by a newer "
                 "nimbus-ha; upgrade this host")


@pytest.fixture(scope="module")
def fz(zk_server, tmp_path_factory):
    with FuzzNimbus(zk_server.port, f"/garbage-{uuid.uuid4().hex[:8]}",
                    tmp_path_factory.mktemp("garbage")) as nimbus:
        yield nimbus


def errors_during(fz: FuzzNimbus, case: NodeCase) -> list[str]:
    mark = fz.logs.mark()
    assert run_case(fz, case) is None
    return fz.logs.errors_since(mark)


UNREADABLE = "nimbus.state.cluster_state: unreadable node, left as it is: "


def test_a_storm_from_a_newer_release_stops_scheduling_but_nothing_else(fz):
    path = fz.state.path("storms", "future-1-1")
    # Its code is here, as a newer leader's submission would have been synced: without
    # it this nimbus would step aside for lack of code (which it does whatever the
    # node's format) instead of meeting the node in its duties.
    code = fz.daemon.master.store.path("future-1-1")
    code.mkdir()
    try:
        errors = errors_during(fz, NodeCase("storms", path, json.dumps(NEWER).encode(), True))
    finally:
        shutil.rmtree(code, ignore_errors=True)
    assert f"{UNREADABLE}StormBase at {path}: {NEWER_PROBLEM}" in errors
    # Placing work without knowing where that topology runs could double-book slots.
    assert f"nimbus.master.daemon: scheduling stopped, no assignment changed: StormBase at " \
           f"{path}: {NEWER_PROBLEM}" in errors


@pytest.mark.parametrize("data, problem", [
    (b"", "empty (a node created but never written?)"),
    (b'{"format": 1, "storm_name": 7', "not JSON: Expecting ',' delimiter: line 1 column 30 "
                                       "(char 29)"),
    (b'{"format": 1, "storm_name": "x", "launch_time_secs": "yesterday", "status": "ACTIVE"}',
     "field 'launch_time_secs' must be an integer, got a string \"yesterday\""),
])
def test_a_partly_written_storm_is_logged_and_left(fz, data, problem):
    path = fz.state.path("storms", "partial-2-2")
    assert f"{UNREADABLE}StormBase at {path}: {problem}" in errors_during(
        fz, NodeCase("storms", path, data, True))


def test_a_storm_whose_name_is_no_topology_id_is_ignored(fz):
    path = fz.state.path("storms", "junk")
    assert f"{UNREADABLE}{path}: not a topology id (name-counter-time); ignored" in \
        errors_during(fz, NodeCase("storms_bad_id", path, b"{}", True))


def test_a_readable_storm_with_numbers_out_of_thrift_range_is_listed(fz):
    path = fz.state.path("storms", "odd-3-3")
    odd = StormBase("odd", launch_time_secs=-(2**40), status="INACTIVE", num_workers=10**12)
    case = NodeCase("storms", path, odd.encode(), False)
    mark = fz.logs.mark()
    fz.zk.create(path, case.data)
    try:
        fz.settle()
        with fz.client() as client:
            listed = {t.name: t for t in client.getClusterInfo().topologies}
        assert (listed["odd"].uptime_secs, listed["odd"].status) == (2**31 - 1, "INACTIVE")
        assert listed[HEALTHY].status == "ACTIVE"
    finally:
        fz.zk.delete(path)
    assert fz.logs.tracebacks_since(mark) == []


def test_an_unreadable_assignment(fz):
    path = fz.state.path("assignments", "junk-4-4")
    assert f"{UNREADABLE}Assignment at {path}: not UTF-8 text (byte 0 of 3)" in errors_during(
        fz, NodeCase("assignments", path, b"\xff\xfe\xfd", True))


def test_an_unreadable_supervisor_counts_as_absent(fz):
    path = fz.state.path("supervisors", "sup-junk")
    errors = errors_during(fz, NodeCase("supervisors", path, b'{"format": 1}', True))
    assert f"{UNREADABLE}SupervisorInfo at {path}: field 'time_secs' is missing" in errors


def test_an_unreadable_worker_beat_of_the_healthy_topology(fz):
    path = fz.state.path("workerbeats", fz.topology_id,
                         f"{STAND_IN_SUPERVISOR}-{STAND_IN_PORT}")
    errors = errors_during(fz, NodeCase("workerbeats", path, b"beat?", True))
    assert f"{UNREADABLE}WorkerBeat at {path}: not JSON: Expecting value: line 1 column 1 " \
           "(char 0)" in errors


def test_an_unreadable_error_of_the_healthy_topology(fz):
    case = NodeCase("errors", fz.state.path("errors", fz.topology_id, "spout", "e"),
                    b'{"format": 1, "error": 5, "error_time_secs": 1}', True, sequence=True,
                    companions=[(fz.state.path("errors", fz.topology_id, "spout"), b"")])
    errors = errors_during(fz, case)
    assert f"{UNREADABLE}ErrorInfo at {case.created}: field 'error' must be a string, got an " \
           "integer 5" in errors


def test_the_healthy_topologys_own_metafile_garbled_keeps_its_code(fz):
    """An unreadable metafile is not a removal: the code held here stays (check_node_case
    compares it), and the topology stays listed."""
    path = fz.state.code_path(fz.topology_id)
    errors = errors_during(fz, NodeCase("code_distributor_healthy", path,
                                        b'{"format": 1, "distributor": "localfs"}', True))
    assert f"{UNREADABLE}CodeMeta at {path}: field 'metafile_b64' is missing" in errors


def test_an_unreadable_metafile_of_another_topology(fz):
    junk = "junk-5-5"
    base = StormBase(junk, 1, "INACTIVE").encode()
    path = fz.state.path("code-distributor", junk)
    data = json.dumps({"format": 1, "distributor": "localfs", "metafile_b64": "%%%",
                       "uploaded_by": "x", "created_secs": 1}).encode()
    errors = errors_during(fz, NodeCase("code_distributor", path, data, True,
                                        companions=[(fz.state.path("storms", junk), base)]))
    assert f"{UNREADABLE}CodeMeta at {path}: field 'metafile_b64' is not base64" in errors


def test_an_unreadable_nimbus_registration(fz):
    path = fz.state.path("nimbuses", "10.9.0.1:6627")
    data = json.dumps({**NEWER, "host": "10.9.0.1"}).encode()
    assert f"{UNREADABLE}NimbusInfo at {path}: {NEWER_PROBLEM}" in errors_during(
        fz, NodeCase("nimbuses", path, data, True))


def test_leader_lock_nodes_with_garbage(fz):
    path = fz.state.path("leader-lock", "nimbus-junk-9999999999")
    assert f"{UNREADABLE}{path}: holds b'\\xff\\xfe', not host:port" in errors_during(
        fz, NodeCase("leader_lock", path, b"\xff\xfe", True))
    path = fz.state.path("leader-lock", "junk")
    assert f"{UNREADABLE}{path}: not a leader lock node (nimbus-<id>-<sequence>); not " \
           "counted in the queue" in errors_during(
               fz, NodeCase("leader_lock_bad_name", path, b"", True))
    assert fz.daemon.master.elector.is_leader()


def test_garbage_in_the_roots_cluster_id_stops_everything_that_removes_until_it_is_back(fz):
    cluster_id = fz.zk.get(fz.state.root)[0].decode()
    errors = errors_during(fz, NodeCase("root", fz.state.root, b"\x00garbage", True))
    stopped = (f"ZooKeeper root {fz.state.root} holds cluster b'\\x00garbage', not cluster "
               f"{cluster_id} that this nimbus joined (ZooKeeper wiped and set up again, or "
               "restored from elsewhere?); refusing to act on it. Restart this nimbus to join "
               "the new cluster: its code is then kept aside, never removed")
    assert f"nimbus.master.code_sync: code sync stopped, nothing fetched or removed: " \
           f"{stopped}" in errors
    assert f"nimbus.master.elector: not leading: {stopped}" in errors
    assert fz.daemon.master.elector.is_leader()  # back once the id is


def test_a_nimbus_does_not_start_on_a_root_that_holds_no_cluster_id(zk_server, zk_root,
                                                                      make_zk, tmp_path):
    garbage = b"\xff" * 100
    make_zk().create(zk_root, garbage)
    port = free_port()
    conf = load_config(overrides={
        "storm.zookeeper.servers": ["127.0.0.1"], "storm.zookeeper.port": zk_server.port,
        "storm.zookeeper.root": zk_root, "nimbus.thrift.port": port,
        "storm.local.dir": str(tmp_path / "local")}, extra_defaults={}, unchecked_prefixes={})
    with pytest.raises(LayoutMissingError) as err:
        NimbusDaemon(conf)
    assert str(err.value) == (
        f"ZooKeeper root {zk_root} holds {garbage[:40]!r} (100 bytes) where nimbus-ha keeps "
        "its cluster id: not a nimbus-ha root, or damaged; check storm.zookeeper.root")
    assert f"thrift-accept-{port}" not in [t.name for t in threading.enumerate()]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # the port was released


# -- a supervisor facing a garbage assignment ---------------------------------------------------
@pytest.fixture
def stub_worker(tmp_path):
    import sys

    script = tmp_path / "stub_worker.py"
    script.write_text(STUB_WORKER)
    return (sys.executable, str(script))


def test_a_supervisor_keeps_its_worker_and_code_while_the_assignment_is_unreadable(
        tmp_path, zk_server, zk_root, make_zk, stub_worker, caplog):
    from test_supervisor import TOPOLOGY

    caplog.set_level("ERROR", logger="nimbus.state.cluster_state")
    state = StormClusterState(make_zk(), zk_root)
    state.setup()
    port = free_port()
    files = _code(_tar({"topology.yaml": b"command: [true]\n"}))
    sup = _supervisor(tmp_path, zk_server, zk_root, stub_worker, files, port)
    sup.start()
    try:
        _submit_directly(state, files, {"worker-0": [sup.id, port]})
        wait_for(lambda: _beat(state, sup, port), 15, "a first beat")
        (worker,) = sup.table.running()
        path = state.path("assignments", TOPOLOGY)
        good = state.zk.get(path)[0]

        def passes(n: int) -> None:
            done = sup.passes
            sup._monitor.wake()
            wait_for(lambda: sup.passes >= done + n or sup._monitor.wake(), 15, f"{n} passes")

        # A newer release's assignment, then a garbled one: nothing is started or stopped.
        for garbage, problem in (
                (json.dumps({**json.loads(good), "format": 2}).encode(), NEWER_PROBLEM),
                (b"\x00" * 10, "not JSON: Expecting value: line 1 column 1 (char 0)")):
            state.zk.set(path, garbage)
            passes(2)
            assert sup.table.running() == [worker] and worker.exit_code() is None
            assert sup.code.has(TOPOLOGY)
            assert f"unreadable node, left as it is: Assignment at {path}: {problem}" in \
                caplog.messages
        # Readable again: the same worker runs on, then an empty assignment stops it.
        state.zk.set(path, good)
        passes(2)
        assert sup.table.running() == [worker] and worker.exit_code() is None
        state.zk.set(path, Assignment(master_code_dir="/x", code_sha256=_sha(files)).encode())
        wait_for(lambda: not sup.table.running() and not sup.code.has(TOPOLOGY), 15,
                 "the worker to stop and its code to go")
        assert [r for r in caplog.records if r.exc_info] == []
    finally:
        sup.stop()
