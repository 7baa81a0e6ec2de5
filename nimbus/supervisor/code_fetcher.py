"""Topology code fetched apart from the reconcile loop, each fetch within a deadline.

A code fetch talks to nimbuses, which may be slow, far or cut off; unpacking a large
bundle takes time too. The reconcile loop must never wait for either: it is also what
stops workers that are no longer assigned here. So the loop only *asks*
(:meth:`CodeFetcher.request`) and goes on; the ``supervisor-code-fetch`` thread fetches,
verifies and unpacks one code key (a topology id, or a version's ``<id>.v<N>``:
nimbus.state.code_versions) at a time (:class:`~nimbus.supervisor.code_cache.
CodeCache`), gives up on it after ``supervisor.code.fetch.timeout.secs``, and wakes the
loop when a fetch has ended either way.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nimbus.background_loop import BackgroundLoop
from nimbus.supervisor.code_cache import CodeCache, CodeUnavailableError

log = logging.getLogger(__name__)


@dataclass
class _Job:
    code_sha256: dict[str, str]
    error: CodeUnavailableError | None = None   # set when the fetch failed


class CodeFetcher:
    """Fetch requested code keys' code on a thread of its own; see the module doc.

    ``peers(code_key)`` lists the nimbuses to try (it may read ZooKeeper: it runs on
    the fetch thread); ``on_done()`` is called after each fetch, whatever its outcome.
    """

    def __init__(self, cache: CodeCache, peers: Callable[[str], list[str]],
                 on_done: Callable[[], None], timeout_s: float):
        self.cache = cache
        self._peers = peers
        self._on_done = on_done
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._jobs: dict[str, _Job] = {}
        self._queue: collections.deque[str] = collections.deque()
        self.current: str | None = None   # the code key being fetched now
        self._idle = False                # the last step found nothing queued
        self._prepared = False            # the distributor was prepared (first step)
        # Straight on to the next fetch; when none is queued, a request wakes the loop
        # (and a look every second is the safety net).
        self._loop = BackgroundLoop("supervisor-code-fetch", self._fetch_next,
                                    period=lambda: 1.0 if self._idle else 0.0)

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        """Stop after the fetch under way, if any (bounded by its deadline)."""
        self._loop.stop(join_timeout=self.timeout_s + 10)

    def request(self, code_key: str, code_sha256: dict[str, str]) -> Path | None:
        """The code key's verified code directory if it is here; otherwise None, and a
        fetch is queued (once). Raises the error of a fetch that failed since the last
        request, once: the next request queues a new attempt."""
        if self.cache.has(code_key):
            return self.cache.path(code_key)
        with self._lock:
            job = self._jobs.get(code_key)
            if job is not None and job.error is not None:
                del self._jobs[code_key]
                raise job.error
            if job is None or job.code_sha256 != code_sha256:
                self._jobs[code_key] = _Job(dict(code_sha256))
                if code_key not in self._queue:
                    self._queue.append(code_key)
                self._loop.wake()
        return None

    def forget_except(self, keep: set[str]) -> None:
        """Drop the queued fetches of code keys not in ``keep`` (the one under way ends
        by itself; its code is removed by the next clean-up if still unwanted)."""
        with self._lock:
            for code_key in list(self._jobs):
                if code_key not in keep and code_key != self.current:
                    del self._jobs[code_key]
            self._queue = collections.deque(t for t in self._queue if t in self._jobs)

    def _next(self) -> tuple[str, dict[str, str]] | None:
        with self._lock:
            while self._queue:
                code_key = self._queue.popleft()
                job = self._jobs.get(code_key)
                if job is not None and job.error is None:
                    self.current = code_key
                    return code_key, job.code_sha256
            return None

    def _fetch_next(self) -> None:
        """One step of the ``supervisor-code-fetch`` loop: the next queued fetch (the
        first step prepares the code distributor, if any)."""
        if not self._prepared:
            self._prepared = True
            if self.cache.distributor is not None:
                self.cache.distributor.prepare()
        found = self._next()
        self._idle = found is None
        if found is None:
            return
        code_key, code_sha256 = found
        error: CodeUnavailableError | None = None
        started = time.monotonic()
        try:
            self.cache.ensure(code_key, code_sha256, self._peers(code_key),
                              deadline=started + self.timeout_s)
        except CodeUnavailableError as exc:
            error = exc
        except Exception as exc:  # a ZooKeeper error listing the peers, say
            error = CodeUnavailableError(f"{code_key}: {exc}")
        with self._lock:
            self.current = None
            job = self._jobs.get(code_key)
            if job is not None and job.code_sha256 == code_sha256:
                if error is None:
                    del self._jobs[code_key]
                else:
                    job.error = error
        if error is None:
            log.info("code of %s ready after %.1f s", code_key,
                     time.monotonic() - started)
        self._on_done()
