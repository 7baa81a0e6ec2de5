"""The Spark class archive (supervisor.spark.class.archive): a supervisor builds it once,
in the background, when a Spark session is first wanted there, and every pipeline
worker's JVM started afterwards maps it; a damaged one is ignored.

One cluster for the module: ZooKeeper, one nimbus, one supervisor process with one slot,
real Spark (local[1]). The tests run in order.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest
from processes import workers_in
from waiting import wait_for

from nimbus.dev.cluster import LocalCluster
from nimbus.dev.feed import WORDCOUNT, CommittedOutput, RecordFeed, exactly_once_report
from nimbus.distribution.archive import pack_directory

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SPARK_CONF = {"spark.ui.enabled": "false", "spark.driver.memory": "512m",
              "spark.sql.shuffle.partitions": "1"}
SPARK_TIMEOUT_S = 240   # the archive's build and a Spark start on a busy 2-core machine


class Archived:
    def __init__(self, cluster: LocalCluster, work: Path):
        self.cluster = cluster
        self.supervisor = cluster.supervisors[0]
        self.feed = RecordFeed(work / "input")
        self.output = CommittedOutput(work / "output")
        self.topology_id = ""

    def wait_log(self, pattern: str, what: str, after: int = 0) -> re.Match[str]:
        return wait_for(lambda: re.search(pattern, self.supervisor.log_text()[after:]),
                        SPARK_TIMEOUT_S, what)

    def worker_dir(self) -> Path:
        return self.supervisor.worker_dir(self.topology_id, self.supervisor.ports[0])

    def kill_and_resume(self, restarts: int) -> int:
        """kill -9 of the worker's group, its restart (the ``restarts``-th), 20 records
        committed exactly once; returns the pid of the new worker's JVM."""
        [worker] = workers_in(self.worker_dir())
        mark = len(self.supervisor.log_text())
        os.killpg(worker, signal.SIGKILL)
        self.wait_log(rf"starting worker {self.topology_id}:\d+ \(restart {restarts}\)",
                      "the worker to be restarted", mark)
        self.feed_and_check(20)
        [worker] = workers_in(self.worker_dir())
        [jvm] = java_children(worker)
        return jvm

    def feed_and_check(self, count: int) -> None:
        ids = self.feed.feed(count)
        wait_for(lambda: self.output.holds(ids), SPARK_TIMEOUT_S,
                 f"records {ids[0]}..{ids[-1]} to be committed")
        assert exactly_once_report(self.feed.fed, self.output.ids()) == {
            "lost": [], "duplicated": [], "unexpected": []}


def java_children(pid: int) -> list[int]:
    """The java processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:]
        if comm == "java" and int(rest.split()[1]) == pid:
            found.append(int(entry.name))
    return found


def mapped(pid: int, path: Path) -> bool:
    try:
        return str(path) in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.fixture(scope="module")
def archived(tmp_path_factory):
    work = tmp_path_factory.mktemp("archive")
    cluster = LocalCluster(work / "cluster", nimbuses=1, supervisors=1, slots_per_supervisor=1,
                           class_archive=True,
                           conf={"storm.zookeeper.session.timeout": 6000,
                                 "supervisor.monitor.frequency.secs": 1,
                                 "topology.spark.master": "local[1]",
                                 "topology.spark.conf": SPARK_CONF,
                                 "topology.spark.checkpoint.dir": str(work / "checkpoints")})
    with cluster:
        yield Archived(cluster, work)
        print(f"--- supervisor log ---\n{cluster.supervisors[0].log_text()[-4000:]}")


def test_the_first_pipeline_has_the_archive_built_and_its_restart_maps_it(archived):
    supervisor_dir = archived.supervisor.local_dir / "supervisor"
    # Nothing built before a Spark session is wanted here (no warm workers: the first
    # pipeline).
    assert "building the Spark class archive" not in archived.supervisor.log_text()
    archived.topology_id = archived.cluster.client().submit(
        "wordcount", pack_directory(WORDCOUNT), {
            "wordcount.input.dir": str(archived.feed.input_dir),
            "wordcount.output.dir": str(archived.output.output_dir),
            "wordcount.trigger.secs": 0.5})
    archived.feed_and_check(20)    # started without it: the build runs beside it
    match = archived.wait_log(r"Spark class archive (\S+) built and in use",
                              "the class archive to be built")
    archive = Path(match.group(1))
    assert archive.parent == supervisor_dir / "class-archive"
    assert archive.stat().st_mode & 0o777 == 0o644   # the supervisor's, read-only to others
    jvm = archived.kill_and_resume(restarts=1)
    assert f"with the class archive {archive}" in \
        archived.supervisor.worker_log(archived.topology_id,
                                       archived.supervisor.ports[0]).read_text()
    assert mapped(jvm, archive), "the driver's JVM has not mapped the class archive"


def test_a_damaged_archive_is_ignored_and_the_pipeline_still_runs(archived):
    archive = next((archived.supervisor.local_dir / "supervisor" / "class-archive")
                   .glob("spark-classes-*.jsa"))
    archive.write_bytes(os.urandom(1 << 16))
    jvm = archived.kill_and_resume(restarts=2)
    assert not mapped(jvm, archive)
