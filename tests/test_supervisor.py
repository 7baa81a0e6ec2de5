"""The supervisor's parts: restart backoff, desired slots, code verification, slot ports,
worker handles and leases; and one reconcile loop against a real ZooKeeper with a
stand-in worker (a tiny script that follows docs/runtime.md's pipe protocol)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import socket
import sys
import tarfile
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from faults import expire_session
from kazoo.exceptions import NoNodeError
from supervisor_index import index_work
from waiting import wait_for

from nimbus.config import ConfigError, load_config
from nimbus.daemons.supervisor import build_supervisor
from nimbus.state import runtime_view, worker_state
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.records import ACTIVE, Assignment, ErrorInfo, StormBase, WorkerBeat
from nimbus.supervisor.code_cache import (
    CODE_FILES,
    CodeCache,
    CodeUnavailableError,
    CodeVerificationError,
)
from nimbus.supervisor.code_fetcher import CodeFetcher
from nimbus.supervisor.daemon import Supervisor, check_supervisor_conf, load_supervisor_id
from nimbus.supervisor.lease import LeaseKeeper
from nimbus.supervisor.policy import (
    DesiredWorker,
    RestartBackoff,
    SlotPortInUseError,
    check_ports_free,
    desired_workers,
    worker_index,
)
from nimbus.supervisor.worker_handle import WorkerHandle

TOPOLOGY = "demo-1-1700000000"

# A stand-in worker: reads worker.json, beats on the status pipe while its lease is valid,
# kills its group when the lease runs out (or its pipe closes). It starts a child
# (`sleep`) in its group, so tests can see that group kills reach children. Behaviour
# knobs come from the topology conf: topology.stub.exit_after (seconds, then exit 3 with
# an error line), topology.stub.silent (never beat), topology.stub.batch (beats report a
# committed batch), topology.stub.daemonize (also start a child in a session of its own),
# topology.stub.probe (paths it tries to read, results in <worker-dir>/probe.json)
# and topology.stub.status_file (bytes
# copied to the status pipe as they are, once the first lease is in).
STUB_WORKER = textwrap.dedent('''
    import json, os, select, signal, subprocess, sys, threading, time
    spec = json.load(open(os.path.join(sys.argv[1], "worker.json")))
    conf = spec["conf"]
    status = os.fdopen(spec["status_fd"], "w", buffering=1)
    child = subprocess.Popen(["sleep", "600"])
    # Before child.pid is written: tests stop the stub as soon as they have read it.
    signal.signal(signal.SIGTERM, lambda *_: (child.kill(), sys.exit(0)))
    with open(os.path.join(sys.argv[1], "child.pid"), "w") as f:
        f.write(str(child.pid))
    if conf.get("topology.stub.probe"):  # what a hostile tenant would try to read
        found = {"uid": os.getuid()}
        for path in conf["topology.stub.probe"]:
            try:
                if os.path.isdir(path):
                    os.listdir(path)
                else:
                    open(path, "rb").read(1)
                found[path] = "read"
            except OSError as exc:
                found[path] = type(exc).__name__
        with open(os.path.join(sys.argv[1], "probe.json"), "w") as f:
            json.dump(found, f)
    if conf.get("topology.stub.daemonize"):  # a child that leaves the process group
        daemon = subprocess.Popen(["sleep", "600"], start_new_session=True)
        with open(os.path.join(sys.argv[1], "daemon.pid"), "w") as f:
            f.write(str(daemon.pid))
    deadline = [None]
    def die(reason):
        print("lease lost:", reason, flush=True)
        os.killpg(os.getpgrp(), signal.SIGKILL)
    def leases():
        buf = b""
        while True:
            data = os.read(spec["lease_fd"], 4096)
            if not data:
                die("eof")
            buf += data
            *lines, buf = buf.split(b"\\n")
            for line in lines:
                deadline[0] = float(line.split()[1])
    threading.Thread(target=leases, daemon=True).start()
    started = time.monotonic()
    sent_file = [False]
    while True:
        now = time.monotonic()
        if deadline[0] is not None and conf.get("topology.stub.status_file") \
                and not sent_file[0]:
            sent_file[0] = True
            status.flush()
            os.write(spec["status_fd"], open(conf["topology.stub.status_file"], "rb").read())
        if deadline[0] is not None and now > deadline[0]:
            die("expired")
        if deadline[0] is None and now - started > 10:
            sys.exit(5)
        exit_after = conf.get("topology.stub.exit_after")
        if exit_after is not None and deadline[0] is not None and now - started > exit_after:
            status.write(json.dumps({"error": {"component": "main", "error": "boom"}}) + "\\n")
            sys.exit(3)
        if deadline[0] is not None and not conf.get("topology.stub.silent"):
            main = {"pid": os.getpid()}
            if conf.get("topology.stub.batch"):
                # As a pipeline that committed a batch reports it: a progress whose
                # batch ran (an addBatch duration), not a trigger that found no data.
                main["batch_id"] = 1
                main["progress"] = {"batch_id": 1, "duration_ms": {"addBatch": 5}}
            status.write(json.dumps({"beat": {"components": {"main": main}}}) + "\\n")
        time.sleep(0.2)
''')


@pytest.fixture
def stub_worker(tmp_path: Path) -> tuple[str, ...]:
    script = tmp_path / "stub_worker.py"
    script.write_text(STUB_WORKER)
    return (sys.executable, str(script))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of this test process still answers kill(0): look at its state.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# -- policy ----------------------------------------------------------------------------------
def test_backoff_doubles_to_sixty_and_resets_after_five_minutes():
    backoff = RestartBackoff()
    assert [backoff.delay_after_exit(1.0) for _ in range(9)] == [0, 1, 2, 4, 8, 16, 32, 60, 60]
    assert backoff.delay_after_exit(299.0) == 60
    assert backoff.delay_after_exit(300.0) == 0   # it ran five minutes: start afresh
    assert backoff.delay_after_exit(0.5) == 1


def test_desired_workers_are_this_supervisors_slots_only():
    assignments = {
        "b-2-2": Assignment(master_code_dir="", executor_node_port={
            "worker-0": ["me", 6701], "worker-1": ["other", 6700], "worker-2": ["me", 6799]}),
        "a-1-1": Assignment(master_code_dir="", executor_node_port={
            "worker-1": ["me", 6700], "bogus": ["me", 6702], "worker-3": ["me"]}),
        # Two topologies naming one slot (a leader never writes that): the first id wins.
        "c-3-3": Assignment(master_code_dir="", executor_node_port={"worker-0": ["me", 6700]}),
    }
    assert desired_workers(assignments, "me", [6700, 6701, 6702]) == {
        6700: DesiredWorker("a-1-1", 6700, "worker-1", 1),
        6701: DesiredWorker("b-2-2", 6701, "worker-0", 0),
    }
    assert desired_workers(assignments, "nobody", [6700]) == {}


def test_worker_index_parses_only_worker_keys():
    assert worker_index("worker-12") == 12
    for bad in ("worker-", "worker-x", "executor-1", "worker--1"):
        with pytest.raises(ValueError):
            worker_index(bad)


def test_taken_slot_port_is_refused_with_the_key_named():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SlotPortInUseError) as info:
            check_ports_free([port])
        assert str(info.value) == f"supervisor slot port {port} is in use (supervisor.slots.ports)"
    check_ports_free([port])   # released: free again


def test_supervisor_conf_is_checked():
    check_supervisor_conf(load_config(overrides={}))
    for key, value in [("supervisor.monitor.frequency.secs", 0),
                       ("supervisor.slots.ports", []),
                       ("supervisor.slots.ports", [70000])]:
        with pytest.raises(ConfigError, match=key):
            check_supervisor_conf(load_config(overrides={key: value}))


def test_supervisor_id_is_kept(tmp_path: Path):
    made = load_supervisor_id(tmp_path / "supervisor" / "id")
    assert load_supervisor_id(tmp_path / "supervisor" / "id") == made
    assert len(made) == 36


# -- code cache ------------------------------------------------------------------------------
def _tar(entries: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _code(bundle: bytes) -> dict[str, bytes]:
    return {"stormjar.jar": bundle, "stormconf.json": b'{"topology.workers": 1}',
            "stormcode.ser": b""}


def _sha(files: dict[str, bytes]) -> dict[str, str]:
    return {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}


class FakePeers:
    """fetch(peer, "<id>/<file>", dest) serving per-peer file contents."""

    def __init__(self, served: dict[str, dict[str, bytes]]):
        self.served = served
        self.calls: list[tuple[str, str]] = []

    def __call__(self, peer: str, remote: str, dest: Path, timeout_s: float = 30.0) -> str:
        self.calls.append((peer, remote))
        if peer not in self.served:
            raise ConnectionRefusedError("connection refused")
        data = self.served[peer][remote.split("/", 1)[1]]
        dest.write_bytes(data)
        return hashlib.sha256(data).hexdigest()


def test_code_cache_fetches_verifies_and_unpacks(tmp_path: Path):
    files = _code(_tar({"topology.yaml": b"command: [true]\n", "lib/x.py": b"x = 1\n"}))
    fetch = FakePeers({"n2:6627": files})
    cache = CodeCache(tmp_path / "stormdist", 1 << 20, fetch)
    path = cache.ensure(TOPOLOGY, _sha(files), ["n1:6627", "n2:6627"])
    assert sorted(p.name for p in path.iterdir()) == sorted([*CODE_FILES, "resources"])
    assert (cache.resources(TOPOLOGY) / "lib" / "x.py").read_bytes() == b"x = 1\n"
    calls = len(fetch.calls)
    assert cache.ensure(TOPOLOGY, _sha(files), ["n2:6627"]) == path   # already here
    assert len(fetch.calls) == calls
    assert cache.remove_except(set()) == [TOPOLOGY]
    assert not path.exists()


def test_code_cache_refuses_a_bad_sha256_and_tries_the_next_peer(tmp_path: Path):
    good = _code(_tar({"topology.yaml": b"command: [true]\n"}))
    tampered = {**good, "stormjar.jar": _tar({"topology.yaml": b"command: [evil]\n"})}
    cache = CodeCache(tmp_path / "stormdist", 1 << 20, FakePeers({"bad:1": tampered}))
    with pytest.raises(CodeVerificationError, match="stormjar.jar: no verified copy"):
        cache.ensure(TOPOLOGY, _sha(good), ["bad:1"])
    assert not cache.has(TOPOLOGY)
    assert list((tmp_path / "stormdist").iterdir()) == []   # no temporary left behind
    cache = CodeCache(tmp_path / "stormdist", 1 << 20,
                      FakePeers({"bad:1": tampered, "good:2": good}))
    cache.ensure(TOPOLOGY, _sha(good), ["bad:1", "good:2"])
    assert (cache.resources(TOPOLOGY) / "topology.yaml").read_bytes() == b"command: [true]\n"


def test_code_cache_refuses_an_unsafe_archive_member(tmp_path: Path):
    # The sha256 matches (the leader stored exactly this), but the entry leaves its dir.
    files = _code(_tar({"topology.yaml": b"command: [true]\n", "../escape.txt": b"x"}))
    cache = CodeCache(tmp_path / "stormdist", 1 << 20, FakePeers({"n:1": files}))
    with pytest.raises(CodeVerificationError, match="unsafe bundle.*leaves its directory"):
        cache.ensure(TOPOLOGY, _sha(files), ["n:1"])
    assert not cache.has(TOPOLOGY)
    assert not (tmp_path / "stormdist" / "escape.txt").exists()
    assert not (tmp_path / "escape.txt").exists()


def test_code_cache_refuses_unverifiable_or_unreachable_code(tmp_path: Path):
    files = _code(_tar({"topology.yaml": b"command: [true]\n"}))
    cache = CodeCache(tmp_path / "stormdist", 1 << 20, FakePeers({"n:1": files}))
    with pytest.raises(CodeVerificationError, match="no sha256 for stormcode.ser"):
        cache.ensure(TOPOLOGY, {k: v for k, v in _sha(files).items() if k != "stormcode.ser"},
                     ["n:1"])
    with pytest.raises(CodeUnavailableError, match="connection refused"):
        cache.ensure(TOPOLOGY, _sha(files), ["down:1"])
    with pytest.raises(CodeUnavailableError, match="no nimbus holds its code"):
        cache.ensure(TOPOLOGY, _sha(files), [])


# -- worker handle and lease ------------------------------------------------------------------
def _spec_writer(worker_dir: Path, conf: dict | None = None):
    def write(lease_fd: int, status_fd: int) -> None:
        (worker_dir / "worker.json").write_text(json.dumps({
            "lease_fd": lease_fd, "status_fd": status_fd, "conf": conf or {}}))
    return write


def test_worker_handle_beats_while_leased_and_dies_when_the_lease_runs_out(
        tmp_path: Path, stub_worker):
    beats: list[dict] = []
    closed = threading.Event()
    handle = WorkerHandle(TOPOLOGY, 6700, tmp_path / "w", session_id=7, restarts=0,
                          on_status=lambda h, s: beats.append(s),
                          on_closed=lambda h: closed.set(), command=stub_worker)
    handle.start(_spec_writer(tmp_path / "w"))
    try:
        assert handle.renew(time.monotonic() + 1.5)
        wait_for(lambda: len(beats) >= 2, 10, "beats")
        assert beats[0] == {"beat": {"components": {"main": {"pid": handle.pid}}}}
        child = int(wait_for(lambda: (tmp_path / "w" / "child.pid").read_text(), 5, "child"))
        # No renewal: the worker kills its own group (the child with it) at the deadline.
        wait_for(lambda: handle.exit_code() is not None, 10, "the worker to die")
        assert handle.exit_code() == -signal.SIGKILL
        wait_for(closed.is_set, 5, "the status pipe to close")
        wait_for(lambda: not _alive(child), 5, "the child to die")
        assert "lease lost: expired" in (tmp_path / "w" / "worker.log").read_text()
    finally:
        handle.release()


def test_worker_handle_stop_and_kill_reach_the_whole_group(tmp_path: Path, stub_worker):
    handles = []
    for name in ("a", "b"):
        h = WorkerHandle(TOPOLOGY, 6700, tmp_path / name, 1, 0, lambda h, s: None,
                         command=stub_worker)
        h.start(_spec_writer(tmp_path / name))
        h.renew(time.monotonic() + 60)
        handles.append(h)
    a, b = handles
    children = [int(wait_for(lambda d=d: (tmp_path / d / "child.pid").read_text(), 5, "child"))
                for d in ("a", "b")]
    a.stop(grace_s=3)
    assert a.exit_code() == 0 and a.ended_by == "stop"   # SIGTERM was enough
    started = time.monotonic()
    b.kill("lost")
    wait_for(lambda: b.exit_code() is not None, 5, "kill")
    assert time.monotonic() - started < 2 and b.exit_code() == -signal.SIGKILL
    b.release()
    assert b.ended_by == "lost"
    wait_for(lambda: not any(_alive(c) for c in children), 5, "children to die")
    assert not a.renew(time.monotonic() + 10)   # released: nothing to write to


class FakeZk:
    """Just enough of KazooClient for LeaseKeeper: its own node's owner, and assignment
    data per path (a path not there: no node)."""

    def __init__(self, session: int, owner: int | None,
                 assignments: dict[str, bytes] | None = None):
        self.client_id = (session, b"pw")
        self.owner = owner
        self.assignments = assignments or {}
        self.asked: list[str] = []

    def sync_async(self, path: str):
        self.asked.append(f"sync {path}")
        return _Answered(lambda: path)

    def exists_async(self, path: str):
        self.asked.append(f"exists {path}")
        stat = None if self.owner is None else SimpleNamespace(ephemeralOwner=self.owner)
        return _Answered(lambda: stat)

    def get_async(self, path: str):
        self.asked.append(f"get {path}")

        def get():
            if path not in self.assignments:
                raise NoNodeError()
            return self.assignments[path], SimpleNamespace(mzxid=7)
        return _Answered(get)


class _Answered:
    """An already answered kazoo async result."""

    def __init__(self, value):
        self.get_nowait = value

    def rawlink(self, callback):
        callback(self)


class FakeWorker:
    def __init__(self, session_id: int, topology_id: str = "t-1-1"):
        self.session_id = session_id
        self.topology_id = topology_id
        self.ended_by = ""
        self.leases: list[float] = []
        self.versions: list[int | None] = []  # the assignment's mzxid with each renewal

    def renew(self, deadline: float, assignment_version: int | None = None) -> bool:
        self.leases.append(deadline)
        self.versions.append(assignment_version)
        return True


def keeper(zk: FakeZk, workers, holds=lambda worker, data: data == b"here", **kwargs):
    return LeaseKeeper(zk, lambda: "/s/me", lambda: 6.0, lambda: workers,
                       assignment_path=lambda t: f"/a/{t}", holds=holds, **kwargs)


def test_lease_is_renewed_only_after_a_round_trip_of_the_workers_own_session():
    mine, older = FakeWorker(5), FakeWorker(4)
    zk = FakeZk(5, owner=5, assignments={"/a/t-1-1": b"here"})
    before = time.monotonic()
    deadline = keeper(zk, [mine, older]).renew_once()
    assert deadline is not None and before + 4.0 <= deadline <= time.monotonic() + 4.0
    assert mine.leases == [deadline] and older.leases == []
    # one pipelined round trip: a sync through the ensemble's leader, its own node, and
    # the assignment of each topology it runs
    assert zk.asked == ["sync /s/me", "exists /s/me", "get /a/t-1-1"]
    # The node belongs to another session (left by a restart): proves nothing.
    assert keeper(FakeZk(5, owner=4), [mine]).renew_once() is None
    # No node (session expired, not yet registered again), or disconnected: nothing.
    assert keeper(FakeZk(5, owner=None), [mine]).renew_once() is None
    assert keeper(FakeZk(5, owner=5), [mine], may_renew=lambda: False).renew_once() is None
    assert mine.leases == [deadline]


def test_a_worker_whose_assignment_changed_is_not_renewed():
    """Issue 18: leases are renewed only for workers the server's answer still places
    here; the others are reported, so that the supervisor stops them."""
    kept, moved, removed = FakeWorker(5, "t-1-1"), FakeWorker(5, "t-2-1"), \
        FakeWorker(5, "t-3-1")
    unassigned = []
    zk = FakeZk(5, owner=5, assignments={"/a/t-1-1": b"here", "/a/t-2-1": b"elsewhere"})
    deadline = keeper(zk, [kept, moved, removed],
                      on_unassigned=unassigned.append).renew_once()
    assert kept.leases == [deadline] and moved.leases == [] and removed.leases == []
    assert kept.versions == [7]  # what a frozen worker's thaw is checked against
    assert unassigned == [moved, removed]


class SlowZk(FakeZk):
    """A FakeZk whose every answer comes ``delay_s`` after the request, in order."""

    def __init__(self, delay_s: float, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.delay_s = delay_s
        self.unanswered = 0
        self.most_unanswered = 0
        self._lock = threading.Lock()
        self.timers: list[threading.Timer] = []

    def _later(self, answered: _Answered) -> _Late:
        late = _Late(answered, self)
        with self._lock:
            self.unanswered += 1
            self.most_unanswered = max(self.most_unanswered, self.unanswered)
        timer = threading.Timer(self.delay_s, late.answer)
        timer.daemon = True
        self.timers.append(timer)
        timer.start()
        return late

    def exists_async(self, path: str):
        return self._later(super().exists_async(path))

    def get_async(self, path: str):
        return self._later(super().get_async(path))

    def sync_async(self, path: str):
        return self._later(super().sync_async(path))


class _Late:
    def __init__(self, answered: _Answered, zk: SlowZk):
        self.get_nowait = answered.get_nowait
        self._zk = zk
        self._callbacks = []
        self._done = False
        self._lock = threading.Lock()

    def rawlink(self, callback):
        with self._lock:
            if not self._done:
                self._callbacks.append(callback)
                return
        callback(self)

    def answer(self):
        with self._zk._lock:
            self._zk.unanswered -= 1
        with self._lock:
            self._done, callbacks = True, self._callbacks
        for callback in callbacks:
            callback(self)


def test_rounds_are_pipelined_so_a_slow_zookeeper_keeps_the_leases():
    """Issue 20: a round does not wait for the one before. With answers 1.2 s late and
    a 4 s lease, rounds a quarter second apart are all in flight at once, and every
    answer renews the lease, deadlines counted from each round's send, in send order."""
    worker = FakeWorker(5)
    zk = SlowZk(1.2, 5, owner=5, assignments={"/a/t-1-1": b"here"})
    lease = keeper(zk, [worker], interval_s=0.25)
    assert lease.length_s == pytest.approx(4.0)
    lease.start()
    try:
        wait_for(lambda: len(worker.leases) >= 6, 20, "six renewals")
    finally:
        lease.stop()
        for timer in zk.timers:
            timer.cancel()
    # Each round is three requests (the sync, the node, the assignment): more than one
    # round was unanswered at once.
    assert zk.most_unanswered >= 6
    assert worker.leases == sorted(set(worker.leases))


