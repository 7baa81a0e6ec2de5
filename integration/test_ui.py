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
from waiting import wait_for

from nimbus.dev.cluster import LocalCluster
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
    cluster = LocalCluster(tmp / "cluster", nimbuses=2, supervisors=1, slots_per_supervisor=3,
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
    # pipeline) is taken by scripts/screenshot_dashboard.py.
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


# -- the topology page -------------------------------------------------------------------
# What the page shows, read in one go in the browser (elements are redrawn every 2 s).
PAGE_SNAPSHOT_JS = """
const page = document.getElementById("topology-page");
if (page.hidden) return null;
const text = (el) => el ? el.textContent : null;
const vertices = (root, selector) => [...root.querySelectorAll(selector)].reduce(
  (n, line) => n + line.getAttribute("points").trim().split(/\\s+/).filter(Boolean).length, 0);
const workers = {};
for (const row of page.querySelectorAll("#tp-workers tbody tr")) {
  workers[row.dataset.worker] = {
    state: row.querySelector("[data-state]").dataset.state,
    placements: [...row.querySelectorAll(".placement-history li .where")].map(text),
    sparkUi: row.querySelectorAll("a.spark-ui").length};
}
const components = {};
for (const card of page.querySelectorAll("article.component")) {
  components[card.dataset.component] = {
    title: text(card.querySelector(".component-name")),
    input: vertices(card, ".chart-rates polyline.input"),
    processed: vertices(card, ".chart-rates polyline.processed"),
    duration: vertices(card, ".chart-duration polyline.duration"),
    sources: [...card.querySelectorAll("table.sources tbody tr")].map(
      (row) => [...row.querySelectorAll("td")].map(text)),
    sink: text(card.querySelector(".sink")),
    checkpoint: text(card.querySelector(".checkpoint code"))};
}
return {id: page.dataset.topology, status: text(document.getElementById("tp-status")),
        workers, components,
        errors: [...page.querySelectorAll("#tp-errors summary.error-text")].map(text),
        actions: [...page.querySelectorAll("#tp-actions button")].map(
          (b) => [b.dataset.action, !b.disabled]),
        elements: page.querySelectorAll("img, script, iframe").length,
        pwned: window.__pwned === undefined ? null : window.__pwned};
"""
# Markup where a tenant controls text: a pipeline's input directory (Spark names it in
# the source's description) and a command (named in its start error). Component names
# cannot carry it: they are checked ids (nimbus/state/component_ids.py) wherever they
# enter, so these are the tenant strings that reach the page.
MARKUP = "<img src=x onerror=window.__pwned=1>"
SPARK_CONF = {"spark.ui.enabled": "false", "spark.driver.memory": "512m",
              "spark.sql.shuffle.partitions": "1"}


def page_snapshot(browser) -> dict | None:
    return browser.execute_script(PAGE_SNAPSHOT_JS)


def page_data(env, topology_id: str) -> dict:
    answer = get(env, f"/api/v1/topology/{topology_id}/page")
    assert answer.status_code == 200, answer.text
    return answer.json()


class Feeding:
    """Records into a pipeline's input, a file every 2 s, until stopped: batches go on
    so that its charts have points."""

    def __init__(self, feed) -> None:
        self._feed = feed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ui-test-feed", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._feed.feed(200)
            self._stop.wait(2.0)

    def __enter__(self) -> Feeding:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def test_topology_page_shows_workers_charts_progress_and_errors_as_text(env, browser,
                                                                       tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from nimbus.dev.feed import WORDCOUNT, RecordFeed

    client = env["cluster"].client()
    feed = RecordFeed(tmp_path / f"in-{MARKUP}")
    checkpoints = tmp_path / "checkpoints"
    pipeline = client.submit("pipeline", pack_directory(WORDCOUNT), {
        "topology.min.replication.count": 2, "topology.spark.master": "local[1]",
        "topology.spark.conf": SPARK_CONF, "topology.spark.checkpoint.dir": str(checkpoints),
        "wordcount.input.dir": str(feed.input_dir),
        "wordcount.output.dir": str(tmp_path / "out"), "wordcount.trigger.secs": 1})
    crasher_dir = tmp_path / "crasher"
    crasher_dir.mkdir()
    (crasher_dir / "topology.yaml").write_text(yaml.safe_dump(
        {"command": [f"no-such-command-{MARKUP}"]}))
    crasher = client.submit("crasher", pack_directory(crasher_dir),
                            {"topology.min.replication.count": 2})
    try:
        with Feeding(feed):
            browser.get(env["url"] + "/")
            # Reached from the dashboard's row, as a user would.
            link = WebDriverWait(browser, 10).until(lambda d: d.find_element(
                By.CSS_SELECTOR, f'tr[data-topology="{pipeline}"] a.topology-link'))
            link.click()
            WebDriverWait(browser, 10).until(lambda d: (page_snapshot(d) or {}).get("id")
                                             == pipeline)
            assert browser.current_url.endswith(f"#/topology/{pipeline}")

            def charts_match(_driver) -> tuple[dict, dict] | None:
                # The page against the REST data, once it has 3 points of history: the
                # charts draw every point (history changes every 10 s, the page every 2).
                data = page_data(env, pipeline)
                main = data["components"].get("main")
                shown = page_snapshot(browser)
                if not main or len(main["history"]) < 3 or not shown \
                        or "main" not in shown["components"]:
                    return None
                drawn = shown["components"]["main"]
                durations = sum(1 for point in main["history"] if point[3] is not None)
                if (drawn["input"], drawn["processed"], drawn["duration"]) != (
                        len(main["history"]), len(main["history"]), durations):
                    return None
                return data, shown

            data, shown = WebDriverWait(browser, 150, poll_frequency=0.5).until(
                charts_match, "the charts to draw the history's points")
            (worker,) = data["workers"]
            row = shown["workers"]["worker-0"]
            assert row["state"] == worker["state"] == "running"
            assert row["placements"] == [f"{p['host']}:{p['port']}"
                                         for p in worker["placements"]]
            assert row["placements"][0] == f"{worker['host']}:{worker['port']}"
            assert row["sparkUi"] == 0, "spark.ui.enabled is false: no link"
            main, drawn = data["components"]["main"], shown["components"]["main"]
            assert drawn["title"] == "main"
            (source,) = main["progress"]["sources"]
            assert source["description"] == f"FileStreamSource[file:{feed.input_dir}]"
            assert drawn["sources"][0][0] == source["description"], "markup shown as text"
            assert '"logOffset"' in drawn["sources"][0][2]
            assert "FileSink" in drawn["sink"]
            # The location the page names is where Spark keeps the query's checkpoint.
            assert drawn["checkpoint"] == main["checkpoint"] == str(
                checkpoints / pipeline / "main")
            assert (checkpoints / pipeline / "main" / "commits").is_dir()
            assert dict(shown["actions"]) == {"activate": False, "deactivate": True,
                                              "rebalance": True, "kill": True}
            assert (shown["elements"], shown["pwned"]) == (0, None)
            check_logs_panel(env, browser, pipeline)
            assert browser.save_screenshot(str(tmp_path / "topology-page.png"))

        # A worker that cannot start: restarting, its error (markup) shown as text.
        browser.get(env["url"] + f"/#/topology/{crasher}")

        def crasher_shown(_driver) -> tuple[dict, dict] | None:
            data = page_data(env, crasher)
            shown = page_snapshot(browser)
            if not data["workers"] or not shown or not shown["workers"] or not shown["errors"]:
                return None
            if shown["workers"]["worker-0"]["state"] != data["workers"][0]["state"]:
                return None
            return (data, shown) if data["workers"][0]["state"] == "restarting" else None

        data, shown = WebDriverWait(browser, 60, poll_frequency=0.5).until(
            crasher_shown, "the crasher's worker restarting")
        assert any(MARKUP in text for text in shown["errors"]), shown["errors"]
        assert shown["components"] == {} or "main" not in shown["components"] or \
            shown["components"]["main"]["input"] == 0
        assert (shown["elements"], shown["pwned"]) == (0, None)
        # The dashboard's actions work from the page: deactivate it.
        button = browser.find_element(By.CSS_SELECTOR, '#tp-actions [data-action="deactivate"]')
        button.click()
        alert = WebDriverWait(browser, 5).until(lambda d: d.switch_to.alert)
        assert "Deactivate crasher" in alert.text
        alert.accept()
        wait_for(lambda: status_of(env, crasher) == "INACTIVE", 30, "INACTIVE in ZooKeeper")
        WebDriverWait(browser, 10).until(
            lambda d: (page_snapshot(d) or {}).get("status") == "INACTIVE")
        browser.find_element(By.CSS_SELECTOR, "#tp-head a.back").click()
        WebDriverWait(browser, 10).until(lambda d: d.find_element(
            By.ID, "dashboard").is_displayed())
        assert severe(browser) == []
    finally:
        for topology_id in (pipeline, crasher):   # the next test's cluster as it was
            post(env, f"/api/v1/topology/{topology_id}/kill/0")


def check_logs_panel(env, browser, topology_id: str) -> None:
    """The Logs panel shows worker-0's tail as the REST resource gives it (read from its
    supervisor's logviewer), and a search finds the worker's own line in its log."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def tail_shown(driver) -> list[str] | None:
        lines = [line.strip() for line in
                 driver.find_element(By.ID, "tp-log-text").text.splitlines() if line.strip()]
        rest = get(env, f"/api/v1/topology/{topology_id}/logs?worker=0").json()["lines"]
        # The tail grows as Spark writes: the panel's last line is one of the newest.
        return lines if lines and lines[-1] in [line.strip() for line in rest[-50:]] \
            else None

    try:
        WebDriverWait(browser, 30, poll_frequency=0.5).until(tail_shown, "the log's tail")
    except Exception:
        answer = get(env, f"/api/v1/topology/{topology_id}/logs?worker=0")
        raise AssertionError(f"{answer.status_code} {answer.text[-2000:]}\n"
                             f"{browser.find_element(By.ID, 'tp-log-where').text}") from None
    box = browser.find_element(By.ID, "tp-log-search")
    box.clear()
    box.send_keys("started query")
    browser.find_element(By.ID, "tp-log-go").click()
    where = WebDriverWait(browser, 15, poll_frequency=0.3).until(
        lambda d: d.find_element(By.ID, "tp-log-where").text.startswith(
            tuple(f"{n} match(es)" for n in range(1, 10))) and
        d.find_element(By.ID, "tp-log-where").text, "the search's matches")
    found = get(env, f"/api/v1/topology/{topology_id}/logs?worker=0&search=started+query")
    matches = found.json()["matches"]
    assert where.startswith(f"{len(matches)} match(es)")
    assert all(m["matchString"] == "started query" and
               m["afterString"].startswith(f" {topology_id}.main") for m in matches), matches
    shown = browser.find_element(By.ID, "tp-log-text").text
    assert f"started query {topology_id}.main" in shown
    # Bad input: a clear error, never a 500.
    assert get(env, f"/api/v1/topology/{topology_id}/logs?worker=x").status_code == 400
    missing = get(env, f"/api/v1/topology/{topology_id}/logs?worker=7")
    assert missing.status_code == 404 and "no worker 7" in missing.json()["errorMessage"]
    browser.find_element(By.ID, "tp-log-tail").click()
    # Storm UI's workerLogLink: the worker's log page on its supervisor's logviewer.
    (worker,) = get(env, f"/api/v1/topology/{topology_id}").json()["workers"]
    link = worker["workerLogLink"]
    assert link.startswith("http://127.0.0.1:") and f"%2F{worker['port']}%2F" in link, link
    page = requests.get(link, timeout=10)
    assert page.status_code == 200 and "nimbus.worker" in page.text


# -- code versions (issue 31): the CLI's upgrade and history, the page's Versions panel ---
VERSIONS_JS = """
const rows = [...document.querySelectorAll("#tp-version-list tbody tr")];
return {running: document.getElementById("tp-version-running").textContent,
        rows: rows.map((r) => [Number(r.dataset.version), r.dataset.state]),
        choices: [...document.querySelectorAll("#tp-version-pick option")].map((o) => o.value),
        switchEnabled: !document.getElementById("tp-version-switch").disabled,
        workerVersions: [...document.querySelectorAll("#tp-workers td.version")].map(
          (td) => td.textContent)};
"""


def versioned_bundle(tmp: Path, version: int) -> Path:
    directory = tmp / f"versioned-v{version}"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "topology.yaml").write_text(yaml.safe_dump({"command": [
        sys.executable, "-c", f"import time; time.sleep(3600 + {version})"]}))
    return directory


def test_upgrade_by_the_cli_and_a_switch_back_from_the_versions_panel(env, browser,
                                                                      tmp_path):
    import json

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    conf_file = str(env["cluster"].config_file)
    client = env["cluster"].client()
    topology_id = client.submit("versioned", pack_directory(versioned_bundle(tmp_path, 1)),
                                {"topology.min.replication.count": 2})
    try:
        wait_for(lambda: page_data(env, topology_id)["workers"] and
                 page_data(env, topology_id)["workers"][0]["state"] == "running", 60,
                 "version 1's worker running")
        upgraded = run_cli("upgrade", "versioned", str(versioned_bundle(tmp_path, 2)),
                           "--timeout", "110", "--config", conf_file)
        assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
        assert upgraded.stdout.splitlines()[0] == f"uploaded version 2 of versioned " \
                                                  f"({topology_id})"
        assert "  worker-0 runs version 2 (1/1)" in upgraded.stdout
        assert upgraded.stdout.splitlines()[-1] == "versioned runs version 2"

        browser.get(env["url"] + f"/#/topology/{topology_id}")

        def shown(want_running: str, want_rows: list) -> dict | None:
            got = browser.execute_script(VERSIONS_JS)
            return got if got["running"] == want_running and got["rows"] == want_rows \
                else None

        panel = WebDriverWait(browser, 20, poll_frequency=0.3).until(
            lambda _d: shown("version 2 runs", [[2, "running"], [1, "previous"]]),
            "the Versions panel listing both versions")
        assert (panel["choices"], panel["switchEnabled"]) == (["1"], True)
        Select(browser.find_element(By.ID, "tp-version-pick")).select_by_value("1")
        browser.find_element(By.ID, "tp-version-switch").click()
        alert = WebDriverWait(browser, 5).until(lambda d: d.switch_to.alert)
        assert alert.text.startswith("Switch versioned to version 1?")
        alert.accept()
        wait_for(lambda: client.history("versioned")["running"] == 1, 110,
                 "version 1 running again")
        panel = WebDriverWait(browser, 30, poll_frequency=0.3).until(
            lambda _d: shown("version 1 runs", [[2, "rolled back"], [1, "running"]]),
            "the panel showing the switch back")
        assert panel["choices"] == ["2"]
        WebDriverWait(browser, 30, poll_frequency=0.3).until(
            lambda d: d.execute_script(VERSIONS_JS)["workerVersions"] == ["1"],
            "the worker's version 1 in the Workers table")
        history = run_cli("history", "versioned", "--json", "--config", conf_file,
                          check=True)
        data = json.loads(history.stdout)
        assert (data["running"], data["switch"]) == (1, None)
        assert [(v["version"], v["state"]) for v in data["versions"]] == [
            (2, "rolled back"), (1, "running")]
        table = run_cli("history", "versioned", "--config", conf_file, check=True)
        assert table.stdout.splitlines()[0] == f"versioned ({topology_id}): version 1 runs"
        assert severe(browser) == []
    finally:
        post(env, f"/api/v1/topology/{topology_id}/kill/0")


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
