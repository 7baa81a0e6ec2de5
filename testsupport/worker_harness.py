"""The supervisor's side of a worker, for tests: pipes, leases, status lines, the group.

:class:`WorkerHarness` starts ``python -m nimbus.worker`` exactly as docs/runtime.md says
a supervisor does (own session, inherited pipe fds, its first words to the slot's
``worker.log`` under the log root, which the worker then writes itself), renews or
withholds its lease, and collects the status lines. It does not talk to ZooKeeper.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nimbus.state.worker_logs import LOG_FILE, log_root, port_dir
from nimbus.worker_protocol.spec import WorkerSpec


def group_members(pgid: int) -> list[int]:
    """Pids of the live (not zombie) processes in process group ``pgid`` (Linux /proc)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces, so split after ')'.
        fields = stat[stat.rfind(")") + 2:].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def process_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] != "Z"


def wait_until(predicate: Callable[[], Any], timeout: float, what: str,
               interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned); AssertionError
    naming ``what`` after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def worker_conf(conf: dict[str, Any]) -> dict[str, Any]:
    """``conf`` over what a supervisor writes into every worker's spec: the cluster's
    defaults of each key a worker reads (a worker copies none), with ``storm.local.dir``
    as ``conf`` gives it."""
    from nimbus.config import load_config
    from nimbus.supervisor.starting import cluster_worker_conf

    local_dir = Path(conf.get("storm.local.dir") or "/nonexistent-storm-local-dir")
    defaults = cluster_worker_conf(load_config(
        overrides={"storm.local.dir": str(local_dir)}), local_dir)
    return {**defaults, **conf}


class WorkerHarness:
    """One worker process and the supervisor end of its lease and status pipes."""

    def __init__(self, worker_dir: Path, *, topology_id: str, code_dir: Path,
                 conf: dict[str, Any], port: int = 6700, supervisor_id: str = "sup-test",
                 host: str = "127.0.0.1", restarts: int = 0, worker_index: int = 0,
                 num_workers: int = 1) -> None:
        self.worker_dir = Path(worker_dir)
        self.fields = dict(topology_id=topology_id, port=port, supervisor_id=supervisor_id,
                           host=host, code_dir=str(code_dir), conf=worker_conf(conf),
                           restarts=restarts,
                           worker_index=worker_index, num_workers=num_workers)
        self.proc: subprocess.Popen[bytes] | None = None
        self.messages: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._lease_w: int | None = None
        self._status_r: int | None = None
        self._reader: threading.Thread | None = None
        self._renewer: threading.Thread | None = None
        self._renew_stop = threading.Event()

    # -- process ---------------------------------------------------------------------

    @property
    def log_path(self) -> Path:
        """The worker's log: its slot's under the log root of its configuration."""
        fields = self.fields
        return port_dir(log_root(fields["conf"]), fields["topology_id"],
                        fields["port"]) / LOG_FILE

    def start(self) -> WorkerHarness:
        self.worker_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        lease_r, self._lease_w = os.pipe()
        self._status_r, status_w = os.pipe()
        WorkerSpec(lease_fd=lease_r, status_fd=status_w, **self.fields).dump(self.worker_dir)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "nimbus.worker", str(self.worker_dir)],
                pass_fds=(lease_r, status_w), start_new_session=True,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        # Only the worker holds these ends now: its exit is the status pipe's EOF.
        os.close(lease_r)
        os.close(status_w)
        self._reader = threading.Thread(target=self._read_status, name="harness-status",
                                        daemon=True)
        self._reader.start()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def wait_exit(self, timeout: float) -> int:
        """The worker's return code (negative: killed by that signal)."""
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def signal(self, sig: int = signal.SIGTERM, group: bool = False) -> None:
        if group:
            os.killpg(self.pid, sig)
        else:
            os.kill(self.pid, sig)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        """Stop renewing, kill whatever is left of the group, close the pipes."""
        self.stop_renewing()
        if self.proc is not None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            wait_until(lambda: not group_members(self.pid), 30, "the worker's group to go")
        self.close_lease()
        if self._reader is not None:
            self._reader.join(timeout=5)
        if self._status_r is not None:
            os.close(self._status_r)
            self._status_r = None

    # -- lease -----------------------------------------------------------------------

    def lease(self, seconds: float) -> None:
        """Send one lease valid for ``seconds`` from now."""
        assert self._lease_w is not None
        os.write(self._lease_w, f"lease {time.monotonic() + seconds:.6f}\n".encode())

    def keep_renewing(self, ttl: float = 10.0, every: float = 0.5) -> None:
        """Renew the lease every ``every`` seconds (thread ``harness-lease``) until
        :meth:`stop_renewing`."""
        self.lease(ttl)
        self._renew_stop.clear()

        def renew() -> None:
            while not self._renew_stop.wait(every):
                try:
                    self.lease(ttl)
                except OSError:
                    return

        self._renewer = threading.Thread(target=renew, name="harness-lease", daemon=True)
        self._renewer.start()

    def stop_renewing(self) -> None:
        self._renew_stop.set()
        if self._renewer is not None:
            self._renewer.join()
            self._renewer = None

    def close_lease(self) -> None:
        """Close the supervisor's end: the worker sees EOF, as when the supervisor dies."""
        if self._lease_w is not None:
            os.close(self._lease_w)
            self._lease_w = None

    # -- status ----------------------------------------------------------------------

    def _read_status(self) -> None:
        assert self._status_r is not None
        buffer = b""
        while True:
            chunk = os.read(self._status_r, 65536)
            if not chunk:
                return
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            with self._cond:
                self.messages.extend(json.loads(line) for line in lines if line.strip())
                self._cond.notify_all()

    def beats(self) -> list[dict[str, Any]]:
        with self._cond:
            return [m["beat"] for m in self.messages if "beat" in m]

    def errors(self) -> list[dict[str, Any]]:
        with self._cond:
            return [m["error"] for m in self.messages if "error" in m]

    def wait_for(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        """Wait until ``predicate()`` is truthy; the failure message quotes worker.log."""
        try:
            return wait_until(predicate, timeout, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- worker.log ---\n{self.log_text()[-4000:]}") from None
