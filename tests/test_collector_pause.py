"""A client decodes with the cyclic collector paused (nimbus/thrift/collector_pause.py)."""

from __future__ import annotations

import gc
import threading

import pytest
from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.transport import TMemoryBuffer

from nimbus.thrift import storm
from nimbus.thrift.collector_pause import QuietDecoding, collector_paused


@pytest.fixture
def collections():
    """The number of collections started, counted while the test runs."""
    started = []

    def probe(phase, info):
        if phase == "start":
            started.append(info["generation"])

    gc.callbacks.append(probe)
    yield started
    gc.callbacks.remove(probe)


def encoded_cluster_summary(topologies: int) -> bytes:
    summary = storm.ClusterSummary(supervisors=[], nimbus_uptime_secs=1, topologies=[
        storm.TopologySummary(id=f"t-{i}-1", name=f"t-{i}", num_tasks=1, num_executors=1,
                              num_workers=1, uptime_secs=i, status="ACTIVE", owner="o")
        for i in range(topologies)])
    buffer = TMemoryBuffer()
    summary.write(TBinaryProtocolFactory().get_protocol(buffer))
    return buffer.getvalue()


class _Watched:
    """A protocol whose struct reads note the collections started while they ran."""

    def __init__(self, protocol, collections: list[int]):
        self._protocol = protocol
        self._collections = collections
        self.during: list[int] = []

    def read_struct(self, obj):
        before = len(self._collections)
        self._protocol.read_struct(obj)
        self.during = self._collections[before:]

    def __getattr__(self, name):
        return getattr(self._protocol, name)


def decode(data: bytes, quiet: bool, collections: list[int]) -> tuple[object, list[int]]:
    """The decoded summary, and the collections that started during its decoding."""
    watched = _Watched(TBinaryProtocolFactory().get_protocol(TMemoryBuffer(data)),
                       collections)
    summary = storm.ClusterSummary()
    summary.read(QuietDecoding(watched) if quiet else watched)
    return summary, watched.during


def test_a_large_reply_decodes_without_a_collection(collections):
    data = encoded_cluster_summary(5_000)
    assert gc.isenabled()
    loud, during = decode(data, False, collections)
    assert len(during) > 5   # what the pause saves: 5,000 structs start collections
    quiet, during = decode(data, True, collections)
    assert during == []
    assert quiet == loud
    assert gc.isenabled()


def test_pauses_nest_and_restore_what_was_there():
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()   # the outer pause still runs
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()   # someone else turned it off: it stays off
    finally:
        gc.enable()


def test_a_thread_ending_its_pause_leaves_another_paused():
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with collector_paused():
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=other, name="test-pause")
    thread.start()
    try:
        assert inside.wait(10)
        with collector_paused():
            pass
        assert not gc.isenabled()   # the other thread is still decoding
    finally:
        release.set()
        thread.join(10)
    assert gc.isenabled()


class _Broken:
    def read_struct(self, obj):
        raise EOFError("the connection closed mid-reply")


def test_an_error_while_decoding_turns_the_collector_back_on():
    with pytest.raises(EOFError):
        QuietDecoding(_Broken()).read_struct(storm.ClusterSummary())
    assert gc.isenabled()
