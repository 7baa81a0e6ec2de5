"""The status pipe is untrusted input (issue 19, W4/W5/W6): whatever a worker writes, the
supervisor changes nothing in ZooKeeper outside the worker's own nodes.

Against a real ZooKeeper and a real supervisor. The first test sends hostile lines
through a real worker's status pipe; the second drives the supervisor's status handler
with a seeded fuzzer of messages (the error budget lifted, so every message reaches
ZooKeeper). Both compare the whole tree under the cluster's root before and after.
"""

from __future__ import annotations

import json
import random
import time
from types import SimpleNamespace

import pytest
from test_supervisor import (
    TOPOLOGY,
    _beat,
    _code,
    _free_port,
    _submit_directly,
    _supervisor,
    _tar,
    stub_worker,  # noqa: F401 - a fixture
)
from waiting import wait_for

from nimbus.state.beat_progress import MAX_BEAT_BYTES
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.records import ACTIVE, Assignment, ErrorInfo, StormBase, WorkerBeat
from nimbus.supervisor import status_input
from nimbus.supervisor.status_input import MAX_ERROR_CHARS

pytestmark = pytest.mark.zookeeper

VICTIM = "alice-7-1700000001"


@pytest.fixture
def cluster_state(make_zk, zk_root):
    state = StormClusterState(make_zk(), zk_root)
    state.setup()
    return state


def _victim(state: StormClusterState) -> None:
    """Another user's topology, with an error of its own: what the attack aimed at."""
    zk = state.zk
    zk.create(state.storm_path(VICTIM), StormBase("alice", 1, ACTIVE, 1).encode())
    zk.create(state.path("assignments", VICTIM), Assignment(master_code_dir="/x").encode())
    zk.create(state.path("workerbeats", VICTIM), b"")
    zk.create(state.path("errors", VICTIM), b"")
    state.report_error(VICTIM, "counts", ErrorInfo(error="alice's", error_time_secs=1))


def _tree(state: StormClusterState) -> dict[str, tuple[bytes, int]]:
    """Every node under the root: path -> (data, version)."""
    out = {}
    pending = [state.root]
    while pending:
        path = pending.pop()
        data, stat = state.zk.get(path)
        out[path] = (data, stat.version)
        pending += [f"{path}/{child}" for child in state.zk.get_children(path)]
    return out


def _outside_own_nodes(state: StormClusterState, tree: dict, sup_id: str, port: int) -> dict:
    own = (state.path("errors", TOPOLOGY) + "/", state.path("workerbeats", TOPOLOGY) + "/",
           state.path("supervisors", sup_id))
    return {p: v for p, v in tree.items() if not p.startswith(own)}


def _hostile(state: StormClusterState) -> list[object]:
    """Messages that aim at other nodes, or at size."""
    storms = state.path("storms")
    return [
        {"error": {"component": storms, "error": "absolute: the trim would delete them"}},
        {"error": {"component": f"../../storms/{VICTIM}", "error": "climbs out"}},
        {"error": {"component": f"../{VICTIM}/counts", "error": "into alice's errors"}},
        {"error": {"component": "..", "error": "dot dot"}},
        {"error": {"component": ".", "error": "dot"}},
        {"error": {"component": "a/b", "error": "two parts"}},
        {"error": {"component": "x" * 65, "error": "too long"}},
        {"error": {"component": "nul\x00", "error": "a NUL"}},
        {"error": {"component": 42, "error": "not a string"}},
        {"error": "not an object"},
        {"error": {"component": "main", "error": "y" * 900_000}},
        {"beat": {"components": {storms: {"pid": 1}, "ok": {"batch_id": "z" * 10_000,
                                                             "evil": {"deep": 1}}}}},
        {"beat": {"components": {f"c{i}": {"batch_id": i} for i in range(1000)}}},
    ]


