"""Worker logs end to end (docs/logs.md): real supervisors run a real topology whose
workers print fast, rotate their logs at a small size, and serve them from each
supervisor's logviewer over HTTPS with client certificates; ``nimbus-ha logs`` runs as a
user runs it; the logs outlive the workers that wrote them for the retention, no longer.

One cluster for the module, with TLS (storm.thrift.transport: tls, the
SimpleACLAuthorizer): one nimbus, two supervisors of one slot each, topology ``chatty``
of two workers, one on each. Each worker's command prints a numbered, timed line of
200 bytes every 40 ms and an ``ERROR`` line every tenth to its standard error, so each
log (``supervisor.worker.log.max.mb`` 0.01, two backups) rotates every 2 s or so.
"""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
import yaml
from helpers import run_cli
from tls_certs import DAEMON, USER, CertificateAuthority
from waiting import wait_for

from nimbus.dev.cluster import LocalCluster, SupervisorProcess
from nimbus.distribution.archive import pack_directory
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.zk_client import make_zk_client
from nimbus.thrift.client import NimbusClient

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SIMPLE_ACL = "org.apache.storm.security.auth.authorizer.SimpleACLAuthorizer"
MAX_BYTES = int(0.01 * 1024 * 1024)
RETENTION_MIN = 0.1   # 6 s
LINE = re.compile(rb"chatty port=(\d+) seq=(\d+) t=([\d.]+) ")
WRITER = """
import os, sys, time
port = os.environ["NIMBUS_HA_WORKER_PORT"]
seq = 0
while True:
    print(f"chatty port={port} seq={seq} t={time.time():.3f} " + "x" * 150, flush=True)
    if seq % 10 == 0:
        print(f"ERROR marker port={port} seq={seq}", file=sys.stderr, flush=True)
    seq += 1
    time.sleep(0.04)
"""


class Cluster:
    """The module's cluster, its users' configuration files and certificates."""

    def __init__(self, cluster: LocalCluster, files: dict[str, Path], ids: dict,
                 topology_id: str, state: StormClusterState, secret: Path):
        self.cluster = cluster
        self.files = files
        self.ids = ids
        self.topology_id = topology_id
        self.state = state
        self.secret = secret

    def slots(self) -> dict[int, tuple[SupervisorProcess, int]]:
        """worker index -> (its supervisor, its port), as the assignment places it."""
        assignment = self.state.assignment_info(self.topology_id)
        by_id = {s.id: s for s in self.cluster.supervisors}
        return {int(executor.split("-")[1]): (by_id[slot[0]], int(slot[1]))
                for executor, slot in (assignment.executor_node_port.items()
                                       if assignment else [])}

    def get(self, user: str, supervisor: SupervisorProcess, path: str,
            **params) -> requests.Response:
        identity = self.ids[user]
        return requests.get(f"https://127.0.0.1:{supervisor.logviewer_port}{path}",
                            params=params, timeout=15, verify=str(identity.ca),
                            cert=(str(identity.cert), str(identity.key)))

    def logs(self, *args: str, user: str = "alice") -> subprocess.CompletedProcess:
        return run_cli("logs", "chatty", *args, "--config", str(self.files[user]))


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("worker-logs")
    ca = CertificateAuthority(tmp / "ca")
    daemons = ca.issue("cluster", DAEMON)
    ids = {name: ca.issue(name, USER) for name in ("alice", "mallory", "ops")}
    topology = tmp / "chatty"
    topology.mkdir()
    (topology / "writer.py").write_text(WRITER)
    (topology / "topology.yaml").write_text(yaml.safe_dump(
        {"command": [sys.executable, "writer.py"]}))
    secret = tmp / "secret.txt"
    secret.write_text("the secret outside every log root\n")
    cluster = LocalCluster(tmp / "cluster", nimbuses=1, supervisors=2, slots_per_supervisor=1,
                           conf={**daemons.conf(), "nimbus.authorizer": SIMPLE_ACL,
                                 "nimbus.admins": ["ops"],
                                 "nimbus.supervisor.users": ["cluster"],
                                 "nimbus.daemon.users": ["cluster"],
                                 "storm.zookeeper.session.timeout": 6000,
                                 "supervisor.monitor.frequency.secs": 1,
                                 "supervisor.heartbeat.frequency.secs": 1,
                                 "supervisor.worker.shutdown.sleep.secs": 1,
                                 "supervisor.worker.log.max.mb": 0.01,
                                 "supervisor.worker.log.backups": 2,
                                 "logviewer.cleanup.age.mins": RETENTION_MIN})
    zk = None
    try:
        cluster.start()
        base = yaml.safe_load(cluster.config_file.read_text())
        files = {}
        for name, identity in ids.items():
            files[name] = tmp / f"{name}.yaml"   # a client host: seeds and a certificate
            files[name].write_text(yaml.safe_dump({
                **{k: v for k, v in base.items() if k != "storm.local.dir"},
                **identity.conf()}))
        as_alice = NimbusClient(cluster.client_conf(**ids["alice"].conf()), deadline_s=60)
        topology_id = as_alice.submit("chatty", pack_directory(topology),
                                      {"topology.workers": 2})
        zk = make_zk_client(cluster.client_conf(), name="test-observer")
        env = Cluster(cluster, files, ids, topology_id,
                      StormClusterState(zk, "/storm"), secret)
        wait_for(lambda: len(env.slots()) == 2 and all(
            (s.worker_log(topology_id, p).parent / "worker.log.2").exists()
            for s, p in env.slots().values()), 90, "both workers to rotate their logs twice")
        yield env
    except BaseException:
        for daemon in [*cluster.nimbuses, *cluster.supervisors]:
            print(f"--- {daemon.log_file.name} ---\n{daemon.log_text()[-3000:]}")
        raise
    finally:
        if zk is not None:
            zk.stop()
            zk.close()
        cluster.stop()