# -- the daemon against a real ZooKeeper --------------------------------------------------------
@pytest.fixture
def cluster_state(make_zk, zk_root):
    state = StormClusterState(make_zk(), zk_root)
    state.setup()
    return state


def _submit_directly(state: StormClusterState, files: dict[str, bytes], slots: dict) -> None:
    """What a leader would write: the topology's nodes and an assignment."""
    zk = state.zk
    zk.create(state.storm_path(TOPOLOGY), StormBase("demo", 1, ACTIVE, 1).encode())
    zk.create(state.path("assignments", TOPOLOGY), Assignment(
        master_code_dir="/x", executor_node_port=slots, code_sha256=_sha(files)).encode())
    zk.create(state.path("workerbeats", TOPOLOGY), b"")
    zk.create(state.path("errors", TOPOLOGY), b"")
    index_work(state, TOPOLOGY, slots)


def _supervisor(tmp_path, zk_server, zk_root, stub_worker, files, port,
                **extra) -> Supervisor:
    conf = load_config(overrides={
        "storm.zookeeper.port": zk_server.port, "storm.zookeeper.root": zk_root,
        "storm.zookeeper.session.timeout": 4000, "storm.local.dir": str(tmp_path / "local"),
        "storm.local.hostname": "127.0.0.1", "supervisor.slots.ports": [port],
        "supervisor.monitor.frequency.secs": 1,
        "supervisor.code.cleanup.grace.secs": 0, "supervisor.heartbeat.frequency.secs": 1,
        "supervisor.worker.start.timeout.secs": 5, "supervisor.worker.timeout.secs": 3,
        "supervisor.worker.shutdown.sleep.secs": 1, "supervisor.spark.class.archive": False,
        "logviewer.port": 0, **extra})
    sup = build_supervisor(conf, worker_command=stub_worker)
    sup.code = CodeCache(sup.code.root, 1 << 20, FakePeers({"nimbus:6627": files}))
    sup._peers = lambda topology_id: ["nimbus:6627"]  # no nimbus in these tests
    return sup


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _beat(state: StormClusterState, sup: Supervisor, port: int) -> WorkerBeat | None:
    data = state.get_worker_heartbeat(TOPOLOGY, sup.id, port)
    return WorkerBeat.decode(data) if data else None


