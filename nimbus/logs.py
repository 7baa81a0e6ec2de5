"""``nimbus-ha logs NAME``: a topology's worker logs, from wherever they are kept, with
nothing but ``nimbus.seeds`` (no ZooKeeper, no shell on a supervisor host).

A nimbus says where the logs may be (``getLogSources``: every live supervisor with a
logviewer, those the topology is assigned to first; nimbus/master/log_sources.py), and
each of those logviewers lists and serves its files (nimbus/web/logviewer_client.py). A
worker's log stays on the host that ran it after its work moved away, for
``logviewer.cleanup.age.mins``, so the logs of a crashed worker whose work went
elsewhere are found too. docs/logs.md is the user's reference; in short:

* without ``--since``: each slot's current file (``worker.log``), whole;
* ``--since 10m``: every file of each slot back to what was written in the last ten
  minutes, by each supervisor's clock, to within :data:`INDEX_SPAN_S` seconds (never
  less; the time index, nimbus/state/worker_logs.py);
* ``--worker N``: the slots ``worker-N`` runs in now, or wrote in before;
* ``--grep RE``: the lines a Python regular expression finds (searched here: the bytes
  travel);
* ``--follow``: then, every :data:`POLL_S`, what was added since, across rotations
  (a file is known by its identity, not its name), and the slots that appear (a moved or
  restarted worker), until interrupted.

Lines are prefixed with ``[<host>:<slot port>]`` when more than one slot is shown.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from nimbus.cluster_security import ClusterSecurity
from nimbus.config import Config
from nimbus.thrift.client import NimbusClient
from nimbus.web.logviewer_client import LogviewerClient, LogviewerError

POLL_S = 1.0
#: How often ``--follow`` asks again where the logs are (new slots).
REDISCOVER_S = 10.0
_SINCE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


class LogsError(Exception):
    """Nothing could be shown: no logviewer answered, or every one refused."""


def parse_since(text: str) -> float:
    """``10m``, ``30s``, ``2h``, ``1d`` or a number of seconds; ValueError otherwise."""
    match = _SINCE.fullmatch(text or "")
    if match is None:
        raise ValueError(f"--since {text!r}: expected a duration such as 30s, 10m, 2h or 1d")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds <= 0:
        raise ValueError(f"--since {text!r}: the duration must be more than 0")
    return seconds


@dataclass(frozen=True)
class LogsOptions:
    worker: int | None = None
    follow: bool = False
    since_s: float | None = None
    grep: re.Pattern[str] | None = None
    poll_s: float = POLL_S


@dataclass
class Slot:
    """One slot's logs on one supervisor: what is followed of it."""

    viewer: LogviewerClient
    topology_id: str
    port: int
    file_id: str = ""        # the identity of the file being followed (its inode)
    offset: int = 0          # how much of it was shown
    partial: bytes = b""     # the start of a line not ended yet
    label: str = field(default="")