def _lines(data: bytes) -> list[tuple[int, int, float]]:
    return [(int(m.group(1)), int(m.group(2)), float(m.group(3)))
            for m in (LINE.search(line) for line in data.splitlines()) if m]


def test_a_workers_output_is_served_by_its_supervisors_logviewer(env):
    for index, (supervisor, port) in env.slots().items():
        listed = env.get("alice", supervisor, "/api/v1/listLogs", topoId=env.topology_id)
        assert listed.status_code == 200
        assert f"{env.topology_id}/{port}/worker.log" in listed.json()
        current = env.get("alice", supervisor, "/api/v1/download",
                          file=f"{env.topology_id}/{port}/worker.log")
        assert current.status_code == 200
        lines = _lines(current.content)
        assert lines and {p for p, _, _ in lines} == {port}
        older = env.get("alice", supervisor, "/api/v1/download",
                        file=f"{env.topology_id}/{port}/worker.log.1")
        assert f"ERROR marker port={port}".encode() in older.content + current.content, \
            "its standard error too"
        assert index in (0, 1)


def test_logs_rotate_at_the_configured_size_keeping_the_backups(env):
    directories = [s.worker_log(env.topology_id, p).parent for s, p in env.slots().values()]
    rotated: dict[Path, set[int]] = {d: set() for d in directories}
    deadline = time.monotonic() + 15
    # Look as they rotate, until each slot made a new worker.log.1 at least once.
    while any(len(seen) < 3 for seen in rotated.values()):
        assert time.monotonic() < deadline, "they went on rotating"
        for directory in directories:
            names = {p.name for p in directory.iterdir()}
            assert "worker.log.3" not in names, "two backups, never three"
            for name in ("worker.log.1", "worker.log.2"):
                try:
                    data = (directory / name).read_bytes()
                    rotated[directory].add((directory / name).stat().st_ino)
                except FileNotFoundError:
                    continue   # being renamed
                assert MAX_BYTES - 300 < len(data) <= MAX_BYTES, (name, len(data))
                assert data.endswith(b"\n"), "cut at a line's end"
        time.sleep(0.2)
    supervisor, _ = env.slots()[0]
    detail = env.get("alice", supervisor, "/api/v1/listLogs", topoId=env.topology_id,
                     detail="true").json()
    assert sorted(d["name"] for d in detail) == ["worker.log", "worker.log.1",
                                                 "worker.log.2"]