def test_supervisor_runs_its_slot_restarts_a_crash_and_stops_when_unassigned(
        tmp_path, zk_server, zk_root, cluster_state, stub_worker):
    port = _free_port()
    files = _code(_tar({"topology.yaml": b"command: [true]\n"}))
    # The topology conf makes the stand-in fail after 1.5 s of running, with an error line.
    files["stormconf.json"] = (b'{"topology.stub.exit_after": 1.5, "pipeline.input": "in", '
                               b'"storm.local.dir": "elsewhere"}')
    sup = _supervisor(tmp_path, zk_server, zk_root, stub_worker, files, port)
    sup.start()
    try:
        assert cluster_state.supervisor_info(sup.id).meta == [port]
        _submit_directly(cluster_state, files, {"worker-0": [sup.id, port]})
        beat = wait_for(lambda: _beat(cluster_state, sup, port), 15, "a first beat")
        assert (beat.topology_id, beat.supervisor_id, beat.host, beat.port, beat.restarts) == \
            (TOPOLOGY, sup.id, "127.0.0.1", port, 0)
        spec = json.loads((sup.workers_dir / f"{TOPOLOGY}-{port}" / "worker.json").read_text())
        assert spec["conf"]["topology.stub.exit_after"] == 1.5
        # Every topology key reaches the worker; storm.local.dir stays the supervisor's.
        assert spec["conf"]["pipeline.input"] == "in"
        assert spec["conf"]["storm.local.dir"] == str(sup.local_dir)
        assert spec["code_dir"] == str(sup.code.resources(TOPOLOGY))
        assert (spec["worker_index"], spec["num_workers"], spec["restarts"]) == (0, 1, 0)
        # It fails: its error is recorded, and it is restarted (after 1 s) and counted.
        wait_for(lambda: (b := _beat(cluster_state, sup, port)) and b.restarts == 1, 15,
                 "a restarted worker's beat")
        errors = cluster_state.errors(TOPOLOGY, "main")
        assert errors[0] == ErrorInfo("boom", errors[0].error_time_secs, "127.0.0.1", port)
        # Unassigned: the worker is stopped and the code removed.
        cluster_state.zk.set(cluster_state.path("assignments", TOPOLOGY), Assignment(
            master_code_dir="/x", code_sha256=_sha(files)).encode())
        wait_for(lambda: not sup.table.running() and not sup.code.has(TOPOLOGY), 10,
                 "the worker to stop and its code to go")
    finally:
        sup.stop()
    assert cluster_state.supervisor_info(sup.id) is None   # its session ended with it
    assert [t.name for t in threading.enumerate() if t.name.startswith(
        ("supervisor-", "worker-status-"))] == []


