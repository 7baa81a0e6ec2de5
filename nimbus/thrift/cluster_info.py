"""getClusterInfo's reply, encoded from parts that are each encoded once.

At 10,000 topologies, encoding the TopologySummary list is most of the reply's cost.

- A supervisor's heartbeat or a nimbus's changes the reply but not that list, so the
  list is encoded once per snapshot parts and second
  (:mod:`nimbus.thrift.topology_summaries`).
- A new second changes every uptime and nothing else: each topology's struct is encoded
  once while its records stand, as the bytes before its uptime and the bytes after, and
  a new second joins them around the new uptimes.

The reply is spliced from those encodings: Thrift's binary protocol writes a struct as
its fields one after another, in the IDL's order, closed by a stop byte, and a list as
its element type, its length and its elements. So the bytes are those of encoding the
whole reply at once (a test checks that).
"""

from __future__ import annotations

import struct
from typing import Any

from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.utils import serialize

from nimbus.thrift import nimbus_ha, storm
from nimbus.thrift.topology_summaries import TopologySummaries

_PROTOCOL = TBinaryProtocolFactory()
_STOP = b"\x00"


def _fields(struct: Any) -> bytes:
    """The encoding of ``struct``'s set fields, without the stop byte that ends it."""
    return serialize(struct, _PROTOCOL)[:-1]


# The getClusterInfo_result's header for its ``success`` field (the reply's one field).
_REPLY_HEAD = _fields(nimbus_ha.NimbusHa.getClusterInfo_result(
    success=storm.ClusterSummary(nimbus_uptime_secs=None)))[:-1]


_I32 = struct.Struct(">i")
# The topologies field's header and the list's element type, before the list's length.
_LIST_HEAD = _fields(storm.ClusterSummary(topologies=[], nimbus_uptime_secs=None))[:-4]
# A TopologySummary's uptime_secs field header: type i32 (8), field id 6.
_UPTIME_HEAD = b"\x08\x00\x06"


def _split_at_uptime(summary: Any) -> tuple[bytes, bytes] | None:
    """``summary``'s encoding as (the bytes before its uptime's value, those after): the
    fields before it (id, name and three i32 counts) are required, so it is at a known
    offset. Checked: None when it is not there (the struct is then encoded whole)."""
    data = serialize(summary, _PROTOCOL)
    at = 3 + 4 + len(summary.id.encode()) + 3 + 4 + len(summary.name.encode()) + 3 * 7 + 3
    if data[at - 3:at] != _UPTIME_HEAD or len(data) < at + 4 or \
            _I32.unpack_from(data, at)[0] != summary.uptime_secs:
        return None
    return data[:at], data[at + 4:]


class ClusterInfoReplies:
    """One nimbus's getClusterInfo replies. Not thread-safe: the caller serialises
    :meth:`encode` (the topology structs are updated in place)."""

    def __init__(self) -> None:
        self._topologies = TopologySummaries()
        # (the topology list, its second, the topologies field's encoding)
        self._piece: tuple[list[Any], int | None, bytes] | None = None
        # topology id -> (its struct, its bytes before and after the uptime's value)
        self._split: dict[str, tuple[Any, tuple[bytes, bytes] | None]] = {}
        self._splits: list[tuple[bytes, bytes] | None] = []  # those of the last list
        self._splits_of: list[Any] | None = None  # the list they are of

    def encode(self, snap: Any, now: float, supervisors: list[Any], nimbuses: list[Any],
               nimbus_uptime_secs: int) -> bytes:
        """The encoded ``getClusterInfo_result`` of ``snap`` at ``now``, with these
        SupervisorSummary and NimbusSummary lists."""
        topologies = self._topologies.at(snap, now)
        second = self._topologies.second
        if self._piece is None or self._piece[0] is not topologies \
                or self._piece[1] != second:
            self._piece = (topologies, second, self._encode_list(topologies))
        # Fields in the order the IDL numbers them, as one encoding would write them.
        head = _fields(storm.ClusterSummary(supervisors=supervisors,
                                            nimbus_uptime_secs=nimbus_uptime_secs))
        tail = _fields(storm.ClusterSummary(nimbuses=nimbuses, nimbus_uptime_secs=None))
        return _REPLY_HEAD + head + self._piece[2] + tail + _STOP + _STOP

    def _encode_list(self, topologies: list[Any]) -> bytes:
        """The topologies field: each struct's kept bytes around its current uptime."""
        if self._splits_of is not topologies:  # another list: find each struct's bytes
            kept, split = self._split, {}
            for summary in topologies:
                entry = kept.get(summary.id)
                if entry is None or entry[0] is not summary:
                    entry = (summary, _split_at_uptime(summary))
                split[summary.id] = entry
            self._split, self._splits_of = split, topologies
            self._splits = [split[summary.id][1] for summary in topologies]
        parts = [_LIST_HEAD, _I32.pack(len(topologies))]
        pack = _I32.pack
        for summary, around in zip(topologies, self._splits, strict=True):
            if around is not None:
                parts += (around[0], pack(summary.uptime_secs), around[1])
            else:
                parts.append(serialize(summary, _PROTOCOL))
        return b"".join(parts)
