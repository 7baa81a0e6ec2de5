"""The take-over socket: where a worker whose supervisor died waits for that supervisor's
next process, and how each end knows who is at the other.

A worker (or a warm worker) whose lease pipe reached EOF listens on
``<worker-dir>/supervisor.sock`` (:data:`SOCKET_NAME`; nimbus/worker/takeover.py,
nimbus/worker/warm.py). The supervisor's next process connects to every such socket at
start (nimbus/supervisor/takeover.py). Each end asks the kernel who the other is
(:func:`peer_credentials`): the worker lets in only root or its own user, the supervisor
checks that the pid it is told is the socket's owner.
"""

from __future__ import annotations

import socket
import struct

#: The socket's name in the worker directory (or the warm worker's directory).
SOCKET_NAME = "supervisor.sock"


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket (Linux)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid
