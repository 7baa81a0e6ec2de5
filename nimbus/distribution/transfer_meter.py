"""Progress and throughput of a code transfer, for distributors to report uploads/downloads.

On a terminal it draws a rich progress bar; always, when the transfer ends, it logs the
bytes moved, the duration and the throughput at INFO.
"""

from __future__ import annotations

import logging
import sys
import time
from types import TracebackType

from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

log = logging.getLogger("nimbus.transfer")


class TransferMeter:
    """``with TransferMeter("upload t-1-1 to s3", total) as meter: meter.advance(n)``."""

    def __init__(self, label: str, total_bytes: int, logger: logging.Logger = log):
        self.label = label
        self.total = total_bytes
        self.done = 0
        self._log = logger
        self._started = 0.0
        self._progress: Progress | None = None
        self._task = None

    def __enter__(self) -> TransferMeter:
        self._started = time.monotonic()
        if sys.stderr.isatty():
            self._progress = Progress("[progress.description]{task.description}", BarColumn(),
                                      DownloadColumn(), TransferSpeedColumn(), transient=True)
            self._progress.start()
            self._task = self._progress.add_task(self.label, total=self.total)
        return self

    def advance(self, nbytes: int) -> None:
        self.done += nbytes
        if self._progress is not None:
            self._progress.update(self._task, advance=nbytes)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self._started

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()
        elapsed = max(self.elapsed_s, 1e-6)
        outcome = "failed after" if exc_type else "done:"
        self._log.info("%s %s %d bytes in %.2fs (%.1f MB/s)", self.label, outcome, self.done,
                       elapsed, self.done / elapsed / 1e6)
