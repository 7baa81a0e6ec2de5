"""The poll(2) handler answers every wait as kazoo's own selector-based one does, and a
kazoo client on it works against a real ZooKeeper, through a server restart."""

from __future__ import annotations

import os
import resource
import socket
import threading

import pytest
from kazoo.client import KazooClient
from kazoo.handlers.utils import selector_select
from kazoo.protocol.states import KazooState

from nimbus.dev.zookeeper import ZooKeeperServer
from nimbus.state.zk_handler import PollingThreadingHandler

HANDLER = PollingThreadingHandler()


def both(rlist: list, wlist: list, timeout: float = 0.0) -> tuple:
    """(ours, kazoo's) answers to the same wait."""
    return HANDLER.select(rlist, wlist, [], timeout), selector_select(rlist, wlist, [], timeout)


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_nothing_ready_is_three_empty_lists(pair):
    a, _b = pair
    ours, theirs = both([a], [], timeout=0.01)
    assert ours == theirs == ([], [], [])


def test_a_socket_with_data_is_readable_and_one_with_room_writable(pair):
    a, b = pair
    b.sendall(b"x")
    ours, theirs = both([a], [b])
    assert ours == theirs == ([a], [b], [])
    # A socket asked both ways is listed once per asking, as readable if it is (kazoo's).
    ours, theirs = both([a, b], [a, b])
    assert ours == theirs == ([a, a], [b, b], [])


def test_a_socket_whose_peer_hung_up_is_readable(pair):
    a, b = pair
    b.close()
    ours, theirs = both([a], [])
    assert ours == theirs == ([a], [], [])
    assert a.recv(1) == b""  # what kazoo then reads: the end of the connection


def test_a_descriptor_number_beyond_select_s_limit_is_waited_on(pair):
    """select(2) refuses descriptors numbered 1,024 and above; a busy nimbus has them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1100:
        pytest.skip(f"this machine allows {hard} open files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1100), hard))
    try:
        a, b = pair
        high = socket.socket(fileno=os.dup2(a.fileno(), 1050))
        try:
            b.sendall(b"x")
            assert HANDLER.select([high], [], [], 0) == ([high], [], [])
        finally:
            high.close()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_bad_arguments_are_refused_as_kazoo_refuses_them(pair):
    a, _b = pair
    with pytest.raises(TypeError):
        HANDLER.select([a], [], [], "1")
    with pytest.raises(ValueError):
        HANDLER.select([a], [], [], -1)
    closed = socket.socket()
    closed.close()
    with pytest.raises(TypeError):
        HANDLER.select([closed], [], [], 0)


def test_a_wait_ends_when_data_arrives(pair):
    a, b = pair
    sender = threading.Timer(0.05, lambda: b.sendall(b"x"))
    sender.start()
    try:
        assert HANDLER.select([a], [], [], 30) == ([a], [], [])
    finally:
        sender.cancel()
        sender.join()


def test_a_kazoo_client_on_it_reads_watches_and_survives_a_server_restart(tmp_path):
    zk_server = ZooKeeperServer(tmp_path / "zk").start()  # its own: this test restarts it
    zk_root = "/handler"
    zk = KazooClient(hosts=zk_server.hosts, timeout=10.0, handler=PollingThreadingHandler())
    try:
        zk.start(timeout=15)
        zk.create(f"{zk_root}/a", b"1", makepath=True)
        changed = threading.Event()
        zk.get(f"{zk_root}/a", watch=lambda _event: changed.set())
        zk.set(f"{zk_root}/a", b"2" * 100_000)  # a reply read in several chunks
        assert changed.wait(10)
        assert zk.get(f"{zk_root}/a")[0] == b"2" * 100_000
        # Many requests in flight at once: each answered, in order.
        results = [zk.exists_async(f"{zk_root}/a") for _ in range(500)]
        assert [r.get(timeout=10).version for r in results] == [1] * 500

        lost = threading.Event()
        back = threading.Event()

        def watch(state: KazooState) -> None:
            (lost if state != KazooState.CONNECTED else back).set()

        zk.add_listener(watch)
        zk_server.stop()
        assert lost.wait(10)
        zk_server.start()
        assert back.wait(30)
        assert zk.get(f"{zk_root}/a")[0] == b"2" * 100_000
    finally:
        zk.stop()
        zk.close()
        zk_server.stop()
