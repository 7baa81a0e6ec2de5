"""Workers as accounts of their own (issue 19, W1; ``supervisor.run.worker.as.user``):
bob's topology reads none of the supervisor's files nor alice's code and worker files.

Real OS accounts (``useradd``; the tests run as root), a real ZooKeeper, a real
supervisor and worker processes (the stand-in worker of test_supervisor.py, which probes
paths a hostile tenant would try). The Python that runs the workers must be reachable by
every account; on this machine it lives under /root (mode 0700), so the test opens
/root for traversal (o+x, not listing) while it runs, and restores its mode.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import pytest
from supervisor_index import index_work
from test_supervisor import STUB_WORKER, FakePeers, _code, _free_port, _sha, _tar
from waiting import wait_for

from nimbus.config import ConfigError, load_config
from nimbus.daemons.supervisor import build_supervisor
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.records import ACTIVE, Assignment, StormBase
from nimbus.supervisor.code_cache import CodeCache
from nimbus.supervisor.run_as_user import account_for, remove_account

pytestmark = pytest.mark.zookeeper

ALICE, BOB = "alices-1-1700000000", "bobs-2-1700000000"

if os.geteuid() != 0:
    pytest.skip("run-as-user tests make OS accounts: they need root", allow_module_level=True)


@pytest.fixture
def base():
    """A directory every account can traverse (pytest's tmp_path is under a 0700 one)."""
    path = Path(tempfile.mkdtemp(prefix="nh-runas-", dir="/tmp"))
    os.chmod(path, 0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def reachable_python():
    """o+x on every directory above the interpreter, for the duration of the test."""
    changed = []
    for part in Path(sys.executable).resolve().parents:
        mode = part.stat().st_mode
        if not mode & stat.S_IXOTH:
            os.chmod(part, mode | stat.S_IXOTH)
            changed.append((part, mode))
    yield
    for part, mode in changed:
        os.chmod(part, mode)


@pytest.fixture
def state(make_zk, zk_root):
    state = StormClusterState(make_zk(), zk_root)
    state.setup()
    return state


def _conf(zk_server, zk_root, base: Path, ports: list[int], **extra):
    return load_config(overrides={
        "storm.zookeeper.port": zk_server.port, "storm.zookeeper.root": zk_root,
        "storm.zookeeper.session.timeout": 4000, "storm.local.dir": str(base / "local"),
        "storm.local.hostname": "127.0.0.1", "supervisor.slots.ports": ports,
        "supervisor.monitor.frequency.secs": 1,
        "supervisor.code.cleanup.grace.secs": 0, "supervisor.worker.start.timeout.secs": 10,
        "supervisor.run.worker.as.user": True, "supervisor.spark.class.archive": False,
        "logviewer.port": 0, **extra})


def _assign(state: StormClusterState, topology_id: str, files: dict[str, bytes],
            slot: list) -> None:
    zk = state.zk
    zk.create(state.storm_path(topology_id), StormBase(topology_id, 1, ACTIVE, 1).encode())
    zk.create(state.path("assignments", topology_id), Assignment(
        master_code_dir="/x", executor_node_port={"worker-0": slot},
        code_sha256=_sha(files)).encode())
    zk.create(state.path("workerbeats", topology_id), b"")
    zk.create(state.path("errors", topology_id), b"")
    index_work(state, topology_id, {"worker-0": slot})


def test_bob_reads_nothing_of_the_supervisor_or_of_alice(zk_server, zk_root, base, state,
                                                        reachable_python):
    stub = base / "stub_worker.py"
    stub.write_text(STUB_WORKER)
    os.chmod(stub, 0o755)
    secret = base / "supervisor.key"  # stands for its TLS key, its storm.yaml
    secret.write_text("-----BEGIN PRIVATE KEY-----\n")
    os.chmod(secret, 0o600)
    ports = [_free_port(), _free_port()]
    local = base / "local"
    alice_worker = local / "workers" / f"{ALICE}-{ports[0]}"
    probes = [str(secret), str(local / "supervisor" / "id"), str(local / "supervisor"),
              str(local / "supervisor" / "stormdist" / ALICE / "stormconf.json"),
              str(alice_worker / "worker.json"), str(alice_worker),
              str(local / "checkpoints" / ALICE), "/proc/1/cwd",
              # alice's logs, their record and the log root (docs/logs.md)
              str(local / "workers-artifacts" / ALICE / str(ports[0]) / "worker.log"),
              str(local / "workers-artifacts" / ALICE / str(ports[0])),
              str(local / "workers-artifacts" / ALICE / "log-meta.json"),
              str(local / "workers-artifacts" / ALICE), str(local / "workers-artifacts"),
              str(local / "workers-artifacts" / BOB / str(ports[1])),  # its own logs
              str(local / "supervisor" / "stormdist" / BOB / "resources")]  # its own
    alice = _code(_tar({"topology.yaml": b"command: [true]\n"}))
    alice["stormconf.json"] = b'{"alice.db.password": "alices-own"}'
    bob = _code(_tar({"topology.yaml": b"command: [true]\n"}))
    bob["stormconf.json"] = json.dumps({"topology.stub.probe": probes}).encode()
    sup = build_supervisor(_conf(zk_server, zk_root, base, ports),
                           worker_command=(sys.executable, str(stub)))
    sup.code = CodeCache(sup.code.root, 1 << 20, _Peers({ALICE: alice, BOB: bob}))
    sup._peers = lambda topology_id: ["nimbus:6627"]
    sup.start()
    try:
        _assign(state, ALICE, alice, [sup.id, ports[0]])
        _assign(state, BOB, bob, [sup.id, ports[1]])
        probe = local / "workers" / f"{BOB}-{ports[1]}" / "probe.json"
        wait_for(lambda: probe.exists() and probe.stat().st_size > 0, 30, "bob's probe")
        found = json.loads(probe.read_text())
        handles = {h.topology_id: h for h in sup.table.running()}
        alice_uid = pwd.getpwnam(account_for(ALICE)).pw_uid
        bob_uid = pwd.getpwnam(account_for(BOB)).pw_uid
        assert found.pop("uid") == bob_uid and bob_uid not in (0, alice_uid)
        assert found.pop(probes[-1]) == "read", "its own code"
        assert found.pop(probes[-2]) == "read", "its own log directory"
        assert found == dict.fromkeys(probes[:-2], "PermissionError"), found
        assert os.stat(f"/proc/{handles[ALICE].pid}").st_uid == alice_uid
        # Its log is its own to write (its pump rotates it as alice's account).
        alice_logs = local / "workers-artifacts" / ALICE / str(ports[0])
        assert (alice_logs.stat().st_uid, alice_logs.stat().st_mode & 0o777) == \
            (alice_uid, 0o700)
        assert (alice_logs / "worker.log").stat().st_uid == alice_uid
    finally:
        sup.stop()
        for topology_id in (ALICE, BOB):
            remove_account(account_for(topology_id))


class _Peers(FakePeers):
    """Serves each topology's own files, whatever the peer."""

    def __init__(self, by_topology: dict[str, dict[str, bytes]]):
        super().__init__({})
        self.by_topology = by_topology

    def __call__(self, peer: str, remote: str, dest: Path, timeout_s: float = 30.0) -> str:
        topology_id = remote.split("/", 1)[0]
        self.served = {peer: self.by_topology[topology_id]}
        return super().__call__(peer, remote, dest, timeout_s)


def test_a_python_other_accounts_cannot_reach_is_refused_at_start(zk_server, zk_root, base):
    if all(p.stat().st_mode & stat.S_IXOTH for p in Path(sys.executable).resolve().parents):
        pytest.skip("this interpreter is reachable by every account: nothing to refuse")
    with pytest.raises(ConfigError, match="workers, running as accounts of their own, "
                                          "cannot reach"):
        build_supervisor(_conf(zk_server, zk_root, base, [_free_port()]))
