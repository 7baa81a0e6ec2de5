"""A request's head (request line and headers) at the gate of nimbus-ha's HTTP servers
(nimbus/web/gate.py): what it may be, the answers refusing it, and handing
the bytes read of it to cheroot, which parses them as if it had read them itself.
"""

from __future__ import annotations

import _pyio
import json
import socket
from dataclasses import dataclass
from typing import Any

from cheroot.makefile import StreamReader, StreamWriter

READ_BYTES = 16 * 1024


@dataclass(frozen=True)
class HeadLimits:
    """How large a request's head may be, and how long it may take to arrive."""

    line_bytes: int = 8192
    head_bytes: int = 32768
    timeout_s: float = 5.0


def error_answer(status: str, message: str) -> bytes:
    """A complete HTTP answer with the UI's JSON error body, closing the connection."""
    body = json.dumps({"error": status.split(" ", 1)[1], "errorMessage": message},
                      separators=(",", ":")).encode()
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nConnection: close\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


PLAIN_HTTP_ANSWER = error_answer("400 Bad Request", "this port speaks HTTPS only: use https://")


class _Complete:
    """The verdict on a head that is complete and within the limits."""


COMPLETE = _Complete()


def judge_head(head: bytes | bytearray, limits: HeadLimits) -> _Complete | bytes | None:
    """:data:`COMPLETE`, the answer refusing ``head`` (414 or 431), or None while it is
    within the limits but not complete."""
    start = 2 if head.startswith(b"\r\n") else 0  # one leading empty line is allowed
    line_end = head.find(b"\n", start)
    line = (line_end if line_end >= 0 else len(head)) - start
    if line_end > start and head[line_end - 1] == 0x0D:
        line -= 1
    if line > limits.line_bytes:
        return error_answer("414 URI Too Long", f"the request line is longer than "
                            f"{limits.line_bytes} bytes: shorten the URL")
    ends = []
    if line_end >= 0:
        crlf = head.find(b"\r\n\r\n", max(start, line_end - 1))
        lf = head.find(b"\n\n", line_end)
        ends = [i + n for i, n in ((crlf, 4), (lf, 2)) if i >= 0]
    size = (min(ends) if ends else len(head)) - start
    if size > limits.head_bytes:
        return error_answer("431 Request Header Fields Too Large",
                            f"the request headers are longer than {limits.head_bytes} "
                            "bytes: send fewer or shorter headers")
    return COMPLETE if ends else None


class _HeadFirstIO(socket.SocketIO):
    """A socket's reading side that first gives back bytes read before."""

    def __init__(self, sock: socket.socket, head: bytes):
        super().__init__(sock, "rb")
        self._head = memoryview(head)

    def readinto(self, b: Any) -> int | None:
        if self._head:
            n = min(len(b), len(self._head))
            b[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        return super().readinto(b)

    def take_head(self) -> bytes:
        rest, self._head = bytes(self._head), memoryview(b"")
        return rest


class HeadFirstReader(StreamReader):
    """cheroot's socket reader over :class:`_HeadFirstIO`."""

    def __init__(self, sock: socket.socket, head: bytes, bufsize: int):
        _pyio.BufferedReader.__init__(self, _HeadFirstIO(sock, head), bufsize)
        self.bytes_read = 0

    def unread(self) -> bytes:
        """What was received but not read yet (a pipelined request), taken out."""
        parts = []
        while self.has_data():  # read1 reads nothing from the socket then
            parts.append(self.read1(READ_BYTES))
        return b"".join(parts) + self.raw.take_head()


def replaying_makefile(head: bytes) -> Any:
    """cheroot's ``makefile`` for a connection whose first ``head`` bytes were read
    already: its reader gives them back first."""
    def makefile(sock: socket.socket, mode: str = "r", bufsize: int = 8192) -> Any:
        if "r" in mode:
            return HeadFirstReader(sock, head, bufsize)
        return StreamWriter(sock, mode, bufsize)
    return makefile
