"""Scenarios about leadership: a leader cut from ZooKeeper (quiet, polled, or asked to
act), a flapping leader under a client workload, and a nimbus cut from its peer during
a submit's replication wait. Each takes a seed and returns a :class:`checker.Report`;
the same seed gives the same faults at the same offsets.
"""

from __future__ import annotations

import random
import time
from typing import Any

from checker import Report
from labcluster import PartitionLab
from labprocess import LabNimbus, wait_until
from leadership import log_events
from nemesis import Flapper
from steps import (
    Options,
    converge,
    cut_leader_figures,
    finish,
    new_report,
    process_bundle,
    say,
    submit,
)

# How long a cut leader is watched for its step-down and a successor, in sessions.
OBSERVE_SESSIONS = 5.0
# Bounds, as ratios to the negotiated session timeout (see README.md).
STEP_DOWN_MAX = 0.9     # a cut leader stops leading before its session can expire...
NEW_LEADER_MAX = 1.2    # ...and another leads soon after it has
NOT_LEADER_MAX = 1.0    # a leader-only call to a cut nimbus is refused within a session


def _other(lab: PartitionLab, nimbus: LabNimbus) -> LabNimbus:
    return next(n for n in lab.nimbuses if n is not nimbus)


def _gained_since(nimbus: LabNimbus, since: float) -> bool:
    return any(k == "gained" and t >= since for t, k in log_events(nimbus.log_text()))


def _lost_since(nimbus: LabNimbus, since: float) -> bool:
    return any(k == "lost" and t >= since for t, k in log_events(nimbus.log_text()))


def _poller(target: str, calls: list[str], interval: tuple[float, float],
            topology_id: str, timeout_s: float, open_loop: bool = False) -> dict[str, Any]:
    return {"target": target, "calls": calls, "interval_s": list(interval),
            "topology_id": topology_id, "timeout_s": timeout_s, "open_loop": open_loop}


def leader_cut(name: str, seed: int, opts: Options, polls: bool = False,
               activate: bool = False) -> Report:
    """The leader is cut from ZooKeeper (symmetric) and healed once a successor leads.

    ``polls``: a client polls the cut leader with getTopologyInfo and getLeader, each
    once a second (and the other nimbus too). ``activate``: a client sends ``activate``
    straight to the cut leader from the moment of the cut, one call after another.
    """
    rng = random.Random(seed)
    lab = PartitionLab(opts.work / name, session_ms=opts.session_ms,
                       pythonpath=opts.pythonpath, slots=(1, 1))
    with lab:
        report = new_report(lab, name, seed)
        session = lab.session_s
        topology_id = submit(lab, "proc", process_bundle(lab.work / "proc"))
        leader = lab.wait_leader(30)
        other = _other(lab, leader)
        workload = None
        if polls or activate:
            spec: dict[str, Any] = {"seed": seed, "pollers": [], "operators": []}
            if polls:
                # Once a second each, whatever the cut leader does (open loop): a
                # getTopologyInfo that hangs must hold up neither the next one nor the
                # getLeader polls.
                spec["pollers"] = [
                    _poller(leader.address, ["getTopologyInfo"], (1.0, 1.0), topology_id,
                            4 * session, open_loop=True),
                    _poller(leader.address, ["getLeader"], (1.0, 1.0), topology_id,
                            4 * session, open_loop=True),
                    _poller(other.address, ["getLeader", "getClusterInfo"], (0.25, 1.0),
                            topology_id, 4 * session)]
            else:
                spec["pollers"] = [_poller(n.address, ["getLeader"], (0.25, 1.0),
                                           topology_id, 4 * session) for n in lab.nimbuses]
            if activate:
                spec["operators"] = [{"name": "activate", "target": leader.address,
                                      "ops": [["activate", "proc"]], "interval_s": [0.5, 0.5],
                                      "timeout_s": 60.0, "after_go": True}]
            workload = lab.workload("client", spec).start()
        # A seeded pause, part of the fault schedule (not a wait for anything): the cut's
        # phase against the daemons' pings and the client's polls.
        time.sleep(rng.uniform(1.0, 3.0))
        say(opts, f"{name}: cutting leader {leader.name} from ZooKeeper")
        cut = lab.nemesis.partition([leader.node], [lab.zk_node],
                                    f"{leader.name} <-/-> zk")
        cut_at = cut.event.began
        if workload is not None and activate:
            workload.go()
        try:
            wait_until(lambda: _lost_since(leader, cut_at) and _gained_since(other, cut_at),
                       OBSERVE_SESSIONS * session, "the cut leader to step down and the "
                       "other nimbus to lead", interval_s=0.05)
        except TimeoutError as exc:
            report.notes.append(str(exc))
        if workload is not None:
            _let_the_client_see(workload, leader, other, activate, cut_at, session, report)
        lab.nemesis.heal(cut)
        say(opts, f"{name}: healed")
        converge(lab, report, 5 * session)
        history = None
        if workload is not None:
            workload.stop()
            history = workload.history()
        cut_leader_figures(report, lab, leader, cut_at, history)
        report.bound("step_down_ratio", STEP_DOWN_MAX, "a cut leader steps down")
        report.bound("new_leader_ratio", NEW_LEADER_MAX, "measured from the cut")
        if polls:
            report.bound("last_claim_ratio", STEP_DOWN_MAX,
                         "a cut leader stops answering 'I am the leader'")
        if activate:
            _refusal_figures(report, history or [], leader, cut_at)
            report.bound("not_leader_ratio", NOT_LEADER_MAX,
                         "a leader-only call to a cut nimbus is refused")
        finish(lab, report, history)
    return report


