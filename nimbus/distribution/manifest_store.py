"""Base of code distributors that keep code in a shared store (S3, HDFS, ...).

Layout: ``<root>/<topology-id>/<file>`` for the code and ``<root>/<topology-id>/
.manifest.json`` written *last*, so a bundle is complete exactly when its manifest exists.
The metafile is that manifest: size and sha256 of every file.

* ``upload`` streams each file into the store, then writes the manifest.
* ``download`` streams each file into a temporary directory, hashing as it goes, and
  moves the copy into place only when every size and sha256 matches.
* ``get_replication_count`` is the store's own redundancy (declared in a setting) once
  the manifest exists, and 0 before: no nimbus hunts for another that holds a copy.
* Supervisors read the store themselves (``serves_supervisors``): ``download`` writes
  nothing but the copy, so on a supervisor it is the same call.
* ``cleanup`` drops only this host's metafile; ``delete_shared``, which only the leader
  calls after its fenced removal of the topology, deletes the objects; ``list_shared``
  lists the topologies under the root, so that the leader sweeps those whose removal did
  not finish.

A subclass provides ``name``, ``PREFIX``, ``config_defaults`` and :meth:`connect`, which
returns an fsspec filesystem and the root path; it may refine :meth:`explain`, and replace
the streaming copy of one file (:meth:`_store_file`, :meth:`_fetch_file`) with its store's
own transfer, as the s3 plugin does with concurrent parts and ranges. Either way the base
checks every downloaded file's size and sha256 against the manifest.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from nimbus.distribution.distributors import CodeVerificationError, DistributorError, MetafileError
from nimbus.distribution.hookspecs import DistributorContext, hookimpl
from nimbus.distribution.local_code import (
    atomic_dir,
    check_relative_path,
    check_topology_id,
    list_files,
    safe_join,
)
from nimbus.distribution.transfer_meter import TransferMeter

log = logging.getLogger(__name__)

MANIFEST = ".manifest.json"
MANIFEST_FORMAT = 1
STREAM_BLOCK = 8 * 1024 * 1024


class StoreCodeError(DistributorError):
    """The store is unreachable, refuses us, or holds data that fails verification."""


class StoreMetafileError(StoreCodeError, MetafileError):
    """The metafile is not this store's manifest of that topology."""


class StoreVerificationError(StoreCodeError, CodeVerificationError):
    """A file read from the store does not match its manifest's size and sha256."""


