"""A leader cut from ZooKeeper by a *silent* partition (issue 18, bugs 1 and 3), on
loopback: every nimbus reaches ZooKeeper through a proxy of its own, and the leader's
proxy starts discarding every byte, both ways, with the sockets left open, as a
firewall's DROP rule does. A client keeps polling the cut leader (getTopologyInfo and
getLeader), which used to keep its dead session looking alive for ~42 s.

What must hold, judged from the nimbuses' logs and from what the client saw:

* the cut leader steps down (its lease runs out) before the other nimbus takes over;
* after its step-down, it never again answers that it leads;
* a leader-only call sent to it is refused with "not a leader" instead of hanging;
* once the partition heals, it follows the new leader and the cluster agrees.

The network-namespace lab (integration/partition/, tests a-c) proves the same with
iptables DROP rules between real namespaces, a stricter setting, and with bounds on each
delay. Where the lab can run (root, ``ip netns``, iptables) this test is skipped, to
keep the suite's time; it runs where the lab cannot.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from helpers import leadership_events
from tcp_proxy import DelayProxy
from thriftpy2.thrift import TApplicationException
from waiting import wait_for

from nimbus.dev.cluster import LocalCluster
from nimbus.distribution.archive import pack_directory
from nimbus.thrift import NOT_LEADER_PREFIX
from nimbus.thrift.client import connect

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SESSION_MS = 4000
PROCESS_YAML = 'command: ["sleep", "3600"]\n'


class Poller:
    """Asks one nimbus, from threads of its own, what a client would: getTopologyInfo
    (a read on ZooKeeper) on one thread, getLeader on another, recording each answer to
    the latter as (sent, received, whether it said that nimbus leads)."""

    def __init__(self, address: str, topology_id: str):
        self.address = address
        self.topology_id = topology_id
        self.answers: list[tuple[float, float, bool]] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._loop, args=(self._read,), name="test-reader",
                             daemon=True),
            threading.Thread(target=self._loop, args=(self._ask_leader,),
                             name="test-leader-poller", daemon=True)]

    def __enter__(self) -> Poller:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _loop(self, ask) -> None:  # type: ignore[no-untyped-def]
        while not self._stop.is_set():
            try:
                with connect(self.address, timeout_s=10) as client:
                    while not self._stop.wait(0.25):
                        ask(client)
            except Exception:
                self._stop.wait(0.25)  # a read that timed out: connect again

    def _read(self, client) -> None:  # type: ignore[no-untyped-def]
        client.getTopologyInfo(self.topology_id)

    def _ask_leader(self, client) -> None:  # type: ignore[no-untyped-def]
        sent = time.time()
        try:
            leader = client.getLeader()
            leads = f"{leader.host}:{leader.port}" == self.address
        except TApplicationException:
            leads = False  # "no leader known"
        self.answers.append((sent, time.time(), leads))


def _why_no_lab() -> str | None:
    """Why the partition lab cannot run on this machine (None: it can)."""
    spec = importlib.util.spec_from_file_location(
        "netlab", Path(__file__).parent / "partition" / "netlab.py")
    assert spec is not None and spec.loader is not None
    netlab = sys.modules.get("netlab")  # the lab's tests may have imported it already
    if netlab is None:
        netlab = importlib.util.module_from_spec(spec)
        sys.modules["netlab"] = netlab  # its dataclasses look themselves up there
        spec.loader.exec_module(netlab)
    return netlab.preflight()


def test_a_silently_cut_leader_steps_down_before_another_leads(tmp_path):
    if _why_no_lab() is None:
        pytest.skip("proved by the partition lab's tests a-c, which run on this machine")
    cluster = LocalCluster(tmp_path / "cluster", nimbuses=2, conf={
        "storm.zookeeper.session.timeout": SESSION_MS, "nimbus.monitor.freq.secs": 1})
    proxies = [DelayProxy(cluster.zk.port).start() for _ in cluster.nimbuses]
    try:
        for nimbus, proxy in zip(cluster.nimbuses, proxies, strict=True):
            conf = yaml.safe_load(nimbus.config_file.read_text())
            conf["storm.zookeeper.port"] = proxy.port
            nimbus.config_file.write_text(yaml.safe_dump(conf))
        cluster.start()
        _run(cluster, proxies, tmp_path)
    finally:
        cluster.stop()
        for proxy in proxies:
            proxy.stop()


def _run(cluster: LocalCluster, proxies: list[DelayProxy], tmp_path) -> None:
    bundle = tmp_path / "topology"
    bundle.mkdir()
    (bundle / "topology.yaml").write_text(PROCESS_YAML)

    topology_id = cluster.client().submit("quiet", pack_directory(bundle),
                                          {"topology.min.replication.count": 2})
    leader = cluster.wait_for_leader()
    other = next(n for n in cluster.nimbuses if n is not leader)
    with Poller(leader.address, topology_id) as poller:
        wait_for(lambda: len(poller.answers) >= 4, 30, "the poller's first answers")
        cut_at = time.time()
        proxies[leader.index].drop()
        wait_for(lambda: any(gained for _, gained in leadership_events(other.log_text())),
                 60, "the other nimbus to lead")
        # A leader-only call to the cut nimbus: refused, not left hanging (a timeout of
        # one session timeout would fail it with a transport error, not this refusal).
        with connect(leader.address, timeout_s=SESSION_MS / 1000) as client:
            with pytest.raises(TApplicationException) as refused:
                client.activate("quiet")
        assert refused.value.message.startswith(NOT_LEADER_PREFIX), refused.value.message
        # The poller goes on while the other nimbus leads.
        asked_after = time.time()
        wait_for(lambda: len([a for a in poller.answers if a[0] > asked_after]) >= 8, 60,
                 "answers from the cut leader after the takeover")
    stepped_down = [t for t, gained in leadership_events(leader.log_text())
                    if not gained and t >= cut_at]
    took_over = [t for t, gained in leadership_events(other.log_text()) if gained]
    assert stepped_down and took_over, (leader.log_text()[-3000:], other.log_text()[-3000:])
    # Whichever noticed first, its lease or its connection watchdog, it said why.
    assert ("leader lease ran out" in leader.log_text()
            or "no answer from ZooKeeper for" in leader.log_text())
    # Never two leaders: the cut one had stepped down before the other took the lock.
    assert stepped_down[0] < took_over[0], (stepped_down[0] - cut_at, took_over[0] - cut_at)
    # ... and it never claimed to lead again in any answer asked after its step-down.
    late = [a for a in poller.answers if a[0] >= stepped_down[0] and a[2]]
    assert late == [], f"{len(late)} answers 'I lead' after stepping down"

    proxies[leader.index].heal()
    wait_for(lambda: cluster.leader_address() == other.address, 60,
             "both nimbuses to name the new leader")