@pytest.mark.parametrize("cleanup", [True, False])
def test_unneeded_code_waits_out_its_grace_and_a_killed_topologys_checkpoints_go(
        tmp_path, zk_server, zk_root, cluster_state, stub_worker, cleanup):
    """Code no assignment needs stays supervisor.code.cleanup.grace.secs (work that comes
    back is not fetched again); then it goes, and with topology.spark.checkpoint.cleanup
    the checkpoints go with it, but only those of a killed topology, never of one that
    merely moved away."""
    port = _free_port()
    files = _code(_tar({"topology.yaml": b"command: [true]\n"}))
    files["stormconf.json"] = json.dumps(
        {"topology.spark.checkpoint.cleanup": cleanup}).encode()
    grace = 2
    sup = _supervisor(tmp_path, zk_server, zk_root, stub_worker, files, port,
                      **{"supervisor.code.cleanup.grace.secs": grace})
    fetches = sup.code._fetch
    checkpoints = sup.local_dir / "checkpoints" / TOPOLOGY / "main"
    assignment = cluster_state.path("assignments", TOPOLOGY)

    def assign(slots: dict) -> None:
        cluster_state.zk.set(assignment, Assignment(
            master_code_dir="/x", executor_node_port=slots,
            code_sha256=_sha(files)).encode())

    sup.start()
    try:
        _submit_directly(cluster_state, files, {"worker-0": [sup.id, port]})
        wait_for(lambda: sup.table.running(), 15, "a worker")
        checkpoints.mkdir(parents=True)
        (checkpoints / "offsets").write_text("0")
        fetched = len(fetches.calls)
        # Moved away and back within the grace: kept, and not fetched again.
        assign({})
        wait_for(lambda: not sup.table.running(), 10, "the worker to stop")
        assert sup.code.has(TOPOLOGY)
        assign({"worker-0": [sup.id, port]})
        wait_for(lambda: sup.table.running(), 15, "the worker back")
        assert len(fetches.calls) == fetched
        # Moved away for good: the code goes after the grace, its checkpoints stay.
        assign({})
        wait_for(lambda: not sup.code.has(TOPOLOGY), 10 + grace, "the code to go")
        assert checkpoints.is_dir(), "the topology still exists: its state is kept"
        # Back (fetched again), then killed: after the grace, code and checkpoints go.
        assign({"worker-0": [sup.id, port]})
        wait_for(lambda: sup.table.running(), 15, "the worker back again")
        assert len(fetches.calls) > fetched
        cluster_state.zk.delete(assignment)
        cluster_state.zk.delete(cluster_state.storm_path(TOPOLOGY))
        wait_for(lambda: not sup.code.has(TOPOLOGY), 10 + grace, "the code to go")
        assert checkpoints.parent.is_dir() is not cleanup
    finally:
        sup.stop()


