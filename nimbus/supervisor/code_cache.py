"""This host's verified copies of topology code: ``<storm.local.dir>/supervisor/stormdist``.

Code is kept by its code key (nimbus.state.code_versions): a topology's id for the code
it was submitted with (version 1), ``<topology-id>.v<N>`` for version N of it, so two
versions of one topology are two entries here, fetched, verified and removed apart.

A code key's directory holds Storm's three files, each checked against the sha256 the
leader wrote into the Assignment, and
``resources/``: the bundle (``stormjar.jar``) unpacked, the root a worker runs. The
directory is built in a temporary sibling and renamed into place (:func:`atomic_dir`),
so it exists only when complete and verified.

The files come through the cluster's code distributor when it serves supervisors
(:mod:`nimbus.supervisor.distributor_source`), and otherwise, or when that fails, from
the nimbuses over Thrift (the ``fetch`` the cache is given:
:mod:`nimbus.supervisor.code_transport`), in the order the caller gives (a random one:
see the supervisor's ``_peers``), each file tried on every nimbus.
"""

from __future__ import annotations

import logging
import lzma
import math
import shutil
import tarfile
import time
import zipfile
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path

from nimbus.distribution.archive import BundleError, check_bundle
from nimbus.distribution.local_code import TEMP_PREFIX, atomic_dir, check_topology_id
from nimbus.supervisor.code_transport import FetchFile
from nimbus.supervisor.distributor_source import DistributorSource

log = logging.getLogger(__name__)

BUNDLE_FILE = "stormjar.jar"   # the names the leader stores (nimbus.master.lifecycle)
CONF_FILE = "stormconf.json"
TOPOLOGY_FILE = "stormcode.ser"
CODE_FILES = (BUNDLE_FILE, CONF_FILE, TOPOLOGY_FILE)
RESOURCES_DIR = "resources"

#: How long one connect or read of a fetch may take at most (a deadline may cut it).
FETCH_IO_TIMEOUT_S = 30.0


class CodeUnavailableError(RuntimeError):
    """No peer delivered a topology's code that matches its Assignment."""


class CodeVerificationError(CodeUnavailableError):
    """Fetched code does not match the Assignment's sha256, or its bundle is unsafe."""