def test_hostile_lines_on_a_real_status_pipe_touch_only_the_workers_own_nodes(
        tmp_path, zk_server, zk_root, cluster_state, stub_worker):  # noqa: F811
    port = _free_port()
    files = _code(_tar({"topology.yaml": b"command: [true]\n"}))
    lines = [json.dumps(m).encode() for m in _hostile(cluster_state)]
    lines += [b"not json at all", b"\xff\xfe invalid utf-8", b"[1, 2, 3]", b"x" * (2 << 20),
              json.dumps(_huge_beat()).encode()]
    status_file = tmp_path / "hostile.jsonl"
    status_file.write_bytes(b"\n".join(lines) + b"\n")
    files["stormconf.json"] = json.dumps({"topology.stub.status_file": str(status_file),
                                          "topology.stub.silent": True}).encode()
    _victim(cluster_state)
    sup = _supervisor(tmp_path, zk_server, zk_root, stub_worker, files, port)
    _submit_directly(cluster_state, files, {"worker-0": [sup.id, port]})
    before = _outside_own_nodes(cluster_state, _tree(cluster_state), sup.id, port)
    sup.start()
    try:
        def marker_seen() -> bool:
            data = cluster_state.get_worker_heartbeat(TOPOLOGY, sup.id, port)
            return bool(data) and "marker" in WorkerBeat.decode(data).components

        wait_for(marker_seen, 30, "the last line to be handled")
        # The largest beat a worker can send (under the pipe's 1 MiB line) is bounded.
        data = cluster_state.get_worker_heartbeat(TOPOLOGY, sup.id, port)
        beat = WorkerBeat.decode(data)
        assert len(data) <= MAX_BEAT_BYTES and beat.spark_ui_url == ""
        assert len(beat.components) == status_input.MAX_BEAT_COMPONENTS
        assert beat.components["marker"]["batch_id"] == 7
        after = _outside_own_nodes(cluster_state, _tree(cluster_state), sup.id, port)
        assert after == before
        components = set(cluster_state.error_components(TOPOLOGY))
        assert components == {"worker-0", "main"}, components
        refused = [e.error for e in cluster_state.errors(TOPOLOGY, "worker-0")]
        assert any(f"under {cluster_state.path('storms')!r}, which is not a component id"
                   in text for text in refused), refused
        assert all(len(e.error) <= MAX_ERROR_CHARS + 64
                   for e in cluster_state.errors(TOPOLOGY, "main"))
        assert [e.error for e in cluster_state.errors(VICTIM, "counts")] == ["alice's"]
    finally:
        sup.stop()


def _huge_beat() -> dict:
    """A beat just under the status pipe's 1 MiB line: many components, each with long
    texts, many sources and a long history, and a Spark UI address that is a script."""
    text = "<script>x</script>" * 8
    progress = {"batch_id": 1, "sources": [{"description": text, "end_offset": text,
                                            "start_offset": {"deep": [text]}}] * 10,
                "state_operators": [{"operator_name": text}] * 12, "watermark": text,
                "sink": {"description": text}, "duration_ms": {"x": 1}}
    history = [[10 ** 9 + i, 1.0, 2.0, 3] for i in range(120)]
    components = {"marker": {"batch_id": 7, "progress": progress, "history": history}}
    components.update({f"c{i}": {"batch_id": i, "progress": progress, "history": history}
                       for i in range(90)})
    beat = {"beat": {"components": components, "spark_ui_url": "javascript:alert(1)"}}
    assert len(json.dumps(beat)) < (1 << 20)
    return beat


def _fuzzed(rng: random.Random, state: StormClusterState) -> object:
    atoms = ["main", "/", "..", ".", "", "a/b", "/storm", state.root, state.path("storms"),
             f"../{VICTIM}", "worker-0", "é", "x" * rng.randint(60, 70), "\n", "\x00",
             "__system", "-lead", "ok.name", None, 7, 1.5, True, [], {}]

    def atom() -> object:
        value = rng.choice(atoms)
        if isinstance(value, str) and rng.random() < 0.3:
            value = value + rng.choice(atoms[:8])  # type: ignore[operator]
        return value

    kind = rng.random()
    if kind < 0.5:
        return {"error": {"component": atom(), "error": rng.choice(
            ["e", "", None, "m" * rng.randint(0, 20_000), 5])}}
    if kind < 0.7:
        return {"beat": {"components": {str(atom()): {"batch_id": atom(), "pid": atom()}
                                        for _ in range(rng.randint(0, 5))}}}
    if kind < 0.8:   # Spark's details: any shape, any size
        return {"beat": {"spark_ui_url": rng.choice([atom(), "http://h:1", "http://\n"]),
                         "components": {str(atom()): {
                             "batch_id": 1, "progress": rng.choice([atom(), {
                                 "sources": [{"description": atom(), "end_offset": atom()}]
                                 * rng.randint(0, 30), "duration_ms": {str(atom()): atom()},
                                 "watermark": atom()}]),
                             "history": rng.choice([atom(), [[atom(), atom(), atom(), atom()]]
                                                    * rng.randint(0, 200)])}
                             for _ in range(rng.randint(0, 3))}}}
    key = atom()
    return rng.choice([{"error": atom()}, {"beat": atom()}, {"beat": {"components": atom()}},
                       {key if isinstance(key, str) else "k": atom()}])