class ManifestStoreDistributor:
    """Hook implementations shared by store-backed distributors; see module docstring."""

    name = "store"
    PREFIX = "nimbus.codedistributor.store."
    # Every host with the store's settings reads it itself: supervisors fetch from the
    # store, not through a nimbus (download registers nothing, so it counts nothing).
    serves_supervisors = True

    def __init__(self) -> None:
        self.conf: dict[str, Any] = {}
        self.fs: Any = None
        self.root = ""
        self._ctx: DistributorContext | None = None

    # -- for subclasses -------------------------------------------------------------------
    def connect(self, conf: dict[str, Any]) -> tuple[Any, str]:
        """Return (fsspec filesystem, root path); raise StoreCodeError with a hint."""
        raise NotImplementedError

    def explain(self, exc: BaseException, what: str) -> StoreCodeError:
        """A StoreCodeError that says what to check; subclasses add store-specific hints."""
        return StoreCodeError(f"{self.name}: {what} failed ({type(exc).__name__}: {exc})")

    def _failed(self, exc: BaseException, what: str) -> StoreCodeError:
        """:meth:`explain`'s error, its message always starting with ``what`` (which
        names the topology) when a subclass's hint leaves it out."""
        error = self.explain(exc, what)
        if what not in str(error):
            error = type(error)(f"{what} failed: {error}")
        return error

    def setting(self, key: str) -> Any:
        return self.conf[self.PREFIX + key]

    def replication(self) -> int:
        """Copies the store keeps of a complete bundle (a setting by default)."""
        return self.setting("replication.count")

    # -- hooks ----------------------------------------------------------------------------
    @hookimpl
    def prepare(self, conf: dict[str, Any], context: DistributorContext) -> None:
        self.conf = {**self.config_defaults(),
                     **{k: v for k, v in conf.items() if k.startswith(self.PREFIX)}}
        self._ctx = context
        context.local_dir.mkdir(parents=True, exist_ok=True)
        self.fs, self.root = self.connect(self.conf)

    def _key(self, topology_id: str, rel: str = "") -> str:
        check_topology_id(topology_id)
        return f"{self.root}/{topology_id}" + (f"/{rel}" if rel else "")

    @hookimpl
    def upload(self, dir_path: Path, topology_id: str) -> Path:
        files = list_files(dir_path)
        total = sum((dir_path / rel).stat().st_size for rel in files)
        entries = []
        try:
            with TransferMeter(f"upload {topology_id} to {self.name}:{self.root}",
                               total) as meter:
                for rel in files:
                    entries.append(self._put(dir_path / rel, rel.as_posix(), topology_id, meter))
            manifest = json.dumps({"format": MANIFEST_FORMAT, "topology_id": topology_id,
                                   "root": self.root, "files": entries}, sort_keys=True)
            self.fs.pipe_file(self._key(topology_id, MANIFEST), manifest.encode())
        except StoreCodeError:
            raise
        except Exception as exc:
            raise self._failed(exc, f"upload of {topology_id}") from None
        metafile = self._ctx.local_dir / f"{topology_id}.meta"
        metafile.write_text(manifest)
        return metafile

    def _put(self, local: Path, rel: str, topology_id: str, meter: TransferMeter) -> dict:
        size, sha256 = self._store_file(local, self._key(topology_id, rel), meter)
        return {"path": rel, "size": size, "sha256": sha256}

    def _store_file(self, local: Path, key: str, meter: TransferMeter) -> tuple[int, str]:
        """Copy ``local`` to ``key``; return the size and sha256 (hex) of the bytes sent.

        The default streams through the fsspec file system in :data:`STREAM_BLOCK` blocks;
        a subclass may replace it with its store's own (e.g. concurrent) transfer."""
        digest = hashlib.sha256()
        size = 0
        # File systems with real directories (HDFS) need the parent; S3 ignores this.
        self.fs.makedirs(key.rsplit("/", 1)[0], exist_ok=True)
        with open(local, "rb") as src, self.fs.open(key, "wb") as dst:
            for block in iter(lambda: src.read(STREAM_BLOCK), b""):
                dst.write(block)
                digest.update(block)
                size += len(block)
                meter.advance(len(block))
        return size, digest.hexdigest()

    @hookimpl
    def download(self, dest_dir: Path, topology_id: str, metafile: Path) -> list[Path]:
        entries = self._read_manifest(metafile, topology_id)
        total = sum(e["size"] for e in entries)
        try:
            with atomic_dir(dest_dir) as tmp, TransferMeter(
                    f"download {topology_id} from {self.name}:{self.root}", total) as meter:
                for entry in entries:
                    self._get(entry, topology_id, tmp, meter)
        except StoreCodeError:
            raise
        except FileNotFoundError as exc:
            raise StoreCodeError(
                f"download of {topology_id}: a file of its manifest is not in "
                f"{self.name}:{self.root} (the topology was removed, or its upload never "
                f"completed): {exc}") from None
        except Exception as exc:
            raise self._failed(exc, f"download of {topology_id}") from None
        return [dest_dir / e["path"] for e in entries]

    def _get(self, entry: dict, topology_id: str, root: Path, meter: TransferMeter) -> None:
        target = safe_join(root, entry["path"])
        target.parent.mkdir(parents=True, exist_ok=True)
        size, sha256 = self._fetch_file(self._key(topology_id, entry["path"]), target,
                                        entry["size"], meter)
        if size != entry["size"] or sha256 != entry["sha256"]:
            raise StoreVerificationError(
                f"{topology_id}/{entry['path']}: the stored file in {self.name}:{self.root} "
                f"does not match its manifest ({size} bytes, sha256 "
                f"{sha256[:12]}...; expected {entry['size']} bytes, sha256 "
                f"{entry['sha256'][:12]}...); refusing the copy")

    def _fetch_file(self, key: str, target: Path, size: int,
                    meter: TransferMeter) -> tuple[int, str]:
        """Copy ``key`` (which the manifest says holds ``size`` bytes) to ``target``;
        return the size and sha256 (hex) of what was written, for the caller to verify.

        The default streams through the fsspec file system in :data:`STREAM_BLOCK`
        blocks; a subclass may replace it with its store's own transfer."""
        digest = hashlib.sha256()
        written = 0
        with self.fs.open(key, "rb") as src, open(target, "wb") as dst:
            for block in iter(lambda: src.read(STREAM_BLOCK), b""):
                dst.write(block)
                digest.update(block)
                written += len(block)
                meter.advance(len(block))
        return written, digest.hexdigest()

    def _read_manifest(self, metafile: Path, topology_id: str) -> list[dict]:
        try:
            meta = json.loads(Path(metafile).read_text(encoding="utf-8"))
            if meta["format"] != MANIFEST_FORMAT or meta["topology_id"] != topology_id:
                raise ValueError("wrong format or topology")
            if meta["root"] != self.root:
                raise ValueError(f"written for {meta['root']}, not {self.root}")
            for e in meta["files"]:
                if not (isinstance(e["path"], str) and isinstance(e["size"], int)
                        and isinstance(e["sha256"], str) and len(e["sha256"]) == 64):
                    raise ValueError(f"bad entry {e!r:.80}")
                check_relative_path(e["path"])
            return meta["files"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StoreMetafileError(
                f"{metafile}: not a {self.name} manifest for {topology_id}: {exc}") from None

    @hookimpl
    def get_replication_count(self, topology_id: str) -> int:
        try:
            complete = self.fs.exists(self._key(topology_id, MANIFEST))
        except Exception as exc:
            log.warning("replication count of %s unknown: %s", topology_id, exc)
            return 0
        return self.replication() if complete else 0

    @hookimpl
    def cleanup(self, topology_id: str) -> None:
        # This host's state only: the objects in the store are shared by every nimbus.
        (self._ctx.local_dir / f"{check_topology_id(topology_id)}.meta").unlink(missing_ok=True)

    @hookimpl
    def delete_shared(self, topology_id: str) -> None:
        # Manifest first: from that moment on nobody counts or fetches the bundle.
        for path, recursive in ((self._key(topology_id, MANIFEST), False),
                                (self._key(topology_id), True)):
            try:
                self.fs.rm(path, recursive=recursive)
            except FileNotFoundError:
                pass
            except Exception as exc:
                log.warning("could not delete %s: %s", path, exc)
                return

    @hookimpl
    def list_shared(self) -> list[str]:
        # The ids of the objects under the root, not its "directories": a store may keep
        # an empty prefix (SeaweedFS's filer does) after every object under it is gone.
        self.fs.invalidate_cache(self.root)   # s3fs caches listings: another nimbus wrote
        found = set()
        for path in self.fs.find(self.root, maxdepth=2, withdirs=False, detail=False):
            relative = str(path)[len(self.root.rstrip("/")) + 1:]
            name = relative.split("/", 1)[0]
            try:
                found.add(check_topology_id(name))
            except ValueError:
                continue
        return sorted(found)

    @hookimpl
    def close(self, conf: dict[str, Any]) -> None:
        self.fs = None
