"""Incarnation: a process is judged dead only when that is certain."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nimbus.state.incarnation import Incarnation

BOOT = "115c8508-6270-43fa-81e8-4b055c531e8c"
NAMESPACE = "pid:[4026531836]"


def stat_line(pid: int, ticks: int, state: str = "S", name: str = "python") -> str:
    # Fields 3 to 52 of proc(5); field 22 (the start time) is the 20th after the name.
    rest = [state] + ["0"] * 18 + [str(ticks)] + ["0"] * 30
    return f"{pid} ({name}) " + " ".join(rest) + "\n"


class FakeProc:
    """A /proc with this process and the others a test adds."""

    def __init__(self, root: Path, boot: str = BOOT, namespace: str = NAMESPACE):
        self.root = root
        (root / "sys/kernel/random").mkdir(parents=True)
        (root / "sys/kernel/random/boot_id").write_text(boot + "\n")
        self.add(os.getpid(), 1000)
        (root / str(os.getpid()) / "ns").mkdir()
        os.symlink(namespace, root / str(os.getpid()) / "ns/pid")
        os.symlink(str(os.getpid()), root / "self")

    def add(self, pid: int, ticks: int, state: str = "S", name: str = "python") -> None:
        (self.root / str(pid)).mkdir(exist_ok=True)
        (self.root / str(pid) / "stat").write_text(stat_line(pid, ticks, state, name))


@pytest.fixture
def proc(tmp_path) -> FakeProc:
    return FakeProc(tmp_path / "proc")


def test_this_process_is_known_and_alive(proc):
    me = Incarnation.of_process(proc=proc.root)
    assert me == Incarnation(BOOT, NAMESPACE, os.getpid(), 1000)
    assert me.known and not me.is_dead(proc.root)


def test_a_pid_that_is_gone_or_reused_or_a_zombie_is_dead(proc):
    proc.add(4242, 500)
    assert not Incarnation(BOOT, NAMESPACE, 4242, 500).is_dead(proc.root)
    assert Incarnation(BOOT, NAMESPACE, 4243, 500).is_dead(proc.root)      # gone
    assert Incarnation(BOOT, NAMESPACE, 4242, 499).is_dead(proc.root)      # reused
    proc.add(4244, 700, state="Z")
    assert Incarnation(BOOT, NAMESPACE, 4244, 700).is_dead(proc.root)      # zombie


def test_a_command_name_with_spaces_and_parentheses_is_read(proc):
    proc.add(4245, 800, name="odd) name (x")
    assert not Incarnation(BOOT, NAMESPACE, 4245, 800).is_dead(proc.root)


def test_another_boot_or_pid_namespace_is_never_judged(proc):
    # Gone here says nothing about a process on another kernel or in another namespace.
    assert not Incarnation("another-boot", NAMESPACE, 4243, 500).is_dead(proc.root)
    assert not Incarnation(BOOT, "pid:[1]", 4243, 500).is_dead(proc.root)


def test_unknown_or_unreadable_is_never_dead(proc, tmp_path):
    assert not Incarnation("", "", 0, 0).is_dead(proc.root)        # an earlier release
    assert not Incarnation(BOOT, NAMESPACE, 4243, 0).is_dead(proc.root)
    (proc.root / "4246").mkdir()
    (proc.root / "4246" / "stat").mkdir()                           # unreadable
    assert not Incarnation(BOOT, NAMESPACE, 4246, 500).is_dead(proc.root)
    (proc.root / "4247").mkdir()
    (proc.root / "4247" / "stat").write_text("4247 (short) S 1 2\n")  # malformed
    assert not Incarnation(BOOT, NAMESPACE, 4247, 500).is_dead(proc.root)
    os.remove(proc.root / "self")
    os.symlink("1", proc.root / "self")          # a /proc of another pid namespace
    assert not Incarnation.of_process(proc=proc.root).known
    assert not Incarnation(BOOT, NAMESPACE, 4243, 500).is_dead(proc.root)
    nowhere = tmp_path / "no-proc"
    assert not Incarnation(BOOT, NAMESPACE, 4243, 500).is_dead(nowhere)
    assert not Incarnation.of_process(proc=nowhere).known


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_a_real_child_is_alive_until_it_has_ended():
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    seen = Incarnation.of_process(child.pid)
    assert seen.known and not seen.is_dead()
    child.stdin.close()
    child.wait()
    assert seen.is_dead()
