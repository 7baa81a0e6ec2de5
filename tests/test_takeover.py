"""Taking over an earlier supervisor process's workers: what the new process trusts.

A tenant's code runs in the worker, so everything on the take-over socket is untrusted:
the line it sends, how slowly it sends it, and what the socket file is.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from worker_harness import process_alive, wait_until

from nimbus.supervisor import takeover as takeover_module
from nimbus.supervisor.takeover import SOCKET_NAME, find_orphans, find_warm_orphans
from nimbus.worker.takeover import socket_path

TOPOLOGY_ID = "tailer-1-1700000000"

# A stand-in for a worker: listens on <dir>/supervisor.sock (via /proc/self/fd, the path
# may be long) in a session of its own, and answers each connection with ANSWER, byte by
# byte every DRIP seconds.
LISTENER = textwrap.dedent("""
    import os, socket, sys, time
    directory, answer, drip = sys.argv[1], sys.argv[2].encode(), float(sys.argv[3])
    fd = os.open(directory, os.O_RDONLY)
    server = socket.socket(socket.AF_UNIX)
    server.bind(f"/proc/self/fd/{fd}/supervisor.sock")
    server.listen(1)
    open(os.path.join(directory, "listening"), "w").close()
    while True:
        conn, _ = server.accept()
        try:
            for i in range(len(answer)):
                conn.sendall(answer[i:i + 1])
                time.sleep(drip)
        except OSError:
            pass
""")


def listener(tmp_path: Path, directory: Path, answer: str,
             drip: float = 0.0) -> subprocess.Popen:
    directory.mkdir(parents=True)
    script = tmp_path / "listener.py"
    script.write_text(LISTENER)
    proc = subprocess.Popen([sys.executable, str(script), str(directory), answer, str(drip)],
                            start_new_session=True)
    wait_until(lambda: (directory / "listening").exists(), 20, "the listener")
    return proc


@pytest.mark.parametrize("answer,drip", [
    ("[" * 4000 + "\n", 0.0),       # json nests too deep: RecursionError, not ValueError
    ('{"takeover": 1}\n', 0.0),     # not a take-over line
    ('{"takeover": {"pid": 1}}\n' * 100, 0.5),   # drips: never a whole line in time
])
def test_a_worker_that_answers_wrong_is_killed_and_cannot_stall_the_start(
        tmp_path, answer, drip):
    directory = tmp_path / "workers" / f"{TOPOLOGY_ID}-6701"
    proc = listener(tmp_path, directory, answer, drip)
    try:
        found = find_orphans(tmp_path / "workers", [6701], cgroup_root=None, timeout_s=1.0)
        assert found.orphans == {} and found.unidentified == set()
        assert proc.wait(timeout=10) < 0  # killed: it was no worker to take over
    finally:
        proc.kill()
        proc.wait()


def test_a_symlink_in_place_of_the_socket_is_not_followed(tmp_path):
    """A tenant's link to another worker's socket must not reach that worker."""
    other = tmp_path / "workers" / f"{TOPOLOGY_ID}-6702"
    proc = listener(tmp_path, other, "ignored\n", 0.0)
    mine = tmp_path / "workers" / "other-1-1700000000-6701"
    mine.mkdir()
    (mine / SOCKET_NAME).symlink_to(other / SOCKET_NAME)
    try:
        found = find_orphans(tmp_path / "workers", [6701], cgroup_root=None, timeout_s=1.0)
        # The link's slot is held (what may still run there is unknown). The listener it
        # points at was reached only through its own directory, where its answer failed
        # the checks: killed, and never taken for slot 6701.
        assert found.orphans == {} and found.unidentified == {6701}
        assert proc.wait(timeout=10) < 0
    finally:
        proc.kill()
        proc.wait()


def test_a_socket_nobody_listens_on_is_removed(tmp_path):
    directory = tmp_path / "workers" / f"{TOPOLOGY_ID}-6701"
    directory.mkdir(parents=True)
    with socket_path(directory) as address:
        dead = socket.socket(socket.AF_UNIX)
        dead.bind(address)
        dead.close()  # bound, never listening: a worker that is gone
    found = find_orphans(tmp_path / "workers", [6701], cgroup_root=None)
    assert found.orphans == {} and found.unidentified == set()
    assert not os.path.lexists(directory / SOCKET_NAME)


def test_a_worker_that_refuses_is_killed_not_left_beside_a_new_one(tmp_path):
    """One whose lease pipe has not shown EOF yet refuses; it must not run on while
    the slot starts another."""
    directory = tmp_path / "workers" / f"{TOPOLOGY_ID}-6701"
    proc = listener(tmp_path, directory, "", 0.0)  # accepts and closes: says nothing
    try:
        find_orphans(tmp_path / "workers", [6701], cgroup_root=None, timeout_s=1.0)
        wait_until(lambda: not process_alive(proc.pid), 10, "the silent listener's end")
    finally:
        proc.kill()
        proc.wait()


def test_a_take_over_line_is_checked_against_the_socket_and_the_slot(tmp_path):
    """What a worker says of itself is a tenant's to forge: each claim is checked."""
    directory = tmp_path / f"{TOPOLOGY_ID}-6701"
    leader = subprocess.Popen(["sleep", "60"], start_new_session=True)  # leads its group
    follower = subprocess.Popen(["sleep", "60"])                       # in pytest's
    good = {"pid": leader.pid, "topology_id": TOPOLOGY_ID, "port": 6701, "worker_index": 0,
            "num_workers": 1, "restarts": 2, "kind": "process"}
    sock, other = socket.socketpair()
    try:
        assert takeover_module._orphan(sock, leader.pid, -1, good, directory).restarts == 2
        cases = [
            (leader.pid, {**good, "pid": follower.pid}, "socket's owner is pid"),
            (follower.pid, {**good, "pid": follower.pid}, "leads no process group"),
            (leader.pid, {**good, "port": 6702}, "not this directory's"),
            (leader.pid, {**good, "worker_index": 1}, "no place in a topology"),
            (leader.pid, {**good, "restarts": -1}, "restarts is not a count"),
            (leader.pid, {**good, "restarts": 10**400}, "restarts is not a count"),
            (leader.pid, {**good, "port": 70000}, "port is not a count"),
            (leader.pid, {**good, "port": "6701"}, "port is not a count"),
            (leader.pid, {**good, "kind": "daemon"}, "names no topology or kind"),
        ]
        for peer, hello, message in cases:
            with pytest.raises(ValueError, match=message):
                takeover_module._orphan(sock, peer, -1, hello, directory)
    finally:
        sock.close()
        other.close()
        for child in (leader, follower):
            child.kill()
            child.wait()




