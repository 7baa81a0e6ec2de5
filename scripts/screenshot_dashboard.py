"""Take docs/dashboard.png: the dashboard of a dev cluster with a PySpark pipeline running.

    .venv/bin/python scripts/screenshot_dashboard.py [--out docs/dashboard.png]

ZooKeeper, 2 nimbuses and 2 supervisors; the word-count pipeline fed records for a while,
then one worker killed so that the page shows a restart and its error. Needs chromium and
chromium-driver (scripts/setup.sh installs them).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parents[1] / "docs" / "dashboard.png")
    args = parser.parse_args()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="dashboard-") as tmp:
        work = Path(tmp)
        feed, output = RecordFeed(work / "in"), CommittedOutput(work / "out")
        with LocalCluster(work / "cluster", nimbuses=2, supervisors=2, slots_per_supervisor=2,
                          conf={"nimbus.monitor.freq.secs": 1,
                                "supervisor.monitor.frequency.secs": 1,
                                "topology.spark.master": "local[1]",
                                "topology.spark.conf": SPARK_CONF,
                                "topology.spark.checkpoint.dir": str(work / "ckpt")}) as cluster:
            client = cluster.client()
            topology_id = client.submit("wordcount", pack_directory(WORDCOUNT), {
                "topology.min.replication.count": 2,
                "wordcount.input.dir": str(feed.input_dir),
                "wordcount.output.dir": str(output.output_dir),
                "wordcount.trigger.secs": 1})
            sleeper = work / "sleeper"
            sleeper.mkdir()
            (sleeper / "topology.yaml").write_text(
                'command: ["sleep", "3600"]\n')
            client.submit("sleeper", pack_directory(sleeper),
                          {"topology.min.replication.count": 2})
            server = UIServer(cluster.client_conf(), port=0, host="127.0.0.1").start()
            options = webdriver.ChromeOptions()
            options.binary_location = shutil.which("chromium") or "chromium"
            for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                        "--window-size=1400,900", "--disable-gpu"):
                options.add_argument(arg)
            driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")),
                                      options=options)
            try:
                driver.get(server.url)
                ids = feed.feed(2000)
                wait_for(lambda: output.holds(ids), 180, "the first records to commit")
                pid = processes_with_arg(WORKER_MODULE, f"{topology_id}-")[0]
                os.killpg(pid, signal.SIGKILL)  # a restart and its error, for the page
                ids = feed.feed(2000)
                wait_for(lambda: output.holds(ids), 180, "records after the restart")
                for _ in range(12):  # a steady stream, so that the chart has a shape
                    feed.feed(3000)
                    time.sleep(1)
                driver.save_screenshot(str(args.out))
                print(f"saved {args.out}")
            finally:
                driver.quit()
                server.stop()


if __name__ == "__main__":
    main()
