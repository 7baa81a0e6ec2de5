"""conf/prometheus-alerts.yaml in a real Prometheus (Debian's) scraping a real cluster:
two nimbuses and two supervisors, each serving /metrics. The test causes each condition,
waits for its alert to fire, undoes the cause and waits for it to resolve.

The rules are the shipped file with every time in it divided by 60 (`for: 5m` becomes
5 s, a `[10m]` window 10 s, the duty cycle's 30 s threshold 4 s...), so that an
afternoon's alert fires in seconds; the expressions are otherwise the file's own.

Caused for real: a worker in a crash loop, a leader duty stuck in a plugin call, a
follower whose code sync keeps failing, a killed follower (replication below the
minimum), a killed supervisor, and every nimbus killed (no leader). One condition cannot
be caused, by design: two nimbuses claiming to lead. An exporter that claims to be a
second leader stands in for it, in the nimbuses' job. The stalled pipeline needs Spark;
its rule is covered by promtool's unit tests (tests/test_alert_rules.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
import requests
import yaml
from helpers import process_bundle
from prometheus_client import CollectorRegistry, Gauge, make_wsgi_app
from waiting import wait_for

from nimbus.dev.cluster import LocalCluster
from nimbus.dev.zookeeper import free_port
from nimbus.distribution.archive import pack_directory

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "conf" / "prometheus-alerts.yaml"
PLUGINS = Path(__file__).resolve().parent / "plugins_for_tests"
SCALE = 60
# Each alert's wait: its scaled `for:` and windows are seconds; a failover or a
# supervisor's start under load takes longer.
FIRE_S = 90


def scaled_rules(text: str) -> str:
    """The rules with every duration divided by SCALE (at least 1 s)."""
    def seconds(match: re.Match[str]) -> str:
        value = int(match.group(2)) * {"s": 1, "m": 60, "h": 3600}[match.group(3)]
        return f"{match.group(1)}{max(1, value // SCALE)}s"

    text = re.sub(r"(\[|for: )(\d+)([smh])", seconds, text)
    # The two thresholds in seconds (the duty cycle's age and the batch age).
    text = text.replace("nimbus_leader_duty_cycle_age_seconds > 30",
                        "nimbus_leader_duty_cycle_age_seconds > 4")
    return text.replace("supervisor_component_batch_age_seconds > 120",
                        "supervisor_component_batch_age_seconds > 4")


class Prometheus:
    """A real Prometheus on 127.0.0.1, scraping and evaluating every second."""

    def __init__(self, work: Path, nimbus_ports: list[int], supervisor_ports: list[int]):
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus is missing: scripts/setup.sh installs Debian's package")
        work.mkdir(parents=True)
        (work / "rules.yaml").write_text(scaled_rules(RULES.read_text()))
        (work / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                       "scrape_timeout": "1s"},
            "rule_files": [str(work / "rules.yaml")],
            "scrape_configs": [
                {"job_name": "nimbus", "static_configs": [
                    {"targets": [f"127.0.0.1:{p}" for p in nimbus_ports]}]},
                {"job_name": "supervisor", "static_configs": [
                    {"targets": [f"127.0.0.1:{p}" for p in supervisor_ports]}]}]}))
        self.port = free_port()
        self.log = open(work / "prometheus.log", "wb")
        self.process = subprocess.Popen(
            [binary, f"--config.file={work / 'prometheus.yml'}",
             f"--storage.tsdb.path={work / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def get(self, path: str) -> dict:
        response = requests.get(f"http://127.0.0.1:{self.port}{path}", timeout=10)
        response.raise_for_status()
        return response.json()["data"]

    def ready(self) -> bool:
        try:
            return requests.get(f"http://127.0.0.1:{self.port}/-/ready", timeout=5).ok
        except requests.ConnectionError:
            return False

    def targets_up(self) -> int:
        return sum(1 for t in self.get("/api/v1/targets")["activeTargets"]
                   if t["health"] == "up")

    def alerts(self, state: str = "firing") -> list[dict[str, str]]:
        return [a["labels"] for a in self.get("/api/v1/alerts")["alerts"]
                if a["state"] == state]

    def firing(self, name: str) -> list[dict[str, str]]:
        return [labels for labels in self.alerts() if labels["alertname"] == name]

    def wait_firing(self, name: str, **labels: str) -> dict[str, str]:
        def found() -> dict[str, str] | None:
            return next((a for a in self.firing(name)
                         if all(a.get(k) == v for k, v in labels.items())), None)

        return wait_for(found, FIRE_S, f"{name} {labels} to fire")

    def wait_resolved(self, name: str) -> None:
        wait_for(lambda: not any(a["alertname"] == name
                                 for a in self.alerts("firing") + self.alerts("pending")),
                 FIRE_S, f"{name} to resolve")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


class ImpostorLeader:
    """An exporter in the nimbuses' job that reports ``nimbus_is_leader 1``."""

    def __init__(self, port: int):
        registry = CollectorRegistry()
        Gauge("nimbus_is_leader", "claims to lead", registry=registry).set(1)
        self.server: WSGIServer = make_server("127.0.0.1", port, make_wsgi_app(registry),
                                              handler_class=_Quiet)
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       name="impostor-leader", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


def crasher_bundle(tmp: Path) -> bytes:
    directory = tmp / "crasher"
    directory.mkdir()
    (directory / "topology.yaml").write_text(yaml.safe_dump(
        {"command": [sys.executable, "-c", "raise SystemExit(3)"]}))
    return pack_directory(directory)


