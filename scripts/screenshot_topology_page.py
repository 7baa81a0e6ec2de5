"""Take docs/topology-page.png: a PySpark pipeline's topology page on a dev cluster.

    .venv/bin/python scripts/screenshot_topology_page.py [--out docs/topology-page.png]

ZooKeeper, 2 nimbuses and 2 supervisors; the word-count pipeline fed a varying stream of
records, deactivated and activated again (a second placement), then run for a few
minutes with its worker killed once (a restart, its error and a gap in the charts).
Needs chromium and chromium-driver (scripts/setup.sh installs them). Takes about eight
minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path
from urllib.request import urlopen

from nimbus.dev.cluster import LocalCluster, wait_for
from nimbus.dev.feed import (
    WORDCOUNT,
    WORKER_MODULE,
    CommittedOutput,
    RecordFeed,
    processes_with_arg,
)
from nimbus.distribution.archive import pack_directory
from nimbus.ui.server import UIServer

SPARK_CONF = {"spark.ui.enabled": "false", "spark.driver.memory": "512m",
              "spark.sql.shuffle.partitions": "2"}


def feed_steadily(feed: RecordFeed, stop: threading.Event) -> None:
    """A file a second, its size swinging between 500 and 4,000 records (a shape for the
    charts)."""
    tick = 0
    while not stop.is_set():
        feed.feed(500 + (tick * 700) % 3500)
        tick += 1
        stop.wait(1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1]
                        / "docs" / "topology-page.png")
    args = parser.parse_args()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="topology-page-") as tmp:
        work = Path(tmp)
        feed, output = RecordFeed(work / "in"), CommittedOutput(work / "out")
        with LocalCluster(work / "cluster", nimbuses=2, supervisors=2, slots_per_supervisor=2,
                          conf={"nimbus.monitor.freq.secs": 1,
                                "supervisor.monitor.frequency.secs": 1}) as cluster:
            client = cluster.client()
            topology_id = client.submit("wordcount", pack_directory(WORDCOUNT), {
                "topology.min.replication.count": 2, "topology.spark.master": "local[1]",
                "topology.spark.conf": SPARK_CONF,
                "topology.spark.checkpoint.dir": str(work / "checkpoints"),
                "wordcount.input.dir": str(feed.input_dir),
                "wordcount.output.dir": str(output.output_dir),
                "wordcount.trigger.secs": 1})
            stop = threading.Event()
            feeder = threading.Thread(target=feed_steadily, args=(feed, stop), daemon=True)
            server = UIServer(cluster.client_conf(), port=0, host="127.0.0.1").start()
            options = webdriver.ChromeOptions()
            options.binary_location = shutil.which("chromium") or "chromium"
            for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                        "--window-size=1400,1000", "--disable-gpu"):
                options.add_argument(arg)
            driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")),
                                      options=options)

            def running() -> bool:   # as the page will show it
                with urlopen(f"{server.url}/api/v1/topology/{topology_id}/page",
                             timeout=10) as answer:
                    return any(w["alive"] for w in json.load(answer)["workers"])

            try:
                ids = feed.feed(1000)
                wait_for(lambda: output.holds(ids), 180, "the first records to commit")
                feeder.start()
                time.sleep(30)
                client.deactivate("wordcount")   # a second placement
                time.sleep(20)
                client.activate("wordcount")
                wait_for(running, 180, "the pipeline running again")
                time.sleep(150)   # a stretch of history
                pid = processes_with_arg(WORKER_MODULE, f"{topology_id}-")[0]
                os.killpg(pid, signal.SIGKILL)   # a restart, its error, a gap
                wait_for(running, 180, "the pipeline running after its restart")
                time.sleep(150)
                driver.get(f"{server.url}/#/topology/{topology_id}")
                wait_for(lambda: driver.execute_script(
                    "return document.querySelectorAll('#topology-page polyline').length"),
                    30, "the charts")
                # Open the placement history and the durations (they stay open across
                # the page's refreshes), then shoot the whole page.
                driver.execute_script(
                    "document.querySelectorAll('#topology-page details summary')"
                    ".forEach((s) => { if (!s.closest('#tp-errors')) s.click(); })")
                wait_for(lambda: driver.execute_script(
                    "return document.querySelectorAll('#topology-page details[open]').length"
                    " >= 2"), 10, "the details open")
                height = driver.execute_script(
                    "return document.documentElement.scrollHeight")
                driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
                    "width": 1400, "height": min(4000, height), "deviceScaleFactor": 1,
                    "mobile": False})
                driver.save_screenshot(str(args.out))
                print(f"saved {args.out}")
            finally:
                stop.set()
                driver.quit()
                server.stop()


if __name__ == "__main__":
    main()
