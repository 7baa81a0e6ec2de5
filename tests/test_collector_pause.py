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


def decode(data: bytes, quiet: bool) -> storm.ClusterSummary:
    protocol = TBinaryProtocolFactory().get_protocol(TMemoryBuffer(data))
    summary = storm.ClusterSummary()
    summary.read(QuietDecoding(protocol) if quiet else protocol)
    return summary


def test_a_large_reply_decodes_without_a_collection(collections):
    data = encoded_cluster_summary(5_000)
    assert gc.isenabled()
    loud = decode(data, quiet=False)
    assert len(collections) > 5   # what the pause saves: 5,000 structs start collections
    del collections[:]
    quiet = decode(data, quiet=True)
    # None while decoding; at most one after, when the collector is back on and catches
    # up with what was allocated (a young generation, never a full collection).
    assert collections in ([], [0], [1])
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