@pytest.fixture
def env(tmp_path, monkeypatch) -> Iterator[dict]:
    release = tmp_path / "release"
    release.mkdir()
    monkeypatch.setenv("PYTHONPATH", str(PLUGINS))  # the daemons import the plugin
    monkeypatch.setenv("HANGING_RELEASE_DIR", str(release))
    cluster = LocalCluster(tmp_path / "cluster", 2, supervisors=2, slots_per_supervisor=2,
                           metrics=True, conf={
                               "storm.codedistributor.class":
                                   "hanging_distributor:HangingDistributor",
                               "nimbus.leader.watchdog.secs": 0,  # the alert, not an exit
                               "nimbus.code.sync.freq.secs": 3,
                               "supervisor.monitor.frequency.secs": 1,
                               "topology.min.replication.count": 2,
                               "topology.max.replication.wait.time.sec": 30})
    impostor_port = free_port()
    prometheus = None
    try:
        cluster.start()  # the supervisors too, each registered
        prometheus = Prometheus(
            tmp_path / "prometheus",
            [n.metrics_port for n in cluster.nimbuses] + [impostor_port],
            [s.metrics_port for s in cluster.supervisors])
        wait_for(prometheus.ready, 60, "Prometheus to start")
        yield {"cluster": cluster, "prometheus": prometheus, "release": release,
               "impostor_port": impostor_port, "tmp": tmp_path}
    except BaseException:
        for daemon in [*cluster.nimbuses, *cluster.supervisors]:
            print(f"--- {daemon.log_file.name} ---\n{daemon.log_text()[-3000:]}")
        raise
    finally:
        if prometheus is not None:
            prometheus.stop()
        cluster.stop()


def test_each_alert_fires_in_a_real_prometheus_then_resolves(env):
    cluster: LocalCluster = env["cluster"]
    prom: Prometheus = env["prometheus"]
    client = cluster.client()
    # A topology held by both nimbuses (its minimum is 2) and running on a supervisor.
    sleeper = client.submit("sleeper", process_bundle(env["tmp"] / "sleeper"), {})
    # Every daemon scraped (the impostor's target is down until its phase), and the rules
    # evaluated since: a healthy cluster fires nothing.
    wait_for(lambda: prom.targets_up() == 4, 60, "every daemon to be scraped")
    wait_for(lambda: all(r.get("lastEvaluation", "0001").startswith("20")
                         for g in prom.get("/api/v1/rules")["groups"] for r in g["rules"]),
             30, "the rules to be evaluated")
    wait_for(lambda: prom.firing("NimbusHaNoLeader") == [], 30, "a leader to be seen")
    assert prom.alerts() == []

    # A worker in a crash loop; killing its topology resolves it.
    crasher = client.submit("crasher", crasher_bundle(env["tmp"]),
                            {"topology.min.replication.count": 1})
    prom.wait_firing("NimbusHaWorkerCrashLoop", topology_id=crasher, job="supervisor")
    client.kill("crasher", 0)
    prom.wait_resolved("NimbusHaWorkerCrashLoop")

    # A leader duty stuck in a plugin call (the removal of a killed topology's code).
    leader = cluster.wait_for_leader()
    client.submit("hang-1", process_bundle(env["tmp"] / "hang"),
                  {"topology.min.replication.count": 1})
    # Removed by the duty cycle, a second later: a kill with wait 0 would run the removal
    # (and the stuck call) inside the Thrift request, and the client would time out.
    client.kill("hang-1", 1)
    prom.wait_firing("NimbusHaDutyCycleLate", instance=f"127.0.0.1:{leader.metrics_port}")
    (env["release"] / "release-hang").touch()
    prom.wait_resolved("NimbusHaDutyCycleLate")

    # A follower whose code sync keeps failing.
    follower = next(n for n in cluster.nimbuses if n is not leader)
    client.submit("nosync-1", process_bundle(env["tmp"] / "nosync"),
                  {"topology.min.replication.count": 1})
    prom.wait_firing("NimbusHaCodeSyncFailing",
                     instance=f"127.0.0.1:{follower.metrics_port}")
    (env["release"] / "release-nosync").touch()
    prom.wait_resolved("NimbusHaCodeSyncFailing")

    # The follower and a supervisor killed: the sleeper's code on 1 host of 2, and one
    # supervisor fewer. Both come back, and both alerts resolve.
    lost = cluster.supervisors[1]
    follower.kill9()
    lost.kill9()
    prom.wait_firing("NimbusHaReplicationBelowMinimum", topology_id=sleeper,
                     topology="sleeper")
    prom.wait_firing("NimbusHaSupervisorLost", job="nimbus")
    follower.start()
    cluster.start_supervisor(lost)
    prom.wait_resolved("NimbusHaReplicationBelowMinimum")
    prom.wait_resolved("NimbusHaSupervisorLost")

    # Two leaders: an exporter that claims to lead joins the nimbuses' job.
    impostor = ImpostorLeader(env["impostor_port"])
    try:
        prom.wait_firing("NimbusHaTwoLeaders", job="nimbus")
    finally:
        impostor.stop()
    prom.wait_resolved("NimbusHaTwoLeaders")

    # Every nimbus killed: no leader, and no nimbus left to say so.
    for nimbus in cluster.nimbuses:
        nimbus.kill9()
    prom.wait_firing("NimbusHaNoLeader", job="nimbus")
    for nimbus in cluster.nimbuses:
        nimbus.start()
    cluster.wait_for_leader()
    prom.wait_resolved("NimbusHaNoLeader")
