"""A supervisor switching a slot between code versions (issue 31), against a real
ZooKeeper with the stand-in worker of test_supervisor: the assignment's version changes,
the worker is stopped and started again on the new version's code (its own code key),
its heartbeat says the version, whether it committed and its failures, and the code no
slot wants any more goes."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest
from test_supervisor import (
    TOPOLOGY,
    _beat,
    _code,
    _free_port,
    _said,
    _sha,
    _submit_directly,
    _supervisor,
    _tar,
    cluster_state,  # noqa: F401 - a fixture
    stub_worker,  # noqa: F401 - a fixture
)
from waiting import wait_for

from nimbus.state.records import Assignment
from nimbus.worker_protocol.spec import WorkerSpec

pytestmark = pytest.mark.zookeeper

V2 = f"{TOPOLOGY}.v2"
V3 = f"{TOPOLOGY}.v3"


class KeyedPeers:
    """fetch(peer, "<code-key>/<file>", dest) serving each code key's own files."""

    def __init__(self, served: dict[str, dict[str, bytes]]):
        self.served = served
        self.calls: list[str] = []

    def __call__(self, peer: str, remote: str, dest: Path, timeout_s: float = 30.0) -> str:
        key, name = remote.split("/", 1)
        self.calls.append(key)
        data = self.served[key][name]
        dest.write_bytes(data)
        return hashlib.sha256(data).hexdigest()


def _version(files: dict[str, bytes], version: int, **changes) -> Assignment:
    return Assignment(master_code_dir="/x", code_sha256=_sha(files), code_version=version,
                      **changes)


def test_a_slot_switches_versions_and_back(tmp_path, zk_server, zk_root,
                                           cluster_state, stub_worker,  # noqa: F811
                                           caplog):
    port = _free_port()
    slots = {"worker-0": ["", port]}
    v1 = _code(_tar({"topology.yaml": b"command: [true]\n"}))
    v2 = _code(_tar({"topology.yaml": b"command: [true]  # version 2\n"}))
    v2["stormconf.json"] = b'{"topology.stub.marker": 2}'
    # Version 3 is a pipeline that crashes before any batch: failures of version 3.
    v3 = _code(_tar({"topology.py": b"def build(spark, conf): ...\n"}))
    v3["stormconf.json"] = b'{"topology.stub.exit_after": 0.6}'
    sup = _supervisor(tmp_path, zk_server, zk_root, stub_worker, v1, port)
    peers = KeyedPeers({TOPOLOGY: v1, V2: v2, V3: v3})
    sup.code._fetch = peers
    assignment = cluster_state.path("assignments", TOPOLOGY)
    worker_json = sup.workers_dir / f"{TOPOLOGY}-{port}" / "worker.json"

    def assign(**fields) -> None:
        cluster_state.zk.set(assignment, Assignment(
            master_code_dir="/x", executor_node_port={"worker-0": [sup.id, port]},
            **fields).encode())

    def said() -> tuple | None:
        got = _said(cluster_state, sup, port)
        return got and (got["version"], got["committed"], got["failures"])

    sup.start()
    try:
        slots = {"worker-0": [sup.id, port]}
        _submit_directly(cluster_state, v1, slots)
        wait_for(lambda: said() == (1, True, 0), 15, "version 1 up")
        with caplog.at_level(logging.INFO, logger="nimbus.supervisor.ending"):
            assign(code_sha256=_sha(v2), code_version=2)
            wait_for(lambda: said() == (2, True, 0), 20, "version 2 up")
        assert f"stopping worker {TOPOLOGY}:{port}: switching from version 1 to " \
               "version 2" in caplog.messages
        spec = WorkerSpec.load(worker_json)
        assert (spec.code_version, spec.code_dir, spec.topology_id, spec.restarts) == \
            (2, str(sup.code.resources(V2)), TOPOLOGY, 0)   # a switch is no restart
        assert spec.conf["topology.stub.marker"] == 2          # version 2's own conf
        assert spec.topology_checkpoint_dir.name == TOPOLOGY   # the same checkpoints
        wait_for(lambda: (b := _beat(cluster_state, sup, port)) and b.code_version == 2,
                 10, "a beat of version 2")
        # Version 1's code is wanted by no slot: it goes (grace 0 here).
        wait_for(lambda: not sup.code.has(TOPOLOGY) and sup.code.has(V2), 10,
                 "version 1's code to go")

        # Version 3 crashes before its first commit: its failures are counted.
        assign(code_sha256=_sha(v3), code_version=3)
        wait_for(lambda: (s := said()) and s[0] == 3 and s[2] >= 2, 30,
                 "version 3 failing")
        got = _said(cluster_state, sup, port)
        assert got["committed"] is False and got["last_error"] == "boom"
        # Rolled back (to 1, in a rolling record: worker-0 runs version 1 by name):
        # counted afresh, and version 1's code fetched again.
        fetched = peers.calls.count(TOPOLOGY)
        assign(code_sha256=_sha(v3), code_version=3, worker_versions={"worker-0": 1},
               version_sha256={"1": _sha(v1)})
        wait_for(lambda: said() == (1, True, 0), 20, "version 1 back")
        assert peers.calls.count(TOPOLOGY) > fetched
        assert json.loads(worker_json.read_text())["code_version"] == 1
    finally:
        sup.stop()
