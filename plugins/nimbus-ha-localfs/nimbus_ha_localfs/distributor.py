"""The default code distributor: code on the nimbus hosts' own disks.

* ``upload`` hashes every file of the topology's code directory (sha256) into a JSON
  metafile and registers this host under ``<root>/code-distributor/<id>/<host:port>``.
* ``download`` fetches each file from a registered peer through the peer's Thrift
  ``beginFileDownload``, verifies size and sha256, and only then moves the copy into place
  and registers this host. A corrupt or partial copy is discarded and the next peer tried.
* ``get_replication_count`` counts the registrations.
* On a supervisor (``context.on_supervisor``) ``download`` fetches the same way, from the
  registered nimbuses, but registers nothing: a supervisor's copy is never a replica, and
  no peer fetches from a supervisor. A supervisor starts at the replica its rank among
  the topology's assigned supervisors picks, so a fleet spreads evenly over the nimbuses
  (anyone else starts at a random one).
* Registrations are ephemeral; ``nimbus.plugin_api.ReplicaRegistry`` re-creates them after a
  session expiry. At start-up, copies left on disk by an earlier run are verified against
  their metafile and registered again; a copy that fails verification is deleted so that
  the code sync fetches a good one.
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any

from nimbus.plugin_api import (
    CodeVerificationError,
    DistributorContext,
    DistributorError,
    MetafileError,
    ReplicaReader,
    ReplicaRegistry,
    TransferMeter,
    atomic_dir,
    check_relative_path,
    discard_copy,
    hookimpl,
    leftover_copies,
    list_files,
    safe_join,
    sha256_file,
    supervisor_rank,
)

log = logging.getLogger(__name__)

METAFILE_FORMAT = 1

# Errors are from nimbus.distribution.distributors: MetafileError for a metafile not localfs's for
# the topology, CodeVerificationError (also raised per file, and re-exported from here)
# when every replica served a copy that fails its size or sha256, and DistributorError
# when no replica could deliver one for any other reason.


def read_metafile(metafile: Path, topology_id: str) -> list[dict[str, Any]]:
    """The file list of a localfs metafile; raises MetafileError if it is not one."""
    try:
        meta = json.loads(Path(metafile).read_text(encoding="utf-8"))
        if meta["format"] != METAFILE_FORMAT or meta["topology_id"] != topology_id:
            raise ValueError("wrong format or topology")
        files = meta["files"]
        for entry in files:
            if not (isinstance(entry["path"], str) and isinstance(entry["size"], int)
                    and isinstance(entry["sha256"], str) and len(entry["sha256"]) == 64):
                raise ValueError(f"bad entry {entry!r:.80}")
            check_relative_path(entry["path"])
        return files
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MetafileError(
            f"{metafile}: not a localfs metafile for {topology_id}: {exc}") from None


class LocalFileSystemCodeDistributor:
    """Storm's LocalFileSystemCodeDistributor, over ZooKeeper and the nimbus Thrift API."""

    name = "localfs"
    serves_supervisors = True

    def __init__(self) -> None:
        self._ctx: DistributorContext | None = None
        self._replicas: ReplicaRegistry | None = None

    # -- hooks --------------------------------------------------------------------------
    @hookimpl
    def config_defaults(self) -> dict[str, Any]:
        return {}

    @hookimpl
    def prepare(self, conf: dict[str, Any], context: DistributorContext) -> None:
        self._ctx = context
        context.local_dir.mkdir(parents=True, exist_ok=True)
        if context.zk is not None and not context.on_supervisor:
            self._replicas = ReplicaRegistry(context.zk, context.zk_root, context.address,
                                             name="localfs")
        self._adopt_existing_copies()

    @hookimpl
    def upload(self, dir_path: Path, topology_id: str) -> Path:
        files = [{"path": rel.as_posix(), "size": (dir_path / rel).stat().st_size,
                  "sha256": sha256_file(dir_path / rel)} for rel in list_files(dir_path)]
        metafile = self._metafile_path(topology_id)
        metafile.write_text(json.dumps(
            {"format": METAFILE_FORMAT, "topology_id": topology_id, "files": files}))
        self._register(topology_id)
        return metafile

    @hookimpl
    def download(self, dest_dir: Path, topology_id: str, metafile: Path) -> list[Path]:
        files = read_metafile(metafile, topology_id)
        peers = self._download_order(topology_id)
        if not peers:
            raise DistributorError(f"no nimbus holds a registered copy of {topology_id}")
        errors = []
        refused = 0  # replicas whose copy failed verification
        total = sum(e["size"] for e in files)
        for peer in peers:
            try:
                with atomic_dir(dest_dir) as tmp, TransferMeter(
                        f"download {topology_id} from {peer}", total) as meter:
                    for entry in files:
                        self._fetch_verified(peer, topology_id, entry, tmp)
                        meter.advance(entry["size"])
                    # Before the copy is committed: a committed copy always has its
                    # metafile, so a restart can verify and register it.
                    self._metafile_path(topology_id).write_bytes(Path(metafile).read_bytes())
                break
            except Exception as exc:  # try the next replica
                log.warning("download of %s from %s failed: %s", topology_id, peer, exc)
                errors.append(f"{peer}: {exc}")
                refused += isinstance(exc, CodeVerificationError)
        else:
            if refused == len(peers):
                raise CodeVerificationError(
                    f"could not download {topology_id}: the copy of every replica fails "
                    "verification: " + "; ".join(errors))
            raise DistributorError(f"could not download {topology_id}: " + "; ".join(errors))
        self._register(topology_id)
        return [dest_dir / e["path"] for e in files]

    @hookimpl
    def get_replication_count(self, topology_id: str) -> int:
        return len(self._peers(topology_id))

    @hookimpl
    def cleanup(self, topology_id: str) -> None:
        if self._replicas is not None:
            self._replicas.unregister(topology_id)
        self._metafile_path(topology_id).unlink(missing_ok=True)

    @hookimpl
    def close(self, conf: dict[str, Any]) -> None:
        if self._replicas is not None:
            self._replicas.close()

    # -- internals ----------------------------------------------------------------------
    def _require_ctx(self) -> DistributorContext:
        if self._ctx is None:
            raise RuntimeError("localfs distributor used before prepare()")
        return self._ctx

    def _metafile_path(self, topology_id: str) -> Path:
        return safe_join(self._require_ctx().local_dir, f"{topology_id}.meta")

    def _peers(self, topology_id: str) -> list[str]:
        ctx = self._require_ctx()
        if ctx.on_supervisor and ctx.zk is not None:
            # Read-only: a supervisor keeps no registry of its own.
            return sorted(ReplicaReader(ctx.zk, ctx.zk_root).peers(topology_id))
        return sorted(self._replicas.peers(topology_id)) if self._replicas is not None else []

    def _download_order(self, topology_id: str) -> list[str]:
        """The replicas to try, spread over many downloaders.

        A supervisor named in the topology's Assignment starts at the replica its rank
        among the assigned supervisors picks (rank mod replicas): a fleet fetching one
        topology at once loads every nimbus within one download of the others. Anyone
        else (a nimbus, a supervisor not in the assignment yet) takes a random order. The
        rest follow in order, so every replica is tried before the download fails.
        """
        ctx = self._require_ctx()
        peers = [p for p in self._peers(topology_id) if p != ctx.address]
        rank = self._supervisor_rank(topology_id) if ctx.on_supervisor else None
        if rank is None or not peers:
            random.shuffle(peers)
            return peers
        start = rank % len(peers)
        return peers[start:] + peers[:start]

    def _supervisor_rank(self, topology_id: str) -> int | None:
        ctx = self._require_ctx()
        return supervisor_rank(ctx.zk, ctx.zk_root, ctx.address.removeprefix("supervisor-"),
                               topology_id)

    def _register(self, topology_id: str) -> None:
        if self._replicas is not None:
            self._replicas.register(topology_id, self._require_ctx().address)

    def _adopt_existing_copies(self) -> None:
        """Register copies an earlier run left on disk, if they still verify."""
        ctx = self._require_ctx()
        for topology_id, metafile, code in leftover_copies(ctx.local_dir, ".meta", ctx.code_dir):
            try:
                for entry in read_metafile(metafile, topology_id):
                    path = safe_join(code, entry["path"])
                    if path.stat().st_size != entry["size"] or sha256_file(path) != entry["sha256"]:
                        raise CodeVerificationError(f"{entry['path']} changed on disk")
            except (OSError, ValueError, DistributorError) as exc:
                log.warning("local copy of %s is not intact (%s): deleting it", topology_id, exc)
                discard_copy(metafile, code)
                continue
            self._register(topology_id)

    def _fetch_verified(self, peer: str, topology_id: str, entry: dict[str, Any],
                        dest_root: Path) -> None:
        ctx = self._require_ctx()
        target = safe_join(dest_root, entry["path"])
        target.parent.mkdir(parents=True, exist_ok=True)
        digest = ctx.fetch_file(peer, f"{topology_id}/{entry['path']}", target)
        size = target.stat().st_size
        if size != entry["size"]:
            raise CodeVerificationError(
                f"{entry['path']}: {size} bytes received, {entry['size']} expected")
        if digest != entry["sha256"]:
            raise CodeVerificationError(f"{entry['path']}: sha256 mismatch ({digest})")