class CodeCache:
    """Complete, verified topology code on this host; see the module docstring.

    ``fetch`` copies a file from a nimbus (the supervisor's: Thrift's); None, the cache
    fetches nothing from the nimbuses (only through ``distributor``, if any)."""

    def __init__(self, root: Path, max_bundle_bytes: int, fetch: FetchFile | None = None,
                 distributor: DistributorSource | None = None):
        self.root = Path(root)
        self.distributor = distributor
        #: Code keys fetched, by source: "distributor" or "nimbus" (over Thrift).
        self.fetched_from: dict[str, int] = {"distributor": 0, "nimbus": 0}
        self._unneeded_since: dict[str, float] = {}   # see expired()
        #: Unneeded code keys still within their grace period at the last expired().
        self.retained: set[str] = set()
        self.root.mkdir(parents=True, exist_ok=True)
        self._max_bytes = max_bundle_bytes
        self._fetch = fetch
        # A crash during an install leaves only a temporary directory, never a copy.
        for leftover in self.root.glob(TEMP_PREFIX + "*"):
            shutil.rmtree(leftover, ignore_errors=True)

    def path(self, code_key: str) -> Path:
        """The directory of a code key (a topology id or ``<id>.v<N>``)."""
        return self.root / check_topology_id(code_key)

    def resources(self, code_key: str) -> Path:
        """The unpacked bundle: where ``topology.py`` or ``topology.yaml`` is."""
        return self.path(code_key) / RESOURCES_DIR

    def has(self, code_key: str) -> bool:
        return self.path(code_key).is_dir()

    def topologies(self) -> set[str]:
        """The code keys whose code is here (complete and verified)."""
        return {p.name for p in self.root.iterdir()
                if p.is_dir() and not p.name.startswith(TEMP_PREFIX)}

    def held(self) -> set[str]:
        """The code keys held here in any form: verified, or the distributor's copy."""
        held = self.topologies()
        if self.distributor is not None and self.distributor.copies.is_dir():
            held |= {p.name for p in self.distributor.copies.iterdir()
                     if p.is_dir() and not p.name.startswith(TEMP_PREFIX)}
        return held

    def ensure(self, code_key: str, code_sha256: dict[str, str],
               peers: Iterable[str], deadline: float | None = None) -> Path:
        """The directory of ``code_key``'s code (a topology id, or a version's key),
        fetched and verified first if it is not here yet.

        The distributor is tried first (when there is one); ``peers`` are nimbus
        addresses to try in order after it, or instead of it. Raises CodeUnavailableError when
        none delivers every file with the expected sha256 (each file is tried on every
        peer, so one corrupt copy does not block the others), or when ``deadline`` (a
        ``time.monotonic()`` value) passes first: no peer is tried after it, and each
        connect and read is bounded by the time left. Raises CodeVerificationError when
        the files match but the bundle holds an unsafe entry.
        """
        dest = self.path(code_key)
        if dest.is_dir():
            return dest
        missing = [f for f in CODE_FILES if not code_sha256.get(f)]
        if missing:
            raise CodeVerificationError(
                f"{code_key}: the assignment names no sha256 for {', '.join(missing)}; "
                "refusing to run unverified code")
        source = "distributor"
        with atomic_dir(dest) as staging:
            if self.distributor is None or not self.distributor.fetch(
                    code_key, code_sha256, staging, CODE_FILES):
                source = "nimbus"
                peers = list(dict.fromkeys(peers))
                if not peers:
                    raise CodeUnavailableError(f"{code_key}: no nimbus holds its code")
                fetch = self._fetch
                if fetch is None:
                    raise CodeUnavailableError(f"{code_key}: not delivered through the "
                                               "code distributor, and this cache cannot "
                                               "fetch from the nimbuses")
                for name in CODE_FILES:
                    self._fetch_one(fetch, code_key, name, code_sha256[name], peers,
                                    staging / name, deadline)
            self._unpack(code_key, staging / BUNDLE_FILE, staging / RESOURCES_DIR)
        self.fetched_from[source] += 1
        log.info("fetched and verified the code of %s (from the %s)", code_key,
                 "code distributor" if source == "distributor" else "nimbuses")
        return dest

    def _fetch_one(self, fetch: FetchFile, topology_id: str, name: str, expected: str,
                   peers: list[str], dest: Path, deadline: float | None = None) -> None:
        problems = []
        for peer in peers:
            timeout_s = FETCH_IO_TIMEOUT_S
            if deadline is not None:
                timeout_s = min(timeout_s, deadline - time.monotonic())
                if timeout_s <= 0:
                    problems.append("the fetch deadline passed "
                                    "(supervisor.code.fetch.timeout.secs)")
                    break
            try:
                got = fetch(peer, f"{topology_id}/{name}", dest, timeout_s=timeout_s)
            except Exception as exc:  # a peer down or without the file: try the next
                problems.append(f"{peer}: {exc or type(exc).__name__}")
                continue
            if got == expected:
                return
            problems.append(f"{peer}: sha256 {got[:12]}... is not the assigned "
                            f"{expected[:12]}...")
            log.warning("%s/%s from %s does not match its assignment's sha256", topology_id,
                        name, peer)
        dest.unlink(missing_ok=True)
        error = CodeVerificationError if problems and all(
            "sha256" in p for p in problems) else CodeUnavailableError
        raise error(f"{topology_id}/{name}: no verified copy ({'; '.join(problems)})")

    def _unpack(self, topology_id: str, bundle: Path, dest: Path) -> None:
        try:
            check_bundle(bundle, self._max_bytes)  # refuses links, "..", absolute names
        except BundleError as exc:
            raise CodeVerificationError(f"{topology_id}: unsafe bundle: {exc}") from None
        dest.mkdir()
        try:
            if zipfile.is_zipfile(bundle):
                with zipfile.ZipFile(bundle) as zf:
                    zf.extractall(dest)
            else:
                with tarfile.open(bundle) as tf:
                    # check_bundle has refused everything but files and directories; the
                    # "data" filter (where Python has it) refuses them a second time.
                    if hasattr(tarfile, "data_filter"):
                        tf.extractall(dest, filter="data")
                    else:  # pragma: no cover - Python without PEP 706
                        tf.extractall(dest)
        except (zipfile.BadZipFile, tarfile.TarError, zlib.error, lzma.LZMAError, EOFError,
                OSError, NotImplementedError) as exc:
            # Say, a zip entry that inflates beyond its declared size (its CRC fails)
            # or a full disk; atomic_dir removes what was written.
            raise CodeVerificationError(f"{topology_id}: cannot unpack its bundle: {exc}") \
                from None

    def expired(self, keep: set[str], grace_s: float, now: float | None = None,
                gone: Callable[[str], bool] = lambda _id: False) -> set[str]:
        """Of the code keys held here and not in ``keep``, those unneeded for at least
        ``grace_s`` (counted from the first call that found them unneeded; a key needed
        again starts afresh), and at once those that ``gone(code_key)``, asked once when
        a key first becomes unneeded, says no longer exist (their topology killed: no
        work of theirs can come back). The caller removes them with
        :meth:`remove_except`, keeping the rest (:attr:`retained`, set by this call)."""
        now = time.monotonic() if now is None else now
        unneeded = self.held() - keep
        for topology_id in list(self._unneeded_since):
            if topology_id not in unneeded:
                del self._unneeded_since[topology_id]
        for topology_id in unneeded - set(self._unneeded_since):
            # -inf: its grace is over at once.
            self._unneeded_since[topology_id] = -math.inf if gone(topology_id) else now
        expired = {t for t in unneeded if now - self._unneeded_since[t] >= grace_s}
        self.retained = unneeded - expired
        return expired

    def remove_except(self, keep: set[str]) -> list[str]:
        """Delete the code of every code key not in ``keep`` (the distributor's copies
        too); returns the keys removed."""
        if self.distributor is not None:
            self.distributor.remove_except(keep)
        removed = []
        for code_key in sorted(self.topologies() - keep):
            shutil.rmtree(self.root / code_key, ignore_errors=True)
            removed.append(code_key)
            log.info("removed the code of %s: no longer assigned here", code_key)
        return removed
