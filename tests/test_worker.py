"""The worker process with process topologies (no Spark, no ZooKeeper).

Each test plays the supervisor with :class:`WorkerHarness`: real pipes, a real
``python -m nimbus.worker`` in its own session, real signals.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from worker_harness import WorkerHarness, group_members, process_alive, wait_until, worker_conf

from nimbus.state.records import WorkerBeat
from nimbus.supervisor.takeover import find_orphans
from nimbus.supervisor.worker_handle import WorkerHandle
from nimbus.worker.lease import Lease
from nimbus.worker.status import format_error
from nimbus.worker.takeover import socket_path
from nimbus.worker_protocol.component_share import assigned
from nimbus.worker_protocol.exits import EXIT_FAILED, EXIT_INVALID_TOPOLOGY, EXIT_OK, EXIT_STARTUP
from nimbus.worker_protocol.spark_settings import session_settings
from nimbus.worker_protocol.spec import SpecError, WorkerSpec
from nimbus.worker_protocol.takeover import SOCKET_NAME

REPO = Path(__file__).resolve().parents[1]
TOPOLOGY_ID = "tailer-1-1700000000"
# A worker starts in well under a second; generous bounds for a loaded 2-core machine.
START_TIMEOUT = 20.0

# The child command: records its pid and environment, creates a marker, then waits for
# SIGTERM (noted in a file) unless told to exit at once.
CHILD = textwrap.dedent("""
    import json, os, signal, sys, time
    state = os.environ["NIMBUS_HA_STATE_DIR"]
    def on_term(signum, frame):
        open(os.path.join(state, "got-sigterm"), "w").close()
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    env = {k: v for k, v in os.environ.items() if k.startswith(("NIMBUS_HA_", "EXTRA_"))}
    with open(os.path.join(state, "env.json"), "w") as f:
        json.dump({"env": env, "cwd": os.getcwd(), "pid": os.getpid()}, f)
    open(os.path.join(state, "started"), "w").close()
    if len(sys.argv) > 1:
        sys.stderr.write("about to fail\\n")
        sys.exit(int(sys.argv[1]))
    while True:
        time.sleep(1)
