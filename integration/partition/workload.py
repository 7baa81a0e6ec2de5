"""The client workload: polls and leader-only calls, every one recorded as history.

    python workload.py --conf client.yaml --spec spec.json --history out.jsonl

Runs inside the lab's client node until SIGTERM. The spec (JSON) names

* ``pollers``: ``{"target": "host:port", "calls": ["getLeader", "getClusterInfo",
  "getTopologyInfo"], "topology_id": ..., "interval_s": [low, high], "timeout_s": ...,
  "open_loop": bool}``,
  one thread each (``poller-<i>-<target>``) calling one nimbus directly, in turn (a
  call that hangs holds up the next: give each a poller of its own to keep it apart);
* ``operators``: ``{"name": ..., "target": "leader" or "host:port", "ops": [["activate",
  NAME], ["deactivate", NAME], ["submit", NAME_PREFIX]], "interval_s": [low, high],
  "timeout_s": ..., "after_go": bool, "once": bool, "bundle_dir": ..., "submit_conf":
  {...}}``, one thread each (``operator-<name>``). ``"leader"`` goes through
  :class:`~nimbus.thrift.client.NimbusClient` (finds the leader, follows redirects);
  an address is called directly, as a client that knows no better would. With
  ``after_go`` the thread waits until the spec's ``go_file`` exists;
* ``seed``: each thread draws its intervals and operations from its own
  ``random.Random`` seeded from it, so a run can be repeated.

Each call is one JSON line: ``kind`` (poll/op), ``thread``, ``target``, ``call``,
``arg``, ``sent`` and ``received`` (``time.time()``, comparable with the daemons' log
lines), ``latency_s``, ``outcome`` (``ok``, ``not_leader``, ``error``, or ``pending``
for a call still unanswered at the end), ``answer``, ``error``, ``claims_leader`` (the
target named itself the leader) and ``names_leader``.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

from nimbus.config import Config
from nimbus.distribution.distributors import load_cluster_config
from nimbus.thrift.client import NimbusClient, connect, not_leader_redirect

JOIN_TIMEOUT_S = 3.0


class History:
    """JSON lines appended and flushed one by one (a crash keeps what was recorded)."""

    def __init__(self, path: Path):
        self._file = open(path, "a", encoding="utf-8")
        self._lock = threading.Lock()
        self._in_flight: dict[int, dict[str, Any]] = {}

    def begin(self, record: dict[str, Any]) -> dict[str, Any]:
        record["sent"] = time.time()
        record["_m"] = time.monotonic()
        with self._lock:
            self._in_flight[id(record)] = record
        return record

    def end(self, record: dict[str, Any], outcome: str, **fields: Any) -> None:
        received, now = time.time(), time.monotonic()
        with self._lock:
            if self._in_flight.pop(id(record), None) is None:
                return  # close() has written it as pending already
            record.update(fields, outcome=outcome, received=received,
                          latency_s=round(now - record.pop("_m"), 4))
            self._write(record)

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Write the calls still unanswered as ``pending`` (sent, never received)."""
        with self._lock:
            for record in self._in_flight.values():
                record.pop("_m", None)
                self._write({**record, "outcome": "pending", "received": None,
                             "pending_at": time.time()})
            self._in_flight.clear()
            self._file.close()


class Poller(threading.Thread):
    """Calls one nimbus directly, each of ``calls`` in turn, at seeded intervals.

    Closed loop by default (the next call waits for the last answer). With
    ``open_loop`` each call runs on a thread of its own (``<poller>-call-<n>``, at most
    ``max_in_flight`` at once), so a call that hangs does not hold up the next: a
    monitoring client polling once a second, whatever the nimbus does.
    """

    def __init__(self, index: int, spec: dict[str, Any], history: History,
                 rng: random.Random, stop: threading.Event):
        super().__init__(name=f"poller-{index}-{spec['target']}", daemon=True)
        self.spec = spec
        self.history = history
        self.rng = rng
        self.stop_event = stop
        self.calls_made = 0
        self._calls: list[threading.Thread] = []

    def run(self) -> None:
        calls = self.spec["calls"]
        while not self.stop_event.is_set():
            call = calls[self.calls_made % len(calls)]
            self.calls_made += 1
            if not self.spec.get("open_loop"):
                self.poll(call)
            else:
                self._calls = [t for t in self._calls if t.is_alive()]
                if len(self._calls) < int(self.spec.get("max_in_flight", 16)):
                    thread = threading.Thread(target=self.poll, args=(call,), daemon=True,
                                              name=f"{self.name}-call-{self.calls_made}")
                    thread.start()
                    self._calls.append(thread)
            self.stop_event.wait(self.rng.uniform(*self.spec["interval_s"]))

    def join_calls(self, timeout_s: float) -> None:
        """Join the open-loop calls still running (those blocked stay pending)."""
        deadline = time.monotonic() + timeout_s
        for thread in self._calls:
            thread.join(max(0.0, deadline - time.monotonic()))

    def poll(self, call: str) -> None:
        target = self.spec["target"]
        record = self.history.begin({"kind": "poll", "thread": threading.current_thread().name,
                                     "target": target, "call": call, "arg": None})
        try:
            with connect(target, self.spec.get("timeout_s", 15.0)) as client:
                fields = _ask(client, call, target, self.spec.get("topology_id"))
        except Exception as exc:
            self.history.end(record, "error", error=f"{type(exc).__name__}: {exc}"[:300])
            return
        self.history.end(record, "ok", **fields)


