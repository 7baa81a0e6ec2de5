"""A worker whose lease runs out while its supervisor is still there freezes instead of
dying, and only a renewal thaws it (nimbus/worker/lease.py, WorkerHandle.renew).

The first tests drive :class:`Lease` with a stand-in freeze; the last ones run a real
worker process in a real cgroup v2, through the supervisor's own WorkerHandle, and need
root and a writable cgroup2 hierarchy (they are skipped elsewhere).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from worker_harness import process_alive, wait_until, worker_conf

from nimbus.state.worker_logs import LOG_FILE, log_root, port_dir
from nimbus.supervisor.cgroups import WorkerCgroups, is_frozen, unified_root
from nimbus.supervisor.lease_record import LeaseRecord, load_record
from nimbus.supervisor.takeover import find_orphans
from nimbus.supervisor.worker_handle import WorkerHandle
from nimbus.worker.lease import Lease
from nimbus.worker_protocol.frozen_cgroup import ORPHAN_TIMEOUT_KEY, REAPERS_CGROUP, read_mark
from nimbus.worker_protocol.spec import WorkerSpec

TOPOLOGY_ID = "frozen-1-1700000000"
ASSIGNMENT_VERSION = 4242  # the mzxid of the assignment its renewals were earned on
PORT = 6702
TIMEOUT = 20.0  # generous bounds for a loaded 2-core machine


class StandInFreeze:
    """Blocks the lease's watchdog as a real freeze would, until :meth:`thaw`."""

    def __init__(self, works: bool = True):
        self.works = works
        self.calls = 0
        self.frozen = threading.Event()
        self._thawed = threading.Event()

    def __call__(self) -> bool:
        self.calls += 1
        if not self.works:
            return False
        self._thawed.clear()
        self.frozen.set()
        self._thawed.wait(30)
        self.frozen.clear()
        return True

    def thaw(self) -> None:
        self._thawed.set()


@pytest.fixture
def lease_pipe():
    r, w = os.pipe()
    yield r, w
    for fd in (r, w):
        try:
            os.close(fd)
        except OSError:
            pass


def _grant(fd: int, seconds: float) -> float:
    deadline = time.monotonic() + seconds
    os.write(fd, f"lease {deadline:.3f}\n".encode())
    return deadline


def test_a_lapsed_lease_freezes_and_a_renewal_resumes_it(lease_pipe):
    r, w = lease_pipe
    freeze, reasons = StandInFreeze(), []
    lease = Lease(r, on_expiry=reasons.append, freeze=freeze).start()
    try:
        first = _grant(w, 0.5)
        assert freeze.frozen.wait(TIMEOUT)
        assert time.monotonic() >= first and reasons == []
        standing = lease.running_clock()
        time.sleep(0.3)  # frozen time the clock of its own progress must not count
        assert lease.running_clock() == standing  # it stands still while frozen
        renewed = _grant(w, 30)
        freeze.thaw()
        wait_until(lambda: lease.deadline == pytest.approx(renewed, abs=1e-3), TIMEOUT,
                   "the renewal to be read")
        wait_until(lambda: lease.frozen_s > 0, TIMEOUT, "the frozen time to be counted")
        assert lease.frozen_s >= 0.3
        # Its clock runs again, behind the monotonic one by exactly the frozen time: read
        # between two monotonic readings (a tolerance would fail on a loaded machine).
        before = time.monotonic()
        clock = lease.running_clock()
        after = time.monotonic()
        assert before - lease.frozen_s <= clock <= after - lease.frozen_s
        assert reasons == [] and freeze.calls == 1
    finally:
        lease.stop()


def test_a_thaw_without_a_renewal_expires_the_lease_at_once(lease_pipe):
    r, w = lease_pipe
    freeze, reasons = StandInFreeze(), []
    lease = Lease(r, on_expiry=reasons.append, freeze=freeze).start()
    try:
        _grant(w, 0.3)
        assert freeze.frozen.wait(TIMEOUT)
        freeze.thaw()  # nothing in the pipe: whoever thawed it was no supervisor
        wait_until(lambda: reasons, TIMEOUT, "the lease to expire")
        assert len(reasons) == 1 and reasons[0].startswith("lease deadline passed")
        assert freeze.calls == 1
    finally:
        lease.stop()


def test_a_thaw_with_a_stale_renewal_expires_the_lease(lease_pipe):
    r, w = lease_pipe
    freeze, reasons = StandInFreeze(), []
    lease = Lease(r, on_expiry=reasons.append, freeze=freeze).start()
    try:
        _grant(w, 0.3)
        assert freeze.frozen.wait(TIMEOUT)
        _grant(w, -5)  # a line, but one that grants nothing
        freeze.thaw()
        wait_until(lambda: reasons, TIMEOUT, "the lease to expire")
        assert len(reasons) == 1 and freeze.calls == 1
    finally:
        lease.stop()


