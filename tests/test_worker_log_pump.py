"""The worker's log pump (nimbus/worker/log_pump.py) and the time index it keeps
(nimbus/state/worker_logs.py).

The pump takes over a process's standard output and error, so each test runs it in a
process of its own: a real pipe, real children writing into it, real files rotated.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nimbus.state.worker_logs import (
    INDEX_RECORD,
    INDEX_SPAN_S,
    LogSettings,
    generation_name,
    generations,
    index_name,
    offset_since,
    parse_log_path,
)
from nimbus.worker.log_pump import LogPump


def _run(tmp_path: Path, body: str, max_bytes: int = 2000, backups: int = 2) -> Path:
    """Run ``body`` in a process whose pump writes into ``tmp_path/logs``."""
    logs = tmp_path / "logs"
    script = textwrap.dedent(f"""
        import os, subprocess, sys, time
        from pathlib import Path
        from nimbus.state.worker_logs import LogSettings
        from nimbus.worker.log_pump import LogPump
        pump = LogPump(Path({str(logs)!r}), LogSettings({max_bytes}, {backups})).start()
    """) + textwrap.dedent(body) + "\npump.stop()\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == b"" and done.stderr == b"", "everything went to the log"
    return logs


def _lines_of(logs: Path) -> list[str]:
    """Every line kept, oldest file first."""
    text = "".join((logs / generation_name(g)).read_text() for g in generations(logs))
    return text.splitlines()


def test_output_of_the_process_and_its_children_is_rotated_at_line_ends(tmp_path):
    logs = _run(tmp_path, """
        for i in range(200):
            print(f"line {i:04d} " + "x" * 40, flush=True)
            if i % 50 == 0:
                subprocess.run(["sh", "-c", f"echo child {i}; echo child-err {i} >&2"])
        os.write(2, b"raw stderr\\n")
    """)
    assert generations(logs) == [2, 1, 0]  # two backups kept, the older ones gone
    for generation in (2, 1, 0):
        data = (logs / generation_name(generation)).read_bytes()
        assert 0 < len(data) <= 2000 and data.endswith(b"\n")
        if generation:  # a rotated file is full up to the last line that fitted
            assert len(data) > 2000 - 60
    lines = _lines_of(logs)
    numbered = [int(line.split()[1]) for line in lines if line.startswith("line ")]
    assert numbered == list(range(numbered[0], 200)), "in order, none lost"
    assert "child 150" in lines and "child-err 150" in lines
    assert lines[-1] == "raw stderr"


def test_a_line_longer_than_a_file_is_cut_and_nothing_is_lost(tmp_path):
    logs = _run(tmp_path, """
        print("before", flush=True)
        print("y" * 2500, flush=True)
        print("after", flush=True)
    """, backups=3)
    sizes = [(logs / generation_name(g)).stat().st_size for g in generations(logs)]
    assert max(sizes) <= 2000
    assert "".join(_lines_of(logs)) == "before" + "y" * 2500 + "after"


def test_no_backups_keeps_the_current_file_only(tmp_path):
    logs = _run(tmp_path, """
        for i in range(100):
            print(f"line {i:04d} " + "x" * 40, flush=True)
    """, backups=0)
    assert generations(logs) == [0]
    assert sorted(p.name for p in logs.iterdir()) == ["worker.log", "worker.log.idx"]


def test_a_new_process_appends_and_its_index_goes_on(tmp_path):
    _run(tmp_path, 'print("first process", flush=True)')
    logs = _run(tmp_path, 'time.sleep(1.1); print("second process", flush=True)')
    assert _lines_of(logs) == ["first process", "second process"]
    index = (logs / index_name("worker.log")).read_bytes()
    records = [INDEX_RECORD.unpack_from(index, i) for i in range(0, len(index), 16)]
    assert [offset for offset, _ in records] == [0, len("first process\n")]
    assert records[1][1] - records[0][1] >= 1.0


def test_a_warm_workers_log_moves_to_its_slot(tmp_path):
    slot = tmp_path / "slot"
    slot.mkdir()
    (slot / "worker.log").write_text("the slot's earlier worker\n")
    logs = _run(tmp_path, f"""
        print("warm and waiting", flush=True)
        pump.move_to(Path({str(slot)!r}))
        print("taken", flush=True)
    """)
    assert _lines_of(slot) == ["the slot's earlier worker", "warm and waiting", "taken"]
    assert (logs / "worker.log").read_text() == "warm and waiting\n"


def _pump(tmp_path: Path, clock: list[float]) -> LogPump:
    """A pump that is not started: its writes driven by the test, on a fake clock."""
    pump = LogPump(tmp_path, LogSettings(max_bytes=1 << 20, backups=1),
                   clock=lambda: clock[0])
    pump._open()
    return pump


def test_the_index_dates_writes_and_offset_since_never_starts_late(tmp_path):
    clock = [1000.0]
    pump = _pump(tmp_path, clock)
    written: list[tuple[float, int]] = []   # (time, offset) of every write
    for step in range(200):
        clock[0] = 1000.0 + step * 0.7       # a write every 0.7 s, 30 bytes each
        written.append((clock[0], pump._size))
        pump._write(f"{step:05d} {'z' * 23}\n".encode())
    index_fd = os.open(tmp_path / "worker.log.idx", os.O_RDONLY)
    try:
        modified = clock[0]
        for cutoff in [990.0, 1000.0, 1000.3, 1033.5, 1090.0, 1139.0, 1139.3]:
            offset = offset_since(index_fd, cutoff, modified)
            first_due = next((o for t, o in written if t >= cutoff), None)
            assert offset is not None and offset <= first_due
            skipped = [t for t, o in written if o >= offset and t < cutoff]
            assert all(cutoff - t < INDEX_SPAN_S for t in skipped), "at most 10 s early"
        assert offset_since(index_fd, modified + 0.5, modified) is None
        assert offset_since(None, 5.0, modified) == 0   # no index: the whole file
        assert offset_since(None, modified + 1, modified) is None
    finally:
        os.close(index_fd)
    # A quiet writer: a record per 10 s at most for small writes, so the index stays
    # small beside its file.
    records = os.path.getsize(tmp_path / "worker.log.idx") // INDEX_RECORD.size
    assert records <= 200 * 0.7 / INDEX_SPAN_S + 2 + 6000 // 1024


def test_an_index_that_is_full_rotates_its_file(tmp_path, monkeypatch):
    monkeypatch.setattr("nimbus.worker.log_pump.INDEX_MAX_RECORDS", 3)
    clock = [0.0]
    pump = _pump(tmp_path, clock)
    for step in range(7):
        clock[0] = step * 20.0
        pump._write(b"quiet\n")
    assert generations(tmp_path) == [1, 0]
    assert (tmp_path / "worker.log").read_text() == "quiet\n"


@pytest.mark.parametrize("path, problem", [
    ("/etc/passwd", "relative to the log root"),
    ("../x-1-1/6700/worker.log", "<topology-id>/<port>/<file>"),
    ("..%2Fx-1-1/6700/worker.log", "not a topology id"),
    ("w-1-1/6700/../../../etc/passwd", "<topology-id>/<port>/<file>"),
    ("w-1-1/6700/..", "not a log file name"),
    ("w-1-1/6700/.worker.log.idx", "not a log file name"),
    ("w-1-1/06700/worker.log", "not a port"),
    ("w-1-1/70000/worker.log", "not a port"),
    ("w-1-1/6700/worker.log\0.txt", "NUL"),
    ("w-1-1//worker.log", "not a port"),
    ("w-1-1/6700/" + "a" * 200, "not a log file name"),
    ("w-1-1/6700/" + "a" * 600, "at most 512"),
    ("w..x-1-1/6700/worker.log", "not a topology id"),
])
def test_log_paths_name_a_file_two_levels_below_the_root_only(path, problem):
    with pytest.raises(ValueError, match=problem):
        parse_log_path(path)


def test_a_good_log_path():
    assert parse_log_path("word-count-1-1700000000/6700/worker.log.3") == \
        ("word-count-1-1700000000", 6700, "worker.log.3")