def _let_the_client_see(workload: Any, leader: LabNimbus, other: LabNimbus, activate: bool,
                        cut_at: float, session: float, report: Report) -> None:
    """Keep the client going until what it must see is in its history: an answer of the
    cut leader to a poll sent after the other nimbus led, or (activate) a refusal."""
    def seen() -> bool:
        history = workload.history()
        if activate:
            return any(r["kind"] == "op" and r["outcome"] == "not_leader"
                       and r["sent"] >= cut_at for r in history)
        gained = [t for t, k in log_events(other.log_text()) if k == "gained" and t >= cut_at]
        return bool(gained) and any(
            r["target"] == leader.address and r["sent"] > min(gained)
            and r.get("received") for r in history)

    try:
        wait_until(seen, 2 * session, "the client to see the outcome", interval_s=0.2)
    except TimeoutError as exc:
        report.notes.append(str(exc))


def _refusal_figures(report: Report, history: list[dict[str, Any]], leader: LabNimbus,
                     cut_at: float) -> None:
    ops = [r for r in history if r["kind"] == "op" and r["target"] == leader.address
           and r["sent"] >= cut_at]
    refused = [r for r in ops if r["outcome"] == "not_leader"]
    report.ratio("not_leader", min(r["received"] for r in refused) - cut_at
                 if refused else None)
    waits = [(r["received"] or r.get("pending_at", r["sent"])) - r["sent"] for r in ops]
    report.ratio("slowest_leader_call", max(waits) if waits else None)
    report.figures["leader_calls_after_cut"] = len(ops)
    report.figures["leader_calls_accepted_after_cut"] = sum(r["outcome"] == "ok" for r in ops)


def leader_flapping(name: str, seed: int, opts: Options) -> Report:
    """The leader of the moment is cut from ZooKeeper and healed at seeded intervals
    (symmetric and one-way cuts) for ``opts.flap_s`` seconds, while a client polls both
    nimbuses and submits, activates and deactivates through whoever leads."""
    rng = random.Random(seed)
    lab = PartitionLab(opts.work / name, session_ms=opts.session_ms,
                       pythonpath=opts.pythonpath, slots=(2, 2))
    with lab:
        report = new_report(lab, name, seed)
        session = lab.session_s
        bundle = process_bundle(lab.work / "proc")
        topology_id = submit(lab, "flip", bundle)
        lab.wait_leader(30)
        workload = lab.workload("client", {
            "seed": seed,
            "pollers": [_poller(n.address, ["getLeader", "getClusterInfo", "getTopologyInfo"],
                                (0.25, 1.0), topology_id, 4 * session, open_loop=True)
                        for n in lab.nimbuses],
            "operators": [{"name": "ops", "target": "leader", "interval_s": [0.5, 2.0],
                           "timeout_s": 3 * session, "bundle_dir": str(bundle),
                           "ops": [["activate", "flip"], ["deactivate", "flip"],
                                   ["submit", "flap"]]}]}).start()

        def target() -> Any:
            leader = lab.leader()
            return leader.node if leader is not None else rng.choice(lab.nimbuses).node

        say(opts, f"{name}: flapping for {opts.flap_s:.0f}s")
        flapper = Flapper(lab.nemesis, rng, target, [lab.zk_node], opts.flap_s,
                          cut_s=(0.3 * session, 1.5 * session),
                          heal_s=(0.5 * session, 1.5 * session),
                          modes=("symmetric", "symmetric", "in", "out")).start()
        flapper.wait(opts.flap_s + 3 * session)
        flapper.stop()
        say(opts, f"{name}: {len(flapper.cycles)} cuts made; healed")
        converge(lab, report, 5 * session)
        workload.stop()
        history = workload.history()
        report.figures["cuts"] = len(flapper.cycles)
        report.details["cuts"] = [
            {"target": c.target, "mode": c.mode, "began": round(c.cut.event.began, 3),
             "held_s": round(c.cut.healed.began - c.cut.event.began, 2)
             if c.cut and c.cut.healed else None} for c in flapper.cycles]
        _flap_step_downs(report, lab, flapper, session)
        finish(lab, report, history)
        report.figures["leaderships"] = len(report.details.get("leaderships", []))
    return report