def test_where_nothing_can_freeze_the_lapse_kills_as_before(lease_pipe):
    r, w = lease_pipe
    freeze, reasons = StandInFreeze(works=False), []
    lease = Lease(r, on_expiry=reasons.append, freeze=freeze).start()
    try:
        deadline = _grant(w, 0.3)
        wait_until(lambda: reasons, TIMEOUT, "the lease to expire")
        assert time.monotonic() >= deadline and freeze.calls == 1
    finally:
        lease.stop()


def test_an_orphaned_worker_with_no_takeover_point_is_never_frozen(lease_pipe):
    r, w = lease_pipe
    freeze, reasons = StandInFreeze(), []
    lease = Lease(r, on_expiry=reasons.append, outlives_supervisor=True,
                  freeze=freeze).start()
    try:
        _grant(w, 0.5)
        os.close(w)  # the supervisor is gone, and no successor could find the worker
        wait_until(lambda: reasons, TIMEOUT, "the lease to expire")
        assert freeze.calls == 0
    finally:
        lease.stop()


class StandInTakeover:
    """What a take-over point tells the lease: whether a connection waits."""

    def __init__(self) -> None:
        self.waiting = False

    def __call__(self) -> bool:
        return self.waiting


def _orphaned_and_frozen(lease_pipe) -> tuple[Lease, StandInFreeze, StandInTakeover,
                                              list[str]]:
    r, w = lease_pipe
    freeze, takeover, reasons = StandInFreeze(), StandInTakeover(), []
    lease = Lease(r, on_expiry=reasons.append, outlives_supervisor=True, freeze=freeze)
    lease.attach_pending = takeover
    lease.start()
    _grant(w, 0.5)
    os.close(w)  # the supervisor is killed
    wait_until(lambda: lease.orphaned, TIMEOUT, "the lease to see its supervisor gone")
    assert freeze.frozen.wait(TIMEOUT), "an orphan that can be found freezes"
    assert reasons == []
    return lease, freeze, takeover, reasons


def test_an_orphan_freezes_and_a_successor_that_attaches_with_a_renewal_thaws_it(
        lease_pipe):
    lease, freeze, takeover, reasons = _orphaned_and_frozen(lease_pipe)
    second_r, second_w = os.pipe()
    try:
        renewed = _grant(second_w, 30)  # written into the connection before the thaw
        takeover.waiting = True
        freeze.thaw()
        assert lease.attach(second_r), "a thawed orphan's lease may be taken over"
        takeover.waiting = False
        wait_until(lambda: lease.deadline == pytest.approx(renewed, abs=1e-3), TIMEOUT,
                   "the successor's renewal to be read")
        assert not lease.orphaned and reasons == [] and freeze.calls == 1
    finally:
        lease.stop()
        os.close(second_w)


def test_a_thawed_orphan_with_no_connection_waiting_kills_itself(lease_pipe):
    lease, freeze, _takeover, reasons = _orphaned_and_frozen(lease_pipe)
    try:
        freeze.thaw()  # by hand: no supervisor connected
        wait_until(lambda: reasons, TIMEOUT, "the lease to expire")
        assert len(reasons) == 1 and reasons[0].startswith("lease deadline passed")
        assert not lease.attach(os.dup(0)), "too late to take it over"
    finally:
        lease.stop()


def test_a_thawed_orphan_whose_connection_brings_no_renewal_kills_itself(lease_pipe):
    lease, freeze, takeover, reasons = _orphaned_and_frozen(lease_pipe)
    second_r, second_w = os.pipe()
    try:
        takeover.waiting = True
        freeze.thaw()
        assert lease.attach(second_r)
        wait_until(lambda: reasons, TIMEOUT, "the lease to expire")
        assert len(reasons) == 1 and freeze.calls == 1
    finally:
        lease.stop()
        os.close(second_w)


# -- a real worker in a real cgroup ---------------------------------------------------------

CHILD = """
import os, time
state = os.environ["NIMBUS_HA_STATE_DIR"]
# Written whole, then renamed: a reader that sees the file sees the pid (an open "w"
# makes it empty first, and a reader in between read "").
with open(os.path.join(state, "child.pid.tmp"), "w") as f:
    f.write(str(os.getpid()))
os.replace(os.path.join(state, "child.pid.tmp"), os.path.join(state, "child.pid"))
while True:
    with open(os.path.join(state, "ticks"), "a") as f:
        f.write(f"{time.monotonic():.3f}\\n")
    time.sleep(0.1)
"""