def test_supervisor_kills_a_silent_worker_and_its_workers_on_connection_loss(
        tmp_path, zk_server, zk_root, cluster_state, stub_worker):
    port = _free_port()
    files = _code(_tar({"topology.yaml": b"command: [true]\n"}))
    files["stormconf.json"] = b'{"topology.stub.silent": true}'
    sup = _supervisor(tmp_path, zk_server, zk_root, stub_worker, files, port)
    sup.start()
    try:
        _submit_directly(cluster_state, files, {"worker-0": [sup.id, port]})
        first = wait_for(lambda: sup.table.running(), 10, "a worker")[0]
        # Silent: killed after supervisor.worker.start.timeout.secs, restarted, counted.
        wait_for(lambda: (h := sup.table.running()) and h[0] is not first, 15,
                 "a replacement worker")
        assert first.ended_by == "timeout" and first.exit_code() == -signal.SIGKILL
        assert sup.table.slots[(TOPOLOGY, port)].restarts == 1
        assert "sent no status" in cluster_state.errors(TOPOLOGY, "worker-0")[0].error
        # SUSPENDED (a blip, a ZooKeeper server restarting): the worker runs on; issue 20.
        second = sup.table.running()[0]
        from kazoo.protocol.states import KazooState
        sup._on_connection_state(KazooState.SUSPENDED)
        sup._on_connection_state(KazooState.CONNECTED)
        assert second.exit_code() is None and not second.ended_by
        # LOST: every worker is killed at once, not counted as a crash.
        sup._on_connection_state(KazooState.LOST)
        wait_for(lambda: second.exit_code() is not None, 3, "the kill")
        assert second.ended_by == "lost"
        sup._on_connection_state(KazooState.CONNECTED)
        third = wait_for(lambda: (h := sup.table.running()) and h[0] is not second
                         and h[0], 10, "a restart on reconnection")
        assert third.restarts == 1 and sup.table.slots[(TOPOLOGY, port)].restarts == 1
    finally:
        sup.stop()


class _KilledHere(Exception):
    """Stands for a kill -9 of the supervisor at this point of its registration."""


def test_a_restarted_supervisor_replaces_its_earlier_node_in_one_transaction(
        tmp_path, zk_server, zk_root, cluster_state, stub_worker, make_zk):
    """The leader moves a supervisor's work at once when its node is gone, on the grounds
    that its session (and its leases) ended; while the earlier session lives, the node
    must never be gone, not even between two calls of the replacement."""
    files = _code(_tar({"topology.yaml": b"command: [true]\n"}))
    sup = _supervisor(tmp_path, zk_server, zk_root, stub_worker, files, _free_port())
    earlier = make_zk()  # the session of this supervisor's killed process, still alive
    earlier.create(sup.node_path, b"earlier", ephemeral=True)
    create = sup.zk.create

    def create_unless_replacing(path, *args, **kwargs):
        # A create that would fill the gap a delete left: the process is killed first.
        if path == sup.node_path and cluster_state.zk.exists(path) is None:
            raise _KilledHere()
        return create(path, *args, **kwargs)

    sup.zk.create = create_unless_replacing
    sup.start()
    try:
        stat = cluster_state.zk.exists(sup.node_path)
        assert stat is not None and stat.ephemeralOwner == sup.zk.client_id[0]
        assert stat.ephemeralOwner != earlier.client_id[0]
        earlier.stop()  # the earlier session ends: the replacement stays
        assert cluster_state.supervisor_info(sup.id).meta == sup.ports
    finally:
        sup.stop()


def test_a_slot_whose_earlier_worker_cannot_be_identified_starts_nothing_until_its_lease(
        tmp_path, zk_server, zk_root, cluster_state, stub_worker):
    port = _free_port()
    files = _code(_tar({"topology.yaml": b"command: [true]\n"}))
    sup = _supervisor(tmp_path, zk_server, zk_root, stub_worker, files, port)
    slot_dir = sup.workers_dir / f"{TOPOLOGY}-{port}"
    slot_dir.mkdir(parents=True)
    (slot_dir / "supervisor.sock").write_text("no socket")  # who runs there is unknown
    started = time.monotonic()
    sup.start()
    try:
        # Held for 2/3 of the 4 s session; made longer here, so that a slow pass cannot
        # outlast it.
        assert list(sup.adoption.held_until) == [port]
        assert started + 2.0 < sup.adoption.held_until[port] <= time.monotonic() + 8 / 3
        sup.adoption.held_until[port] = time.monotonic() + 600
        _submit_directly(cluster_state, files, {"worker-0": [sup.id, port]})
        passes = sup.passes
        wait_for(lambda: sup.passes >= passes + 3, 15, "three reconcile passes")
        assert sup.table.running() == []
        sup.adoption.held_until[port] = 0.0  # as when 2/3 of the session timeout has passed
        sup._monitor.wake()
        wait_for(lambda: _beat(cluster_state, sup, port), 15, "the slot's worker")
        assert sup.adoption.held_until == {}
    finally:
        sup.stop()


def test_supervisor_exits_when_a_slot_port_is_taken(tmp_path, zk_server, zk_root):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        conf = load_config(overrides={
            "storm.zookeeper.port": zk_server.port, "storm.zookeeper.root": zk_root,
            "storm.local.dir": str(tmp_path / "local"), "supervisor.slots.ports": [port]})
        with pytest.raises(SlotPortInUseError):
            build_supervisor(conf)
    assert not (tmp_path / "local" / "supervisor").exists()   # took nothing


class BlockedPeers(FakePeers):
    """FakePeers whose fetches of one topology hang until ``release`` is set (a nimbus
    cut off mid-transfer), each at most its ``timeout_s``."""

    def __init__(self, served: dict[str, dict[str, bytes]], blocked_topology: str):
        super().__init__(served)
        self.blocked_topology = blocked_topology
        self.release = threading.Event()
        self.hanging = threading.Event()

    def __call__(self, peer: str, remote: str, dest: Path, timeout_s: float = 30.0) -> str:
        if remote.startswith(self.blocked_topology + "/") and not self.release.is_set():
            self.hanging.set()
            if not self.release.wait(timeout_s):
                raise TimeoutError("timed out")
        return super().__call__(peer, remote, dest, timeout_s)


def test_stopping_an_unassigned_worker_never_waits_behind_a_code_fetch(
        tmp_path, zk_server, zk_root, cluster_state, stub_worker):
    """Issue 18, bug 2: the reconcile loop used to fetch code itself, so a fetch from a
    nimbus that does not answer held up the stopping of a worker no longer assigned."""
    ports = [_free_port(), _free_port()]
    files = _code(_tar({"topology.yaml": b"command: [true]\n"}))
    slow = "slow-2-1700000000"
    sup = _supervisor(tmp_path, zk_server, zk_root, stub_worker, files, ports[0])
    sup.ports = ports
    peers = BlockedPeers({"nimbus:6627": files}, slow)
    sup.code = CodeCache(sup.code.root, 1 << 20, peers)
    sup.start()
    try:
        _submit_directly(cluster_state, files, {"worker-0": [sup.id, ports[0]]})
        running = wait_for(lambda: sup.table.running(), 15, "the first worker")[0]
        # A second topology lands on the other slot; its code cannot be fetched.
        cluster_state.zk.create(cluster_state.path("assignments", slow), Assignment(
            master_code_dir="/x", executor_node_port={"worker-0": [sup.id, ports[1]]},
            code_sha256=_sha(files)).encode())
        index_work(cluster_state, slow, {"worker-0": [sup.id, ports[1]]})
        assert peers.hanging.wait(15), "the fetch of the slow topology never began"
        # The first one is unassigned while that fetch hangs: stopped all the same.
        cluster_state.zk.set(cluster_state.path("assignments", TOPOLOGY), Assignment(
            master_code_dir="/x", code_sha256=_sha(files)).encode())
        wait_for(lambda: running.exit_code() is not None, 15, "the unassigned worker to stop")
        assert sup.fetcher.current == slow and not peers.release.is_set()
        assert running.ended_by == "stop"
        peers.release.set()
        started = wait_for(lambda: [h for h in sup.table.running()
                                    if h.topology_id == slow], 15, "the slow topology's worker")
        assert started[0].port == ports[1]
    finally:
        peers.release.set()
        sup.stop()


