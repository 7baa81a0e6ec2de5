"""Supervisors as separate processes: a real ZooKeeper, a real nimbus, real supervisors
and real workers (``python -m nimbus.worker``) running a process topology.

The topology's command appends ``<slot port> <pid> <monotonic time>`` to one output file
five times a second, so the file shows which slot ran it, which process, and in which
order two processes wrote (both append to the same file on the same host).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from helpers import observer
from processes import acting, frozen
from waiting import wait_for

from nimbus.dev.cluster import LocalCluster, SupervisorProcess
from nimbus.distribution.archive import pack_directory
from nimbus.state.records import WorkerBeat
from nimbus.supervisor.cgroups import unified_root
from nimbus.timing import WORKER_LEASE_FRACTION

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SESSION_MS = 4000
ORPHAN_S = 4   # supervisor.worker.orphan.timeout.secs where a frozen orphan is awaited
LEASE_S = WORKER_LEASE_FRACTION * SESSION_MS / 1000
CONF = {
    "storm.zookeeper.session.timeout": SESSION_MS,
    "nimbus.monitor.freq.secs": 1,
    "supervisor.monitor.frequency.secs": 1,
    "supervisor.heartbeat.frequency.secs": 1,
    "supervisor.worker.shutdown.sleep.secs": 2,
    "worker.heartbeat.frequency.secs": 1,
}
WRITER = textwrap.dedent("""
    import os, sys, time
    while True:
        with open(sys.argv[1], "a") as out:
            out.write(f"{os.environ['NIMBUS_HA_WORKER_PORT']} {os.getpid()} "
                      f"{time.monotonic():.3f}\\n")
        time.sleep(0.2)
