"""``nimbus-ha upgrade``, ``rollback`` and ``history`` (nimbus/cli.py) against a fake
client: their options, how they follow a switch and the exit status they end with, the
history table, topology-info's version lines, and submit's warning about a Spark
file-sink log left by another query. The real thing, against a cluster, is in
integration/."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from thriftpy2.thrift import TApplicationException

from nimbus import cli
from nimbus.thrift import storm
from nimbus.thrift.client import NimbusUnavailableError

TID = "wc-3-1700000000"
T0 = 1_700_000_000


def entry(version: int, state: str, error: str = "", submitter: str = "alice") -> dict:
    return {"version": version, "sha256": f"{version:x}" * 64, "submitter": submitter,
            "created_secs": T0 + 100 * version, "state": state, "error": error}


def switch(kind: str, frm: int, to: int, switched: list[str], strategy: str = "all"
           ) -> dict:
    return {"kind": kind, "from": frm, "to": to, "strategy": strategy,
            "started_secs": T0 + 1000, "deadline_secs": 4_000_000_000, "by": "alice",
            "switched": switched}


def history(running: int, versions: list[dict], sw: dict | None = None) -> dict:
    return {"topology_id": TID, "name": "wc", "running": running, "switch": sw,
            "versions": sorted(versions, key=lambda e: -e["version"])}


class FakeClient:
    """Stands for NimbusClient: answers history() with ``histories`` in turn (the last
    one for ever), records the calls that change something."""

    def __init__(self, histories: list[Any] | None = None, workers: int = 3,
                 version: int = 3) -> None:
        self.histories = list(histories or [])
        self.calls: list[tuple[Any, ...]] = []
        self.workers = workers
        self.version = version
        self.looks = 0

    def upgrade(self, name: str, bundle: Any, topology_conf: dict, strategy: str = "all"
                ) -> dict:
        self.calls.append(("upgrade", name, bundle, topology_conf, strategy))
        return {"topology_id": TID, "version": self.version}

    def rollback(self, name: str, version: int | None = None) -> dict:
        self.calls.append(("rollback", name, version))
        return {"topology_id": TID, "version": version or 1}

    def submit(self, name: str, bundle: Any, topology_conf: dict, progress: Any = None,
               active: bool = True) -> str:
        self.calls.append(("submit", name, topology_conf))
        return TID

    def history(self, name: str) -> dict:
        self.looks += 1
        answer = self.histories.pop(0) if len(self.histories) > 1 else self.histories[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def topology_view(self, name: str) -> dict:
        return {"workers": [{"worker": f"worker-{i}", "version": self.worker_version}
                            for i in range(self.workers)]}

    worker_version: int | None = None   # what topology-info says each worker runs


@pytest.fixture
def fake(monkeypatch):
    made = FakeClient()
    monkeypatch.setattr("nimbus.thrift.client.NimbusClient", lambda *a, **k: made)
    monkeypatch.setattr(cli, "SWITCH_POLL_S", 0.0)
    return made


@pytest.fixture
def bundle(tmp_path) -> Path:
    directory = tmp_path / "v3"
    directory.mkdir()
    (directory / "topology.yaml").write_text('command: ["sleep", "3600"]\n')
    return directory


def run(*args: str):
    return CliRunner().invoke(cli.main, list(args))


def test_upgrade_packs_and_sends_as_submit_and_waits_for_each_worker(fake, bundle, tmp_path):
    fake.histories = [
        history(2, [entry(1, "previous"), entry(2, "running"), entry(3, "switching")],
                switch("upgrade", 2, 3, [], "rolling")),
        history(2, [entry(1, "previous"), entry(2, "running"), entry(3, "switching")],
                switch("upgrade", 2, 3, ["worker-0"], "rolling")),
        history(2, [entry(1, "previous"), entry(2, "running"), entry(3, "switching")],
                switch("upgrade", 2, 3, ["worker-0", "worker-1", "worker-2"], "rolling")),
        history(3, [entry(1, "old"), entry(2, "previous"), entry(3, "running")])]
    done = run("upgrade", "wc", str(bundle), "--conf", "wordcount.trigger.secs=2",
               "--conf", f"wordcount.output.dir={tmp_path / 'out'}",
               "--set", "topology.upgrade.timeout.secs=600", "--set", "nimbus.seeds=[h:1]",
               "--strategy", "rolling")
    assert done.exit_code == 0, done.output
    ((verb, name, sent, conf, strategy),) = fake.calls
    assert (verb, name, sent, strategy) == ("upgrade", "wc", bundle, "rolling")
    # What the command sets, laid over the running version's conf by the leader: --conf
    # values (YAML) and --set topology.* keys, not every default (topology.workers...).
    assert conf == {"wordcount.trigger.secs": 2, "wordcount.output.dir": str(tmp_path / "out"),
                    "topology.upgrade.timeout.secs": 600}
    lines = done.output.splitlines()
    assert lines[0] == f"uploaded version 3 of wc ({TID})"
    assert lines[1].startswith("upgrade of wc from version 2 to 3: one worker at a time, "
                               "rolled back if not done by ")
    assert lines[2:] == ["  worker-0 runs version 3 (1/3)", "  worker-1 runs version 3 (2/3)",
                         "  worker-2 runs version 3 (3/3)", "wc runs version 3"]


def test_workers_that_switched_between_two_looks_are_told_too(fake, bundle):
    """The switch completed (and its record with it) before the next look: the workers
    it switched meanwhile are those topology-info shows on the new version."""
    fake.histories = [
        history(2, [entry(2, "running"), entry(3, "switching")],
                switch("upgrade", 2, 3, ["worker-1"])),
        history(3, [entry(2, "previous"), entry(3, "running")])]
    fake.workers, fake.worker_version = 3, 3
    done = run("upgrade", "wc", str(bundle))
    assert done.exit_code == 0, done.output
    assert done.output.splitlines()[2:] == [
        "  worker-1 runs version 3 (1/3)", "  worker-0 runs version 3 (2/3)",
        "  worker-2 runs version 3 (3/3)", "wc runs version 3"]


def test_upgrade_refuses_what_submit_refuses_before_sending(fake, tmp_path):
    done = run("upgrade", "wc", str(tmp_path / "missing"))
    assert done.exit_code == 1 and "no such file or directory" in done.output
    bad = run("upgrade", "wc", str(tmp_path), "--conf", "novalue")
    assert bad.exit_code == 1 and "--conf expects KEY=VALUE" in bad.output
    choice = run("upgrade", "wc", str(tmp_path), "--strategy", "sideways")
    assert choice.exit_code == 2 and "sideways" in choice.output
    assert fake.calls == []


def test_a_failed_version_rolled_back_exits_1_with_its_error(fake, bundle):
    error = "ValueError: build() raised \x1b[2Jboom"
    fake.histories = [
        history(2, [entry(2, "running"), entry(3, "switching")], switch("upgrade", 2, 3, [])),
        history(2, [entry(2, "running"), entry(3, "failed", error)],
                switch("rollback", 3, 2, [])),
        history(2, [entry(2, "running"), entry(3, "failed", error)],
                switch("rollback", 3, 2, ["worker-0"])),
        history(2, [entry(2, "running"), entry(3, "failed", error)])]
    done = run("upgrade", "wc", str(bundle))
    assert done.exit_code == 1, done.output
    out = done.output
    assert "version 3 of wc failed: ValueError: build() raised ?[2Jboom" in out, \
        "the recorded error, its control characters shown, not obeyed"
    assert "rolling wc back to version 2" in out
    assert "  worker-0 is back on version 2 (1/3)" in out
    assert out.rstrip().endswith("wc runs version 2")


def test_a_switch_over_before_the_first_look_is_judged_by_the_history(fake, bundle):
    fake.histories = [history(2, [entry(2, "running"), entry(3, "failed", "checkpoint "
                                                                         "refused")])]
    done = run("upgrade", "wc", str(bundle))
    assert done.exit_code == 1
    assert "version 3 of wc is failed: checkpoint refused" in done.output
    fake.histories = [history(3, [entry(2, "previous"), entry(3, "running")])]
    assert run("upgrade", "wc", str(bundle)).exit_code == 0


def test_no_wait_returns_once_the_leader_took_it(fake, bundle):
    done = run("upgrade", "wc", str(bundle), "--no-wait")
    assert done.exit_code == 0
    assert done.output.splitlines() == [
        f"uploaded version 3 of wc ({TID})",
        "switching its workers (all); follow it with `nimbus-ha history wc`"]
    assert fake.looks == 0


def test_timeout_exits_2_and_says_the_switch_goes_on(fake, bundle):
    fake.histories = [history(2, [entry(2, "running"), entry(3, "switching")],
                              switch("upgrade", 2, 3, ["worker-0"]))]
    done = run("upgrade", "wc", str(bundle), "--timeout", "0.2")
    assert done.exit_code == 2
    assert "the switch goes on (see `nimbus-ha history wc`)" in done.output


def test_waiting_rides_out_a_nimbus_that_does_not_answer(fake, bundle):
    fake.histories = [
        NimbusUnavailableError("no leader answered within 30s"),
        TApplicationException(TApplicationException.INTERNAL_ERROR,
                              "this nimbus cannot read the cluster state now"),
        history(3, [entry(2, "previous"), entry(3, "running")])]
    done = run("upgrade", "wc", str(bundle))
    assert done.exit_code == 0, done.output
    assert done.output.count("still waiting") == 1


def test_a_switch_not_visible_yet_is_waited_for(fake, bundle, monkeypatch):
    """A nimbus answering from a view a moment behind: version 3 is not listed yet."""
    fake.histories = [history(2, [entry(2, "running")]),
                      history(2, [entry(2, "running")]),
                      history(3, [entry(2, "previous"), entry(3, "running")])]
    assert run("upgrade", "wc", str(bundle)).exit_code == 0
    monkeypatch.setattr(cli, "SWITCH_UNSEEN_S", 0.0)
    fake.histories = [history(2, [entry(2, "running")])]
    gone = run("upgrade", "wc", str(bundle))
    assert gone.exit_code == 1 and "version 3 of wc is no longer kept" in gone.output


def test_nimbus_errors_are_one_line_and_exit_1(fake, bundle, monkeypatch):
    def refuse(*args: Any, **kwargs: Any) -> dict:
        raise storm.InvalidTopologyException(
            msg="wc is switching from version 2 to 3: upgrade refused until it ends")

    monkeypatch.setattr(fake, "upgrade", refuse)
    done = run("upgrade", "wc", str(bundle))
    assert (done.exit_code, done.output) == (
        1, "Error: wc is switching from version 2 to 3: upgrade refused until it ends\n")
    monkeypatch.setattr(fake, "history", lambda name: (_ for _ in ()).throw(
        storm.NotAliveException(msg="no topology named nope")))
    missing = run("history", "nope")
    assert (missing.exit_code, missing.output) == (1, "Error: no topology named nope\n")


def test_rollback_to_a_version_and_by_default(fake):
    fake.histories = [
        history(3, [entry(2, "previous"), entry(3, "running")],
                switch("rollback", 3, 2, ["worker-0"])),
        history(2, [entry(2, "running"), entry(3, "rolled back")])]
    done = run("rollback", "wc", "--to", "2")
    assert done.exit_code == 0, done.output
    assert fake.calls == [("rollback", "wc", 2)]
    assert done.output.splitlines() == [
        f"switching wc ({TID}) to version 2",
        "rollback of wc from version 3 to 2: all workers at once",
        "  worker-0 runs version 2 (1/3)", "wc runs version 2"]
    fake.calls.clear()
    assert run("rollback", "wc", "--no-wait").exit_code == 0
    assert fake.calls == [("rollback", "wc", None)]
    assert run("rollback", "wc", "--to", "0").exit_code == 2   # not a version


def test_a_rollback_that_fails_exits_1(fake, monkeypatch):
    # Its target was listed before: what the history says counts once the switch could
    # have shown (here at once).
    monkeypatch.setattr(cli, "SWITCH_UNSEEN_S", 0.0)
    fake.histories = [history(3, [entry(1, "failed", "Spark refused the checkpoint"),
                                  entry(3, "running")])]
    done = run("rollback", "wc", "--to", "1")
    assert done.exit_code == 1
    assert "version 1 of wc is failed: Spark refused the checkpoint" in done.output
    assert "wc runs version 3" in done.output


def test_history_table_and_json(fake):
    data = history(2, [entry(1, "old"), entry(2, "running"),
                       entry(3, "failed", "Traceback (most recent call last):\n  boom"),
                       entry(4, "switching", submitter="bob")],
                   switch("upgrade", 2, 4, ["worker-1"], "rolling"))
    data["versions"][3]["created_secs"] = 0   # unknown
    fake.histories = [data]
    done = run("history", "wc")
    assert done.exit_code == 0, done.output
    assert done.output.splitlines() == [
        f"wc ({TID}): version 2 runs",
        "VERSION  STATE        SUBMITTED (UTC)       BY     SHA256        ERROR",
        "      4  switching    2023-11-14 22:20:00Z  bob    444444444444  -",
        "      3  failed       2023-11-14 22:18:20Z  alice  333333333333  "
        "Traceback (most recent call last):",
        "      2  running      2023-11-14 22:16:40Z  alice  222222222222  -",
        "      1  old          -                     alice  111111111111  -",
        "switch under way: upgrade from version 2 to 4 (rolling), started "
        "2023-11-14 22:30:00Z by alice, deadline 2096-10-02 07:06:40Z; switched: worker-1"]
    as_json = run("history", "wc", "--json")
    assert json.loads(as_json.output) == data


def test_topology_info_shows_the_version_and_a_switch(fake, monkeypatch):
    from nimbus.state.runtime_view import version_facts

    info = {"id": TID, "name": "wc", "status": "ACTIVE", "uptime_secs": 5, "num_workers": 2,
            "workers": [], "warm_workers": {}, "components": {}, "errors": {},
            "code_version": 2, "switch": switch("upgrade", 2, 4, ["worker-1"]),
            "code_versions": [{"version": 4, "state": "switching", "error": "",
                               "created_secs": 1},
                              {"version": 3, "state": "failed", "error": "boom\nmore",
                               "created_secs": 1},
                              {"version": 2, "state": "running", "error": "",
                               "created_secs": 1}]}
    worker = {"worker": "worker-0", "host": "h", "port": 6700, "supervisor_id": "s",
              "state": "running", "alive": True, "backoff_secs": 0, "uptime_secs": 1,
              "restarts": 0,
              "warm_start": False, "memory_bytes": 0, "components": {}, "last_error": "",
              "version": 2, "assigned_version": 4}
    info["workers"] = [worker, {**worker, "worker": "worker-1", "version": 4}]
    monkeypatch.setattr(fake, "topology_view", lambda name: info, raising=False)
    lines = cli.version_lines(info)
    assert lines[0] == "code version 2"
    assert lines[1].startswith("switch under way: upgrade from version 2 to 4 (all), 1 of "
                               "2 workers switched, deadline ")
    assert lines[2] == "version 3 failed: boom"
    assert cli.version_lines({k: v for k, v in info.items() if k != "code_version"}) == []
    assert cli.version_lines({**info, "switch": None, **version_facts(None)}) == [
        "code version 1"]
    done = run("topology-info", "wc")
    assert done.exit_code == 0, done.output
    assert "code version 2" in done.output and "2 -> 4" in done.output


# -- submit's warning ------------------------------------------------------------------
def sink_output(tmp_path: Path) -> Path:
    """An output directory a file sink wrote: its _spark_metadata log holds batches."""
    out = tmp_path / "out"
    (out / "_spark_metadata").mkdir(parents=True)
    (out / "_spark_metadata" / "0").write_text('v1\n{"path":"part-0"}\n')
    return out


def test_submit_warns_of_a_sink_log_written_by_another_checkpoint(fake, bundle, tmp_path):
    out = sink_output(tmp_path)
    done = CliRunner().invoke(cli.main, ["submit", "wc", str(bundle), "--conf",
                                         f"wordcount.output.dir={out}"])
    assert done.exit_code == 0, done.output
    assert done.stdout == f"{TID}\n", "a warning, not an error: the submit goes on"
    warning = done.stderr
    assert f"wordcount.output.dir={out} holds a Spark file-sink log " \
           f"({out / '_spark_metadata'})" in warning
    assert "another query's checkpoint" in warning
    assert "nimbus-ha upgrade" in warning and "keeping its checkpoint" in warning
    assert "this check looks at paths as this host sees them" in warning.lower()
    assert fake.calls == [("submit", "wc", fake.calls[0][2])]


@pytest.mark.parametrize("value", ["{out}", "file:{out}", "file://{out}", "{out}/"])
def test_sink_logs_are_found_in_any_string_value_nested_or_a_file_uri(tmp_path, value):
    out = sink_output(tmp_path)
    found = cli.spark_sink_logs({"topology.spark.conf": {"x.path": value.format(out=out)},
                                 "n": 3, "list": ["a", value.format(out=out)]})
    assert [(key, path) for key, _value, path in found] == [
        ("topology.spark.conf.x.path", Path(value.format(out=out).removeprefix(
            "file://").removeprefix("file:"))), ("list", found[1][2])]


def test_no_warning_for_clean_relative_or_remote_paths(fake, bundle, tmp_path, monkeypatch):
    (tmp_path / "fresh").mkdir()
    sink_output(tmp_path / "elsewhere")
    monkeypatch.chdir(tmp_path / "elsewhere")   # "out" here is relative: not checked
    assert cli.spark_sink_logs({"a": str(tmp_path / "fresh"), "b": "out",
                                "c": "s3a://bucket/out", "d": "hdfs:///out",
                                "e": "file://otherhost/out", "f": "x\n/y",
                                "g": str(tmp_path / "nope")}) == []
    done = CliRunner().invoke(cli.main, ["submit", "wc", str(bundle), "--conf",
                                         f"wordcount.output.dir={tmp_path / 'fresh'}"])
    assert done.exit_code == 0 and "file-sink log" not in done.stderr


def test_tar_bundles_are_sent_as_they_are(fake, tmp_path):
    archive = tmp_path / "v3.tar"
    with tarfile.open(archive, "w") as tf:
        data = b'command: ["sleep", "1"]\n'
        info = tarfile.TarInfo("topology.yaml")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    assert run("upgrade", "wc", str(archive), "--no-wait").exit_code == 0
    assert fake.calls[0][2] == archive
