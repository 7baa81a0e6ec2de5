"""The heap freezer: survivors frozen, full collections only at a thaw, one per process."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
from waiting import wait_for

from nimbus import heap_freeze
from nimbus.config import ConfigError, load_config
from nimbus.heap_freeze import THREAD_NAME, FreezeSettings, HeapFreezer, freezer


class Cycle:
    """An object in a reference cycle: only the cyclic collector can free it."""

    def __init__(self) -> None:
        self.me = self


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def _thawed():
    """Every test starts and ends with nothing frozen (the freeze is process-wide), and
    with no daemon's freezer left running by an earlier test in this process."""
    assert heap_freeze._shared is None and heap_freeze._users == 0, \
        "an earlier test left a daemon's heap freezer running"
    gc.unfreeze()
    yield
    gc.unfreeze()


def dead_cycle() -> weakref.ref:
    cycle = Cycle()
    ref = weakref.ref(cycle)
    del cycle
    return ref


def test_a_step_frees_young_cycles_then_freezes_what_survived():
    freezer_ = HeapFreezer(FreezeSettings(60, 3600), clock=Clock())
    garbage = dead_cycle()
    kept = Cycle()
    freezer_.step()
    assert garbage() is None, "a cycle that died before the freeze is collected first"
    assert gc.get_freeze_count() > 0
    assert gc.is_tracked(kept)
    # A full collection no longer walks the frozen objects: a cycle that dies frozen
    # stays until the thaw.
    frozen = weakref.ref(kept)
    del kept
    gc.collect()
    assert frozen() is not None
    assert freezer_.full_collections == 0


def test_a_thaw_collects_cycles_that_died_frozen():
    clock = Clock()
    freezer_ = HeapFreezer(FreezeSettings(60, 3600), clock=clock)
    kept = Cycle()
    freezer_.step()
    frozen = weakref.ref(kept)
    del kept
    clock.now += 3599
    freezer_.step()
    assert frozen() is not None, "no thaw before thaw_s"
    assert freezer_.full_collections == 0
    clock.now += 1
    freezer_.step()
    assert frozen() is None
    assert freezer_.full_collections == 1
    assert gc.get_freeze_count() > 0, "frozen again after the full collection"


def test_objects_freed_by_reference_counting_are_freed_while_frozen():
    class Plain:
        pass

    plain = Plain()
    ref = weakref.ref(plain)
    HeapFreezer(FreezeSettings(60, 3600)).step()
    del plain
    assert ref() is None


def test_the_thread_is_named_and_stopping_unfreezes():
    freezer_ = HeapFreezer(FreezeSettings(60, 3600)).start()
    try:
        wait_for_freeze()
        assert THREAD_NAME in {t.name for t in threading.enumerate()}
    finally:
        freezer_.stop()
    assert THREAD_NAME not in {t.name for t in threading.enumerate()}
    assert gc.get_freeze_count() == 0


def test_disabled_never_freezes():
    freezer_ = HeapFreezer(FreezeSettings(0, 0)).start()
    freezer_.stop()
    assert THREAD_NAME not in {t.name for t in threading.enumerate()}
    assert gc.get_freeze_count() == 0


def test_one_freezer_per_process_until_its_last_user_stops():
    first = freezer(FreezeSettings(60, 3600))
    second = freezer(FreezeSettings(60, 3600))
    try:
        wait_for_freeze()
        assert [t.name for t in threading.enumerate()].count(THREAD_NAME) == 1
        first.release()
        first.release()  # twice is once
        assert THREAD_NAME in {t.name for t in threading.enumerate()}
    finally:
        second.release()
    assert THREAD_NAME not in {t.name for t in threading.enumerate()}
    assert heap_freeze._users == 0
    assert gc.get_freeze_count() == 0


def wait_for_freeze() -> None:
    wait_for(lambda: gc.get_freeze_count() > 0, 10, "the first freeze")