""")


def _bundle(tmp_path: Path, out: Path) -> bytes:
    directory = tmp_path / "writer-topology"
    directory.mkdir()
    (directory / "writer.py").write_text(WRITER)
    (directory / "topology.yaml").write_text(yaml.safe_dump(
        {"command": [sys.executable, "writer.py", str(out)]}))
    return pack_directory(directory)


def _lines(out: Path) -> list[tuple[int, int, float]]:
    if not out.exists():
        return []
    rows = []
    for line in out.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:
            rows.append((int(parts[0]), int(parts[1]), float(parts[2])))
    return rows


def _writers(out: Path) -> list[tuple[int, int]]:
    """(port, pid) of each process that wrote, in order of their first line."""
    seen: list[tuple[int, int]] = []
    for port, pid, _ in _lines(out):
        if (port, pid) not in seen:
            seen.append((port, pid))
    return seen


def _new_writer(out: Path, known: int) -> tuple[int, int] | None:
    writers = _writers(out)
    return writers[known] if len(writers) > known else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


@pytest.fixture
def cluster(tmp_path):
    made: list[LocalCluster] = []

    def make(supervisors: int, **conf: object) -> LocalCluster:
        c = LocalCluster(tmp_path / "cluster", 1, conf={**CONF, **conf},
                         supervisors=supervisors, slots_per_supervisor=1)
        made.append(c)
        try:
            return c.start()
        except BaseException:
            _dump_logs(c)
            raise

    yield make
    for c in made:
        c.stop()


def _dump_logs(c: LocalCluster) -> None:
    for daemon in [*c.nimbuses, *c.supervisors]:
        print(f"--- {daemon.log_file.name} ---\n{daemon.log_text()[-4000:]}")


def _assignment(state, topology_id: str) -> dict[str, list]:
    info = state.assignment_info(topology_id)
    return info.executor_node_port if info else {}


def _topology_id(client, name: str) -> str:
    return next(t.id for t in client.cluster_info().topologies if t.name == name)


def test_worker_runs_on_its_slot_restarts_and_follows_the_topology(cluster, tmp_path):
    c = cluster(1)
    sup = c.supervisors[0]
    state = observer(c)
    out = tmp_path / "writes.txt"
    client = c.client()
    try:
        client.submit("writer", _bundle(tmp_path, out), {})
        topology_id = _topology_id(client, "writer")
        wait_for(lambda: _assignment(state, topology_id), 20, "an assignment")
        assert _assignment(state, topology_id) == {"worker-0": [sup.id, sup.ports[0]]}
        port, pid = wait_for(lambda: _new_writer(out, 0), 30, "the command to run")
        assert port == sup.ports[0]
        beat = wait_for(lambda: (data := state.get_worker_heartbeat(
            topology_id, sup.id, port)) and WorkerBeat.decode(data), 15, "a beat")
        assert (beat.supervisor_id, beat.port, beat.restarts) == (sup.id, port, 0)
        assert beat.components["main"]["pid"] == pid

        # kill -9 of the worker (the command's parent): restarted on the same slot.
        worker = _parent(pid)
        assert (sup.worker_dir(topology_id, port) / "worker.json").exists()
        os.kill(worker, signal.SIGKILL)
        port2, pid2 = wait_for(lambda: _new_writer(out, 1), 30, "a restarted command")
        assert port2 == port and pid2 != pid
        wait_for(lambda: not _alive(pid), 5, "the old command to die with its worker")
        beat = wait_for(lambda: (b := WorkerBeat.decode(state.get_worker_heartbeat(
            topology_id, sup.id, port))).components["main"]["pid"] == pid2 and b, 15,
            "the restarted worker's beat")
        assert beat.restarts == 1
        errors = state.errors(topology_id, "worker-0")
        assert [e.error for e in errors] == [f"worker exited with code {-signal.SIGKILL}"]
        assert (errors[0].host, errors[0].port) == ("127.0.0.1", port)

        # deactivate stops the command; activate runs it again on the slot.
        client.deactivate("writer")
        wait_for(lambda: not _alive(pid2), 20, "deactivate to stop the command")
        assert _assignment(state, topology_id) == {}
        client.activate("writer")
        port3, pid3 = wait_for(lambda: _new_writer(out, 2), 30, "the command after activate")
        assert port3 == port
        assert [p for _, p in _writers(out)] == [pid, pid2, pid3]

        # kill removes it: the command stops and the supervisor drops the code.
        client.kill("writer", 0)
        wait_for(lambda: not _alive(pid3), 20, "kill to stop the command")
        code_dir = sup.local_dir / "supervisor" / "stormdist" / topology_id
        wait_for(lambda: state.storm_base(topology_id) is None and not code_dir.exists(),
                 30, "the topology and its code to be removed")
        assert not sup.worker_dir(topology_id, port).exists()
        assert sup.alive()
    except BaseException:
        _dump_logs(c)
        raise
    finally:
        state.zk.stop()
        state.zk.close()


def test_work_moves_when_a_supervisor_dies_or_freezes_and_never_runs_twice(
        cluster, tmp_path):
    c = cluster(2, **{"supervisor.worker.orphan.timeout.secs": ORPHAN_S})
    state = observer(c)
    out = tmp_path / "writes.txt"
    client = c.client()
    by_port = {s.ports[0]: s for s in c.supervisors}
    try:
        client.submit("writer", _bundle(tmp_path, out), {})
        topology_id = _topology_id(client, "writer")
        port, pid = wait_for(lambda: _new_writer(out, 0), 30, "the command to run")
        first: SupervisorProcess = by_port[port]
        other = next(s for s in c.supervisors if s is not first)
        assert _assignment(state, topology_id) == {"worker-0": [first.id, port]}

        # kill -9 of the supervisor and its process group: its worker (a group of its
        # own) stops at the end of its lease: it freezes in its cgroup, its command with
        # it, for a later process of its supervisor to find; after the session expires
        # the leader moves the work to the other supervisor.
        worker = _parent(pid)
        killed_at = time.monotonic()
        first.kill9_group()
        wait_for(lambda: not acting(pid), 10, "the orphaned command to stop")
        assert time.monotonic() - killed_at < LEASE_S + 1.0 and frozen(pid)
        port2, pid2 = wait_for(lambda: _new_writer(out, 1), 30, "the work to move")
        assert port2 == other.ports[0]
        assert _assignment(state, topology_id) == {"worker-0": [other.id, port2]}
        assert max(t for _, p, t in _lines(out) if p == pid) < \
            min(t for _, p, t in _lines(out) if p == pid2)

        # Issue 29: nothing takes the frozen orphan over (its supervisor stays dead): its
        # reaper ends it, its cgroup and command with it, once it has been frozen
        # supervisor.worker.orphan.timeout.secs.
        wait_for(lambda: not _alive(pid) and not _alive(worker), 30,
                 "the frozen orphan's reaper to end it")
        orphan_cgroup = unified_root() / "nimbus-ha" / first.id / f"{topology_id}-{port}"
        wait_for(lambda: not orphan_cgroup.exists(), 10, "its cgroup to go")
        log_text = first.worker_log(topology_id, port).read_text()
        assert f"frozen for at most {ORPHAN_S} s (supervisor.worker.orphan.timeout.secs)" \
            in log_text
        assert f"ended frozen worker cgroup {orphan_cgroup}: nothing thawed it" in log_text

        # The dead supervisor comes back with its id; it runs nothing that moved, and
        # finds nothing left to take over.
        old_id = first.id
        c.start_supervisor(first)
        assert first.id == old_id
        assert "took over worker" not in first.log_text()

        # SIGSTOP the supervisor that runs the work for longer than the session timeout:
        # its worker stops within its lease (2/3 of the session timeout), before the
        # leader can move the work: it freezes in its cgroup (its command with it); the
        # moved command's first write comes after the old one's last.
        frozen_at = time.monotonic()
        other.signal(signal.SIGSTOP)
        starts_before = other.log_text().count("starting worker")
        try:
            wait_for(lambda: not acting(pid2), 10, "the frozen supervisor's command to stop")
            # Its last renewal was sent before the freeze: stopped within one lease.
            assert time.monotonic() - frozen_at < LEASE_S + 1.0
            assert frozen(pid2), "where cgroups work, a lapsed lease freezes the worker"
            port3, pid3 = wait_for(lambda: _new_writer(out, 2), 30, "the work to move back")
        finally:
            other.signal(signal.SIGCONT)
        # Thawed, the supervisor finds its session lost and kills the frozen worker.
        wait_for(lambda: not _alive(pid2), 30, "the frozen command to be killed")
        assert port3 == first.ports[0]
        rows = _lines(out)
        last_old = max(i for i, (_, p, _t) in enumerate(rows) if p == pid2)
        first_new = min(i for i, (_, p, _t) in enumerate(rows) if p == pid3)
        assert last_old < first_new
        assert max(t for _, p, t in rows if p == pid2) < min(t for _, p, t in rows if p == pid3)

        # SIGCONT: it registers under a new session, reads the assignments, and does not
        # run the work that moved.
        wait_for(lambda: other.log_text().count("registered supervisor") >= 2, 30,
                 "the thawed supervisor to register again")
        wait_for(lambda: other.id in c.registered_supervisors(), 10, "its node")
        seen = state.zk.exists(state.path("supervisors", other.id)).version
        wait_for(lambda: state.zk.exists(state.path("supervisors", other.id)).version
                 >= seen + 2, 10, "two heartbeats after its return")
        assert _writers(out) == [(port, pid), (port2, pid2), (port3, pid3)]
        assert _assignment(state, topology_id) == {"worker-0": [first.id, port3]}
        assert other.log_text().count("starting worker") == starts_before
        assert _alive(pid3) and other.alive() and first.alive()
    except BaseException:
        _dump_logs(c)
        raise
    finally:
        state.zk.stop()
        state.zk.close()


def test_a_supervisor_killed_and_started_again_takes_over_its_running_worker(
        cluster, tmp_path):
    # A session of 12 s (leases of 8 s): room for a Python process to start on a loaded
    # 2-core machine before the worker's lease runs out.
    session_ms = 12000
    lease_s = WORKER_LEASE_FRACTION * session_ms / 1000
    c = cluster(1, **{"storm.zookeeper.session.timeout": session_ms})
    sup = c.supervisors[0]
    state = observer(c)
    out = tmp_path / "writes.txt"
    client = c.client()
    try:
        client.submit("writer", _bundle(tmp_path, out), {})
        topology_id = _topology_id(client, "writer")
        port, pid = wait_for(lambda: _new_writer(out, 0), 30, "the command to run")
        worker = _parent(pid)

        # kill -9 of the supervisor's group, started again at once: the worker (a group
        # of its own) runs on its lease, and the new process takes it over and renews it.
        killed_at = time.monotonic()
        sup.kill9_group()
        c.start_supervisor(sup)
        wait_for(lambda: "took over worker" in sup.log_text(), 30, "the take-over")
        wait_for(lambda: any(p == pid and t > killed_at + lease_s + 1.0
                             for _, p, t in _lines(out)), 30,
                 "a write by the same command after the old lease's end")
        assert _writers(out) == [(port, pid)] and _alive(worker)
        beat = wait_for(lambda: (b := WorkerBeat.decode(state.get_worker_heartbeat(
            topology_id, sup.id, port))).time_secs > time.time() - 1 and b, 15,
            "a beat written by the new supervisor process")
        assert (beat.components["main"]["pid"], beat.restarts) == (pid, 0)
        assert state.errors(topology_id, "worker-0") == []

        # Killed again, and started only after the worker's lease ran out: the worker
        # froze in its cgroup at the lease's end (it wrote nothing since), and the new
        # process takes it over frozen and thaws it with its first renewal.
        sup.kill9_group()
        wait_for(lambda: frozen(worker), 30, "the orphaned worker to freeze")
        frozen_seen = time.monotonic()
        time.sleep(1.0)  # watched: the command writes every 0.2 s when it runs
        restarted = time.monotonic()
        c.start_supervisor(sup)
        wait_for(lambda: "left frozen by this supervisor's earlier process"
                 in sup.log_text(), 30, "the take-over of the frozen worker")
        wait_for(lambda: any(p == pid and t > restarted for _, p, t in _lines(out)), 30,
                 "a write by the same command after the thaw")
        assert not any(frozen_seen < t < restarted for _, _, t in _lines(out))
        assert _writers(out) == [(port, pid)] and acting(worker)
        assert state.errors(topology_id, "worker-0") == []

        # Killed again, and the topology deactivated before it is back: the worker it
        # finds is on no slot of the assignment, so it is ended, and nothing else runs.
        sup.kill9_group()
        client.deactivate("writer")
        wait_for(lambda: _assignment(state, topology_id) == {}, 20, "the empty assignment")
        c.start_supervisor(sup)
        wait_for(lambda: not _alive(worker) and not _alive(pid), 20,
                 "the worker to be ended")
        assert _writers(out) == [(port, pid)]

        # Activated: a worker started afresh on the slot.
        client.activate("writer")
        port2, pid2 = wait_for(lambda: _new_writer(out, 1), 30, "the command after activate")
        assert port2 == port and pid2 != pid
        # Stopping the supervisor stops the worker it runs (no take-over point is left).
        client.kill("writer", 0)
        wait_for(lambda: not _alive(pid2), 20, "kill to stop the command")
    except BaseException:
        _dump_logs(c)
        raise
    finally:
        state.zk.stop()
        state.zk.close()


def test_supervisor_with_a_taken_slot_port_exits_1(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "supervisor.yaml"
        # No ZooKeeper is needed: the ports are checked before anything else is taken.
        config.write_text(yaml.safe_dump({"storm.local.dir": str(tmp_path / "local"),
                                          "supervisor.slots.ports": [port]}))
        result = subprocess.run(
            [sys.executable, "-m", "nimbus.cli", "supervisor", "--config", str(config)],
            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == \
        f"Error: supervisor slot port {port} is in use (supervisor.slots.ports)"
