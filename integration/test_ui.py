"""The UI against a real dev cluster (ZooKeeper, 2 nimbus processes, 1 supervisor) and in
a real headless browser (Debian's chromium + chromium-driver, through Selenium).

The UI runs in this test process (UIServer on 127.0.0.1, a free port); the cluster's
daemons are separate processes, killed with SIGKILL for the failover.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
import yaml
from helpers import observer, run_cli

from nimbus.devcluster import LocalCluster, wait_for
from nimbus.distribution.archive import pack_directory
from nimbus.ui.server import UIServer

pytestmark = [pytest.mark.slow, pytest.mark.integration]

TOPOLOGY_KEYS = {"id", "name", "status", "uptime", "uptimeSeconds", "tasksTotal",
                 "workersTotal", "executorsTotal", "replicationCount", "requestedMemOnHeap",
                 "requestedMemOffHeap", "requestedTotalMem", "requestedCpu",
                 "assignedMemOnHeap", "assignedMemOffHeap", "assignedTotalMem",
                 "assignedCpu"}
NIMBUS_KEYS = {"host", "port", "status", "version", "nimbusUpTime", "nimbusUpTimeSeconds",
               "nimbusLogLink"}
SUPERVISOR_KEYS = {"id", "host", "uptime", "uptimeSeconds", "slotsTotal", "slotsUsed",
                   "totalMem", "totalCpu", "usedMem", "usedCpu", "version",
                   "warmReady", "warmStarting", "warmMemoryBytes"}
CLUSTER_KEYS = {"stormVersion", "supervisors", "topologies", "slotsTotal", "slotsUsed",
                "slotsFree", "executorsTotal", "tasksTotal", "schedulerDisplayResource",
                "totalMem", "totalCpu", "availMem", "availCpu", "memAssignedPercentUtil",
                "cpuAssignedPercentUtil"}


def sleeper_bundle(tmp: Path) -> bytes:
    directory = tmp / "sleeper"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "topology.yaml").write_text(yaml.safe_dump(
        {"command": [sys.executable, "-c", "import time; time.sleep(3600)"]}))
    return pack_directory(directory)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui")
    cluster = LocalCluster(tmp / "cluster", nimbuses=2, supervisors=1,
                           conf={"topology.min.replication.count": 2,
                                 "topology.max.replication.wait.time.sec": 30,
                                 "supervisor.monitor.frequency.secs": 1})
    cluster.start()
    server = None
    try:
        state = observer(cluster)
        bundle = sleeper_bundle(tmp)
        client = cluster.client()
        ids = {name: client.submit(name, bundle, {"topology.min.replication.count": 2})
               for name in ("sleeper", "victim")}
        server = UIServer(cluster.client_conf(), port=0, host="127.0.0.1").start()
        yield {"cluster": cluster, "state": state, "ids": ids, "url": server.url,
               "bundle": bundle, "server": server}
        state.zk.stop()
    finally:
        if server is not None:
            server.stop()
        cluster.stop()


def get(env, path: str) -> requests.Response:
    return requests.get(env["url"] + path, timeout=30)


def post(env, path: str, **kwargs) -> requests.Response:
    return requests.post(env["url"] + path, timeout=60, **kwargs)


def status_of(env, topology_id: str) -> str | None:
    base = env["state"].storm_base(topology_id)
    return base.status if base else None


def test_rest_answers_with_storm_field_names(env):
    tid = env["ids"]["sleeper"]
    # the worker runs and beats: the detail then lists it
    wait_for(lambda: get(env, f"/api/v1/topology/{tid}").json()["bolts"], 60,
             "the sleeper's worker to beat")
    cluster = get(env, "/api/v1/cluster/summary").json()
    assert set(cluster) == CLUSTER_KEYS and cluster["topologies"] == 2
    nimbuses = get(env, "/api/v1/nimbus/summary").json()["nimbuses"]
    assert all(set(n) == NIMBUS_KEYS for n in nimbuses) and len(nimbuses) == 2
    assert sorted(n["status"] for n in nimbuses) == ["Leader", "Not a Leader"]
    leader = [f"{n['host']}:{n['port']}" for n in nimbuses if n["status"] == "Leader"][0]
    assert leader == env["cluster"].leader_address()
    sups = get(env, "/api/v1/supervisor/summary").json()["supervisors"]
    assert [set(s) for s in sups] == [SUPERVISOR_KEYS] and sups[0]["slotsUsed"] >= 1
    topos = get(env, "/api/v1/topology/summary").json()["topologies"]
    assert all(set(t) == TOPOLOGY_KEYS for t in topos)
    assert {t["name"]: t["replicationCount"] for t in topos} == {"sleeper": 2, "victim": 2}
    detail = get(env, f"/api/v1/topology/{tid}").json()
    assert detail["replicationCount"] == 2 and detail["workers"][0]["topologyName"] == \
        "sleeper"
    assert [b["boltId"] for b in detail["bolts"]] == ["main"]
    assert detail["configuration"].get("topology.min.replication.count") == 2
    conf = get(env, "/api/v1/cluster/configuration").json()
    assert conf["storm.zookeeper.port"] == env["cluster"].zk.port
    doc = get(env, "/api/v1/openapi.json").json()
    assert "/api/v1/topology/{id}/rebalance/{wait-time}" in doc["paths"]


def test_mutations_change_zookeeper_as_the_cli_does(env):
    tid, conf_file = env["ids"]["sleeper"], str(env["cluster"].config_file)
    assert post(env, f"/api/v1/topology/{tid}/deactivate").json()["status"] == "success"
    after_rest = env["state"].storm_base(tid)
    run_cli("activate", "sleeper", "--config", conf_file, check=True)
    run_cli("deactivate", "sleeper", "--config", conf_file, check=True)
    after_cli = env["state"].storm_base(tid)
    assert after_rest == after_cli and after_rest.status == "INACTIVE"
    assert post(env, f"/api/v1/topology/{tid}/activate").status_code == 200
    assert status_of(env, tid) == "ACTIVE"
    assert post(env, f"/api/v1/topology/{tid}/rebalance/0",
                json={"rebalanceOptions": {"numWorkers": 2}}).status_code == 200
    assert env["state"].storm_base(tid).num_workers == 2
    run_cli("rebalance", "sleeper", "-n", "1", "--config", conf_file, check=True)
    assert env["state"].storm_base(tid).num_workers == 1
    # bad input changes nothing
    before = env["state"].storm_base_versioned(tid)
    assert post(env, f"/api/v1/topology/{tid}/rebalance/0", data=b"{x",
                headers={"Content-Type": "application/json"}).status_code == 400
    assert post(env, "/api/v1/topology/..%2F..%2Fetc/kill/0").status_code == 404
    assert post(env, f"/api/v1/topology/{tid}/kill/0",
                data=b"x" * (1024 * 1024 + 10)).status_code == 413
    assert env["state"].storm_base_versioned(tid) == before


# -- the browser ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium")
    driver_path = shutil.which("chromedriver")
    if not chromium or not driver_path:
        pytest.fail("chromium and chromium-driver are needed: run scripts/setup.sh")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--disable-gpu"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def severe(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def css(driver, selector: str):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


def text_of(driver, selector: str) -> str:
    found = css(driver, selector)
    return found[0].text if found else ""


def test_dashboard_shows_cluster_without_console_errors(env, browser, tmp_path):
    browser.get(env["url"] + "/")
    leader = env["cluster"].leader_address()
    wait_for(lambda: text_of(browser, "#leader") == leader, 10, "the leader shown")
    tid = env["ids"]["sleeper"]
    wait_for(lambda: css(browser, f'tr[data-nimbus="{leader}"].leader'), 5,
             "the leader's row marked")
    wait_for(lambda: "ACTIVE" in text_of(browser, f'tr[data-topology="{tid}"] .status'), 5,
             "the sleeper ACTIVE")
    wait_for(lambda: text_of(browser, f'tr[data-nimbus="{leader}"] td:nth-child(3)')
             == "2 / 2", 10, "the leader's code complete")
    # This cluster's supervisor keeps no warm workers (a local cluster's default).
    supervisor = env["cluster"].supervisors[0].id
    assert text_of(browser, f'tr[data-supervisor="{supervisor}"] td:nth-child(4)') == "—"
    # The test's own screenshot, for looking at a failure; docs/dashboard.png (a running
    # pipeline) is taken by integration/screenshot_dashboard.py.
    assert browser.save_screenshot(str(tmp_path / "dashboard.png"))
    assert severe(browser) == []


def test_deactivate_clicked_in_the_page_reaches_zookeeper(env, browser):
    from selenium.webdriver.support.ui import WebDriverWait

    tid = env["ids"]["sleeper"]
    browser.get(env["url"] + "/")
    button = wait_for(lambda: [b for b in css(
        browser, f'button[data-action="deactivate"][data-topology="{tid}"]')
        if b.is_enabled()], 10, "an enabled deactivate button")[0]
    button.click()
    alert = WebDriverWait(browser, 5).until(lambda d: d.switch_to.alert)
    assert "Deactivate sleeper" in alert.text
    alert.accept()
    wait_for(lambda: status_of(env, tid) == "INACTIVE", 30, "INACTIVE in ZooKeeper")
    wait_for(lambda: "INACTIVE" in text_of(browser, f'tr[data-topology="{tid}"] .status'),
             5, "INACTIVE in the page")
    assert severe(browser) == []


def test_killed_topology_shows_killed(env, browser):
    tid = env["ids"]["victim"]
    browser.get(env["url"] + "/")
    assert post(env, f"/api/v1/topology/{tid}/kill/600").status_code == 200
    assert status_of(env, tid) == "KILLED"
    wait_for(lambda: "KILLED" in text_of(browser, f'tr[data-topology="{tid}"] .status'), 5,
             "KILLED in the page")
    assert post(env, f"/api/v1/topology/{tid}/activate").status_code == 409


def test_failover_marks_new_leader_and_requests_never_500(env, browser):
    cluster, state = env["cluster"], env["state"]
    tid = env["ids"]["sleeper"]
    browser.get(env["url"] + "/")
    old = cluster.wait_for_leader()
    wait_for(lambda: text_of(browser, "#leader") == old.address, 10, "the old leader shown")
    answers: list[int] = []

    def during() -> None:
        for action in ("activate", "deactivate", "activate"):
            answers.append(post(env, f"/api/v1/topology/{tid}/{action}").status_code)
            for path in ("/api/v1/nimbus/summary", "/api/v1/topology/summary",
                         f"/api/v1/topology/{tid}"):
                answers.append(get(env, path).status_code)

    old.kill9()
    worker = threading.Thread(target=during, name="ui-test-requests")
    worker.start()

    def new_leader_in_zookeeper() -> str | None:
        queue = state.leader_queue()
        return queue[0][1] if queue and queue[0][1] != old.address else None

    new = wait_for(new_leader_in_zookeeper, 60, "a new leader in ZooKeeper",
                   interval_s=0.02)
    seen_at = time.monotonic()
    wait_for(lambda: text_of(browser, "#leader") == new, 2.0, "the new leader in the page",
             interval_s=0.05)
    wait_for(lambda: css(browser, f'tr[data-nimbus="{new}"].leader'), 2.0 - (
        time.monotonic() - seen_at) + 0.05, "the new leader's row marked")
    worker.join(timeout=120)
    assert answers and all(code in (200, 503) for code in answers), answers
    assert 500 not in answers
    # the last activate after the failover went through on the new leader
    wait_for(lambda: post(env, f"/api/v1/topology/{tid}/activate").status_code == 200, 60,
             "an action on the new leader")
    assert status_of(env, tid) == "ACTIVE"
    timeline = get(env, "/api/v1/ui/dashboard").json()["timeline"]
    assert any(e["kind"] == "leader" and new in e["message"] for e in timeline)
    assert severe(browser) == []
