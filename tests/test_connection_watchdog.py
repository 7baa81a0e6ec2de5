"""The connection watchdog on a fake client (its clock and kazoo's queue of sent
requests in the test's hands): a silent connection is dropped, a busy one is not."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

from kazoo.protocol.states import KazooState

from nimbus.state.connection_watchdog import ConnectionWatchdog


class FakeClient:
    def __init__(self) -> None:
        self.state = KazooState.CONNECTED
        self._pending: deque = deque()
        self.calls: list[object] = []
        self.probes = 0

    def add_listener(self, _listener: object) -> None:
        pass

    def remove_listener(self, _listener: object) -> None:
        pass

    def exists_async(self, _path: str) -> SimpleNamespace:
        self.probes += 1
        return SimpleNamespace(rawlink=lambda callback: None)  # never answered

    def _call(self, request: object, _async: object) -> None:
        self.calls.append(request)


def watchdog(zk: FakeClient, clock: list[float]) -> ConnectionWatchdog:
    return ConnectionWatchdog(zk, SimpleNamespace(seconds=3.0), "test",  # type: ignore[arg-type]
                              clock=lambda: clock[0])


def assert_dropped_once_more(dog: ConnectionWatchdog, clock: list[float]) -> None:
    """Nothing arrives for 2.5 s, past the 2 s limit: the connection is dropped, once."""
    dropped = []
    for _ in range(25):
        clock[0] += 0.1
        dropped.append(dog.check_once())
    assert dropped.count(True) == 1 and dog.drops == 1


def test_a_silent_connection_is_dropped_after_two_thirds_of_the_session():
    zk, clock = FakeClient(), [100.0]
    dog = watchdog(zk, clock)
    zk._pending.append(("a request never answered",))
    for _ in range(20):   # 0.1 s steps up to 2.0 s: within 2/3 of 3 s
        clock[0] += 0.1
        assert dog.check_once() is False
    clock[0] += 0.1
    assert dog.check_once() is True and dog.drops == 1 and len(zk.calls) == 1


def test_a_connection_answering_a_long_queue_is_not_dropped():
    """A view loading 10,000 topologies sends tens of thousands of reads; the probe waits
    behind them (ZooKeeper answers in order) for longer than the silence limit, but each
    check sees older requests answered: the connection is alive."""
    zk, clock = FakeClient(), [100.0]
    dog = watchdog(zk, clock)
    zk._pending.extend((f"read {i}",) for i in range(1000))
    for _ in range(100):  # 10 s, five times the silence limit
        clock[0] += 0.1
        for _ in range(5):
            zk._pending.popleft()  # answered
        assert dog.check_once() is False
    assert dog.drops == 0 and zk.probes == 100
    # Then nothing more is answered: dropped once the limit has passed.
    assert_dropped_once_more(dog, clock)


def test_a_connection_delivering_watch_events_is_not_dropped():
    """A nimbus holding 10,000 replicas dies: its session's expiry sends every other
    nimbus 20,000 watch events ahead of any answer, and reading them takes seconds. The
    handler notes each time the connection had something to read; that counts."""
    zk, clock = FakeClient(), [100.0]
    zk.handler = SimpleNamespace(last_inbound=None)
    dog = watchdog(zk, clock)
    zk._pending.append(("a request behind the events",))
    for _ in range(100):  # 10 s of events, five times the silence limit
        clock[0] += 0.1
        zk.handler.last_inbound = clock[0] - 0.05
        assert dog.check_once() is False
    assert dog.drops == 0
    # Then nothing arrives at all: dropped once the limit has passed.
    assert_dropped_once_more(dog, clock)


def test_the_handler_notes_when_the_network_connection_had_something_to_read():
    import socket

    from nimbus.state.zk_handler import PollingThreadingHandler

    handler = PollingThreadingHandler()
    wake_r, wake_w = socket.socketpair()  # kazoo's own wake-up pair: not the network
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    try:
        wake_w.sendall(b"x")
        assert handler.select([client, wake_r], [], [], 0) == ([wake_r], [], [])
        assert handler.last_inbound is None
        peer.sendall(b"y")
        assert handler.select([client, wake_r], [], [], 5) == ([client, wake_r], [], [])
        assert handler.last_inbound is not None
    finally:
        for sock in (wake_r, wake_w, server, client, peer):
            sock.close()
