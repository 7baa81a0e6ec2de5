"""Pipelined ZooKeeper reads for the UI: many nodes for one round trip's latency.

Each function sends every request first (kazoo's async calls), then collects the
answers, so 1,000 topologies cost one round trip's latency, not 1,000. A node that is
not there reads as None (or no children); a record this release cannot decode as None
too (:func:`decode`): one bad node must not hide the rest of the cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import ZnodeStat

from nimbus.state.records import RecordError

ANSWER_TIMEOUT_S = 10
UNREADABLE = (RecordError, TypeError, ValueError)
Watch = Callable[[Any], None]


def decode(cls: Any, data: bytes | None) -> Any:
    """The record ``cls`` that ``data`` holds; None for no data, or data this release
    cannot read (written by another release: skipped, as runtime_view skips it)."""
    if not data:
        return None
    try:
        return cls.decode(data)
    except UNREADABLE:
        return None


def get_all(zk: KazooClient, paths: list[str],
            watch: Watch | None = None) -> list[bytes | None]:
    """The data of each path (None where there is no node), with ``watch`` set on each."""
    results = [zk.get_async(p, watch=watch) for p in paths]
    out: list[bytes | None] = []
    for res in results:
        try:
            out.append(res.get(timeout=ANSWER_TIMEOUT_S)[0])
        except NoNodeError:
            out.append(None)
    return out


def get_all_with_stat(zk: KazooClient,
                      paths: list[str]) -> list[tuple[bytes, ZnodeStat] | None]:
    """(data, stat) of each path (None where there is no node)."""
    results = [zk.get_async(p) for p in paths]
    out: list[tuple[bytes, ZnodeStat] | None] = []
    for res in results:
        try:
            data, stat = res.get(timeout=ANSWER_TIMEOUT_S)
            out.append((data, stat))
        except NoNodeError:
            out.append(None)
    return out


def children_all(zk: KazooClient, paths: list[str], watch: Watch | None = None,
                 missing: Callable[[str], None] | None = None) -> list[list[str]]:
    """Children of each path, sorted, with ``watch`` set on each; a missing path reads
    as none, or is passed to ``missing`` (which raises) for directories of the layout."""
    results = [zk.get_children_async(p, watch=watch) for p in paths]
    out: list[list[str]] = []
    for path, res in zip(paths, results, strict=True):
        try:
            out.append(sorted(res.get(timeout=ANSWER_TIMEOUT_S)))
        except NoNodeError:
            if missing is not None:
                missing(path)
            out.append([])
    return out
