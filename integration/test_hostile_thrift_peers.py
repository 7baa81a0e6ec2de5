"""A real nimbus process under hostile Thrift peers: it drops them and its memory stays flat.

Raw sockets send what no Thrift client would: frame headers of 1 and 2 GiB followed by
megabytes of zeros, negative and zero lengths, random bytes, a half frame, and more idle
connections than ``nimbus.thrift.threads``. The nimbus must drop each bad peer, never run
more worker threads than the cap, answer a real ``getClusterInfo`` afterwards (at once,
however many idle connections are open), and its resident memory must not grow by more
than RSS_GROWTH_BOUND.
"""

from __future__ import annotations

import random
import socket
import struct
import time

import pytest
from raw_thrift import (
    assert_dropped,
    cluster_info_request,
    connect_raw,
    read_reply,
    send_then_end,
)
from thriftpy2.thrift import TMessageType

pytestmark = [pytest.mark.integration, pytest.mark.slow]

THREADS = 4
RSS_GROWTH_BOUND = 20 * 1024 * 1024
ZEROS_SENT = 64 * 1024 * 1024  # what an unchecked 1-2 GiB frame would have buffered
TIMEOUT_S = 10.0


def proc_status(pid: int, field: str) -> int:
    """A field of /proc/<pid>/status: VmRSS in bytes, Threads as a count."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            name, _, value = line.partition(":")
            if name == field:
                number, *unit = value.split()
                return int(number) * (1024 if unit == ["kB"] else 1)
    raise KeyError(field)


def settled(read, timeout_s: float = TIMEOUT_S, polls: int = 10, interval_s: float = 0.1):
    """``read()`` once it has returned the same value ``polls`` times in a row."""
    deadline = time.monotonic() + timeout_s
    last, same = read(), 0
    while same < polls:
        if time.monotonic() > deadline:
            raise TimeoutError(f"value did not settle within {timeout_s}s (last {last})")
        time.sleep(interval_s)
        value = read()
        same = same + 1 if value == last else 0
        last = value
    return last








def send_zeros(sock: socket.socket, total: int) -> int:
    """Send up to ``total`` zero bytes; how many went out before the nimbus hung up."""
    sent = 0
    block = bytes(1024 * 1024)
    try:
        while sent < total:
            sent += sock.send(block)
    except (BrokenPipeError, ConnectionResetError):
        pass
    return sent






def test_hostile_peers_are_dropped_and_memory_stays_flat(make_cluster):
    cluster = make_cluster(1, **{"nimbus.thrift.threads": THREADS})
    nimbus = cluster.nimbuses[0]
    pid, port = nimbus.process.pid, nimbus.port
    client = cluster.client(deadline_s=30)
    client.cluster_info()  # warm: every code path of a normal call has run once
    # The warm-up started a worker thread, which stays: count once the number settled.
    threads_before = settled(lambda: proc_status(pid, "Threads"))
    rss_before = proc_status(pid, "VmRSS")

    def workers_added() -> int:
        return proc_status(pid, "Threads") - threads_before

    # Oversized, negative and zero frame lengths, each followed by a stream of zeros:
    # the nimbus hangs up at the header, long before ZEROS_SENT.
    for header in (struct.pack("!I", 2**31), struct.pack("!i", 2**31 - 1),
                   struct.pack("!i", 2**30), struct.pack("!i", 1048576 + 1),
                   struct.pack("!i", -1), struct.pack("!i", 0)):
        with connect_raw(port) as sock:
            sock.sendall(header)
            sent = send_zeros(sock, ZEROS_SENT)
            assert sent < ZEROS_SENT, f"header {header.hex()}: nimbus read {sent} bytes"
            assert_dropped(sock)

    # Random bytes, then end of stream.
    for seed in range(3):
        with connect_raw(port) as sock:
            send_then_end(sock, random.Random(seed).randbytes(1024 * 1024))
            assert_dropped(sock)

    # Half frames, then the peers go away: the worker that read them is free again.
    for _ in range(3):
        with connect_raw(port) as sock:
            sock.sendall(struct.pack("!i", 4096) + bytes(2048))
        assert client.cluster_info().nimbuses

    # THREADS + 10 idle connections hold no thread: a request behind them is answered at
    # once, and no more than THREADS workers ever run.
    idle = [connect_raw(port) for _ in range(THREADS + 10)]
    waiting = connect_raw(port)
    try:
        waiting.sendall(cluster_info_request())
        waiting.settimeout(2.0)
        assert read_reply(waiting) == ("getClusterInfo", TMessageType.REPLY)
        assert workers_added() <= THREADS - 1
    finally:
        for sock in idle:
            sock.close()
        waiting.close()
    assert workers_added() <= THREADS - 1

    assert nimbus.alive()
    assert [n.port for n in client.cluster_info().nimbuses if n.isLeader] == [port]
    growth = proc_status(pid, "VmRSS") - rss_before
    assert growth < RSS_GROWTH_BOUND, f"RSS grew by {growth} bytes"
    log = nimbus.log_text()
    assert "Traceback" not in log
    assert "over nimbus.thrift.max_buffer_size (1048576)" in log
