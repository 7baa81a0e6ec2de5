"""Code sync: make this host hold the code of every live topology, and nothing else.

One named thread per nimbus. It is woken by ZooKeeper watches (a topology appears under
``storms`` or ``code-distributor``, its metafile is published, a replica registers) and
runs at least every ``nimbus.code.sync.freq.secs`` as a safety net. Storm's design notes
that its watch "pretty much never results in code download"; here the watch path is the
primary one, so replication completes within a download's time of a submit.

A failed download is retried with a growing pause (capped by the sync period) and at
once when a new replica registers, since that host may serve what the others could not.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from kazoo.exceptions import KazooException

from nimbus.cluster_state import StormClusterState
from nimbus.distributors import CodeDistributor
from nimbus.local_code import LocalCodeStore

log = logging.getLogger(__name__)


class CodeSync:
    """Download missing code and remove code of removed topologies; see module doc."""

    MAX_RETRY_PAUSE_S = 30.0

    def __init__(
        self,
        state: StormClusterState,
        store: LocalCodeStore,
        distributor: CodeDistributor,
        period_s: float,
        protected: Callable[[], set[str]] = set,
        on_synced: Callable[[], None] = lambda: None,
    ):
        self._state = state
        self._store = store
        self._distributor = distributor
        self._period_s = period_s
        self._protected = protected
        self._on_synced = on_synced
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._retry_at: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._retry_now = False
        self._thread = threading.Thread(target=self._run, name="code-sync", daemon=True)
        self.runs = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def wake(self, _event: object = None) -> None:
        """Ask for a run soon; also the callback of every watch this sync leaves."""
        self._wake.set()

    def missing(self) -> set[str]:
        """Topologies under /storms whose code this host lacks."""
        return {t for t in self._state.active_storms() if not self._store.has(t)}

    def _run(self) -> None:
        while not self._stop.is_set():
            pause = self._period_s
            try:
                self.sync_once()
                if self._retry_at:
                    pause = min(pause, max(0.05, min(self._retry_at.values()) - time.monotonic()))
            except KazooException as exc:
                log.warning("code sync could not read cluster state: %s", exc)
                pause = min(pause, 1.0)
            except Exception:
                log.exception("code sync run failed")
                pause = min(pause, 5.0)
            try:
                self._on_synced()
            except Exception:
                log.exception("code sync callback failed")
            self._wake.wait(pause)
            self._wake.clear()

    def sync_once(self) -> None:
        """One pass: fetch what is missing, drop what is gone."""
        self.runs += 1
        # Read the disk first, then the submissions in flight, then ZooKeeper: a copy on
        # disk is then either still protected or already visible as a storm or a published
        # metafile, never mistaken for the code of a removed topology.
        held = self._store.topologies()
        protected = self._protected()
        if self._retry_now:
            self._retry_now = False
            self._retry_at = dict.fromkeys(self._retry_at, 0.0)
        wanted = set(self._state.active_storms(watch=self.wake))
        published: dict[str, bytes] = {}
        for topology_id in self._state.code_topologies(watch=self.wake):
            meta = self._state.code_meta(topology_id, watch=self.wake)
            # A new replica is a new place to fetch from: retry failures at once.
            self._state.replica_hosts(topology_id, watch=self._on_replica_change)
            if meta is not None:
                published[topology_id] = meta.metafile
                wanted.add(topology_id)
        for topology_id in sorted(wanted - held):
            if topology_id in published and time.monotonic() >= self._retry_at.get(topology_id, 0):
                self._fetch(topology_id, published[topology_id])
        for topology_id in sorted(held - wanted - protected):
            log.info("removing code of %s: the topology is gone", topology_id)
            try:
                self._distributor.cleanup(topology_id)
            finally:
                self._store.remove(topology_id)
        for topology_id in list(self._retry_at):
            if topology_id not in wanted or self._store.has(topology_id):
                self._retry_at.pop(topology_id, None)
                self._failures.pop(topology_id, None)

    def _on_replica_change(self, _event: object) -> None:
        # kazoo's event thread: only flag; the sync thread owns _retry_at.
        self._retry_now = True
        self._wake.set()

    def _fetch(self, topology_id: str, metafile: bytes) -> None:
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="metafile-") as tmp:
            meta_path = Path(tmp) / f"{topology_id}.meta"
            meta_path.write_bytes(metafile)
            try:
                files = self._distributor.download(
                    self._store.path(topology_id), topology_id, meta_path)
                if not self._store.has(topology_id):
                    raise RuntimeError(f"{self._distributor.name} returned without the code "
                                       f"of {topology_id} in place")
            except Exception as exc:
                failures = self._failures.get(topology_id, 0) + 1
                self._failures[topology_id] = failures
                pause = min(self.MAX_RETRY_PAUSE_S, self._period_s, 0.5 * 2 ** failures)
                self._retry_at[topology_id] = time.monotonic() + pause
                log.warning("download of %s failed (attempt %d, next in %.1fs): %s",
                            topology_id, failures, pause, exc)
                return
        log.info("downloaded %s: %d files in %.2fs", topology_id, len(files),
                 time.monotonic() - started)