def test_a_fetch_that_does_not_finish_in_time_is_given_up_and_tried_again(tmp_path):
    files = _code(_tar({"topology.yaml": b"command: [true]\n"}))
    peers = BlockedPeers({"n:1": files}, TOPOLOGY)
    done = threading.Event()
    fetcher = CodeFetcher(CodeCache(tmp_path / "stormdist", 1 << 20, peers),
                          lambda topology_id: ["n:1"], done.set, timeout_s=0.5)
    fetcher.start()
    try:
        assert fetcher.request(TOPOLOGY, _sha(files)) is None
        assert done.wait(15), "the fetch never ended"
        with pytest.raises(CodeUnavailableError, match="timed out"):
            fetcher.request(TOPOLOGY, _sha(files))
        peers.release.set()  # the nimbus answers again: the next request fetches it
        done.clear()
        assert fetcher.request(TOPOLOGY, _sha(files)) is None
        assert done.wait(15)
        assert fetcher.request(TOPOLOGY, _sha(files)) == fetcher.cache.path(TOPOLOGY)
    finally:
        fetcher.stop()
    assert not any(t.name == "supervisor-code-fetch" for t in threading.enumerate())


def test_a_worker_gets_no_credential_of_the_cluster(
        tmp_path, zk_server, zk_root, cluster_state, stub_worker, monkeypatch):
    """Issue 19, W1: worker.json and the worker's environment hold nothing of the
    supervisor's credentials (ZooKeeper digest, superACL, TLS key, store secrets, secret
    environment variables); the topology's own keys still reach it."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret-1234")
    # Named as the configuration's secret keys are (issue 30's tutorial walk found these
    # reaching workers), and one a secret setting reads its value from (.env).
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", "env-secret-acct")
    monkeypatch.setenv("BLOBBOX_CONNECTION_STRING", "env-secret-conn")
    monkeypatch.setenv("STORE_VALUE", "env-secret-referenced")
    monkeypatch.setenv("NIMBUS_TEST_PLAIN", "kept")
    port = _free_port()
    files = _code(_tar({"topology.yaml": b"command: [true]\n"}))
    files["stormconf.json"] = b'{"pipeline.input": "in", "pipeline.db.password": "alices"}'
    sup = _supervisor(tmp_path, zk_server, zk_root, stub_worker, files, port)
    secrets = {"storm.zookeeper.auth.payload": "nimbus:digest-secret",
               "storm.zookeeper.superACL": "digest:super:abc=",
               "storm.thrift.tls.key.file": "/etc/nimbus/supervisor.key",
               "nimbus.codedistributor.s3.secret.key": "s3-secret-5678"}
    sup.conf = sup.conf.__class__({**sup.conf.as_dict(), **secrets}, indirect={
        "nimbus.codedistributor.s3.access.key": (
            "nimbus.codedistributor.s3.access.key.env", "STORE_VALUE")})
    sup.start()
    try:
        _submit_directly(cluster_state, files, {"worker-0": [sup.id, port]})
        handle = wait_for(lambda: sup.table.running(), 15, "the worker")[0]
        spec_file = sup.workers_dir / f"{TOPOLOGY}-{port}" / "worker.json"
        written = spec_file.read_text()
        conf = json.loads(written)["conf"]
        for key, value in secrets.items():
            assert key not in conf and value not in written, key
        assert "nimbus.seeds" not in conf and "storm.zookeeper.servers" not in conf
        assert (conf["pipeline.input"], conf["pipeline.db.password"]) == ("in", "alices")
        assert conf["topology.spark.master"] == sup.conf["topology.spark.master"]
        environ = Path(f"/proc/{handle.process.pid}/environ").read_bytes().split(b"\0")
        assert b"NIMBUS_TEST_PLAIN=kept" in environ
        assert not [item for item in environ if b"env-secret" in item]
    finally:
        sup.stop()


def test_backoff_starts_afresh_for_a_worker_that_had_done_its_work():
    backoff = RestartBackoff()
    assert [backoff.delay_after_exit(1.0) for _ in range(3)] == [0, 1, 2]
    assert backoff.delay_after_exit(1.0, healthy=True) == 0
    assert [backoff.delay_after_exit(1.0) for _ in range(2)] == [1, 2]


@pytest.mark.parametrize(("batch", "delays"), [(True, ["0", "0", "0"]),
                                               (False, ["0", "1", "2"])])
def test_only_a_crash_loop_backs_off(tmp_path, zk_server, zk_root, cluster_state,
                                     stub_worker, caplog, batch, delays):
    """Issue 20: a worker that dies after it committed is restarted at once; one that
    dies before (a crash loop) backs off."""
    port = _free_port()
    files = _code(_tar({"topology.py": b"def build(spark, conf): ...\n"}))
    files["stormconf.json"] = json.dumps({"topology.stub.exit_after": 0.6,
                                          "topology.stub.batch": batch}).encode()
    sup = _supervisor(tmp_path, zk_server, zk_root, stub_worker, files, port)
    sup.start()
    try:
        with caplog.at_level("WARNING", logger="nimbus.supervisor.ending"):
            _submit_directly(cluster_state, files, {"worker-0": [sup.id, port]})
            wait_for(lambda: sup.table.slots.get((TOPOLOGY, port)) is not None
                     and sup.table.slots[(TOPOLOGY, port)].restarts >= 3, 30, "three restarts")
        got = [r.getMessage().rsplit("restart in ", 1)[1].rstrip("s") for r in caplog.records
               if "exited with code 3; restart in" in r.getMessage()]
        assert got[:3] == delays
    finally:
        sup.stop()


def test_a_child_that_leaves_the_process_group_dies_with_its_worker(
        tmp_path, zk_server, zk_root, cluster_state, stub_worker):
    """Issue 20 (and 19, W7): a command that calls setsid escaped the group kill and kept
    running after its work had moved; in the worker's cgroup it cannot."""
    port = _free_port()
    files = _code(_tar({"topology.yaml": b"command: [true]\n"}))
    files["stormconf.json"] = b'{"topology.stub.daemonize": true}'
    sup = _supervisor(tmp_path, zk_server, zk_root, stub_worker, files, port)
    sup.start()
    try:
        assert sup.cgroups is not None, "this host must give workers cgroups (root, cgroup2)"
        _submit_directly(cluster_state, files, {"worker-0": [sup.id, port]})
        handle = wait_for(lambda: sup.table.running(), 15, "the worker")[0]
        pid_file = sup.workers_dir / f"{TOPOLOGY}-{port}" / "daemon.pid"
        daemon = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), 15,
                              "the daemonized child"))
        assert os.getpgid(daemon) != handle.pid  # it did leave the worker's group
        cgroup = sup.cgroups.path(f"{TOPOLOGY}-{port}")
        assert str(daemon) in (cgroup / "cgroup.procs").read_text().split()
        cluster_state.zk.set(cluster_state.path("assignments", TOPOLOGY), Assignment(
            master_code_dir="/x", code_sha256=_sha(files)).encode())
        wait_for(lambda: handle.exit_code() is not None, 15, "the worker to stop")
        wait_for(lambda: not _alive(daemon), 10, "the daemonized child to die")
        wait_for(lambda: not cgroup.exists(), 10, "its cgroup to go")
    finally:
        sup.stop()


