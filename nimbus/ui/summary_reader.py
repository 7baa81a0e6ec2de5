"""The UI inside a nimbus (``nimbus.ui.enabled``): it reuses that nimbus's summary.

The nimbus already holds the cluster's
:class:`~nimbus.state.cluster_snapshot.ClusterSnapshot` in memory, kept current by its
watched view (:mod:`nimbus.master.summary_cache`); a second reader of the same
directories would only double the watches and the reads. So :class:`SummaryReader`
shows the summary's snapshots (told of each new one: :meth:`NimbusSummary.listen`), with
the replication counts that nimbus serves in getClusterInfo. What no snapshot holds it
reads as a UI of its own does, with the nimbus's view session: heartbeats and errors
while the dashboard is open, one topology when its page is asked for.

The UI is served before the nimbus's master starts (peers download code from it), so
the first snapshot comes a moment after the UI is up: until then requests answer that
the UI has not read the cluster yet.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from kazoo.client import KazooClient

from nimbus.config import Config
from nimbus.state.cluster_snapshot import ClusterSnapshot
from nimbus.state.cluster_state import LayoutMissingError
from nimbus.ui.zk_reader import ZooKeeperReader


class NimbusSummary(Protocol):
    """What the UI needs of a nimbus's summary
    (:class:`nimbus.master.summary_cache.ClusterSummaryCache`)."""

    @property
    def snapshot(self) -> ClusterSnapshot: ...

    @property
    def layout_error(self) -> str: ...

    def refresh_now(self, timeout_s: float = ...) -> ClusterSnapshot: ...

    def listen(self, listener: Callable[[], None]) -> None: ...

    def unlisten(self, listener: Callable[[], None]) -> None: ...


class SummaryReader(ZooKeeperReader):
    """A :class:`~nimbus.ui.reader.UIReader` showing ``summary``'s snapshots (module
    docstring); ``zk``: the nimbus's session for what snapshots do not hold."""

    def __init__(self, conf: Config, zk: KazooClient, summary: NimbusSummary,
                 fetch_conf: Callable[[str], str] | None = None):
        super().__init__(conf, zk, fetch_conf)
        self._summary = summary

    def start(self) -> None:
        self._summary.listen(self._changed)
        super().start()

    def stop(self) -> None:
        """Stop the UI's loops; the summary goes on serving its nimbus."""
        self._summary.unlisten(self._changed)
        super().stop()

    def wait_ready(self, timeout_s: float = 15.0) -> bool:
        """Wait (bounded) for this UI to show the summary, once the summary is loaded;
        not for the summary's first load, which comes once the nimbus's master starts,
        after the UI (module docstring)."""
        if not self._summary.snapshot.loaded and not self._summary.layout_error:
            return self._snapshot is not None
        return super().wait_ready(timeout_s)

    def refresh_now(self, timeout_s: float = 3.0) -> None:
        """Wait (bounded) for a summary that includes every change made before the call
        (read-your-writes after an action), then for this UI to show it."""
        self._summary.refresh_now(timeout_s)
        super().refresh_now(timeout_s)

    def _load(self) -> ClusterSnapshot | None:
        if self._summary.layout_error:
            raise LayoutMissingError(self._summary.layout_error)
        snap = self._summary.snapshot
        return snap if snap.loaded else None
