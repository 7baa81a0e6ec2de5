"""The timing relations a daemon checks at start (nimbus.timing, issue 20)."""

from __future__ import annotations

import pytest

from nimbus.config import ConfigError, load_config
from nimbus.daemons.supervisor import build_supervisor
from nimbus.timing import check_timing, timing_problems


def test_the_defaults_hold():
    assert timing_problems(load_config(overrides={})) == []


@pytest.mark.parametrize(("overrides", "message"), [
    ({"supervisor.worker.timeout.secs": 30, "nimbus.task.timeout.secs": 30},
     "unsafe timing settings: supervisor.worker.timeout.secs (30) must be below "
     "nimbus.task.timeout.secs (30): a worker that stops sending status must be killed by "
     "its supervisor before the leader gives up on it and places its work elsewhere"),
    ({"supervisor.worker.start.timeout.secs": 200},
     "unsafe timing settings: supervisor.worker.start.timeout.secs (200) must be below "
     "nimbus.task.launch.secs (120): a worker that never starts must be killed by its "
     "supervisor before the leader gives up on it and places its work elsewhere"),
])
def test_a_broken_relation_is_refused_naming_its_keys(overrides, message):
    conf = load_config(overrides=overrides)
    with pytest.raises(ConfigError) as refused:
        check_timing(conf)
    assert str(refused.value) == message


def test_daemons_refuse_to_start_on_unsafe_timing(tmp_path):
    from nimbus.daemons.nimbus import NimbusDaemon

    conf = load_config(overrides={"supervisor.worker.timeout.secs": 31,
                                  "storm.local.dir": str(tmp_path / "local"),
                                  "storm.zookeeper.port": 1})
    for daemon in (NimbusDaemon, build_supervisor):
        with pytest.raises(ConfigError, match="^unsafe timing settings: "
                                              "supervisor.worker.timeout.secs \\(31\\)"):
            daemon(conf)
    assert not (tmp_path / "local").exists()  # refused before anything was made