def _restarts(sup: Supervisor, port: int) -> int:
    record = sup.table.slots.get((TOPOLOGY, port))
    return record.restarts if record is not None else 0


@pytest.fixture
def leased_worker(tmp_path, zk_server, zk_root, cluster_state, stub_worker):
    """A started supervisor with one slot, and the worker it runs there in a cgroup of its
    own, holding its first lease: yields (supervisor, handle, port); stops it after."""
    port = _free_port()
    files = _code(_tar({"topology.yaml": b"command: [true]\n"}))
    sup = _supervisor(tmp_path, zk_server, zk_root, stub_worker, files, port)
    sup.start()
    try:
        assert sup.cgroups is not None, "this host must give workers cgroups (root, cgroup2)"
        _submit_directly(cluster_state, files, {"worker-0": [sup.id, port]})
        handle = wait_for(lambda: sup.table.running(), 15, "the worker")[0]
        wait_for(lambda: handle.lease_deadline is not None, 15, "its first lease")
        assert handle.cgroup is not None
        yield sup, handle, port
    finally:
        sup._connected.set()
        sup.stop()


def _killed_for_its_rewritten_assignment(sup: Supervisor, handle: WorkerHandle,
                                         port: int) -> WorkerHandle:
    """Once thawed once, frozen again while its assignment was rewritten: it is killed
    at the next renewal, not counted as a crash, and its slot starts a fresh worker,
    which is returned once it holds a lease."""
    wait_for(lambda: handle.exit_code() is not None, 15, "the frozen worker to be killed")
    assert handle.ended_by == "lease" and handle.thaws == 1
    fresh = wait_for(lambda: [h for h in sup.table.running() if h is not handle],
                     15, "its slot to start it afresh")[0]
    wait_for(lambda: fresh.lease_deadline is not None, 15, "the new worker's lease")
    assert _restarts(sup, port) == 0  # no crash counted
    return fresh


def test_a_frozen_worker_is_thawed_by_a_renewal_and_killed_once_frozen_too_long(
        leased_worker, cluster_state):
    """A worker freezes its cgroup when its lease runs out (nimbus/worker/lease.py; the
    stand-in cannot, so the test freezes it): the supervisor's next renewal thaws it, and
    one that stays frozen past supervisor.worker.timeout.secs is killed, not counted as a
    crash."""
    sup, handle, port = leased_worker
    (handle.cgroup / "cgroup.freeze").write_text("1")
    wait_for(lambda: handle.thaws == 1, 15, "a renewal to thaw it")
    assert not handle.is_frozen() and handle.exit_code() is None

    # Frozen while cut off, and meanwhile its assignment is written again (the same
    # placement; its work could have gone elsewhere and come back): not thawed.
    sup._connected.clear()  # renews nothing, as while cut off
    (handle.cgroup / "cgroup.freeze").write_text("1")
    path = cluster_state.path("assignments", TOPOLOGY)
    cluster_state.zk.set(path, cluster_state.zk.get(path)[0])
    sup._connected.set()
    handle = _killed_for_its_rewritten_assignment(sup, handle, port)

    sup._connected.clear()
    (handle.cgroup / "cgroup.freeze").write_text("1")
    # Said, and shown, while it is frozen (issue 29: it showed as alive).
    wait_for(lambda: _said(cluster_state, sup, port)["state"] == "frozen", 15,
             "its supervisor to say it is frozen")
    (shown,) = runtime_view.topology_info(cluster_state, TOPOLOGY)["workers"]
    assert (shown["state"], shown["alive"]) == ("frozen", False)
    # Its lease ran out longer ago than supervisor.worker.timeout.secs (3 s).
    handle.lease_deadline = time.monotonic() - 4
    sup.reconcile()
    assert handle.ended_by == "lease"
    wait_for(lambda: handle.exit_code() is not None, 15, "the frozen worker to die")
    assert handle.exit_code() == -signal.SIGKILL
    sup.ender.reap()
    assert _restarts(sup, port) == 0


def test_a_worker_frozen_through_a_lost_session_is_thawed_by_the_next_one(
        leased_worker, cluster_state, zk_server):
    """A lost session kills every running worker, but one already frozen on its lapsed
    lease acts no more than a dead one: it is kept, and the next session's renewal thaws
    it if its assignment is unchanged (the same mzxid), or kills it if it was rewritten
    meanwhile (its work may have moved away and back)."""
    sup, handle, port = leased_worker
    def lose_the_session_while_frozen(rewrite: bool = False) -> int:
        sup._connected.clear()  # renews nothing, as while cut off
        (handle.cgroup / "cgroup.freeze").write_text("1")  # as its lapsed lease would
        wait_for(handle.is_frozen, 15, "the worker to be frozen")
        if rewrite:  # the same placement: its work could have gone and come back
            path = cluster_state.path("assignments", TOPOLOGY)
            cluster_state.zk.set(path, cluster_state.zk.get(path)[0])
        session = sup.zk.client_id[0]
        expire_session(sup.zk, zk_server.hosts)
        return session

    first_session = lose_the_session_while_frozen()
    wait_for(lambda: handle.thaws == 1, 15, "a renewal of the next session to thaw it")
    assert handle.session_id not in (first_session, None)
    assert handle.session_id == sup.zk.client_id[0]
    assert not handle.is_frozen() and handle.exit_code() is None and not handle.ended_by
    assert sup.table.running() == [handle]

    # Lost again while frozen, and meanwhile its assignment is written again.
    lose_the_session_while_frozen(rewrite=True)
    _killed_for_its_rewritten_assignment(sup, handle, port)


def _said(state: StormClusterState, sup: Supervisor, port: int) -> dict | None:
    """What ``sup``'s node says of the worker of its slot ``port`` (SupervisorInfo.workers)."""
    info = state.supervisor_info(sup.id)
    return info.workers.get(str(port)) if info is not None else None


@pytest.mark.parametrize(("served", "prefix", "needle"), [
    ("tampered", "its code cannot be used here: ", "sha256"),
    ("nothing", "its code cannot be fetched: ", "nimbus:6627: connection refused")])
