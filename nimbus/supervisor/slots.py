"""The supervisor's slots: the worker process on each port, and what outlives one
process on a slot (its restarts, their backoff, why its next start waits).

:class:`WorkerTable` is the one place both live. ``workers`` is guarded by ``lock``
(never held while blocking): the monitor, lease, heartbeat, metrics and status reader
threads read it. ``slots`` belongs to the monitor thread; the others read it without a
lock, one field at a time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Container, Mapping
from dataclasses import dataclass, field

from nimbus.supervisor.policy import DesiredWorker, RestartBackoff
from nimbus.supervisor.worker_handle import WorkerHandle

log = logging.getLogger(__name__)


@dataclass
class SlotRecord:
    """What outlives one worker process on a slot: its restarts and their backoff."""

    restarts: int = 0
    backoff: RestartBackoff = field(default_factory=RestartBackoff)
    not_before: float = 0.0       # time.monotonic() of the earliest next start
    code_failures: int = 0        # fetches of its code that failed in a row
    code_error: str = ""          # the last one's message, recorded once
    cold_reason: str = ""         # why its next start must be cold (a warm one refused)
    waiting_for_warm: bool = False  # its start waits for a warm worker to be ready
    start_failures: int = 0       # starts in a row whose worker command could not run
    # Set when its worker exited as a crash or could not be started, until the next
    # start: it is restarting, after backoff_s, because of last_error.
    failed: bool = False
    backoff_s: float = 0.0
    last_error: str = ""
    # The code version the slot's assignment wants (0: not seen yet), and how many of
    # the slot's workers on that version exited before they committed (a crash, build()
    # raising, a query failing, a checkpoint Spark refused; never a stop of the
    # supervisor's): what an upgrade's leader reads to roll back (SupervisorInfo.workers
    # "failures"). Counted afresh when the wanted version changes.
    version: int = 0
    failures: int = 0
    # Every component (sorted) its last pipeline worker declared, once built (): unknown):
    # what the slot's next worker is told (WorkerSpec.previous_components), so that a
    # version whose components differ refuses to run beside the old code. Kept across a
    # switch of version; forgotten when the slot is no longer wanted.
    components: tuple[str, ...] = ()

    def switch_to(self, version: int) -> None:
        """The slot's assignment wants ``version`` now: its failures are counted afresh,
        and what made the last version's start wait (its backoff, its code's fetch
        failures, a warm worker's refusal) is forgotten: other code starts at once."""
        self.version, self.failures = version, 0
        self.backoff = RestartBackoff()
        self.not_before = 0.0
        self.code_failures, self.code_error = 0, ""
        self.cold_reason = ""
        self.failed, self.backoff_s = False, 0.0


class WorkerTable:
    """The workers of this supervisor by port, and the records of its slots by
    (topology, port); see the module doc for which thread touches what."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.workers: dict[int, WorkerHandle] = {}
        self.slots: dict[tuple[str, int], SlotRecord] = {}

    def running(self) -> list[WorkerHandle]:
        """Every worker handle held now (some may have exited, not yet reaped)."""
        with self.lock:
            return list(self.workers.values())

    def ports(self) -> list[int]:
        with self.lock:
            return sorted(self.workers)

    def has(self, port: int) -> bool:
        with self.lock:
            return port in self.workers

    def add(self, handle: WorkerHandle) -> None:
        with self.lock:
            self.workers[handle.port] = handle

    def pop_exited(self) -> list[WorkerHandle]:
        """Remove and return every worker whose process has exited."""
        with self.lock:
            exited = {p: h for p, h in self.workers.items() if h.exit_code() is not None}
            for port in exited:
                del self.workers[port]
        return list(exited.values())

    def pop_all(self) -> list[WorkerHandle]:
        with self.lock:
            handles = list(self.workers.values())
            self.workers.clear()
        return handles

    def record(self, topology_id: str, port: int) -> SlotRecord:
        """The slot's record, made if it has none (monitor thread)."""
        return self.slots.setdefault((topology_id, port), SlotRecord())

    def note_versions(self, desired: Mapping[int, DesiredWorker]) -> None:
        """Note the code version each slot in ``desired`` wants (monitor thread): a
        slot whose version changed starts its count of failures afresh."""
        for port, want in desired.items():
            record = self.record(want.topology_id, port)
            if record.version == want.version:
                continue
            if record.version:
                log.info("slot %s:%d switches from version %d to version %d",
                         want.topology_id, port, record.version, want.version)
            record.switch_to(want.version)

    def note_components(self, handle: WorkerHandle) -> None:
        """Remember what ``handle``'s pipeline worker declared of its topology's
        components, for its slot's next worker (monitor thread, once the worker ended:
        what it declared is final then)."""
        if handle.kind != "pipeline" or not handle.topology_components:
            return
        record = self.slots.get((handle.topology_id, handle.port))
        if record is not None:
            record.components = tuple(handle.topology_components)

    def forget_components(self, desired: Mapping[int, DesiredWorker],
                          keep: Container[str] = ()) -> None:
        """Forget the components remembered for every slot that ``desired`` does not
        give to its topology (monitor thread), but those of topologies in ``keep`` (whose
        assignment cannot be read): the topology left the slot, and whatever runs there
        when it comes back (after a deactivate, say) follows no worker of this one."""
        for (topology_id, port), record in self.slots.items():
            want = desired.get(port)
            if topology_id in keep or (want is not None and want.topology_id == topology_id):
                continue
            record.components = ()

    def restarts(self) -> dict[tuple[str, int], int]:
        """(topology, port) -> restarts, for the metrics thread."""
        # list() copies in one step under the GIL: the monitor thread owns slots.
        return {key: r.restarts for key, r in list(self.slots.items())}