class LogsCommand:
    """One run of ``nimbus-ha logs``; :meth:`run` returns the exit status. ``security``:
    whose certificate it presents to the nimbus and the logviewers; by default that of
    ``conf``'s TLS settings (:meth:`ClusterSecurity.for_client`)."""

    def __init__(self, conf: Config, name: str, options: LogsOptions, out: BinaryIO,
                 warn: Callable[[str], None], clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 security: ClusterSecurity | None = None):
        self.conf = conf
        self.security = security if security is not None else ClusterSecurity.for_client(conf)
        self.name = name
        self.options = options
        self._out = out
        self._warn = warn
        self._clock = clock
        self._sleep = sleep
        self.topology_id = ""   # the nimbus says (getLogSources resolves the name)
        self._slots: dict[tuple[str, int, int], Slot] = {}
        self._warned: set[str] = set()
        self._prefix = False

    def run(self) -> int:
        sources = self._discover()
        slots = self._select(sources, initial=True)
        if not slots and not self.options.follow:
            which = f"worker {self.options.worker} of " if self.options.worker is not None \
                else ""
            raise LogsError(f"no logs of {which}{self.name} on any supervisor's logviewer")
        self._prefix = len(slots) > 1 or self.options.follow
        for slot, entries in slots:
            self._show_initial(slot, entries)
        if not self.options.follow:
            for slot in self._slots.values():
                self._end_partial(slot)
            return 0
        self._follow()
        return 0  # not reached: followed until interrupted

    # -- where -------------------------------------------------------------------------
    def _discover(self) -> list[dict[str, Any]]:
        """The logviewers that may hold the topology's logs (a nimbus says)."""
        answer = NimbusClient(self.conf, security=self.security).log_sources(self.name)
        self.topology_id = str(answer["topology_id"])
        sources = [s for s in answer.get("sources", []) if isinstance(s, dict)]
        if not sources:
            raise LogsError(f"no supervisor serves worker logs (logviewer.port is 0 on "
                            f"every one), so the logs of {self.name} cannot be read from here")
        return sources

    def _select(self, sources: list[dict[str, Any]], initial: bool
                ) -> list[tuple[Slot, list[dict[str, Any]]]]:
        """(slot, its files oldest first) of every slot to show, new ones only."""
        context = self.security.client_context
        found: list[tuple[Slot, list[dict[str, Any]]]] = []
        answered = refused = 0
        for source in sources:
            address = f"{source.get('host')}:{source.get('port')}"
            try:
                viewer = LogviewerClient(str(source["host"]), int(source["port"]),
                                         bool(source.get("https")), context)
                entries = viewer.list_files(
                    self.topology_id,
                    since_secs=self.options.since_s if initial else None)
            except LogviewerError as exc:
                if exc.status in (401, 403):
                    refused += 1
                self._warn_once(address, f"warning: the logviewer of supervisor "
                                         f"{source.get('supervisor_id')}: {exc.message}")
                continue
            answered += 1
            assigned = source.get("assigned_workers") or {}
            by_port: dict[int, list[dict[str, Any]]] = {}
            for entry in entries:
                if isinstance(entry.get("port"), int) and entry.get("generation") is not None:
                    by_port.setdefault(entry["port"], []).append(entry)
            for port, files in sorted(by_port.items()):
                key = (viewer.host, viewer.port, port)
                if key in self._slots or not self._wanted(files, assigned.get(str(port))):
                    continue
                slot = Slot(viewer, self.topology_id, port, label=f"{viewer.host}:{port}")
                self._slots[key] = slot
                found.append((slot, sorted(files, key=lambda e: -int(e["generation"]))))
        if initial and not answered:
            raise LogsError("no logviewer could be read" + (
                " (every one refused: see the warnings)" if refused else
                " (see the warnings)"))
        return found

    def _wanted(self, files: list[dict[str, Any]], assigned: int | None) -> bool:
        worker = self.options.worker
        if worker is None:
            return True
        return assigned == worker or any(worker in (f.get("workers") or []) for f in files)

    # -- what --------------------------------------------------------------------------
    def _show_initial(self, slot: Slot, files: list[dict[str, Any]],
                      appeared: bool = False) -> None:
        """Print the slot's files (oldest first) as the options ask, or all of them for a
        slot that ``appeared`` while following, and remember where what was shown ends:
        following goes on from there."""
        if appeared:
            shown = [(f, 0) for f in files]
        elif self.options.since_s is None:
            shown = [(f, 0) for f in files if f["generation"] == 0]
        else:
            shown = [(f, int(f["sinceOffset"])) for f in files
                     if f.get("sinceOffset") is not None]
        for entry, start in shown:
            slot.file_id = str(entry.get("id"))
            slot.offset = self._print_file(slot, entry, start)
        if not shown and files:  # nothing to show: followed from the newest file's end
            slot.file_id, slot.offset = str(files[-1].get("id")), int(files[-1]["size"])

    def _print_file(self, slot: Slot, entry: dict[str, Any], start: int) -> int:
        """Print the file listed as ``entry`` from ``start``; returns the offset it ended
        at. A file rotated since it was listed is found again by its identity."""
        offset = start
        for _attempt in range(3):
            try:
                for chunk in slot.viewer.stream(entry["file"], offset, str(entry.get("id"))):
                    offset += len(chunk)
                    self._lines(slot, chunk)
                break
            except LogviewerError as exc:
                if exc.status == 409:  # rotated meanwhile: under which name is it now?
                    found = self._find(slot, str(entry.get("id")))
                    if found is not None:
                        entry = found
                        continue
                    message = f"[{slot.label}] part of its log was rotated away unread"
                elif exc.status == 416:  # it shrank meanwhile: nothing more to read
                    break
                else:
                    message = exc.message
                self._warn_once(str(entry["file"]), f"warning: {message}")
                break
        self._out.flush()
        return offset

    def _find(self, slot: Slot, file_id: str) -> dict[str, Any] | None:
        try:
            files = slot.viewer.list_files(slot.topology_id, port=slot.port)
        except LogviewerError:
            return None
        return next((f for f in files if str(f.get("id")) == file_id), None)

    def _lines(self, slot: Slot, data: bytes) -> None:
        *complete, slot.partial = (slot.partial + data).split(b"\n")
        for line in complete:
            self._emit(slot, line)

    def _end_partial(self, slot: Slot) -> None:
        if slot.partial:
            self._emit(slot, slot.partial)
            slot.partial = b""
        self._out.flush()

    def _emit(self, slot: Slot, line: bytes) -> None:
        grep = self.options.grep
        if grep is not None and not grep.search(line.decode("utf-8", "replace")):
            return
        prefix = f"[{slot.label}] ".encode() if self._prefix else b""
        self._out.write(prefix + line + b"\n")

    # -- follow ------------------------------------------------------------------------
    def _follow(self) -> None:
        next_discovery = self._clock() + REDISCOVER_S
        while True:
            self._sleep(self.options.poll_s)
            for slot in list(self._slots.values()):
                self._poll(slot)
            if self._clock() >= next_discovery:
                next_discovery = self._clock() + REDISCOVER_S
                self._rediscover()

    def _poll(self, slot: Slot) -> None:
        """Print what was added to the slot's log since the last look, whatever was
        rotated meanwhile: the rest of the file followed (by its identity, under its
        new name), then every newer one."""
        try:
            files = slot.viewer.list_files(slot.topology_id, port=slot.port)
        except LogviewerError as exc:
            self._warn_once(slot.label, f"warning: {exc.message} (still trying)")
            return
        self._warned.discard(slot.label)
        logs = sorted((f for f in files if f.get("generation") is not None),
                      key=lambda e: -int(e["generation"]))   # oldest first
        if not logs:
            return
        followed = next((i for i, f in enumerate(logs) if str(f.get("id")) == slot.file_id),
                        None)
        if followed is None:  # new to this slot, or rotated away unread: all there is
            if slot.file_id:
                self._warn_once(slot.label + "/lost", f"warning: [{slot.label}] some of its "
                                "log was rotated away before it could be read")
            pending = [(f, 0) for f in logs]
        else:
            entry = logs[followed]
            pending = [(entry, slot.offset)] if int(entry["size"]) > slot.offset else []
            pending += [(f, 0) for f in logs[followed + 1:]]
        for entry, start in pending:
            slot.file_id = str(entry.get("id"))
            slot.offset = self._print_file(slot, entry, start)

    def _rediscover(self) -> None:
        """Slots that appeared (a worker moved or restarted elsewhere): shown from their
        start, then followed."""
        try:
            answer = NimbusClient(self.conf, deadline_s=5.0).log_sources(self.name)
        except Exception as exc:  # the topology killed, no nimbus: follow what is known
            self._warn_once("sources", f"warning: cannot ask where the logs are now: {exc}")
            return
        sources = [s for s in answer.get("sources", []) if isinstance(s, dict)]
        for slot, entries in self._select(sources, initial=False):
            self._show_initial(slot, entries, appeared=True)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            self._warn(message)


def run_logs(conf: Config, name: str, options: LogsOptions,
             out: BinaryIO | None = None, warn: Callable[[str], None] | None = None,
             security: ClusterSecurity | None = None) -> int:
    """Run ``nimbus-ha logs`` (see the module docstring) as ``security`` (by default
    ``conf``'s); LogsError when nothing can be shown. ``--follow`` runs until
    interrupted."""
    stream = out if out is not None else sys.stdout.buffer
    return LogsCommand(conf, name, options, stream,
                       warn or (lambda text: print(text, file=sys.stderr, flush=True)),
                       security=security).run()


def compile_grep(pattern: str | None) -> re.Pattern[str] | None:
    """``--grep``: a Python regular expression; ValueError saying what is wrong."""
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"--grep {pattern!r}: not a regular expression: {exc}") from None

