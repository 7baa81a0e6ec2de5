"""Steps the scenarios share: options, bundles, submits, waits, feeding, the final checks."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from checker import Report
from labcluster import PartitionLab
from labprocess import LabNimbus, wait_until
from leadership import claims, log_events

from nimbus.dev.feed import RecordFeed

SPARK_CONF = {"spark.ui.enabled": "false", "spark.driver.memory": "512m",
              "spark.sql.shuffle.partitions": "2",
              # The worker's namespace has no name for this host: keep Spark on loopback.
              "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
# A Spark start plus a batch on a busy 2-core machine, with room to spare.
COMMIT_TIMEOUT_S = 240.0


@dataclass
class Options:
    """How to run a scenario: where, against which checkout, how long a flapping run
    lasts, and where progress lines go."""

    work: Path
    pythonpath: str | None = None
    session_ms: int = 6000
    flap_s: float = 60.0
    log: Callable[[str], None] = field(default=print)


def say(opts: Options, what: str) -> None:
    opts.log(f"{time.strftime('%H:%M:%S')} {what}")


def new_report(lab: PartitionLab, name: str, seed: int) -> Report:
    """A report on a started lab: its negotiated session timeout, and the nimbus-ha
    checkout its processes import (the proof of what ran)."""
    report = Report(name, seed, lab.session_s)
    report.details["nimbus_imported_from"] = lab.nimbus_checkout()
    return report


def process_bundle(directory: Path) -> Path:
    """A process topology that only sleeps (cheap to run, docs/runtime.md)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "topology.yaml").write_text(yaml.safe_dump(
        {"command": ["sleep", "3600"]}))
    return directory


def submit(lab: PartitionLab, name: str, bundle: Path, conf: dict[str, Any] | None = None,
           inactive: bool = False) -> str:
    """Submit through the client node; the new topology's id."""
    args = ["submit", name, str(bundle), "--conf-json", json.dumps(conf or {})]
    return lab.probe(*args, *(["--inactive"] if inactive else []))["id"]


def wait_worker(lab: PartitionLab, topology_id: str, timeout_s: float,
                on: str | None = None) -> tuple[int, str]:
    """(pid, supervisor name) once exactly one worker of the topology runs (on supervisor
    ``on``, if given)."""
    def one() -> tuple[int, str] | None:
        found = lab.topology_workers(topology_id)
        if len(found) != 1:
            return None
        pid, owner = next(iter(found.items()))
        return (pid, owner) if on is None or owner == on else None

    return wait_until(one, timeout_s, f"one worker of {topology_id}"
                      + (f" on {on}" if on else ""), interval_s=0.1)


def agreed_leader(lab: PartitionLab) -> str | None:
    """The leader both nimbuses name, and only it flagged, or None."""
    answers = lab.probe("leaders")["answers"]
    named = set()
    for answer in answers.values():
        if "error" in answer:
            return None
        named.add(answer["leader"])
        if answer["flagged"] != [answer["leader"]]:
            return None
    return named.pop() if len(named) == 1 else None


def converge(lab: PartitionLab, report: Report, timeout_s: float) -> None:
    """Liveness after a heal: both nimbuses name one leader within ``timeout_s``."""
    started = time.time()
    try:
        wait_until(lambda: agreed_leader(lab), timeout_s, "both nimbuses to name one leader",
                   interval_s=0.5)
        report.figures["converged_after_heal_s"] = round(time.time() - started, 2)
    except TimeoutError as exc:
        report.failures.append(f"no agreed leader after the heal: {exc}")


def finish(lab: PartitionLab, report: Report, history: list[dict[str, Any]] | None) -> None:
    """The checks every scenario makes at its end, with the lab still up: the audit
    trail (read in the client node), leadership by the logs, claims by the clients."""
    report.audit_trail(lab.probe("trail")["writes"])
    now = time.time()
    report.leadership({n.address: log_events(n.log_text()) for n in lab.nimbuses},
                      dict.fromkeys((n.address for n in lab.nimbuses), now))
    if history is not None:
        report.client_claims(history)
        report.history_counts(history)


def cut_leader_figures(report: Report, lab: PartitionLab, leader: LabNimbus, cut_at: float,
                       history: list[dict[str, Any]] | None) -> dict[str, float | None]:
    """Step-down and failover times of ``leader``, cut at ``cut_at`` (wall clock), as
    ratios: its "lost leadership" line, its last "I am the leader" answer, the first
    "gained leadership" of another nimbus, and the expiry of its session by ZooKeeper."""
    events = log_events(leader.log_text())
    lost = next((t for t, k in events if k == "lost" and t >= cut_at), None)
    others = [(t, n) for n in lab.nimbuses if n is not leader
              for t, k in log_events(n.log_text()) if k == "gained" and t >= cut_at]
    gained = min(others)[0] if others else None
    report.ratio("step_down", None if lost is None else lost - cut_at)
    report.ratio("new_leader", None if gained is None else gained - cut_at)
    expired = lab.session_expiries().get(leader.node.address, [])
    expiry = next((t for t in sorted(expired) if t >= cut_at), None)
    report.ratio("session_expired", None if expiry is None else expiry - cut_at)
    result: dict[str, float | None] = {"lost": lost, "gained": gained}
    if history is not None:
        mine = [c for c in claims(history) if c.who == leader.address and c.end >= cut_at]
        asked = [r for r in history if r["target"] == leader.address and r["kind"] == "poll"
                 and r.get("received") and r["received"] >= cut_at]
        last = max((c.end for c in mine), default=None)
        # Asked after the cut and never claiming again: it stopped claiming at the cut.
        report.ratio("last_claim", (last - cut_at) if last is not None
                     else 0.0 if asked else None)
        result["last_claim"] = last
    if lost is not None and gained is not None:
        report.require(lost < gained, "the cut leader stepped down only after another "
                       "nimbus led")
    if history is not None and result.get("last_claim") and gained is not None:
        report.require(result["last_claim"] < gained, "the cut leader still answered "
                       "'I am the leader' after another nimbus led")
    return result


class RecordFeeder:
    """Feeds ``count`` numbered records every ``every_s`` on a named thread
    (``record-feeder``) until :meth:`stop`."""

    def __init__(self, feed: RecordFeed, count: int = 10, every_s: float = 1.0):
        self.feed = feed
        self.count = count
        self.every_s = every_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="record-feeder", daemon=True)

    def start(self) -> RecordFeeder:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            with self._lock:
                self.feed.feed(self.count)

    def feed_now(self, count: int) -> list[int]:
        """Feed ``count`` records at once (besides the regular feeding)."""
        with self._lock:
            return self.feed.feed(count)

    def fed(self) -> list[int]:
        with self._lock:
            return list(self.feed.fed)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join(10)
