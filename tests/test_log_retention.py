"""A slot's log directory and its record (nimbus/supervisor/log_dirs.py), and the sweep
that removes logs no worker wrote to for logviewer.cleanup.age.mins
(nimbus/supervisor/log_sweep.py): real directories, a fake clock."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from nimbus.config import ConfigError, load_config
from nimbus.state.worker_logs import META_FILE
from nimbus.supervisor.identity import check_log_conf
from nimbus.supervisor.log_dirs import LogDirs, LogMeta
from nimbus.supervisor.log_sweep import LogSweeper, sweep_period

ALPHA, BETA = "alpha-1-100", "beta-2-200"
NOW = 1_000_000.0
RETENTION_S = 3600.0


def _slot(root: Path, topology_id: str, port: int, age_s: float) -> Path:
    directory = root / topology_id / str(port)
    directory.mkdir(parents=True)
    for name in ("worker.log", "worker.log.idx", "worker.log.1"):
        (directory / name).write_text("x\n")
        os.utime(directory / name, (NOW - age_s, NOW - age_s))
    os.utime(directory, (NOW - age_s, NOW - age_s))
    return directory


def _sweeper(root: Path, in_use: set[tuple[str, int]] | None = None) -> LogSweeper:
    return LogSweeper(root, RETENTION_S, lambda: set(in_use or ()), clock=lambda: NOW)


def test_logs_nobody_writes_are_removed_after_the_retention_and_not_before(tmp_path):
    (tmp_path / ALPHA).mkdir()
    LogMeta(ALPHA, submitter="alice").save(tmp_path / ALPHA / META_FILE)
    old = _slot(tmp_path, ALPHA, 6700, RETENTION_S + 5)
    fresh = _slot(tmp_path, ALPHA, 6701, RETENTION_S - 5)
    used = _slot(tmp_path, BETA, 6700, RETENTION_S * 10)   # a running worker's, silent
    assert _sweeper(tmp_path, {(BETA, 6700)}).sweep() == [old]
    assert not old.exists() and fresh.exists() and used.exists()
    assert (tmp_path / ALPHA / META_FILE).exists(), "its record stays with its last slot"
    # A file written inside the slot keeps it, whatever the directory's own time.
    os.utime(fresh / "worker.log", (NOW, NOW))
    os.utime(fresh, (NOW - RETENTION_S * 2, NOW - RETENTION_S * 2))
    assert _sweeper(tmp_path).sweep() == [used]
    for entry in [*fresh.iterdir(), fresh]:
        os.utime(entry, (NOW - RETENTION_S * 2,) * 2)
    assert _sweeper(tmp_path).sweep() == [fresh]
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "the topologies go with them"


def test_the_sweep_never_follows_a_link(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_text("keep me\n")
    os.utime(elsewhere, (NOW - RETENTION_S * 2,) * 2)
    root = tmp_path / "root"
    slot = _slot(root, ALPHA, 6700, RETENTION_S * 2)
    (slot / "escape").symlink_to(elsewhere)
    for entry in (slot / "escape", slot):
        os.utime(entry, (NOW - RETENTION_S * 2,) * 2, follow_symlinks=False)
    (root / "gamma-3-300").symlink_to(elsewhere)              # a topology that is a link
    (root / BETA).mkdir()
    (root / BETA / "6700").symlink_to(elsewhere)              # a slot that is a link
    os.utime(root / BETA / "6700", (NOW - RETENTION_S * 2,) * 2, follow_symlinks=False)
    _sweeper(root).sweep()
    assert not slot.exists()
    assert (elsewhere / "precious").read_text() == "keep me\n"
    assert (root / "gamma-3-300").is_symlink()   # not a topology's directory: not ours
    assert not (root / BETA).exists(), "the link was removed, not followed"


def test_a_worker_starting_meanwhile_keeps_its_directory_and_record(tmp_path):
    dirs = LogDirs(tmp_path)
    old = _slot(tmp_path, ALPHA, 6700, RETENTION_S * 2)
    started = threading.Event()
    sweeper = LogSweeper(tmp_path, RETENTION_S, lambda: set(), lock=dirs.lock,
                         clock=lambda: NOW)

    def start_worker() -> None:
        with dirs.lock:   # as the monitor thread would, while the sweep waits
            started.set()
        dirs.prepare(ALPHA, 6701, 0, {"topology.submitter.user": "alice"})

    thread = threading.Thread(target=start_worker)
    thread.start()
    started.wait(5)
    thread.join(5)
    sweeper.sweep()
    assert not old.exists()
    assert (tmp_path / ALPHA / "6701").is_dir()
    assert LogMeta.load(tmp_path / ALPHA / META_FILE).submitter == "alice"


def test_the_record_names_the_readers_and_every_worker_that_wrote_in_a_slot(tmp_path):
    dirs = LogDirs(tmp_path)
    conf = {"topology.submitter.user": "alice", "topology.users": ["bob"],
            "topology.readonly.users": ["carol"], "topology.workers": 2}
    path = dirs.prepare(ALPHA, 6700, 0, conf)
    assert path == tmp_path / ALPHA / "6700" / "worker.log"
    dirs.prepare(ALPHA, 6700, 1, conf)   # rebalanced: another worker in the same slot
    dirs.prepare(ALPHA, 6701, 0, conf)
    meta = LogMeta.load(tmp_path / ALPHA / META_FILE)
    assert (meta.submitter, meta.users, meta.readonly_users, meta.ports) == (
        "alice", ["bob"], ["carol"], {"6700": [0, 1], "6701": [0]})
    assert (tmp_path / ALPHA / META_FILE).stat().st_mode & 0o077 == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_with_accounts_a_slot_is_its_topologys_and_the_rest_the_supervisors(tmp_path):
    dirs = LogDirs(tmp_path / "root", run_as_user=True)
    dirs.prepare(ALPHA, 6700, 0, {}, owner=(65534, 65534))
    slot = tmp_path / "root" / ALPHA / "6700"
    assert (slot.stat().st_uid, slot.stat().st_mode & 0o777) == (65534, 0o700)
    for directory in (tmp_path / "root", tmp_path / "root" / ALPHA):
        assert (directory.stat().st_uid, directory.stat().st_mode & 0o777) == (0, 0o711)


@pytest.mark.parametrize("text", ["", "{", "[]", '{"topology_id": 3}', "\xff"])
def test_an_unusable_record_reads_as_none(tmp_path, text):
    (tmp_path / META_FILE).write_text(text, errors="surrogateescape")
    assert LogMeta.load(tmp_path / META_FILE) is None


def test_a_record_with_odd_fields_keeps_what_it_can(tmp_path):
    (tmp_path / META_FILE).write_text(json.dumps({
        "topology_id": ALPHA, "users": "bob", "ports": {"6700": [0, "x", True, 2]}}))
    meta = LogMeta.load(tmp_path / META_FILE)
    assert (meta.users, meta.ports) == ([], {"6700": [0, 2]})


def test_the_sweep_period_follows_the_retention():
    assert sweep_period(0) == 1.0
    assert sweep_period(3) == 1.0
    assert sweep_period(600) == 60.0
    assert sweep_period(7 * 24 * 3600) == 600.0


@pytest.mark.parametrize("overrides, message", [
    ({"supervisor.worker.log.max.mb": 0}, "must be at least"),
    ({"supervisor.worker.log.backups": -1}, "must be 0 to 1000"),
    ({"supervisor.worker.log.backups": 1001}, "must be 0 to 1000"),
    ({"logviewer.cleanup.age.mins": -1}, "must be >= 0"),
])
def test_log_settings_a_worker_cannot_use_fail_the_supervisors_start(overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_log_conf(load_config(overrides=overrides))


def test_a_logviewer_port_must_be_a_port():
    with pytest.raises(ConfigError, match="logviewer.port"):
        load_config(overrides={"logviewer.port": 70000})