@pytest.mark.parametrize(("freeze", "thaw", "expected"), [
    (-1, 3600, r"must be 0 \(never freeze\) or more"),
    (60, 30, "must be at least nimbus.gc.freeze.secs"),
    (0, -1, r"'nimbus.gc.thaw.secs' must be 0 or more"),
])
def test_bad_periods_are_refused(freeze, thaw, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(overrides={"nimbus.gc.freeze.secs": freeze, "nimbus.gc.thaw.secs": thaw})
    with pytest.raises(ValueError):
        FreezeSettings(freeze, thaw)


def test_no_freeze_needs_no_thaw():
    conf = load_config(overrides={"nimbus.gc.freeze.secs": 0, "nimbus.gc.thaw.secs": 0})
    assert not FreezeSettings(conf["nimbus.gc.freeze.secs"],
                              conf["nimbus.gc.thaw.secs"]).enabled


def test_a_thaw_that_found_a_collection_under_way_is_tried_again():
    """gc.collect() does nothing while another collection runs (its finalizers may let
    other threads in): the thaw stays due, and nothing is counted."""
    clock = Clock()
    collections = {"skip": True}

    def collect() -> int:
        if collections.pop("skip", False):
            return 0  # what CPython's gc.collect() does while another one runs
        return gc.collect()

    freezer_ = HeapFreezer(FreezeSettings(60, 3600), clock=clock, collect=collect)
    clock.now += 3600
    freezer_.step()
    assert freezer_.full_collections == 0
    freezer_.step()
    assert freezer_.full_collections == 1


def test_a_stop_that_outwaits_its_join_still_leaves_nothing_frozen(caplog):
    """A step still collecting when stop() gives up joining must not freeze afterwards."""
    started, release = threading.Event(), threading.Event()

    def slow_collect() -> int:
        started.set()
        release.wait(10)
        return gc.collect()

    freezer_ = HeapFreezer(FreezeSettings(60, 3600), collect=slow_collect).start()
    assert started.wait(10)
    stopper = threading.Thread(target=freezer_.stop, kwargs={"join_timeout": 0.1},
                               name="test-stopper")
    with caplog.at_level("WARNING", logger="nimbus.background_loop"):
        stopper.start()
        wait_for(lambda: any("did not stop" in r.getMessage() for r in caplog.records),
                 10, "the join to give up")
    release.set()
    stopper.join(10)
    assert not stopper.is_alive()
    wait_for(lambda: THREAD_NAME not in {t.name for t in threading.enumerate()}, 10,
             "the freezer's thread to end")
    assert gc.get_freeze_count() == 0


@pytest.mark.zookeeper
def test_a_nimbus_freezes_while_it_runs_and_leaves_nothing_frozen(zk_server, zk_root,
                                                                   tmp_path, monkeypatch):
    """Also when its stop fails part-way: the freezer is released all the same."""
    from nimbus.daemons.nimbus import NimbusDaemon
    from nimbus.dev.zookeeper import free_port

    host, _, zk_port = zk_server.hosts.rpartition(":")
    port = free_port()
    conf = load_config(overrides={
        "storm.zookeeper.servers": [host], "storm.zookeeper.port": int(zk_port),
        "storm.zookeeper.root": zk_root, "nimbus.thrift.port": port,
        "nimbus.seeds": [f"127.0.0.1:{port}"], "storm.local.dir": str(tmp_path / "local")})
    daemon = NimbusDaemon(conf)
    daemon.start()
    try:
        wait_for_freeze()
        assert THREAD_NAME in {t.name for t in threading.enumerate()}
    finally:
        def broken_close() -> None:
            type(daemon.master).close(daemon.master)
            raise RuntimeError("close failed")

        monkeypatch.setattr(daemon.master, "close", broken_close)
        with pytest.raises(RuntimeError, match="close failed"):
            daemon.stop()
    assert THREAD_NAME not in {t.name for t in threading.enumerate()}
    assert gc.get_freeze_count() == 0
