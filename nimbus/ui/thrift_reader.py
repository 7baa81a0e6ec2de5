"""What the UI shows, read through a nimbus (``ui.source: thrift``): for a UI host with
nothing but ``nimbus.seeds``, no ZooKeeper access and no ZooKeeper credential.

A :class:`~nimbus.ui.reader.UIReader` fed by other reads: the snapshot is the nimbus's own
(getClusterRecords: its cluster summary, the records as ZooKeeper holds them), asked every
``ui.thrift.poll.secs`` and after each action; the dashboard's live numbers, while it is
open, from getTopologyRows (every live topology's workers by state, restarts, rates and
newest error: what ``top`` shows); one topology's page from getTopologyView. The leader
is asked first, any nimbus while there is none (nimbus/thrift/nimbus_ha.thrift).

What differs from reading ZooKeeper: a change shows within a poll, not within
milliseconds of its watch; replication counts are those the nimbuses report; with
nimbus.authorizer the UI's certificate name must be in ``nimbus.ui.users`` (it reads every
topology, and applies each of its users' rights itself, as with ZooKeeper).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from thriftpy2.thrift import TException

from nimbus.config import Config
from nimbus.state import worker_state
from nimbus.state.cluster_snapshot import ClusterSnapshot
from nimbus.state.records import (
    Assignment,
    NimbusInfo,
    RecordError,
    StormBase,
    SupervisorInfo,
)
from nimbus.thrift import storm
from nimbus.thrift.client import NimbusClient, NimbusUnavailableError
from nimbus.ui.reader import ClusterUnavailableError, Live, UIReader

UNREADABLE = (RecordError, TypeError, ValueError)


def _record(cls: Any, value: Any) -> Any:
    """The record ``value`` (a JSON object) stands for, None if this release cannot
    read it (skipped, as the ZooKeeper reader skips a node it cannot decode)."""
    try:
        return cls.decode(json.dumps(value).encode())
    except UNREADABLE:
        return None


def _records(cls: Any, values: Any) -> dict[str, Any]:
    if not isinstance(values, dict):
        return {}
    decoded = {str(k): _record(cls, v) for k, v in values.items()}
    return {k: v for k, v in decoded.items() if v is not None}


class ThriftReader(UIReader):
    """A :class:`~nimbus.ui.reader.UIReader` that asks a nimbus (module docstring).
    ``start``/``stop``."""

    SOURCE_ERRORS = (NimbusUnavailableError, TException, OSError, ValueError, KeyError)
    UNREACHABLE = "no nimbus answers the UI (nimbus.seeds)"

    def __init__(self, conf: Config, fetch_conf: Callable[[str], str] | None = None,
                 client: NimbusClient | None = None):
        super().__init__(conf, fetch_conf)
        # One attempt per read (every seed once): the loop retries, never waits long.
        self.client = client or NimbusClient(conf, deadline_s=0)
        self._reload_every_s = float(conf["ui.thrift.poll.secs"])
        self._answered = False

    @property
    def connected(self) -> bool:
        return self._answered

    def storm_base(self, topology_id: str) -> StormBase | None:
        """From a snapshot read now (an action's checks must not act on a stale one)."""
        self.refresh_now()
        return self.snapshot().storms.get(topology_id)

    def topology_info(self, topology_id: str, timeout_s: float) -> dict[str, Any] | None:
        try:
            return json.loads(self.client.read(lambda c: c.getTopologyView(topology_id)))
        except storm.NotAliveException:
            return None
        except (NimbusUnavailableError, TException, OSError) as exc:
            raise ClusterUnavailableError(f"{self.UNREACHABLE}: {exc}") from None

    # -- the loop's reads --------------------------------------------------------------
    def _load(self) -> ClusterSnapshot:
        try:
            data = json.loads(self.client.read(lambda c: c.getClusterRecords()))
        except self.SOURCE_ERRORS:
            self._answered = False
            raise
        self._answered = True
        nimbuses = [_record(NimbusInfo, n) for n in data.get("nimbuses") or []]
        replication = data.get("replication")
        # The version each upgraded topology runs (what its conf is cached by); a nimbus
        # of an earlier release sends none: every topology counts as version 1.
        running = data.get("running_versions")
        version = (self._snapshot.version if self._snapshot else 0) + 1
        return ClusterSnapshot(
            nimbuses=[n for n in nimbuses if n is not None],
            leader=data.get("leader") if isinstance(data.get("leader"), str) else None,
            storms=_records(StormBase, data.get("storms")),
            assignments=_records(Assignment, data.get("assignments")),
            supervisors=_records(SupervisorInfo, data.get("supervisors")),
            replication={str(k): int(v) for k, v in replication.items()
                         if isinstance(v, int)} if isinstance(replication, dict) else {},
            running_versions={str(k): v for k, v in running.items()
                              if isinstance(v, int) and not isinstance(v, bool)}
            if isinstance(running, dict) else {},
            taken_at=time.monotonic(), version=version)

    def _poll_live(self, with_errors: bool) -> None:
        snap = self._snapshot
        if snap is None:
            return
        rows = {row["id"]: row for row in json.loads(
            self.client.read(lambda c: c.getTopologyRows()))}
        with self._lock:
            for gone in set(self._live) - set(snap.storms):
                del self._live[gone]
            for topology_id in snap.storms:
                live = self._live.setdefault(topology_id, Live())
                row = rows.get(topology_id)
                if row is None:  # killed, or not listed to this UI: nothing runs
                    live.records_per_second, live.restarts = 0.0, 0
                    live.worker_states = worker_state.count_states([])
                    live.alive_workers = 0
                    live.history.append(0.0)
                    continue
                live.records_per_second = round(float(row["processed_rows_per_second"]), 3)
                live.history.append(live.records_per_second)
                live.restarts = int(row["restarts"])
                live.worker_states = worker_state.count_states(
                    [s for s, n in row["worker_states"].items() for _ in range(int(n))])
                live.alive_workers = int(row["workers_alive"])
                if with_errors:
                    live.newest_error = row.get("newest_error_detail")
                    live.error_count = int(row.get("error_count") or 0)
            self._live_version += 1