def test_hostile_paths_are_refused_by_a_real_supervisors_logviewer(env):
    supervisor, port = env.slots()[0]
    planted = supervisor.worker_log(env.topology_id, port).parent / "planted.log"
    planted.symlink_to(env.secret)   # as a tenant could, in its own log directory
    topo = env.topology_id
    hostile = {
        f"{topo}/{port}/planted.log": 403,
        f"{topo}/{port}/../../../../secret.txt": 400,
        str(env.secret): 400,
        "../../secret.txt": 400,
        f"{topo}/{port}/..%2F..%2Fsecret.txt": 400,
        f"{topo}/{port}/worker.log\0": 400,
        f"{topo}/{port}/" + "w" * 400: 400,
        f"{topo}/{port}/worker.log.idx/..": 400,
        f"{topo}/99999/worker.log": 400,
    }
    try:
        for path, status in hostile.items():
            for endpoint in ("/api/v1/log", "/api/v1/download", "/api/v1/search"):
                answer = env.get("alice", supervisor, endpoint, file=path,
                                 **{"search-string": "secret"})
                assert answer.status_code == status, (endpoint, path, answer.text[:200])
                assert b"the secret" not in answer.content
                assert answer.json()["errorMessage"]
        long_url = env.get("alice", supervisor, "/api/v1/log", file="x" * 9000)
        assert long_url.status_code == 414
    finally:
        planted.unlink()


def test_with_tls_no_certificate_no_answer_and_a_stranger_gets_403(env):
    supervisor, port = env.slots()[0]
    url = f"https://127.0.0.1:{supervisor.logviewer_port}/api/v1/listLogs"
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(url, timeout=15, verify=str(env.ids["alice"].ca))
    refused = env.get("mallory", supervisor, "/api/v1/log",
                      file=f"{env.topology_id}/{port}/worker.log")
    assert refused.status_code == 403
    assert refused.json()["errorMessage"].startswith(
        f"mallory may not read the logs of {env.topology_id}: not its submitter")
    assert env.get("mallory", supervisor, "/api/v1/listLogs").json() == []
    assert env.get("ops", supervisor, "/api/v1/listLogs",
                   topoId=env.topology_id).status_code == 200   # an admin
    # nimbus-ha logs as mallory: the nimbus refuses to say where the logs are.
    denied = env.logs(user="mallory")
    assert denied.returncode == 1 and "mallory may not read chatty" in denied.stderr


def test_nimbus_ha_logs_shows_every_worker_or_one(env):
    slots = env.slots()
    both = env.logs()
    assert both.returncode == 0, both.stderr
    prefixes = {line.split("] ", 1)[0] + "]" for line in both.stdout.splitlines()}
    assert prefixes == {f"[127.0.0.1:{port}]" for _, port in slots.values()}
    one = env.logs("--worker", "1")
    assert one.returncode == 0, one.stderr
    lines = _lines(one.stdout.encode())
    assert lines and {port for port, _, _ in lines} == {slots[1][1]}
    assert not one.stdout.startswith("["), "one slot: no prefix"
    seqs = [seq for _, seq, _ in lines]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "the current file, whole"


def test_nimbus_ha_logs_grep(env):
    # The search reads each worker's current file, which rotates every 10 KiB (about 2
    # s of output): one just rotated holds no marker yet (they come every 0.4 s).
    def search() -> subprocess.CompletedProcess | None:
        got = env.logs("--grep", r"ERROR marker port=\d+ seq=\d*0$")
        return got if got.returncode != 0 or got.stdout.strip() else None

    found = wait_for(search, 30, "a marker to match")
    assert found.returncode == 0, found.stderr
    lines = found.stdout.splitlines()
    assert lines and all("ERROR marker" in line for line in lines)
    bad = env.logs("--grep", "([")
    assert bad.returncode == 1 and "not a regular expression" in bad.stderr


def test_nimbus_ha_logs_since(env):
    everything = _lines(env.logs("--since", "1h", "--worker", "0").stdout.encode())
    spread = max(t for _, _, t in everything) - min(t for _, _, t in everything)
    assert spread > 4, "every file kept, rotated ones too (about 6 s of output)"
    asked = time.time()
    recent = env.logs("--since", "2s", "--worker", "0")
    assert recent.returncode == 0, recent.stderr
    lines = _lines(recent.stdout.encode())
    # Written in the last 2 s, give or take the index's second and a busy machine's pump.
    assert lines and min(t for _, _, t in lines) >= asked - 2 - 3, asked - lines[0][2]
    assert len(lines) < 0.75 * len(everything), (len(lines), len(everything))
    seqs = [seq for _, seq, _ in lines]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "in order, none missing"
    bad = env.logs("--since", "yesterday")
    assert bad.returncode == 1 and "expected a duration" in bad.stderr


