"""Rebalance, getTopologyInfo, getClusterInfo's supervisors, the bundle-kind check at
submit, and the ``rebalance``/``topology-info``/``errors`` commands, against one real
in-process nimbus and a real ZooKeeper.

Supervisors and their workers are not run: their records are written into ZooKeeper
directly, as a supervisor writes them (docs/runtime.md). The leader's duties (the
scheduler) run when the test calls ``run_cycle``, not on a timer.
"""

from __future__ import annotations

import io
import json
import tarfile
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from nimbus_fixtures import idle_nimbus_conf
from waiting import wait_for

from nimbus.cli import main
from nimbus.config import load_config
from nimbus.daemons.nimbus import NimbusDaemon
from nimbus.distribution.archive import NO_KIND_MESSAGE, BundleError, bundle_kind
from nimbus.state.records import ErrorInfo, SupervisorInfo, WorkerBeat
from nimbus.thrift import storm
from nimbus.thrift.client import NimbusClient, connect

pytestmark = pytest.mark.zookeeper

PROCESS_YAML = 'command: ["sleep", "3600"]\n'


def tar_bundle(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def storm_jar() -> bytes:
    """What `storm jar` uploads: classes and a manifest, nothing a worker can run."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
        zf.writestr("org/example/WordCount.class", b"\xca\xfe\xba\xbe")
    return buf.getvalue()


@pytest.fixture
def cluster(zk_server, zk_root, tmp_path, make_zk):
    """(daemon, conf, storm.yaml path, a second ZooKeeper session acting as supervisors)."""
    conf_file = idle_nimbus_conf(zk_server, zk_root, tmp_path)
    conf = load_config(str(conf_file))
    daemon = NimbusDaemon(conf)
    daemon.start()
    try:
        wait_for(daemon.master.elector.is_leader, 30, "the nimbus to lead")
        yield daemon, conf, conf_file, make_zk()
    finally:
        daemon.stop()


def add_supervisor(daemon: NimbusDaemon, zk, supervisor_id: str, host: str,
                   ports: list[int], uptime: int) -> None:
    """Register a supervisor the way one does: an ephemeral node of its own session."""
    zk.create(daemon.master.state.path("supervisors", supervisor_id), SupervisorInfo(
        time_secs=1, hostname=host, meta=ports, uptime_secs=uptime,
        version="sup-1.0").encode(), ephemeral=True)


def submit(conf, name: str = "wc") -> str:
    return NimbusClient(conf).submit(name, tar_bundle({"topology.yaml": PROCESS_YAML}), {})


def placed(daemon: NimbusDaemon, topology_id: str) -> dict[str, list]:
    return daemon.master.state.assignment_info(topology_id).executor_node_port


def cli(conf_file: Path, *args: str):
    return CliRunner().invoke(main, [*args, "--config", str(conf_file)])


# -- rebalance ---------------------------------------------------------------------------

def test_rebalance_sets_num_workers_and_the_scheduler_follows(cluster):
    daemon, conf, conf_file, sup_zk = cluster
    add_supervisor(daemon, sup_zk, "sup-a", "host-a", [6700, 6701], 11)
    add_supervisor(daemon, sup_zk, "sup-b", "host-b", [6700], 22)
    topology_id = submit(conf)
    daemon.master.run_cycle()
    assert placed(daemon, topology_id) == {"worker-0": ["sup-a", 6700]}

    NimbusClient(conf).rebalance("wc", 3)
    assert daemon.master.state.storm_base(topology_id).num_workers == 3
    daemon.master.run_cycle()
    # spread: the supervisor with the fewest workers of the topology first
    assert placed(daemon, topology_id) == {"worker-0": ["sup-a", 6700],
                                           "worker-1": ["sup-b", 6700],
                                           "worker-2": ["sup-a", 6701]}
    with connect(daemon.address) as client:
        info = wait_for(lambda: (i := client.getClusterInfo()).supervisors and i, 30,
                        "the supervisors in the summary")
    assert [(t.name, t.num_workers, t.num_executors, t.num_tasks)
            for t in info.topologies] == [("wc", 3, 3, 3)]
    assert info.supervisors == [
        storm.SupervisorSummary(host="host-a", uptime_secs=11, num_workers=2,
                                num_used_workers=2, supervisor_id="sup-a", version="sup-1.0"),
        storm.SupervisorSummary(host="host-b", uptime_secs=22, num_workers=1,
                                num_used_workers=1, supervisor_id="sup-b", version="sup-1.0")]

    # Storm's `storm rebalance wc -n 1`, through the CLI; the highest indices go
    done = cli(conf_file, "rebalance", "wc", "-n", "1", "--wait", "0")
    assert (done.exit_code, done.output) == (0, "rebalanced wc to 1 worker\n")
    daemon.master.run_cycle()
    assert placed(daemon, topology_id) == {"worker-0": ["sup-a", 6700]}
    done = cli(conf_file, "cluster-info", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["supervisors"] == [
        {"supervisor_id": "sup-a", "host": "host-a", "uptime_secs": 11, "num_workers": 2,
         "num_used_workers": 1},
        {"supervisor_id": "sup-b", "host": "host-b", "uptime_secs": 22, "num_workers": 1,
         "num_used_workers": 0}]


@pytest.mark.parametrize(("options", "message"), [
    (storm.RebalanceOptions(num_workers=0),
     "rebalance: num_workers must be an integer >= 1, not 0"),
    (storm.RebalanceOptions(num_workers=-2),
     "rebalance: num_workers must be an integer >= 1, not -2"),
    (storm.RebalanceOptions(),
     "rebalance: give num_workers (the only option nimbus-ha supports)"),
    (None, "rebalance: give num_workers (the only option nimbus-ha supports)"),
    (storm.RebalanceOptions(num_workers=2, wait_secs=-1),
     "rebalance wait must be >= 0 seconds, not -1"),
    (storm.RebalanceOptions(num_workers=2, num_executors={"counts": 4}),
     "rebalance: num_executors is not supported (a worker runs whole components); "
     "change num_workers instead"),
])
def test_rebalance_refuses_bad_options(cluster, options, message):
    daemon, conf, _, _ = cluster
    topology_id = submit(conf)
    with connect(daemon.address) as client:
        with pytest.raises(storm.InvalidTopologyException) as refused:
            client.rebalance("wc", options)
    assert refused.value.msg == message
    assert daemon.master.state.storm_base(topology_id).num_workers == 1


def test_rebalance_of_unknown_or_killed_topology(cluster):
    daemon, conf, conf_file, _ = cluster
    with connect(daemon.address) as client:
        with pytest.raises(storm.NotAliveException) as refused:
            client.rebalance("nope", storm.RebalanceOptions(num_workers=2))
        assert refused.value.msg == "no live topology named 'nope'"
        submit(conf, "doomed")
        client.killTopologyWithOpts("doomed", storm.KillOptions(wait_secs=60))
        with pytest.raises(storm.InvalidTopologyException) as refused:
            client.rebalance("doomed", storm.RebalanceOptions(num_workers=2))
        assert refused.value.msg == "topology 'doomed' is being killed"
    done = cli(conf_file, "rebalance", "nope", "--workers", "2")
    assert (done.exit_code, done.output) == (1, "Error: no live topology named 'nope'\n")


# -- getTopologyInfo and the CLI views ------------------------------------------------------

def write_runtime(daemon: NimbusDaemon, zk, topology_id: str) -> None:
    """A beat for worker-0 (on sup-a:6700) and errors, as sup-a writes them; worker-1
    (on sup-b:6700) has sent nothing yet."""
    beat = WorkerBeat(time_secs=1, topology_id=topology_id, supervisor_id="sup-a",
                      host="host-a", port=6700, restarts=3, components={
                          "counts": {"batch_id": 9, "num_input_rows": 30,
                                     "input_rows_per_second": 1.5,
                                     "processed_rows_per_second": 1.25},
                          "lines": {"batch_id": 4}})
    zk.create(daemon.master.state.path("workerbeats", topology_id, "sup-a-6700"), beat.encode())
    for i in range(11):
        assert daemon.master.state.report_error(topology_id, "counts", ErrorInfo(
            error=f"boom {i}\n  at line {i}", error_time_secs=1_700_000_000 + i,
            host="host-a", port=6700))


def test_topology_info_over_thrift_and_cli(cluster):
    daemon, conf, conf_file, sup_zk = cluster
    add_supervisor(daemon, sup_zk, "sup-a", "host-a", [6700], 11)
    add_supervisor(daemon, sup_zk, "sup-b", "host-b", [6700], 22)
    topology_id = NimbusClient(conf).submit(
        "wc", tar_bundle({"topology.yaml": PROCESS_YAML}), {"topology.workers": 2,
                                                             "topology.submitter.user": "bob"})
    daemon.master.run_cycle()
    assert placed(daemon, topology_id) == {"worker-0": ["sup-a", 6700],
                                           "worker-1": ["sup-b", 6700]}
    write_runtime(daemon, sup_zk, topology_id)

    with connect(daemon.address) as client:
        info = client.getTopologyInfo(topology_id)
        with pytest.raises(storm.NotAliveException) as refused:
            client.getTopologyInfo("nope-1-1")
    assert refused.value.msg == "no live topology with id 'nope-1-1'"
    assert (info.id, info.name, info.status, info.owner, info.replication_count) == (
        topology_id, "wc", "ACTIVE", "bob", 1)
    assert all(0 <= e.uptime_secs <= 60 for e in info.executors)
    # worker-1 is not running (no beat yet): no uptime, as topology-info shows it.
    assert [e.uptime_secs for e in info.executors if e.host == "host-b"] == [0]
    assert [(e.component_id, e.host, e.port, e.executor_info.task_start,
             e.executor_info.task_end) for e in info.executors] == [
        ("counts", "host-a", 6700, 1, 1), ("lines", "host-a", 6700, 1, 1),
        ("__system", "host-b", 6700, 2, 2)]
    assert info.errors == {"counts": [
        storm.ErrorInfo(error=f"boom {i}\n  at line {i}", error_time_secs=1_700_000_000 + i,
                        host="host-a", port=6700) for i in range(10, 0, -1)]}

    done = cli(conf_file, "topology-info", "wc", "--json")
    assert done.exit_code == 0, done.output
    view = json.loads(done.output)
    uptimes = [w.pop("uptime_secs") for w in view["workers"]]
    assert all(0 <= u <= 60 for u in uptimes) and 0 <= view.pop("uptime_secs") <= 60
    # The beat's age by ZooKeeper's clock: the newest mtime of the nodes read, less its.
    st = daemon.master.state
    mtimes = {path: sup_zk.exists(path).mtime for path in (
        st.path("assignments", topology_id), st.path("supervisors", "sup-a"),
        st.path("supervisors", "sup-b"), st.path("workerbeats", topology_id, "sup-a-6700"))}
    age = (max(mtimes.values()) - mtimes[st.path("workerbeats", topology_id,
                                                 "sup-a-6700")]) // 1000
    # Where each has run: the leader recorded the placement with the assignment.
    started = st.assignment_info(topology_id).executor_start_time_secs

    def placed_at(sid: str, host: str, worker: str) -> list[dict]:
        return [{"supervisor_id": sid, "host": host, "port": 6700,
                 "since_secs": started[worker], "until_secs": 0}]

    # No Spark progress in this beat (a process topology's, or an earlier release's).
    no_details = {"progress": None, "history": [], "history_end_secs": 1,
                  "reported_by": "worker-0", "live": True, "details_cut": False,
                  "checkpoint": None}
    assert view == {
        "id": topology_id, "name": "wc", "status": "ACTIVE", "owner": "bob",
        "num_workers": 2,
        "workers": [
            {"worker": "worker-0", "index": 0, "supervisor_id": "sup-a", "host": "host-a",
             "port": 6700, "state": "running", "alive": True, "beat_age_secs": age,
             "backoff_secs": 0, "last_error": "", "restarts": 3, "memory_bytes": 0,
             "warm_start": False, "spark_ui_url": "",
             "placements": placed_at("sup-a", "host-a", "worker-0"),
             "version": 1, "assigned_version": 1, "components": {
                 "counts": {"batch_id": 9, "num_input_rows": 30,
                            "input_rows_per_second": 1.5, "processed_rows_per_second": 1.25},
                 "lines": {"batch_id": 4, "num_input_rows": 0, "input_rows_per_second": 0.0,
                           "processed_rows_per_second": 0.0}}},
            # Its supervisor (of an earlier release) said nothing of it, and it has not
            # beaten: starting.
            {"worker": "worker-1", "index": 1, "supervisor_id": "sup-b", "host": "host-b",
             "port": 6700, "state": "starting", "alive": False, "beat_age_secs": None,
             "backoff_secs": 0, "last_error": "", "restarts": 0, "memory_bytes": 0,
             "warm_start": False, "spark_ui_url": "",
             "placements": placed_at("sup-b", "host-b", "worker-1"),
             "version": None, "assigned_version": 1, "components": {}}],
        "warm_workers": {
            "sup-a": {"host": "host-a", "ready": 0, "starting": 0, "memory_bytes": 0},
            "sup-b": {"host": "host-b", "ready": 0, "starting": 0, "memory_bytes": 0}},
        "components": {
            "counts": {"host_ports": ["host-a:6700"], "batch_id": 9, "num_input_rows": 30,
                       "input_rows_per_second": 1.5, "processed_rows_per_second": 1.25,
                       **no_details},
            "lines": {"host_ports": ["host-a:6700"], "batch_id": 4, "num_input_rows": 0,
                      "input_rows_per_second": 0.0, "processed_rows_per_second": 0.0,
                      **no_details}},
        "errors": {"counts": [
            {"error": f"boom {i}\n  at line {i}", "time_secs": 1_700_000_000 + i,
             "host": "host-a", "port": 6700} for i in range(10, 0, -1)]},
        # Never upgraded: the submitted code, version 1, runs.
        "code_version": 1, "switch": None,
        "code_versions": [{"version": 1, "state": "running", "error": "",
                           "created_secs": st.storm_base(topology_id).launch_time_secs}],
    }

    done = cli(conf_file, "topology-info", "wc")
    assert done.exit_code == 0, done.output
    for shown in ("Workers", "Components", "Errors (10 newest per component)", "host-a:6700",
                  "boom 10", "2023-11-14 22:13:30Z", "workers 2/2 (1 running)", " running ",
                  " starting ", "code version 1"):
        assert shown in done.output

    done = cli(conf_file, "errors", "wc")
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert lines[:5] == ["counts:",
                         "  2023-11-14 22:13:30Z  host-a:6700  boom 10",
                         "        at line 10",
                         "  2023-11-14 22:13:29Z  host-a:6700  boom 9",
                         "        at line 9"]
    assert len(lines) == 1 + 10 * 2 and lines[-2:] == [
        "  2023-11-14 22:13:21Z  host-a:6700  boom 1", "        at line 1"]
    done = cli(conf_file, "errors", "wc", "--json")
    assert json.loads(done.output) == view["errors"]

    for command in ("topology-info", "errors"):
        done = cli(conf_file, command, "nope")
        assert (done.exit_code, done.output) == (1, "Error: no topology named nope\n")


def test_errors_of_a_topology_without_any(cluster):
    _, conf, conf_file, _ = cluster
    submit(conf, "quiet")
    done = cli(conf_file, "errors", "quiet")
    assert (done.exit_code, done.output) == (0, "No errors reported by quiet.\n")


# -- bundle kinds at submit ----------------------------------------------------------------

@pytest.mark.parametrize(("bundle", "message"), [
    (storm_jar(), NO_KIND_MESSAGE),
    (tar_bundle({"lib/topology.yaml": PROCESS_YAML, "README": "x"}), NO_KIND_MESSAGE),
    (tar_bundle({"topology.yaml": PROCESS_YAML, "topology.py": "def build(s, c): ..."}),
     "bundle has both topology.py and topology.yaml at its root; keep the one that should "
     "run"),
])
def test_submit_refuses_a_bundle_no_worker_can_run(cluster, bundle, message):
    daemon, _, _, _ = cluster
    with connect(daemon.address) as client:
        location = client.beginFileUpload()
        client.uploadChunk(location, bundle)
        client.finishFileUpload(location)
        with pytest.raises(storm.InvalidTopologyException) as refused:
            client.submitTopology("jar", location, "{}", storm.StormTopology(
                spouts={}, bolts={}, state_spouts={}))
    assert refused.value.msg == message
    # nothing was written: no code directory, no znode of any kind
    assert list(daemon.master.store.root.iterdir()) == []
    for sub in ("storms", "assignments", "workerbeats", "errors", "code-distributor"):
        assert daemon.master.state.zk.get_children(daemon.master.state.path(sub)) == [], sub


def test_no_kind_message_is_the_documented_one():
    assert NO_KIND_MESSAGE == ("bundle has neither topology.py (a pipeline) nor "
                               "topology.yaml (a process topology) at its root")


@pytest.mark.parametrize(("files", "kind"), [
    ({"topology.py": "", "lib/x.py": ""}, "pipeline"),
    ({"./topology.yaml": PROCESS_YAML}, "process"),
])
def test_bundle_kind(tmp_path, files, kind):
    path = tmp_path / "b.tgz"
    path.write_bytes(tar_bundle(files))
    assert bundle_kind(path, 1 << 20) == kind
    jar = tmp_path / "b.jar"
    with zipfile.ZipFile(jar, "w") as zf:
        for name, text in files.items():
            zf.writestr(name.removeprefix("./"), text)
        zf.writestr("META-INF/MANIFEST.MF", "")
    assert bundle_kind(jar, 1 << 20) == kind
    jar.write_bytes(storm_jar())
    with pytest.raises(BundleError, match="bundle has neither"):
        bundle_kind(jar, 1 << 20)


# -- path keys at submit (docs/runtime.md, "Paths in a topology's conf") -------------------

def test_submit_refuses_a_relative_checkpoint_dir_from_a_foreign_client(cluster):
    """A client that does not resolve paths (Storm's own, say) is refused, naming the key,
    and nothing is written."""
    daemon, _, _, _ = cluster
    bundle = tar_bundle({"topology.yaml": PROCESS_YAML})
    with connect(daemon.address) as client:
        for conf in ({"topology.spark.checkpoint.dir": "dev-cluster/checkpoints"},
                     {"topology.spark.conf": {"spark.sql.warehouse.dir": "~/wh"}}):
            location = client.beginFileUpload()
            client.uploadChunk(location, bundle)
            client.finishFileUpload(location)
            with pytest.raises(storm.InvalidTopologyException) as refused:
                client.submitTopology("rel", location, json.dumps(conf), storm.StormTopology(
                    spouts={}, bolts={}, state_spouts={}))
            key = next(iter(conf)) if "checkpoint" in json.dumps(conf) else \
                "topology.spark.conf.spark.sql.warehouse.dir"
            assert refused.value.msg.startswith(f"topology conf: {key!r} must be an absolute "
                                                "path or a URI"), refused.value.msg
    assert list(daemon.master.store.root.iterdir()) == []
    assert daemon.master.state.zk.get_children(daemon.master.state.path("storms")) == []


def test_cli_submit_stores_absolute_paths_and_warns_of_relative_looking_values(
        cluster, tmp_path, monkeypatch):
    daemon, _, conf_file, _ = cluster
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "topology.yaml").write_text(PROCESS_YAML)
    work = tmp_path / "work"
    (work / "data" / "in").mkdir(parents=True)
    monkeypatch.chdir(work)
    done = CliRunner().invoke(main, [
        "submit", "paths", str(bundle), "--config", str(conf_file),
        "--set", "topology.spark.checkpoint.dir=ckpt",
        "--conf", "wordcount.input.dir=data/in",      # exists here: warned of
        "--conf", "wordcount.output.dir=data/out",    # does not: no warning
        "--conf", "wordcount.remote=s3a://bucket/in"])
    assert done.exit_code == 0, done.output
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: --conf wordcount.input.dir=data/in looks like a relative path (it exists "
        "here); the pipeline runs in its own directory on a supervisor host, where it names "
        f"another place. Did you mean wordcount.input.dir={work / 'data' / 'in'}?"]
    topology_id = done.stdout.strip().splitlines()[-1]
    with connect(daemon.address) as client:
        stored = json.loads(client.getTopologyConf(topology_id))
    assert stored["topology.spark.checkpoint.dir"] == str(work / "ckpt")
    # a topology's own keys are the pipeline's business: sent as typed
    assert (stored["wordcount.input.dir"], stored["wordcount.output.dir"],
            stored["wordcount.remote"]) == ("data/in", "data/out", "s3a://bucket/in")
