"""kazoo's threading handler, waiting on its sockets with one ``poll(2)`` call.

Why: kazoo 2.11's ``SequentialThreadingHandler.select`` builds a new epoll selector for
every wait (create it, register each socket, wait, close it: five system calls and the
``selectors`` module's Python around them, about 90 µs here), and a client's connection
thread waits before each read and each write, so about four times per request. A nimbus
at 1,000 supervisors reads 200 rewritten heartbeats a second, and each submit at 10,000
topologies costs it about a hundred requests: that overhead was most of its connection
thread's CPU. ``poll(2)`` needs no set-up, and unlike ``select(2)`` has no limit on the
descriptor numbers it takes (a nimbus can hold more than 1,024 files open).

What kazoo gets back is what its own ``selector_select`` returns for the same events: a
socket that hung up or failed counts as readable (kazoo then reads, and sees the end of
the connection), and one descriptor is listed as readable or writable, never both.

The handler also notes when its connection last had something to read
(:attr:`PollingThreadingHandler.last_inbound`): the connection watchdog counts that as
proof of a live connection, whether it was an answer or a watch event.
"""

from __future__ import annotations

import math
import select
import socket
import time
from typing import Any

from kazoo.handlers.threading import SequentialThreadingHandler
from kazoo.handlers.utils import fileobj_to_fd

_READ = select.POLLIN
_WRITE = select.POLLOUT
# A client's connection to ZooKeeper (TCP, maybe TLS); kazoo's other socket, the one its
# callers wake its connection thread with, is a local socket pair.
_NETWORK = (socket.AF_INET, socket.AF_INET6)


class PollingThreadingHandler(SequentialThreadingHandler):
    """``SequentialThreadingHandler`` with :meth:`select` on ``poll(2)``."""

    def __init__(self) -> None:
        super().__init__()
        #: ``time.monotonic()`` when a wait last found the ZooKeeper connection readable
        #: (an answer, a watch event, or its end), None before the first.
        self.last_inbound: float | None = None

    def select(self, rlist: list[Any], wlist: list[Any], xlist: list[Any],
               timeout: float | None = None) -> tuple[list[Any], list[Any], list[Any]]:
        """Like ``select.select`` for ``rlist`` and ``wlist`` (``xlist`` is ignored, as
        kazoo's own does); ``timeout`` in seconds, None to wait for ever."""
        if timeout is not None:
            if not isinstance(timeout, (int, float)):
                raise TypeError("timeout must be a number")
            if timeout < 0:
                raise ValueError("timeout must be non-negative")
        wanted: dict[int, int] = {}
        objects: dict[int, list[Any]] = {}
        for mask, fileobjs in ((_READ, rlist), (_WRITE, wlist)):
            for fileobj in fileobjs:
                fd = fileobj_to_fd(fileobj)  # TypeError for a closed socket, as kazoo's
                wanted[fd] = wanted.get(fd, 0) | mask
                objects.setdefault(fd, []).append(fileobj)
        poller = select.poll()
        for fd, mask in wanted.items():
            poller.register(fd, mask)
        # poll(2) takes milliseconds; rounded up, so that a wait never ends early.
        ready = poller.poll(None if timeout is None else math.ceil(timeout * 1000))
        readable: list[Any] = []
        writable: list[Any] = []
        for fd, events in ready:
            # As the selectors module maps them: anything but "writable" (a hang-up, an
            # error, a closed descriptor) wakes a reader, anything but "readable" a writer.
            if events & ~_WRITE and wanted[fd] & _READ:
                readable.extend(objects[fd])
                if getattr(objects[fd][0], "family", None) in _NETWORK:
                    self.last_inbound = time.monotonic()
            elif events & ~_READ and wanted[fd] & _WRITE:
                writable.extend(objects[fd])
        return readable, writable, []