FOLLOW_WITH_CTRL_C = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'nimbus-ha'; runpy.run_module('nimbus.cli', run_name='__main__')")


def test_nimbus_ha_logs_follow_goes_on_across_rotations(env, tmp_path):
    port = env.slots()[0][1]
    # Ctrl-C as at a terminal: a shell starts a background job (pytest run with `&`) with
    # SIGINT ignored, every child inherits that, and Python then raises no
    # KeyboardInterrupt; the follower puts the terminal's handling back first.
    follower = subprocess.Popen(
        [sys.executable, "-c", FOLLOW_WITH_CTRL_C, "logs", "chatty", "--worker", "0",
         "--follow", "--config", str(env.files["alice"])], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)
    lines: queue.Queue[bytes] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in follower.stdout],
                              daemon=True)
    reader.start()
    try:
        seqs: list[int] = []
        end = time.monotonic() + 30
        # Until 100 lines past the first (4 s: two rotations) were followed.
        while not seqs or seqs[-1] < seqs[0] + 100:
            assert time.monotonic() < end, f"followed {len(seqs)} lines only"
            try:
                line = lines.get(timeout=max(0.1, end - time.monotonic()))
            except queue.Empty:
                continue
            found = LINE.search(line)
            if found:
                assert int(found.group(1)) == port
                seqs.append(int(found.group(2)))
        assert seqs == list(range(seqs[0], seqs[-1] + 1)), "no line lost or repeated"
        assert follower.poll() is None, "it follows until it is stopped"
    finally:
        follower.send_signal(signal.SIGINT)
        try:
            follower.wait(timeout=15)
        except subprocess.TimeoutExpired:
            follower.kill()
    assert follower.returncode == 0, follower.stderr.read().decode()


def test_logs_outlive_their_worker_for_the_retention_only(env):
    slots = env.slots()
    moved_supervisor, moved_port = slots[1]
    moved = moved_supervisor.worker_log(env.topology_id, moved_port).parent
    assert run_cli("rebalance", "chatty", "--workers", "1", "--config",
                   str(env.files["alice"])).returncode == 0
    # worker-1 stops: its supervisor no longer runs a worker of chatty ...
    wait_for(lambda: 1 not in env.slots() and _quiet(moved), 30, "worker-1 to stop")
    stopped_at = time.monotonic()
    # ... and its log is still served: nimbus-ha logs finds it by the worker's index.
    # With --since, rotated files too: the current one may have been rotated just before
    # the worker stopped, and hold no line (seen once in a full run).
    gone_worker = env.logs("--worker", "1", "--since", "1h")
    assert gone_worker.returncode == 0, gone_worker.stderr
    assert {port for port, _, _ in _lines(gone_worker.stdout.encode())} == {moved_port}

    # Killed: its last worker's log is kept as well.
    kept_supervisor, kept_port = slots[0]
    kept = kept_supervisor.worker_log(env.topology_id, kept_port).parent
    assert run_cli("kill", "chatty", "--wait", "0", "--config",
                   str(env.files["alice"])).returncode == 0
    wait_for(lambda: _quiet(kept), 30, "the last worker to stop")
    listed = env.get("ops", kept_supervisor, "/api/v1/listLogs", topoId=env.topology_id)
    assert f"{env.topology_id}/{kept_port}/worker.log" in listed.json()

    # Both go once no worker wrote to them for the retention, and not before.
    wait_for(lambda: not moved.exists(), 60, "the sweep to remove worker-1's logs")
    assert time.monotonic() - stopped_at >= RETENTION_MIN * 60 - 2, "not before"
    # Its topology's directory goes in the same pass, just after the slot's (one rmdir
    # later: looking at once could fall between the two).
    wait_for(lambda: not moved.parent.exists(), 10, "its topology's directory to go with it")
    wait_for(lambda: not kept.exists(), 60, "the sweep to remove the killed topology's logs")
    for supervisor in (moved_supervisor, kept_supervisor):
        assert env.get("ops", supervisor, "/api/v1/listLogs").json() == []


def _quiet(directory: Path, quiet_s: float = 1.0) -> bool:
    """Nothing was written in ``directory``'s worker.log for ``quiet_s``."""
    try:
        return time.time() - (directory / "worker.log").stat().st_mtime > quiet_s
    except FileNotFoundError:
        return False
