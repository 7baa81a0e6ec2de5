"""The default code distributor: code on the nimbus hosts' own disks.

* ``upload`` hashes every file of the topology's code directory (sha256) into a JSON
  metafile and registers this host under ``<root>/code-distributor/<id>/<host:port>``.
* ``download`` fetches each file from a registered peer through the peer's Thrift
  ``beginFileDownload``, verifies size and sha256, and only then moves the copy into place
  and registers this host. A corrupt or partial copy is discarded and the next peer tried.
* ``get_replication_count`` counts the registrations.
* Registrations are ephemeral; after a session expiry a named thread re-creates them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import threading
from pathlib import Path
from typing import Any

from kazoo.protocol.states import KazooState

from nimbus.cluster_state import StormClusterState
from nimbus.hookspecs import DistributorContext, hookimpl
from nimbus.local_code import atomic_dir, list_files, safe_join

log = logging.getLogger(__name__)

METAFILE_FORMAT = 1


class CodeVerificationError(RuntimeError):
    """A downloaded file does not match the size or sha256 recorded at upload."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_metafile(metafile: Path, topology_id: str) -> list[dict[str, Any]]:
    """The file list of a localfs metafile; raises ValueError if it is not one."""
    try:
        meta = json.loads(Path(metafile).read_text(encoding="utf-8"))
        if meta["format"] != METAFILE_FORMAT or meta["topology_id"] != topology_id:
            raise ValueError("wrong format or topology")
        files = meta["files"]
        for entry in files:
            if not (isinstance(entry["path"], str) and isinstance(entry["size"], int)
                    and isinstance(entry["sha256"], str) and len(entry["sha256"]) == 64):
                raise ValueError(f"bad entry {entry!r:.80}")
        return files
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{metafile}: not a localfs metafile for {topology_id}: {exc}") from None


class LocalFileSystemCodeDistributor:
    """Storm's LocalFileSystemCodeDistributor, over ZooKeeper and the nimbus Thrift API."""

    name = "localfs"

    def __init__(self) -> None:
        self._ctx: DistributorContext | None = None
        self._state: StormClusterState | None = None
        self._held: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._reregister = threading.Event()
        self._thread: threading.Thread | None = None
        self._lost = False

    # -- hooks --------------------------------------------------------------------------
    @hookimpl
    def config_defaults(self) -> dict[str, Any]:
        return {}

    @hookimpl
    def prepare(self, conf: dict[str, Any], context: DistributorContext) -> None:
        self._ctx = context
        context.local_dir.mkdir(parents=True, exist_ok=True)
        if context.zk is not None:
            self._state = StormClusterState(context.zk, context.zk_root)
            context.zk.add_listener(self._on_connection_state)
            self._thread = threading.Thread(
                target=self._reregister_loop, name="localfs-reregister", daemon=True)
            self._thread.start()

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
        ctx = self._require_ctx()
        files = read_metafile(metafile, topology_id)
        peers = [p for p in self._replicas(topology_id) if p != ctx.address]
        random.shuffle(peers)  # spread the load of many downloaders over the replicas
        if not peers:
            raise RuntimeError(f"no nimbus holds a registered copy of {topology_id}")
        errors = []
        for peer in peers:
            try:
                with atomic_dir(dest_dir) as tmp:
                    for entry in files:
                        self._fetch_verified(peer, topology_id, entry, tmp)
                break
            except Exception as exc:  # try the next replica
                log.warning("download of %s from %s failed: %s", topology_id, peer, exc)
                errors.append(f"{peer}: {exc}")
        else:
            raise RuntimeError(f"could not download {topology_id}: " + "; ".join(errors))
        self._metafile_path(topology_id).write_bytes(Path(metafile).read_bytes())
        self._register(topology_id)
        return [dest_dir / e["path"] for e in files]

    @hookimpl
    def get_replication_count(self, topology_id: str) -> int:
        return len(self._replicas(topology_id))

    @hookimpl
    def cleanup(self, topology_id: str) -> None:
        ctx = self._require_ctx()
        with self._lock:
            self._held.discard(topology_id)
        if self._state is not None:
            self._state.unregister_replica(topology_id, ctx.address)
        self._metafile_path(topology_id).unlink(missing_ok=True)

    @hookimpl
    def close(self, conf: dict[str, Any]) -> None:
        self._stop.set()
        self._reregister.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._ctx is not None and self._ctx.zk is not None:
            self._ctx.zk.remove_listener(self._on_connection_state)

    # -- internals ----------------------------------------------------------------------
    def _require_ctx(self) -> DistributorContext:
        if self._ctx is None:
            raise RuntimeError("localfs distributor used before prepare()")
        return self._ctx

    def _metafile_path(self, topology_id: str) -> Path:
        return safe_join(self._require_ctx().local_dir, f"{topology_id}.meta")

    def _replicas(self, topology_id: str) -> list[str]:
        return self._state.replica_hosts(topology_id) if self._state is not None else []

    def _register(self, topology_id: str) -> None:
        with self._lock:
            self._held.add(topology_id)
        if self._state is not None:
            self._state.register_replica(topology_id, self._require_ctx().address)

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

    def _on_connection_state(self, state: str) -> None:
        # kazoo's event thread: only signal. Ephemeral registrations die with the session.
        if state == KazooState.LOST:
            self._lost = True
        elif state == KazooState.CONNECTED and self._lost:
            self._lost = False
            self._reregister.set()

    def _reregister_loop(self) -> None:
        while not self._stop.is_set():
            self._reregister.wait()
            self._reregister.clear()
            if self._stop.is_set():
                return
            with self._lock:
                held = sorted(self._held)
            ctx = self._require_ctx()
            for topology_id in held:
                if not (ctx.code_dir / topology_id).is_dir():
                    continue
                try:
                    if self._state.register_replica(topology_id, ctx.address):
                        log.info("re-registered replica of %s after session expiry", topology_id)
                except Exception as exc:
                    log.warning("re-registering %s failed, retrying: %s", topology_id, exc)
                    self._stop.wait(1.0)
                    self._reregister.set()