def _flap_step_downs(report: Report, lab: PartitionLab, flapper: Flapper,
                     session: float) -> None:
    """The slowest step-down of a leader whose symmetric cut outlasted the bound."""
    slowest = None
    for cycle in flapper.cycles:
        cut = cycle.cut
        if cut is None or cut.healed is None or cycle.mode != "symmetric":
            continue
        held = cut.healed.began - cut.event.began
        nimbus = next(n for n in lab.nimbuses if n.node.name == cycle.target)
        events = log_events(nimbus.log_text())
        leading = [k for t, k in events if t < cut.event.began]
        if held < STEP_DOWN_MAX * session or not leading or leading[-1] != "gained":
            continue
        lost = next((t for t, k in events if k == "lost" and t >= cut.event.began), None)
        took = (lost - cut.event.began) if lost is not None else float("inf")
        slowest = took if slowest is None else max(slowest, took)
    if slowest is not None:
        report.ratio("slowest_step_down", None if slowest == float("inf") else slowest)


def peer_cut_during_replication(name: str, seed: int, opts: Options) -> Report:
    """The follower is cut from the leader (not from ZooKeeper) and a topology with
    ``topology.min.replication.count: 2`` is submitted: the leader waits for a replica
    that cannot come; the cut heals at a seeded moment of that wait."""
    rng = random.Random(seed)
    wait_s = 10
    lab = PartitionLab(opts.work / name, session_ms=opts.session_ms,
                       pythonpath=opts.pythonpath, slots=(1, 1))
    with lab:
        report = new_report(lab, name, seed)
        session = lab.session_s
        bundle = process_bundle(lab.work / "proc")
        leader = lab.wait_leader(30)
        follower = _other(lab, leader)
        workload = lab.workload("client", {
            "seed": seed,
            "pollers": [_poller(n.address, ["getLeader", "getClusterInfo"], (0.25, 1.0),
                                "", 4 * session) for n in lab.nimbuses],
            "operators": [{"name": "submit", "target": "leader", "after_go": True,
                           "once": True, "interval_s": [1, 1], "bundle_dir": str(bundle),
                           "timeout_s": wait_s + 3 * session + 30,
                           "submit_conf": {"topology.min.replication.count": 2,
                                           "topology.max.replication.wait.time.sec": wait_s},
                           "ops": [["submit", "replicated"]]}]}).start()
        time.sleep(rng.uniform(0.5, 1.5))  # the cut's phase
        began = time.time()
        say(opts, f"{name}: cutting {follower.name} from {leader.name}")
        cut = lab.nemesis.partition([follower.node], [leader.node],
                                    f"{follower.name} <-/-> {leader.name}")
        submitted_at = workload.go()
        time.sleep(rng.uniform(0.3, 0.8) * wait_s)  # heal during the replication wait
        lab.nemesis.heal(cut)
        healed_at = time.time()
        say(opts, f"{name}: healed")

        def answered() -> dict[str, Any] | None:
            return next((r for r in workload.history() if r["kind"] == "op"), None)

        try:
            answer = wait_until(answered, wait_s + 3 * session + 40, "the submit's answer",
                                interval_s=0.2)
        except TimeoutError as exc:
            answer = None
            report.failures.append(str(exc))
        if answer is not None:
            report.require(answer["outcome"] == "ok", f"the submit failed: {answer}")
            report.figures["submit_answer_s"] = round(answer["received"] - submitted_at, 2)
            report.ratio("submit_answer", answer["received"] - submitted_at)
            report.bound("submit_answer_ratio", (wait_s + session) / session,
                         "the replication wait is bounded")
        try:
            wait_until(lambda: _replicas(lab, "replicated-1") >= 2, 60,
                       "the follower to hold the code after the heal", interval_s=1.0)
            report.figures["replicated_after_heal_s"] = round(time.time() - healed_at, 2)
        except TimeoutError as exc:
            report.failures.append(str(exc))
        workload.stop()
        history = workload.history()
        report.require(not _lost_since(leader, began),
                       "the leader lost its leadership to a cut between nimbuses")
        report.require(not _gained_since(follower, began),
                       "the cut follower led (it lacked a live topology's code)")
        finish(lab, report, history)
    return report


def _replicas(lab: PartitionLab, name: str) -> int:
    topologies = lab.probe("topologies")["topologies"]
    return next((t["replication_count"] for t in topologies if t["name"] == name), 0)