def claiming_listener(tmp_path: Path, directory: Path, fields: dict) -> subprocess.Popen:
    """A listener whose take-over line claims its own pid (a wrapper execs it, so the
    pid is known before it starts) with ``fields``."""
    directory.mkdir(parents=True)
    script = tmp_path / "listener.py"
    script.write_text(LISTENER)
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(textwrap.dedent(f"""
        import json, os, sys
        fields = json.loads(sys.argv[1])
        hello = json.dumps({{"takeover": {{"pid": os.getpid(), **fields}}}}) + "\\n"
        os.execv(sys.executable, [sys.executable, {str(script)!r}, {str(directory)!r},
                                  hello, "0"])
    """))
    proc = subprocess.Popen([sys.executable, str(wrapper), json.dumps(fields)],
                            start_new_session=True)
    wait_until(lambda: (directory / "listening").exists(), 20, "the listener")
    return proc


@pytest.mark.parametrize("where,fields", [
    # A slot's worker claiming to be warm, where a warm worker cannot be.
    ("workers/tailer-1-1700000000-6701", {"kind": "warm", "lease_fd": 3, "status_fd": 4}),
    # In a warm directory, a worker that claims a slot.
    ("warm/warm-3", {"kind": "process", "topology_id": TOPOLOGY_ID, "port": 6701,
                     "worker_index": 0, "num_workers": 1, "restarts": 0}),
    # Warm, but with descriptors that are no numbers.
    ("warm/warm-3", {"kind": "warm", "lease_fd": "3", "status_fd": 4}),
])
def test_a_warm_claim_out_of_place_is_killed(tmp_path, where, fields):
    proc = claiming_listener(tmp_path, tmp_path / where, fields)
    try:
        if where.startswith("warm/"):
            assert find_warm_orphans(tmp_path / "warm", cgroup_root=None, timeout_s=2) == []
        else:
            found = find_orphans(tmp_path / "workers", [6701], cgroup_root=None, timeout_s=2)
            assert found.orphans == {} and found.unidentified == set()
        assert proc.wait(timeout=10) < 0  # killed
    finally:
        proc.kill()
        proc.wait()


def test_a_warm_worker_left_waiting_is_found_with_its_descriptors(tmp_path):
    proc = claiming_listener(tmp_path, tmp_path / "warm" / "warm-3",
                             {"kind": "warm", "lease_fd": 5, "status_fd": 6})
    try:
        found = find_warm_orphans(tmp_path / "warm", cgroup_root=None, timeout_s=5)
        assert [(o.pid, o.kind, o.port, o.child_fds) for o in found] == \
            [(proc.pid, "warm", 3, (5, 6))]
        for orphan in found:
            orphan.kill()
        assert proc.wait(timeout=10) < 0
    finally:
        proc.kill()
        proc.wait()
