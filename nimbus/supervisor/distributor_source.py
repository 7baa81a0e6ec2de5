"""A supervisor's code through the cluster's code distributor, not through a nimbus.

The configured distributor, prepared on this supervisor in the supervisor role
(``DistributorContext.role``), downloads a topology's code with the metafile the leader
published in ZooKeeper (``/code-distributor/<code-key>``: a topology id, or a version's
``<id>.v<N>``, nimbus.state.code_versions; each key is distributed as a topology is),
exactly as a follower nimbus does: an S3, HDFS or shared-directory
store is read directly, a BitTorrent swarm is joined as a peer, and localfs spreads its
downloads over the nimbuses that hold a copy. The download keeps the distributor's own copy
under ``<supervisor dir>/code/<code-key>``; the code cache then takes the three files
from it into its own directory, each checked against the sha256 the leader wrote into the
Assignment, so a distributor is never trusted on its own.

A plugin that downloads through the nimbuses (localfs) does it with the supervisor's own
transport, given to :class:`DistributorSource` (:mod:`nimbus.supervisor.code_transport`).

Whenever this path cannot deliver, :meth:`DistributorSource.fetch` says so and the cache
falls back to the nimbuses over Thrift:

* the plugin does not set ``serves_supervisors`` (logged once), is not installed here, or
  its ``prepare`` fails (logged each time the reason changes, tried again at the next
  fetch);
* the topology's metafile is not published yet, or was written by another distributor;
* the download fails, or its files do not match the Assignment.

The distributor is prepared when the ``supervisor-code-fetch`` thread starts
(:meth:`DistributorSource.prepare`), and again at a fetch after that failed. Only that
thread fetches; :meth:`DistributorSource.remove_except`
runs on the reconcile thread and never touches the copy being downloaded.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from nimbus.distribution.distributors import CodeDistributor, DistributorError
from nimbus.distribution.hookspecs import ROLE_SUPERVISOR, DistributorContext
from nimbus.distribution.local_code import TEMP_PREFIX, check_topology_id
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.records import RecordError
from nimbus.supervisor.code_transport import FetchFile

log = logging.getLogger(__name__)

BLOCK = 1 << 20


def link_or_copy(src: Path, dst: Path, copy: bool) -> str:
    """Put ``src`` at ``dst`` (a hard link unless ``copy`` or the link fails) and return
    the sha256 of what ``dst`` holds, read back."""
    if not copy:
        try:
            os.link(src, dst)
        except OSError:  # another file system, or links refused: copy instead
            copy = True
    if copy:
        shutil.copyfile(src, dst)
    digest = hashlib.sha256()
    with open(dst, "rb") as handle:
        while block := handle.read(BLOCK):
            digest.update(block)
    return digest.hexdigest()


class DistributorSource:
    """The distributor on this supervisor; see the module docstring.

    ``copies`` is where the distributor keeps its copies (its ``code_dir``);
    ``fetch_file`` is how the plugin may download from a nimbus
    (``DistributorContext.fetch_file``); ``private_copies`` makes :meth:`fetch` copy
    files instead of hard-linking them, for code that is handed to a topology's own
    account (run-as-user), which must never be able to change the distributor's copy
    (the one a swarm seeds).
    """

    def __init__(self, conf: Any, zk: KazooClient, zk_root: str, supervisor_id: str,
                 supervisor_dir: Path, fetch_file: FetchFile, private_copies: bool = False):
        self._conf = conf
        self._fetch_file = fetch_file
        self._state = StormClusterState(zk, zk_root)
        self._zk = zk
        self._zk_root = zk_root
        self._address = f"supervisor-{supervisor_id}"
        self.copies = Path(supervisor_dir) / "code"
        self._local_dir = Path(supervisor_dir) / "code-distributor"
        self._private = private_copies
        self._lock = threading.Lock()
        self._distributor: CodeDistributor | None = None
        self._current: str | None = None   # the code key being downloaded
        self._problem = ""                  # the last reason not to use the distributor
        self._preparing = False             # _ready is preparing the plugin (see there)
        self._closed = False                # close() was called: prepare nothing more
        self.name = str(conf["storm.codedistributor.class"])
        self.delivered = 0                  # code keys delivered (tests, metrics)

    # -- the fetch thread --------------------------------------------------------------
    def prepare(self) -> bool:
        """Load and prepare the distributor now, before any fetch: the fetch thread calls
        it as it starts. The copies this supervisor kept from an earlier run are then
        served at once (a swarm seeds them again: a supervisor may be the last holder of
        a topology's code), not after its next download, and the first fetch does not
        wait for the plugin. False when the distributor cannot serve supervisors here
        (the reason logged); each fetch tries again."""
        return self._ready() is not None

    def fetch(self, code_key: str, code_sha256: dict[str, str], staging: Path,
              files: tuple[str, ...]) -> bool:
        """Put ``files`` of ``code_key``'s code, each matching ``code_sha256``, into ``staging``.

        False (and the reason logged) when this path cannot deliver them: the caller then
        fetches from the nimbuses."""
        distributor = self._ready()
        if distributor is None:
            return False
        check_topology_id(code_key)
        with self._lock:
            self._current = code_key
        try:
            copy = self._copy(distributor, code_key)
            if copy is None:
                return False
            if self._take(copy, code_key, code_sha256, staging, files):
                self.delivered += 1
                return True
            # The distributor's copy is not the assigned code: drop it, so that the next
            # fetch downloads it again rather than offer the same bytes.
            self._drop(distributor, code_key)
            return False
        finally:
            with self._lock:
                self._current = None

    def _ready(self) -> CodeDistributor | None:
        if self._distributor is not None:
            return self._distributor
        if self._closed:
            return None
        try:
            distributor = CodeDistributor.from_conf(self._conf)
        except DistributorError as exc:
            self._say(f"the code distributor is not usable here ({exc})")
            return None
        if not distributor.serves_supervisors:
            self._say(f"code distributor {distributor.name!r} does not serve supervisors "
                      "(its plugin does not set serves_supervisors)")
            return None
        with self._lock:
            if self._closed:
                return None
            # remove_except leaves the copies alone meanwhile: the plugin may be taking
            # them up (a swarm seeding them again) and must be asked to drop them.
            self._preparing = True
        try:
            self.copies.mkdir(parents=True, exist_ok=True)
            for leftover in self.copies.glob(TEMP_PREFIX + "*"):
                shutil.rmtree(leftover, ignore_errors=True)
            distributor.prepare(self._conf, DistributorContext(
                zk=self._zk, zk_root=self._zk_root, address=self._address,
                local_dir=self._local_dir / distributor.name, code_dir=self.copies,
                fetch_file=self._fetch_file, role=ROLE_SUPERVISOR))
        except Exception as exc:  # a DistributorError, or a disk that refuses the copies
            # Closed, so that the next try does not find its port or session taken.
            self._close(distributor)
            self._say(str(exc) or type(exc).__name__)
            return None
        finally:
            with self._lock:
                self._preparing = False
        with self._lock:
            closed = self._closed
            if not closed:
                self._distributor = distributor
        if closed:  # close() ran while this prepared: nothing may outlive it
            self._close(distributor)
            return None
        log.info("supervisor fetches code through code distributor %r", distributor.name)
        self._problem = ""
        return distributor

    def _say(self, problem: str) -> None:
        if problem != self._problem:
            log.warning("%s: fetching code from the nimbuses over Thrift instead", problem)
            self._problem = problem

    def _copy(self, distributor: CodeDistributor, code_key: str) -> Path | None:
        """The distributor's complete copy of the code key (downloaded now if absent)."""
        dest = self.copies / code_key
        if dest.is_dir():
            return dest
        try:
            meta = self._state.code_meta(code_key)
        except (KazooException, RecordError) as exc:
            log.warning("cannot read the metafile of %s: %s", code_key, exc)
            return None
        if meta is None:
            log.info("the metafile of %s is not published yet: fetching from the nimbuses",
                     code_key)
            return None
        if meta.distributor != distributor.name:
            log.warning("the code of %s was distributed by %r, not %r: fetching from the "
                        "nimbuses", code_key, meta.distributor, distributor.name)
            return None
        with tempfile.TemporaryDirectory(prefix=TEMP_PREFIX, dir=self.copies) as tmp:
            metafile = Path(tmp) / "metafile"
            metafile.write_bytes(meta.metafile)
            try:
                distributor.download(dest, code_key, metafile)
            except DistributorError as exc:
                log.warning("code distributor %r could not deliver %s (%s): fetching from "
                            "the nimbuses", distributor.name, code_key, exc)
                return None
        return dest if dest.is_dir() else None

    def _take(self, copy: Path, code_key: str, code_sha256: dict[str, str],
              staging: Path, files: tuple[str, ...]) -> bool:
        for name in files:
            src = copy / name
            if not src.is_file() or src.is_symlink():
                log.warning("the distributor's copy of %s has no file %s", code_key, name)
                return False
            got = link_or_copy(src, staging / name, self._private)
            if got != code_sha256[name]:
                log.warning("%s/%s from code distributor %r does not match its assignment's "
                            "sha256 (%s... is not %s...)", code_key, name, self.name,
                            got[:12], code_sha256[name][:12])
                for written in files:
                    (staging / written).unlink(missing_ok=True)
                return False
        return True

    # -- the reconcile thread ---------------------------------------------------------
    def remove_except(self, keep: set[str]) -> list[str]:
        """Drop the distributor's copies of code keys not in ``keep`` (never the one
        being downloaded); returns the keys dropped."""
        if not self.copies.is_dir():
            return []
        with self._lock:
            if self._preparing:   # see _ready: the next pass drops them
                return []
            distributor, current = self._distributor, self._current
            held = {p.name for p in self.copies.iterdir()
                    if p.is_dir() and not p.name.startswith(TEMP_PREFIX)}
            dropped = sorted(held - keep - {current})
            for code_key in dropped:
                self._drop(distributor, code_key)
        return dropped

    def _drop(self, distributor: CodeDistributor | None, code_key: str) -> None:
        if distributor is not None:
            try:
                distributor.cleanup(code_key)
            except Exception as exc:  # the copy goes anyway
                log.warning("code distributor cleanup of %s failed: %s", code_key, exc)
        shutil.rmtree(self.copies / code_key, ignore_errors=True)

    def close(self) -> None:
        """Release the distributor (its threads, sessions and swarm); one still being
        prepared is released when its prepare ends, and none is prepared after."""
        with self._lock:
            self._closed = True
            distributor, self._distributor = self._distributor, None
        if distributor is not None:
            self._close(distributor)

    def _close(self, distributor: CodeDistributor) -> None:
        try:
            distributor.close(self._conf)
        except Exception as exc:
            log.warning("closing code distributor %s failed: %s", distributor.name, exc)