def _cgroups() -> WorkerCgroups:
    root = unified_root()
    if root is None or os.geteuid() != 0:
        pytest.skip("needs root and a cgroup v2 hierarchy")
    base = root / "nimbus-ha" / f"test-freeze-{uuid.uuid4().hex[:8]}"
    try:
        base.mkdir(parents=True)
    except OSError as exc:
        pytest.skip(f"cannot make cgroups: {exc}")
    return WorkerCgroups(base)


@pytest.fixture
def frozen_worker(request, tmp_path):
    """A process-topology worker started by WorkerHandle in a cgroup of its own; yields
    (handle, state_dir); kills it and removes its cgroups afterwards. Indirect
    parameters: keys added to its configuration."""
    cgroups = _cgroups()
    code = tmp_path / "code"
    code.mkdir()
    (code / "child.py").write_text(CHILD)
    (code / "topology.yaml").write_text(f"command: [{json.dumps(sys.executable)}, child.py]\n")
    worker_dir = tmp_path / "workers" / f"{TOPOLOGY_ID}-{PORT}"
    statuses: list[dict] = []
    handle = WorkerHandle(TOPOLOGY_ID, PORT, worker_dir, session_id=1, restarts=0,
                          on_status=lambda _h, status: statuses.append(status))
    handle.cgroups, handle.cgroup = cgroups, cgroups.make(f"{TOPOLOGY_ID}-{PORT}")
    conf = {"storm.local.dir": str(tmp_path / "local"), "worker.heartbeat.frequency.secs": 1,
            **getattr(request, "param", {})}
    # Its first words go where the supervisor sends them, its log pump's after them.
    handle.log_file = port_dir(log_root(conf), TOPOLOGY_ID, PORT) / LOG_FILE
    handle.log_file.parent.mkdir(parents=True)

    def write_spec(lease_fd: int, status_fd: int) -> None:
        WorkerSpec(topology_id=TOPOLOGY_ID, port=PORT, supervisor_id="sup-test",
                   host="127.0.0.1", code_dir=str(code), conf=worker_conf(conf),
                   lease_fd=lease_fd, status_fd=status_fd).dump(worker_dir)

    handle.start(write_spec)
    state = tmp_path / "local" / "checkpoints" / TOPOLOGY_ID / "state"
    try:
        yield handle, state
    finally:
        handle.kill("stop")
        handle.release()
        # Each freeze started a reaper beside the worker's cgroup; it leaves once the
        # worker is gone (nimbus/worker/frozen.py).
        wait_until(lambda: _removed(cgroups.base / REAPERS_CGROUP), TIMEOUT,
                   "the reapers to leave")
        cgroups.base.rmdir()


def _removed(cgroup: Path) -> bool:
    try:
        cgroup.rmdir()
    except FileNotFoundError:
        return True
    except OSError:  # EBUSY while a process is in it
        return False
    return True


def _log(handle: WorkerHandle) -> str:
    return handle.log_path.read_text(errors="replace")


def _ticks(state: Path) -> list[float]:
    try:
        return [float(t) for t in (state / "ticks").read_text().split()]
    except (OSError, ValueError):
        return []


def _let_it_freeze(handle: WorkerHandle, state: Path) -> None:
    """One lease of 2 s, then wait until the command runs and the worker froze itself."""
    assert handle.cgroup is not None
    assert handle.renew(time.monotonic() + 2.0, ASSIGNMENT_VERSION)
    wait_until(lambda: (state / "child.pid").exists(), TIMEOUT, "the command")
    wait_until(lambda: is_frozen(handle.cgroup), TIMEOUT, "the worker to freeze itself")