def test_code_that_cannot_be_had_is_reported_once_and_tried_ever_later(
        tmp_path, zk_server, zk_root, cluster_state, stub_worker, caplog, monkeypatch,
        served, prefix, needle):
    """Issue 19: a bundle that fails its checks was refused silently, then fetched again
    every 5 s for ever. Issue 29: a refused download was a supervisor's WARNING only.
    Now its topology hears of either once, its slot says it is restarting and why, and
    the tries back off."""
    import nimbus.supervisor.starting as starting_module

    monkeypatch.setattr(starting_module, "CODE_RETRY_S", 0.2)
    port = _free_port()
    files = _code(_tar({"topology.yaml": b"command: [true]\n"}))
    tampered = dict(files, **{"stormjar.jar": files["stormjar.jar"] + b"x"})
    sup = _supervisor(tmp_path, zk_server, zk_root, stub_worker, files, port)
    sup.code = CodeCache(sup.code.root, 1 << 20, FakePeers(
        {"nimbus:6627": tampered} if served == "tampered" else {}))
    sup.start()
    try:
        with caplog.at_level("WARNING", logger="nimbus.supervisor.starting"):
            _submit_directly(cluster_state, files, {"worker-0": [sup.id, port]})
            # The fourth try failed: the next is 1.6 s later, said as 2 s.
            said = wait_for(lambda: (got := _said(cluster_state, sup, port)) and
                            got["backoff_secs"] == 2 and got, 30, "four tries")
        delays = [r.getMessage().rsplit("next try in ", 1)[1] for r in caplog.records
                  if "next try in" in r.getMessage()]
        assert delays[:4] == ["0.2s)", "0.4s)", "0.8s)", "1.6s)"]
        errors = cluster_state.errors(TOPOLOGY, "worker-0")
        assert len(errors) == 1
        assert errors[0].error.startswith(prefix)
        assert needle in errors[0].error
        assert said == {"topology_id": TOPOLOGY, "state": "restarting", "restarts": 0,
                        "backoff_secs": 2,
                        "last_error": worker_state.first_line(errors[0].error),
                        # Code that cannot be had is no exit of a worker of its version.
                        "version": 1, "committed": False, "failures": 0}
        assert sup.table.running() == []
    finally:
        sup.stop()


def test_a_crash_loop_is_said_restarting_with_its_backoff_and_recorded_once(
        tmp_path, zk_server, zk_root, cluster_state, stub_worker):
    """Issue 29: a command that kept crashing showed as alive. Its supervisor now says,
    in its own node, that the slot's worker runs, or restarts after which back-off and
    why; topology-info shows the same; its error is recorded once, not once per crash."""
    port = _free_port()
    files = _code(_tar({"topology.yaml": b"command: [true]\n"}))
    files["stormconf.json"] = b'{"topology.stub.exit_after": 0.6}'
    sup = _supervisor(tmp_path, zk_server, zk_root, stub_worker, files, port)
    sup.start()
    try:
        _submit_directly(cluster_state, files, {"worker-0": [sup.id, port]})
        # A process topology that declares no health check: up once it beats, so its
        # crashes (each after it beat) are no failures of its version.
        wait_for(lambda: _said(cluster_state, sup, port) == {
            "topology_id": TOPOLOGY, "state": "running", "restarts": 0, "backoff_secs": 0,
            "last_error": "", "version": 1, "committed": True, "failures": 0}, 15,
            "its first process to run")
        # Restarted at once, then after 1 s, 2 s, 4 s: after the third crash, 2 s.
        restarting = {"topology_id": TOPOLOGY, "state": "restarting", "restarts": 3,
                      "backoff_secs": 2, "last_error": "boom", "version": 1,
                      "committed": False, "failures": 0}
        wait_for(lambda: _said(cluster_state, sup, port) == restarting, 30,
                 "the third crash")

        def shown() -> dict | None:
            (w,) = runtime_view.topology_info(cluster_state, TOPOLOGY)["workers"]
            return {k: w[k] for k in ("state", "alive", "restarts", "backoff_secs",
                                      "last_error", "uptime_secs")}

        wait_for(lambda: shown() == {"state": "restarting", "alive": False, "restarts": 4,
                                     "backoff_secs": 4, "last_error": "boom",
                                     "uptime_secs": 0}, 30, "topology-info to agree")
        assert [e.error for e in cluster_state.errors(TOPOLOGY, "main")] == ["boom"]
        # supervisor_worker_state follows the same states.
        wait_for(lambda: sup.registration.slot_states() == {(TOPOLOGY, port): "restarting"}, 30,
                 "the metrics' state")
    finally:
        sup.stop()


@pytest.mark.parametrize("cgroups", [True, False])
def test_a_worker_command_that_cannot_run_is_said_and_recorded_once(
        tmp_path, zk_server, zk_root, cluster_state, monkeypatch, cgroups):
    """A worker command that cannot be run: where workers run in cgroups the shell that
    joins the cgroup cannot exec it (exit 127, its words quoted from the worker's log);
    elsewhere the start itself fails. Either way the slot restarts with a back-off, and
    its error is recorded once."""
    import nimbus.supervisor.starting as starting_module

    monkeypatch.setattr(starting_module, "CODE_RETRY_S", 0.2)
    port = _free_port()
    files = _code(_tar({"topology.yaml": b"command: [true]\n"}))
    missing = str(tmp_path / "no-such-python")
    sup = _supervisor(tmp_path, zk_server, zk_root, (missing,), files, port)
    sup.start()
    try:
        if not cgroups:
            sup.cgroups = None  # as on a host without them (set before the first start)
        _submit_directly(cluster_state, files, {"worker-0": [sup.id, port]})
        wait_for(lambda: (said := _said(cluster_state, sup, port)) and
                 said["state"] == "restarting" and said["restarts"] + (
                     sup.table.slots[(TOPOLOGY, port)].start_failures) >= 3, 30, "three tries")
        errors = [e.error for e in cluster_state.errors(TOPOLOGY, "worker-0")]
        if cgroups:
            assert errors == [f"worker exited with code 127: nimbus-ha: 1: exec: {missing}: "
                              "not found"]
        else:
            assert errors == [f"cannot run the worker command {missing}: [Errno 2] No such "
                              f"file or directory: '{missing}'"]
        assert _said(cluster_state, sup, port)["last_error"] == errors[0]
    finally:
        sup.stop()


def test_code_cache_expiry_keeps_moved_work_for_its_grace_and_drops_killed_at_once(
        tmp_path: Path):
    cache = CodeCache(tmp_path / "stormdist", 1 << 20, FakePeers({}))
    for name in ("moved-1-1", "killed-1-1", "kept-1-1"):
        (cache.root / name).mkdir()
    killed = {"killed-1-1"}
    assert cache.expired({"kept-1-1"}, 300, now=0.0, gone=killed.__contains__) == \
        {"killed-1-1"}
    assert cache.retained == {"moved-1-1"}
    assert cache.expired({"kept-1-1"}, 300, now=299.0, gone=killed.__contains__) == \
        {"killed-1-1"}
    # Needed again within its grace: its clock starts afresh when it is next unneeded.
    assert cache.expired({"kept-1-1", "moved-1-1"}, 300, now=299.5) == {"killed-1-1"}
    assert cache.expired({"kept-1-1"}, 300, now=300.0) == {"killed-1-1"}
    assert cache.expired({"kept-1-1"}, 300, now=600.0) == {"killed-1-1", "moved-1-1"}