def test_fuzzed_status_messages_touch_only_the_workers_own_nodes(
        tmp_path, zk_server, zk_root, cluster_state, stub_worker, monkeypatch):  # noqa: F811
    port = _free_port()
    files = _code(_tar({"topology.yaml": b"command: [true]\n"}))
    _victim(cluster_state)
    sup = _supervisor(tmp_path, zk_server, zk_root, stub_worker, files, port)
    sup.start()
    try:
        _submit_directly(cluster_state, files, {})  # no worker: the test speaks for it
        before = _outside_own_nodes(cluster_state, _tree(cluster_state), sup.id, port)
        handle = SimpleNamespace(
            topology_id=TOPOLOGY, port=port, worker_index=0, num_workers=1,
            name=f"{TOPOLOGY}:{port}", session_id=sup.zk.client_id[0], ended_by="",
            errors_reported=0, started_at=0.0, restarts=0, committed=False,
            version_committed=False, code_version=1, kind="pipeline", warm="",
            topology_components=None, own_components=None, batched_components=set(),
            memory_bytes=lambda: 0, last_beat_at=None,
            last_error="",
            error_budget=status_input.ErrorBudget(per_minute=10**9))
        monkeypatch.setattr(sup.telemetry, "observe", lambda *args: None)
        rng = random.Random(19)
        for _ in range(400):
            sup.reporting.on_status(handle, _fuzzed(rng, cluster_state))
        after = _outside_own_nodes(cluster_state, _tree(cluster_state), sup.id, port)
        assert after == before
        for component in cluster_state.error_components(TOPOLOGY):
            assert status_input.is_component_id(component), component
        data = cluster_state.get_worker_heartbeat(TOPOLOGY, sup.id, port)
        assert data is not None and len(data) <= MAX_BEAT_BYTES
        WorkerBeat.decode(data)
        assert [e.error for e in cluster_state.errors(VICTIM, "counts")] == ["alice's"]
    finally:
        sup.stop()


def test_the_error_budget_drops_a_flood():
    now = [0.0]
    budget = status_input.ErrorBudget(per_minute=12, clock=lambda: now[0])
    assert [budget.take() for _ in range(14)] == [True] * 12 + [False, False]
    now[0] += 5.0  # one token every 5 s
    assert (budget.take(), budget.take(), budget.dropped) == (True, False, 3)


@pytest.mark.parametrize("raw", [None, "a", {"a": 1}, ["a", "/storm/storms"], ["a", 1],
                                 ["x"] * (status_input.MAX_DECLARED_COMPONENTS + 1)])
def test_a_declared_component_list_is_believed_whole_or_not_at_all(raw):
    assert status_input.checked_component_list(raw) is None


def test_a_declared_component_list_is_sorted_and_deduplicated():
    assert status_input.checked_component_list(["b", "a", "b"]) == ("a", "b")


def test_a_slots_history_goes_on_through_its_workers_restart(
        tmp_path, zk_server, zk_root, cluster_state, stub_worker, monkeypatch):  # noqa: F811
    port = _free_port()
    files = _code(_tar({"topology.yaml": b"command: [true]\n"}))
    sup = _supervisor(tmp_path, zk_server, zk_root, stub_worker, files, port)
    sup.start()
    try:
        _submit_directly(cluster_state, files, {})  # no worker: the test speaks for it
        monkeypatch.setattr(sup.telemetry, "observe", lambda *args: None)
        # No worker of it is placed here, so the clean-up pass would forget the slot.
        monkeypatch.setattr(sup.reporting, "forget_except", lambda keep: None)

        def process(pid: int) -> SimpleNamespace:   # one process of the slot's worker
            return SimpleNamespace(
                topology_id=TOPOLOGY, port=port, worker_index=0, num_workers=1,
                name=f"{TOPOLOGY}:{port}", session_id=sup.zk.client_id[0], ended_by="",
                errors_reported=0, started_at=0.0, restarts=pid, committed=False,
                version_committed=False, code_version=1, kind="pipeline", warm="",
                topology_components=None, own_components=None, batched_components=set(),
                memory_bytes=lambda: 0, last_beat_at=None,
                last_error="",
                error_budget=status_input.ErrorBudget())

        now = int(time.time())
        before = [[now - 100 + 10 * i, 5.0, 5.0, 50] for i in range(5)]
        after = [[now - 20, 9.0, 9.0, 90]]

        def beat(history: list) -> dict:
            return {"beat": {"components": {"main": {"batch_id": 1, "history": history}}}}

        first = process(1)   # written once the supervisor's session is up
        wait_for(lambda: sup.reporting.on_status(first, beat(before)) or
                 _beat(cluster_state, sup, port) is not None, 30, "the first beat")
        sup.reporting.on_status(process(2), beat([]))   # started again, no batch yet
        assert _beat(cluster_state, sup, port).components["main"]["history"] == before
        sup.reporting.on_status(process(2), beat(after))
        assert _beat(cluster_state, sup, port).components["main"]["history"] == \
            before + after
    finally:
        sup.stop()