def test_a_real_worker_freezes_on_a_lapsed_lease_and_its_renewal_thaws_it(frozen_worker):
    handle, state = frozen_worker
    assert handle.cgroup is not None
    assert handle.renew(time.monotonic() + 3.0, ASSIGNMENT_VERSION)
    pid_file = state / "child.pid"
    wait_until(lambda: pid_file.exists() and pid_file.read_text(), TIMEOUT, "the command")
    child = int(pid_file.read_text())
    wait_until(lambda: is_frozen(handle.cgroup) and "frozen until the supervisor renews it"
               in _log(handle), TIMEOUT, "the worker to freeze itself")
    # cgroup.freeze says it is asked; cgroup.events says when every process has stopped.
    wait_until(lambda: "frozen 1" in (handle.cgroup / "cgroup.events").read_text(), TIMEOUT,
               "the kernel to have frozen every process of the cgroup")
    frozen_at = time.monotonic()
    before = len(_ticks(state))
    time.sleep(1.0)  # the command would tick 10 times meanwhile if it ran
    assert len(_ticks(state)) == before, "the command ran while frozen"
    assert handle.exit_code() is None and process_alive(child)

    # The same assignment version: it was not rewritten while the worker was frozen.
    assert handle.renew(time.monotonic() + 30, ASSIGNMENT_VERSION)  # writes, then thaws
    assert not is_frozen(handle.cgroup) and handle.thaws == 1
    wait_until(lambda: len(_ticks(state)) > before + 3, TIMEOUT, "the command to go on")
    assert handle.exit_code() is None and int(pid_file.read_text()) == child
    wait_until(lambda: "the supervisor renewed the lease" in _log(handle), TIMEOUT,
               "the worker to say it was thawed")
    assert _ticks(state)[before] > frozen_at + 1.0  # no tick in between: it was frozen


def test_a_frozen_worker_whose_assignment_was_rewritten_is_killed_not_thawed(
        frozen_worker):
    """Its work may have moved to another slot and back while it was frozen: a running
    worker's lease would have ended it meanwhile, so a frozen one must not wake up."""
    handle, state = frozen_worker
    _let_it_freeze(handle, state)
    assert not handle.renew(time.monotonic() + 30, ASSIGNMENT_VERSION + 1)
    assert handle.ended_by == "lease" and handle.thaws == 0
    wait_until(lambda: handle.exit_code() is not None, TIMEOUT, "the worker to die")
    assert handle.exit_code() == -signal.SIGKILL
    assert "the supervisor renewed the lease" not in _log(handle)


def test_a_real_worker_thawed_without_a_renewal_kills_itself(frozen_worker):
    handle, state = frozen_worker
    _let_it_freeze(handle, state)
    (handle.cgroup / "cgroup.freeze").write_text("0")  # not the supervisor's way
    wait_until(lambda: handle.exit_code() is not None, TIMEOUT, "the worker to die")
    assert handle.exit_code() == -signal.SIGKILL
    assert "with no renewal" in _log(handle) and "lease lost" in _log(handle)


def test_a_frozen_worker_is_killed_at_once_and_a_stop_does_not_wait_for_it(frozen_worker):
    handle, state = frozen_worker
    _let_it_freeze(handle, state)
    child = int((state / "child.pid").read_text())
    started = time.monotonic()
    handle.stop(grace_s=60)  # SIGTERM would wait the whole grace on a frozen process
    assert time.monotonic() - started < 30
    assert handle.exit_code() == -signal.SIGKILL
    wait_until(lambda: not process_alive(child), TIMEOUT, "the command to be gone")


def test_a_frozen_worker_found_with_no_record_is_ended_at_once(frozen_worker, caplog):
    """Its supervisor died while it was frozen and left no record of its lease: the next
    process cannot tell what it runs (it cannot answer), and does not wait for an answer
    either."""
    handle, state = frozen_worker
    _let_it_freeze(handle, state)
    root = unified_root()
    found = find_orphans(handle.worker_dir.parent, [PORT], root,
                         records_dir=handle.worker_dir.parent / "no-records", timeout_s=60)
    assert found.orphans == {} and found.unidentified == set()
    # Refused for being frozen, not after the 60 s an answer may take.
    assert "it is frozen, and no record says what it runs" in caplog.text
    wait_until(lambda: handle.exit_code() is not None, TIMEOUT, "the worker to die")
    assert handle.exit_code() == -signal.SIGKILL


def _kill_supervisor_of(handle: WorkerHandle) -> None:
    """What a supervisor's kill -9 does to its worker: its ends of both pipes close."""
    handle._reader_stop.set()
    if handle._reader is not None:
        handle._reader.join(5)
    with handle._lease_lock:
        for fd in (handle._lease_w, handle._status_r):
            os.close(fd)
        handle._lease_w = handle._status_r = -1