def _ask(client: Any, call: str, target: str, topology_id: str | None) -> dict[str, Any]:
    if call == "getLeader":
        leader = client.getLeader()
        named = f"{leader.host}:{leader.port}"
        return {"answer": {"leader": named}, "names_leader": named,
                "claims_leader": named == target}
    if call == "getClusterInfo":
        info = client.getClusterInfo()
        flagged = [f"{n.host}:{n.port}" for n in info.nimbuses if n.isLeader]
        return {"answer": {"flagged": flagged}, "names_leader": flagged,
                "claims_leader": target in flagged}
    if call == "getTopologyInfo":
        info = client.getTopologyInfo(topology_id)
        return {"answer": {"status": info.status}}
    raise ValueError(f"unknown call {call!r}")


class Operator(threading.Thread):
    """Leader-only calls drawn from ``ops`` at seeded intervals."""

    def __init__(self, spec: dict[str, Any], conf: Config, history: History,
                 rng: random.Random, stop: threading.Event, go_file: Path | None):
        super().__init__(name=f"operator-{spec['name']}", daemon=True)
        self.spec = spec
        self.conf = conf
        self.history = history
        self.rng = rng
        self.stop_event = stop
        self.go_file = go_file
        self.submitted = 0

    def run(self) -> None:
        if self.spec.get("after_go") and self.go_file is not None:
            while not self.go_file.exists():
                if self.stop_event.wait(0.02):
                    return
        while not self.stop_event.is_set():
            op, arg = self.rng.choice(self.spec["ops"])
            self.operate(op, arg)
            if self.spec.get("once"):
                return
            self.stop_event.wait(self.rng.uniform(*self.spec["interval_s"]))

    def operate(self, op: str, arg: str) -> None:
        target = self.spec["target"]
        if op == "submit":
            self.submitted += 1
            arg = f"{arg}-{self.submitted}"
        record = self.history.begin({"kind": "op", "thread": self.name, "target": target,
                                     "call": op, "arg": arg})
        timeout_s = float(self.spec.get("timeout_s", 60.0))
        try:
            answer = self._call(op, arg, target, timeout_s)
        except Exception as exc:
            outcome = "not_leader" if not_leader_redirect(exc) is not None else "error"
            self.history.end(record, outcome, error=f"{type(exc).__name__}: {exc}"[:300])
            return
        self.history.end(record, "ok", answer=answer)

    def _call(self, op: str, arg: str, target: str, timeout_s: float) -> Any:
        if target != "leader":
            with connect(target, timeout_s) as client:
                return getattr(client, op)(arg)
        client = NimbusClient(self.conf, deadline_s=timeout_s)
        if op == "submit":
            from nimbus.distribution.archive import pack_directory

            return client.submit(arg, pack_directory(Path(self.spec["bundle_dir"])),
                                 dict(self.spec.get("submit_conf", {})),
                                 active=self.spec.get("submit_active", False))
        return getattr(client, op)(arg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conf", required=True, type=Path)
    parser.add_argument("--spec", required=True, type=Path)
    parser.add_argument("--history", required=True, type=Path)
    args = parser.parse_args()
    conf = load_cluster_config(args.conf)
    spec = json.loads(args.spec.read_text())
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    history = History(args.history)
    seed = int(spec.get("seed", 0))
    go_file = Path(spec["go_file"]) if spec.get("go_file") else None
    threads: list[threading.Thread] = []
    for index, poller in enumerate(spec.get("pollers", [])):
        threads.append(Poller(index, poller, history, random.Random(f"{seed}-poll-{index}"),
                              stop))
    for index, operator in enumerate(spec.get("operators", [])):
        threads.append(Operator(operator, conf, history,
                                random.Random(f"{seed}-op-{index}"), stop, go_file))
    for thread in threads:
        thread.start()
    print(f"workload started: {len(threads)} threads", flush=True)
    while not stop.wait(0.5):
        pass
    for thread in threads:
        # A call blocked on a silent nimbus cannot be interrupted: it is written as
        # pending, and the daemon thread dies with the process.
        thread.join(JOIN_TIMEOUT_S)
        if isinstance(thread, Poller):
            thread.join_calls(JOIN_TIMEOUT_S)
    history.close()
    print("workload stopped", flush=True)


if __name__ == "__main__":
    main()