""")


def make_worker(tmp_path: Path, yaml_text: str | None = None, *, restarts: int = 0,
                extra_conf: dict | None = None) -> WorkerHarness:
    code = tmp_path / "code"
    code.mkdir()
    (code / "child.py").write_text(CHILD)
    if yaml_text is None:
        yaml_text = (f"command: [{json.dumps(sys.executable)}, child.py]\n"
                     "env: {EXTRA_SETTING: from-yaml, EXTRA_NUMBER: 7}\n")
    (code / "topology.yaml").write_text(yaml_text)
    conf = {"storm.local.dir": str(tmp_path / "local"), "worker.heartbeat.frequency.secs": 1,
            **(extra_conf or {})}
    return WorkerHarness(tmp_path / "workers" / f"{TOPOLOGY_ID}-6701", topology_id=TOPOLOGY_ID,
                         code_dir=code, conf=conf, port=6701, restarts=restarts)


@pytest.fixture
def harnesses():
    started: list[WorkerHarness] = []

    def start(harness: WorkerHarness) -> WorkerHarness:
        started.append(harness)
        return harness.start()

    yield start
    for harness in started:
        harness.close()


def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "local" / "checkpoints" / TOPOLOGY_ID / "state"


def child_info(tmp_path: Path) -> dict:
    path = state_dir(tmp_path) / "env.json"
    wait_until(lambda: path.exists() and path.stat().st_size > 0, START_TIMEOUT, "env.json")
    return json.loads(path.read_text())


def main_pid_beat(worker: WorkerHarness) -> dict:
    return worker.wait_for(lambda: next((b for b in worker.beats()
                                         if "main" in b["components"]), None),
                           START_TIMEOUT, "a beat with component main")


# -- (a) nothing runs before the first lease -------------------------------------------


def test_no_lease_means_no_command_and_exit_1(tmp_path, harnesses):
    worker = harnesses(make_worker(
        tmp_path, extra_conf={"supervisor.worker.start.timeout.secs": 2}))
    assert worker.wait_exit(timeout=START_TIMEOUT) == EXIT_STARTUP
    assert not state_dir(tmp_path).exists()  # the command never ran, nothing was created
    assert worker.beats() == []
    assert worker.errors() == [{"component": "worker-0",
                                "error": "no lease received within 2 s; not starting"}]


def test_command_starts_only_after_the_first_lease(tmp_path, harnesses):
    worker = harnesses(make_worker(tmp_path))
    worker.wait_for(lambda: "waiting up to 90 s for the first lease" in worker.log_text(),
                    START_TIMEOUT, "the worker to wait for its lease")
    assert not (state_dir(tmp_path) / "started").exists()
    assert worker.messages == []
    worker.keep_renewing()
    wait_until((state_dir(tmp_path) / "started").exists, START_TIMEOUT, "the command to start")


# -- (b) beats -----------------------------------------------------------------------------


def test_beats_carry_the_workerbeat_fields_and_the_command_pid(tmp_path, harnesses):
    worker = harnesses(make_worker(tmp_path, restarts=3))
    worker.keep_renewing()
    worker.wait_for(lambda: len(worker.beats()) >= 2, START_TIMEOUT, "two beats")
    pid = child_info(tmp_path)["pid"]
    # The supervisor stamps the time and adds what it measures of the worker itself; a
    # Spark UI address comes only from a pipeline that has one.
    # Its code version too (the supervisor knows what it started); a process
    # topology's worker says what its health check says (here: none declared).
    expected_fields = {f.name for f in dataclasses.fields(WorkerBeat)} - {
        "time_secs", "memory_bytes", "warm_start", "spark_ui_url", "code_version"} | {
        "health"}
    for beat in worker.beats()[:2]:
        assert set(beat) == expected_fields
        assert beat["health"] == "none"
        assert {k: beat[k] for k in ("topology_id", "supervisor_id", "host", "port",
                                     "restarts", "components")} == {
            "topology_id": TOPOLOGY_ID, "supervisor_id": "sup-test", "host": "127.0.0.1",
            "port": 6701, "restarts": 3, "components": {"main": {"pid": pid}}}
        assert isinstance(beat["uptime_secs"], int) and beat["uptime_secs"] >= 0
    assert os.getpgid(pid) == worker.pid  # in the worker's group: the lease kill reaches it
    assert worker.errors() == []


# -- (c), (d) the lease kills the group ----------------------------------------------------


def test_lease_expiry_kills_the_worker_and_its_command(tmp_path, harnesses):
    worker = harnesses(make_worker(tmp_path))
    worker.lease(4.0)
    deadline = time.monotonic() + 4.0
    main_pid_beat(worker)
    pid = child_info(tmp_path)["pid"]
    assert process_alive(pid)
    assert worker.wait_exit(timeout=15) == -signal.SIGKILL
    assert time.monotonic() >= deadline
    wait_until(lambda: not process_alive(pid), 5, "the command to be gone")
    assert group_members(worker.pid) == []
    assert "lease lost (lease deadline passed" in worker.log_text()
    assert not (state_dir(tmp_path) / "got-sigterm").exists()  # SIGKILL, not a stop request


def test_lease_renewals_keep_the_worker_alive_past_the_first_deadline(tmp_path, harnesses):
    worker = harnesses(make_worker(tmp_path))
    worker.keep_renewing(ttl=2.5, every=0.3)
    first_deadline = time.monotonic() + 2.5
    main_pid_beat(worker)
    worker.wait_for(lambda: time.monotonic() > first_deadline + 1.0 and worker.beats(),
                    START_TIMEOUT, "the first deadline to pass")
    assert worker.proc.poll() is None
    worker.stop_renewing()
    assert worker.wait_exit(timeout=15) == -signal.SIGKILL


def test_a_worker_whose_supervisor_is_gone_runs_to_the_end_of_its_lease(tmp_path, harnesses):
    worker = harnesses(make_worker(tmp_path))
    worker.lease(60)
    main_pid_beat(worker)
    pid = child_info(tmp_path)["pid"]
    worker.lease(3.0)  # the newest line wins
    deadline = time.monotonic() + 3.0
    worker.close_lease()  # the supervisor is gone
    worker.wait_for(lambda: "runs to the end of its lease" in worker.log_text(), 5,
                    "the worker to say it runs on")
    assert worker.proc.poll() is None and process_alive(pid)
    assert worker.wait_exit(timeout=15) == -signal.SIGKILL
    assert time.monotonic() >= deadline
    wait_until(lambda: not process_alive(pid), 5, "the command to be gone")
    assert group_members(worker.pid) == []
    assert "lease lost (lease deadline passed" in worker.log_text()


def test_a_worker_without_a_lease_dies_with_its_supervisor(tmp_path, harnesses):
    worker = harnesses(make_worker(tmp_path))
    worker.close_lease()  # before the first lease: nothing to run on
    assert worker.wait_exit(timeout=START_TIMEOUT) == -signal.SIGKILL
    assert "lease lost (lease pipe closed: the supervisor is gone)" in worker.log_text()


def test_a_supervisor_started_again_takes_the_worker_over_within_its_lease(
        tmp_path, harnesses):
    harness = make_worker(tmp_path)
    harness.fields["code_version"] = 3   # an upgraded topology's: it says which it runs
    worker = harnesses(harness)
    worker.lease(60)
    main_pid_beat(worker)
    workers_dir = worker.worker_dir.parent
    # While its supervisor lives, nobody else may take it over.
    with socket.socket(socket.AF_UNIX) as probe:
        probe.settimeout(5)
        with socket_path(worker.worker_dir) as address:
            probe.connect(address)
        assert probe.recv(1) == b""
    # Its log is written by its log pump, a moment after it is said.
    worker.wait_for(lambda: "refused a take-over by pid" in worker.log_text(), 5,
                    "the refusal in its log")
    assert worker.proc.poll() is None

    worker.lease(3.0)
    old_deadline = time.monotonic() + 3.0
    worker.close_lease()
    worker.wait_for(lambda: "runs to the end of its lease" in worker.log_text(), 5,
                    "the worker to say it runs on")
    found = find_orphans(workers_dir, [6701], cgroup_root=None)
    assert list(found.orphans) == [6701] and found.unidentified == set()
    orphan = found.orphans[6701]
    assert (orphan.pid, orphan.topology_id, orphan.port, orphan.worker_index,
            orphan.num_workers, orphan.restarts, orphan.kind, orphan.code_version) == \
        (worker.pid, TOPOLOGY_ID, 6701, 0, 1, 0, "process", 3)
    seen: list[dict] = []
    handle = WorkerHandle.taken_over(orphan, 1, lambda _h, status: seen.append(status), None)
    assert (handle.code_version, handle.code_key) == (3, f"{TOPOLOGY_ID}.v3")
    try:
        assert handle.renew(time.monotonic() + 30)
        wait_until(lambda: time.monotonic() > old_deadline + 1.0
                   and any("beat" in m for m in seen[-3:]), START_TIMEOUT,
                   "beats past the old deadline")
        assert worker.proc.poll() is None and handle.exit_code() is None
        worker.wait_for(lambda: "taken over by supervisor process" in worker.log_text(), 5,
                        "the take-over in its log")
        handle.stop(grace_s=10)  # SIGTERM: the command stops, the worker exits 0
        assert handle.exit_code() == EXIT_OK == worker.wait_exit(timeout=5)
        assert {"exit": EXIT_OK} in seen
    finally:
        handle.release()
    assert not (worker.worker_dir / SOCKET_NAME).exists()


def test_an_orphaned_lease_is_renewed_by_its_successor_and_never_after_it_ran_out():
    first_r, first_w = os.pipe()
    reasons: list[str] = []
    lease = Lease(first_r, on_expiry=reasons.append, outlives_supervisor=True).start()
    second_r, second_w = os.pipe()
    try:
        os.write(first_w, f"lease {time.monotonic() + 1.0:.3f}\n".encode())
        os.close(first_w)  # the supervisor is gone
        wait_until(lambda: lease.orphaned, 5, "the lease to see EOF")
        assert lease.attach(second_r) and not lease.orphaned
        os.write(second_w, f"lease {time.monotonic() + 2.0:.3f}\n".encode())
        renewed = time.monotonic() + 2.0
        wait_until(lambda: lease.deadline and lease.deadline >= renewed - 0.1, 5,
                   "the successor's renewal")
        os.close(second_w)  # gone again: this time nobody comes
        wait_until(lambda: reasons, 10, "the lease to run out")
        assert time.monotonic() >= renewed
        assert len(reasons) == 1 and reasons[0].startswith("lease deadline passed")
        late_r, late_w = os.pipe()
        assert not lease.attach(late_r)  # ran out: nobody may revive it
        os.close(late_r)
        os.close(late_w)
    finally:
        lease.stop()


# -- (e) the command exits -----------------------------------------------------------------


def test_command_exiting_is_an_error_with_its_code_and_stderr(tmp_path, harnesses):
    yaml_text = f"command: [{json.dumps(sys.executable)}, child.py, '7']\n"
    worker = harnesses(make_worker(tmp_path, yaml_text))
    worker.keep_renewing()
    assert worker.wait_exit(timeout=START_TIMEOUT) == EXIT_FAILED
    worker.wait_for(worker.errors, 5, "the error line")
    assert worker.errors() == [{
        "component": "main",
        "error": "command exited with code 7\nlast lines of its stderr:\nabout to fail"}]
    assert "about to fail" in worker.log_text()  # copied to worker.log as well


# -- (f) invalid topology.yaml -------------------------------------------------------------


@pytest.mark.parametrize("yaml_text, message", [
    ("command: python3 main.py\n",
     "topology.yaml: 'command' must be a non-empty list of strings (argv), e.g. "
     "[python3, main.py]; got 'python3 main.py'"),
    ("command: []\n",
     "topology.yaml: 'command' must be a non-empty list of strings (argv), e.g. "
     "[python3, main.py]; got []"),
    ("command: [python3, 5]\n",
     "topology.yaml: 'command' must be a non-empty list of strings (argv), e.g. "
     "[python3, main.py]; got ['python3', 5]"),
    ("comand: [python3]\n",
     "topology.yaml: unknown keys ['comand'] (allowed: 'command', 'env', 'health')"),
    ("command: [python3]\nhealth: {command: [true], file: hb}\n",
     "topology.yaml: 'health' needs exactly one of 'command' (argv) and 'file' (a path "
     "whose modification time advances)"),
    ("command: [python3]\nhealth: {file: hb, every: 0}\n",
     "topology.yaml: 'health.every' must be a positive number of seconds, got 0"),
    ("command: [python3]\nhealth: {file: hb, when: 3}\n",
     "topology.yaml: unknown keys ['when'] in 'health' (allowed: command, file, every, "
     "timeout, grace)"),
    ("- python3\n", "topology.yaml: expected a mapping with 'command', got list"),
    ("command: [python3]\nenv: [A]\n", "topology.yaml: 'env' must be a mapping of NAME: value"),
    ("command: [python3\n", None),  # malformed YAML: the parser's message follows
])
def test_invalid_topology_yaml_is_reported_and_exits_2(tmp_path, harnesses, yaml_text,
                                                       message):
    worker = harnesses(make_worker(tmp_path, yaml_text))
    worker.keep_renewing()
    assert worker.wait_exit(timeout=START_TIMEOUT) == EXIT_INVALID_TOPOLOGY
    worker.wait_for(worker.errors, 5, "the error line")
    [error] = worker.errors()
    assert error["component"] == "worker-0"
    if message is None:
        assert error["error"].startswith("topology.yaml: malformed YAML: ")
    else:
        assert error["error"] == message


def test_missing_executable_is_reported_and_exits_2(tmp_path, harnesses):
    worker = harnesses(make_worker(tmp_path, "command: [./no-such-program, x]\n"))
    worker.keep_renewing()
    assert worker.wait_exit(timeout=START_TIMEOUT) == EXIT_INVALID_TOPOLOGY
    worker.wait_for(worker.errors, 5, "the error line")
    assert worker.errors() == [{
        "component": "main",
        "error": "cannot start command ['./no-such-program', 'x']: "
                 "FileNotFoundError: No such file or directory"}]


def test_bundle_without_a_topology_file_is_reported_and_exits_2(tmp_path, harnesses):
    worker = make_worker(tmp_path)
    (tmp_path / "code" / "topology.yaml").unlink()
    harnesses(worker).keep_renewing()
    assert worker.wait_exit(timeout=START_TIMEOUT) == EXIT_INVALID_TOPOLOGY
    worker.wait_for(worker.errors, 5, "the error line")
    assert worker.errors() == [{
        "component": "worker-0",
        "error": f"bundle {tmp_path / 'code'} holds neither of topology.py and "
                 "topology.yaml; it needs exactly one"}]


# -- (g) SIGTERM ---------------------------------------------------------------------------


@pytest.mark.parametrize("to_group", [True, False], ids=["group", "worker-only"])
def test_sigterm_stops_the_command_and_exits_0(tmp_path, harnesses, to_group):
    worker = harnesses(make_worker(tmp_path))
    worker.keep_renewing()
    main_pid_beat(worker)
    pid = child_info(tmp_path)["pid"]
    worker.signal(signal.SIGTERM, group=to_group)
    assert worker.wait_exit(timeout=START_TIMEOUT) == EXIT_OK
    assert (state_dir(tmp_path) / "got-sigterm").exists()
    assert not process_alive(pid)
    assert worker.errors() == []


# -- (h) the command's environment ---------------------------------------------------------


def test_command_gets_the_contract_variables_and_yaml_env(tmp_path, harnesses):
    worker = harnesses(make_worker(tmp_path))
    worker.keep_renewing()
    info = child_info(tmp_path)
    assert info["env"] == {"NIMBUS_HA_TOPOLOGY_ID": TOPOLOGY_ID,
                           "NIMBUS_HA_WORKER_PORT": "6701",
                           "NIMBUS_HA_STATE_DIR": str(state_dir(tmp_path)),
                           "EXTRA_SETTING": "from-yaml", "EXTRA_NUMBER": "7"}
    assert info["cwd"] == str(tmp_path / "code")
    assert state_dir(tmp_path).is_dir()


# -- pieces without a process --------------------------------------------------------------


def spec_for(tmp_path: Path, **changes) -> WorkerSpec:
    fields = dict(topology_id="t-1-1", port=6700, supervisor_id="s", host="127.0.0.1",
                  code_dir=str(tmp_path), lease_fd=5, status_fd=6,
                  conf=worker_conf({"storm.local.dir": str(tmp_path / "local")}))
    fields.update(changes)
    return WorkerSpec(**fields)


def test_worker_spec_round_trip_and_defaults(tmp_path):
    spec = spec_for(tmp_path, restarts=2, worker_index=1, num_workers=3)
    path = spec.dump(tmp_path)
    assert path == tmp_path / "worker.json"
    assert path.stat().st_mode & 0o777 == 0o600  # the configuration may hold secrets
    assert WorkerSpec.load(tmp_path) == spec
    assert spec.checkpoint_root == tmp_path / "local" / "checkpoints"
    assert spec_for(tmp_path, conf={"topology.spark.checkpoint.dir": "/ck"}).checkpoint_root \
        == Path("/ck")
    assert spec.heartbeat_secs == 1.0


@pytest.mark.parametrize("data, message", [
    ({"port": "6700"}, "worker spec field 'port' must be int, got str '6700'"),
    ({"conf": []}, "worker spec field 'conf' must be dict, got list []"),
    ({"lease_fd": True}, "worker spec field 'lease_fd' must be int, got bool True"),
    ({"worker_index": 2, "num_workers": 2},
     "worker spec: worker_index 2 is not in [0, num_workers=2)"),
    ({"surprise": 1}, "unknown fields ['surprise']"),
])
def test_worker_spec_load_refuses_bad_fields(tmp_path, data, message):
    base = dataclasses.asdict(spec_for(tmp_path))
    (tmp_path / "worker.json").write_text(json.dumps({**base, **data}))
    with pytest.raises(SpecError) as info:
        WorkerSpec.load(tmp_path / "worker.json")
    assert str(info.value) == f"{tmp_path / 'worker.json'}: {message}"


def test_worker_spec_load_names_missing_fields(tmp_path):
    base = dataclasses.asdict(spec_for(tmp_path))
    del base["status_fd"], base["restarts"]  # restarts has a default, status_fd has not
    (tmp_path / "worker.json").write_text(json.dumps(base))
    with pytest.raises(SpecError, match=r"missing fields \['status_fd'\]$"):
        WorkerSpec.load(tmp_path)


@pytest.mark.parametrize("key, value, message", [
    ("topology.stall.timeout.secs", None,
     "worker spec: conf has no 'topology.stall.timeout.secs' (its supervisor writes every "
     "key a worker reads: one of another release?)"),
    ("supervisor.worker.start.timeout.secs", 0,
     "key 'supervisor.worker.start.timeout.secs' must be a positive number, got 0"),
    ("topology.spark.master", "", "key 'topology.spark.master' must be a non-empty string, "
                                  "got ''"),
])
def test_a_worker_reads_its_settings_from_its_spec_and_copies_no_default(
        tmp_path, key, value, message):
    spec = spec_for(tmp_path)
    assert (spec.first_lease_wait_s, spec.stall_timeout_s, spec.orphan_timeout_s,
            spec.spark_master) == (90.0, 300.0, 300.0, "local[*]"), "the cluster defaults"
    conf = dict(spec.conf)
    if value is None:
        del conf[key]
    else:
        conf[key] = value
    with pytest.raises(SpecError) as info:
        spec_for(tmp_path, conf=conf).check_settings()
    assert str(info.value) == message


def test_components_are_shared_round_robin_in_sorted_order():
    names = ["e", "a", "d", "b", "c"]
    assert assigned(names, 0, 1) == ["a", "b", "c", "d", "e"]
    assert assigned(names, 0, 2) == ["a", "c", "e"]
    assert assigned(names, 1, 2) == ["b", "d"]
    assert assigned(names, 2, 3) == ["c"]
    assert assigned(["main"], 1, 2) == []


def test_spark_settings_bind_to_loopback_unless_the_topology_says(tmp_path):
    user = {"spark.ui.enabled": False, "spark.sql.shuffle.partitions": 2}
    spec = spec_for(tmp_path, conf={"topology.spark.conf": user})
    assert session_settings(spec) == {
        "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}
    own = spec_for(tmp_path, conf={"topology.spark.conf": {"spark.driver.host": "10.0.0.5"}})
    assert session_settings(own) == {"spark.driver.host": "10.0.0.5"}


def test_format_error_keeps_type_message_and_traceback_tail_within_the_limit():
    def fail(depth: int) -> None:
        if depth == 0:
            raise ValueError("x" * 5000)
        fail(depth - 1)

    with pytest.raises(ValueError) as info:
        fail(10)
    text = format_error(info.value)
    assert len(text) <= 2048
    assert text.startswith("ValueError: xxx")
    assert "Traceback (most recent call last, tail):" in text
    assert 'raise ValueError("x" * 5000)' in text


# -- examples without Spark ----------------------------------------------------------------


def load_example(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_rows_reads_only_files_in_the_sink_log(tmp_path):
    counts = load_example(REPO / "examples" / "wordcount" / "counts.py")
    out = tmp_path / "out"
    meta = out / "_spark_metadata"
    meta.mkdir(parents=True)

    def part(name: str, *ids: int) -> str:
        (out / name).write_text("".join(json.dumps({"id": i, "words": 1}) + "\n" for i in ids))
        return f"file://{out / name}".replace(" ", "%20")

    def log(name: str, *entries: tuple[str, str]) -> None:
        lines = ["v1"] + [json.dumps({"path": p, "size": 1, "isDir": False,
                                      "modificationTime": 1, "blockReplication": 1,
                                      "blockSize": 1, "action": a}) for p, a in entries]
        (meta / name).write_text("\n".join(lines))

    old = part("part-old.json", 99)  # only in batch 0, superseded by the compact file
    a, b, c = part("part a.json", 1, 2), part("part-b.json", 3), part("part-c.json", 4)
    part("part-uncommitted.json", 5)  # a killed batch's leftover: listed nowhere
    log("0", (old, "add"))
    log("1", (a, "add"))
    log("2.compact", (a, "add"), (b, "add"))
    log("2", (old, "add"))  # replaced by 2.compact: must not be read
    log("3", (c, "add"), (b, "delete"))
    (meta / ".3.crc").write_text("junk")
    assert counts.committed_rows(out) == [{"id": 1, "words": 1}, {"id": 2, "words": 1},
                                          {"id": 4, "words": 1}]
    assert counts.committed_rows(tmp_path / "nothing-yet") == []


def test_tailer_resumes_from_its_offset(tmp_path):
    source, target, state = tmp_path / "in.log", tmp_path / "out.log", tmp_path / "state"
    state.mkdir()
    env = {**os.environ, "TAILER_INPUT": str(source), "TAILER_OUTPUT": str(target),
           "NIMBUS_HA_STATE_DIR": str(state)}
    script = REPO / "examples" / "tailer" / "tailer.py"

    def run_until(expected: bytes) -> None:
        proc = subprocess.Popen([sys.executable, str(script)], env=env,
                                stdout=subprocess.DEVNULL)
        try:
            wait_until(lambda: target.exists() and target.read_bytes() == expected, 15,
                       f"output {expected!r}")
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 0

    source.write_bytes(b"one\ntwo\npart")
    run_until(b"one\ntwo\n")
    with source.open("ab") as f:
        f.write(b"ial\nthree\n")
    run_until(b"one\ntwo\npartial\nthree\n")
    assert (state / "offset").read_text() == str(len(b"one\ntwo\npartial\nthree\n"))


# -- (g) health checks (issue 20: liveness by health, not by pid) --------------------------

LOOP = f"[{json.dumps(sys.executable)}, -c, 'import time; time.sleep(600)']"


@pytest.mark.parametrize(("health", "reason"), [
    ("{file: heartbeat, timeout: 1, grace: 0}",
     "health check failed: {state}/heartbeat does not exist for "),
    ("{command: [sh, -c, 'echo down; exit 4'], every: 0.5, grace: 0}",
     "health check failed: ['sh', '-c', 'echo down; exit 4'] exited with code 4: down"),
    ("{command: [sleep, '5'], every: 0.5, timeout: 0.5, grace: 0}",
     "health check failed: ['sleep', '5'] took more than 0.5s (health.timeout)"),
])
def test_an_unhealthy_command_is_stopped_and_reported(tmp_path, harnesses, health, reason):
    worker = harnesses(make_worker(tmp_path, f"command: {LOOP}\nhealth: {health}\n"))
    worker.keep_renewing()
    assert worker.wait_exit(timeout=START_TIMEOUT) == EXIT_FAILED
    worker.wait_for(worker.errors, 5, "the error line")
    [error] = worker.errors()
    assert error["component"] == "main"
    assert error["error"].startswith(reason.format(state=state_dir(tmp_path))), error


def test_a_command_that_keeps_its_heartbeat_file_fresh_stays_up(tmp_path, harnesses):
    touch = "[sh, -c, 'while true; do touch \"$NIMBUS_HA_STATE_DIR/hb\"; sleep 0.2; done']"
    worker = harnesses(make_worker(
        tmp_path, f"command: {touch}\nhealth: {{file: hb, timeout: 1, grace: 0}}\n"))
    worker.keep_renewing()
    worker.wait_for(lambda: len(worker.beats()) >= 4, START_TIMEOUT, "four beats")
    assert worker.errors() == [] and worker.proc.poll() is None


def test_a_command_counts_as_up_once_its_health_check_passes(tmp_path, harnesses):
    """Its beats say "pending" until its declared check first passes, then "passed"
    (what its supervisor reads as the worker of a new version being up)."""
    check = "{command: [sh, -c, 'exit 0'], every: 0.3, grace: 1}"
    worker = harnesses(make_worker(tmp_path, f"command: {LOOP}\nhealth: {check}\n"))
    worker.keep_renewing()
    first = main_pid_beat(worker)
    assert first["health"] == "pending"     # within its grace: not checked yet
    worker.wait_for(lambda: any(b.get("health") == "passed" for b in worker.beats()),
                    START_TIMEOUT, "a beat saying its check passed")
    said = [b["health"] for b in worker.beats()]
    assert said == sorted(said, key=["pending", "passed"].index)   # never back
    assert worker.errors() == []