@pytest.fixture
def orphaned_frozen(frozen_worker, tmp_path):
    """The worker of ``frozen_worker``, renewed once with a record of its lease, then
    orphaned by its supervisor's death and frozen at its lease's end; yields (the orphan
    as the next supervisor process finds it, state dir, records dir, its old handle)."""
    handle, state = frozen_worker
    records = tmp_path / "leases"
    handle.record_path = records / f"{TOPOLOGY_ID}-{PORT}.json"
    assert handle.renew(time.monotonic() + 2.0, ASSIGNMENT_VERSION)
    assert load_record(handle.record_path) == LeaseRecord(
        handle.pid, TOPOLOGY_ID, PORT, 0, 1, 0, str(handle.cgroup), ASSIGNMENT_VERSION)
    wait_until(lambda: (state / "child.pid").exists(), TIMEOUT, "the command")
    _kill_supervisor_of(handle)
    wait_until(lambda: is_frozen(handle.cgroup), TIMEOUT,
               "the orphan to freeze at its lease's end")
    found = find_orphans(handle.worker_dir.parent, [PORT], unified_root(),
                         records_dir=records, timeout_s=60)
    assert list(found.orphans) == [PORT] and found.unidentified == set()
    orphan = found.orphans[PORT]
    assert (orphan.frozen, orphan.pid, orphan.assignment_version, orphan.worker_index,
            orphan.num_workers) == (True, handle.pid, ASSIGNMENT_VERSION, 0, 1)
    yield orphan, state, handle


@pytest.mark.parametrize("frozen_worker", [{ORPHAN_TIMEOUT_KEY: 2}], indirect=True)
def test_an_orphan_nobody_takes_over_is_ended_whole_cgroup_included(frozen_worker):
    """Issue 29: a worker whose supervisor died froze at its lease's end and stayed so for
    ever. Its reaper (started before the freeze, outside the cgroup) ends it, its command
    with it, once it has been frozen supervisor.worker.orphan.timeout.secs."""
    handle, state = frozen_worker
    assert handle.renew(time.monotonic() + 2.0, ASSIGNMENT_VERSION)
    wait_until(lambda: (state / "child.pid").exists(), TIMEOUT, "the command")
    child = int((state / "child.pid").read_text())
    _kill_supervisor_of(handle)
    wait_until(lambda: is_frozen(handle.cgroup), TIMEOUT, "the orphan to freeze")
    mark = read_mark(handle.cgroup)
    assert mark is not None and mark.deadline - mark.frozen_at == 2.0
    wait_until(lambda: not process_alive(child) and not process_alive(handle.pid),
               TIMEOUT, "its reaper to end it")
    wait_until(lambda: not handle.cgroup.exists(), TIMEOUT, "its cgroup to go")
    log_text = _log(handle)
    assert "frozen for at most 2 s (supervisor.worker.orphan.timeout.secs)" in log_text
    assert f"ended frozen worker cgroup {handle.cgroup}: nothing thawed it" in log_text


def _successor(orphan, handle: WorkerHandle, statuses: list[dict]) -> WorkerHandle:
    successor = WorkerHandle.taken_over(orphan, 2, lambda _h, s: statuses.append(s), None)
    successor.cgroups, successor.cgroup = handle.cgroups, handle.cgroup
    return successor


def test_an_orphan_frozen_at_its_leases_end_is_thawed_by_the_next_process(
        orphaned_frozen):
    orphan, state, handle = orphaned_frozen
    child = int((state / "child.pid").read_text())
    before = len(_ticks(state))
    statuses: list[dict] = []
    successor = _successor(orphan, handle, statuses)
    try:
        time.sleep(0.5)  # the command would tick 5 times meanwhile if it ran
        assert len(_ticks(state)) == before and is_frozen(handle.cgroup)
        # Its assignment unchanged since the renewal the record names: thawed.
        assert successor.renew(time.monotonic() + 30, ASSIGNMENT_VERSION)
        assert successor.thaws == 1 and not is_frozen(handle.cgroup)
        wait_until(lambda: len(_ticks(state)) > before + 3, TIMEOUT, "the command to go on")
        wait_until(lambda: any("takeover" in s for s in statuses), TIMEOUT,
                   "its take-over line, after the thaw")
        assert successor.exit_code() is None and process_alive(child)
        assert int((state / "child.pid").read_text()) == child
        log_text = _log(handle)
        assert "taken over by supervisor process" in log_text
        assert "the supervisor renewed the lease" in log_text and "lease lost" not in log_text
    finally:
        successor.kill("stop")
        successor.release()


def test_an_orphan_frozen_while_its_assignment_was_rewritten_is_killed(orphaned_frozen):
    orphan, state, handle = orphaned_frozen
    successor = _successor(orphan, handle, [])
    try:
        assert not successor.renew(time.monotonic() + 30, ASSIGNMENT_VERSION + 1)
        assert successor.ended_by == "lease" and successor.thaws == 0
        wait_until(lambda: successor.exit_code() is not None, TIMEOUT, "the worker to die")
        assert "the supervisor renewed the lease" not in _log(handle)
    finally:
        successor.release()
