"""Code distributor that keeps topology code in a directory every nimbus mounts.

The directory (``nimbus.codedistributor.shareddir.path``) is shared by all nimbuses: NFS,
CephFS, Lustre, or any file system mounted at the same place on each of them. Layout::

    <path>/.store-id                  a random id written once: metafiles name their store
    <path>/<topology-id>/<file>       the code (stormjar.jar, stormconf.json, stormcode.ser)
    <path>/<topology-id>/.manifest.json   size and sha256 of every file

* ``upload`` copies the code into ``<path>/.incoming-<id>-<random>``, reads every copy
  back and checks its sha256, writes the manifest, syncs the files, then renames the
  directory to ``<path>/<id>``: a bundle is visible complete or not at all.
* ``download`` copies every file into a temporary sibling of ``dest_dir``, hashing as it
  goes, and renames it into place only if every size and sha256 matches the metafile.
* ``get_replication_count`` is the share's declared redundancy
  (``nimbus.codedistributor.shareddir.replication.count``) once the bundle is in place,
  and 0 before and after ``delete_shared``.
* Supervisors that mount the share read it themselves (``serves_supervisors``);
  ``download`` registers nothing, so on a supervisor it is the same call.
* ``cleanup`` drops only this host's metafile; ``delete_shared`` (the leader's, after its
  fenced removal of the topology) renames the bundle away, then deletes it;
  ``list_shared`` lists the bundles, so that the leader sweeps those whose removal did
  not finish.
* ``upload`` and ``download`` first read ``<path>/.store-id`` back: a share that is no
  longer mounted (an empty mount point, or no directory at all) or that another share
  replaced fails with an error naming ``nimbus.codedistributor.shareddir.path``, instead
  of writing the code to the local disk under the mount point or calling it removed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from nimbus.plugin_api import (
    CodeVerificationError,
    DistributorContext,
    DistributorError,
    MetafileError,
    atomic_dir,
    check_relative_path,
    check_topology_id,
    hookimpl,
    list_files,
    safe_join,
)

log = logging.getLogger(__name__)

NAME = "shareddir"
PREFIX = f"nimbus.codedistributor.{NAME}."
MANIFEST = ".manifest.json"
STORE_ID = ".store-id"
METAFILE_FORMAT = 1
BLOCK = 1 << 20


def copy_hashed(src: Path, dst: Path, fsync: bool) -> tuple[int, str]:
    """Copy ``src`` to ``dst`` in 1 MiB blocks; (bytes written, sha256 of them)."""
    import hashlib

    digest = hashlib.sha256()
    size = 0
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while block := fin.read(BLOCK):
            fout.write(block)
            digest.update(block)
            size += len(block)
        if fsync:
            fout.flush()
            os.fsync(fout.fileno())
    return size, digest.hexdigest()


def hash_file(path: Path) -> tuple[int, str]:
    """(size, sha256) of a file as it is on disk now (read back, not from a cache we hold)."""
    import hashlib

    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as fin:
        while block := fin.read(BLOCK):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


class SharedDirCodeDistributor:
    """Topology code in a directory shared by all nimbuses; see the module docstring."""

    name = NAME
    # A supervisor that mounts the share reads it itself; download registers nothing.
    serves_supervisors = True

    def __init__(self) -> None:
        self.root = Path()
        self.store_id = ""
        self.replication = 1
        self.fsync = True
        self._ctx: DistributorContext | None = None

    # -- hooks ----------------------------------------------------------------------------
    @hookimpl
    def config_defaults(self) -> dict[str, Any]:
        return {
            PREFIX + "path": "",               # required: the shared directory
            PREFIX + "replication.count": 1,   # the share's own redundancy (declared)
            PREFIX + "fsync": True,            # sync every file before it becomes visible
        }

    @hookimpl
    def prepare(self, conf: dict[str, Any], context: DistributorContext) -> None:
        settings = {**self.config_defaults(),
                    **{k: v for k, v in conf.items() if k.startswith(PREFIX)}}
        if not settings[PREFIX + "path"]:
            raise DistributorError(f"set {PREFIX}path to the directory shared by all nimbuses")
        self.root = Path(settings[PREFIX + "path"]).expanduser().absolute()
        if not self.root.is_dir():
            raise DistributorError(
                f"{PREFIX}path {self.root} is not a directory (is the share mounted?)")
        # A supervisor only reads the share (a read-only mount is enough there).
        wanted = os.R_OK | os.X_OK if context.on_supervisor else os.W_OK | os.X_OK
        if not os.access(self.root, wanted):
            raise DistributorError(
                f"{PREFIX}path {self.root} is not "
                f"{'readable' if context.on_supervisor else 'writable'} by this "
                f"{'supervisor' if context.on_supervisor else 'nimbus'}")
        if settings[PREFIX + "replication.count"] < 1:
            raise DistributorError(f"{PREFIX}replication.count must be at least 1")
        self.replication = settings[PREFIX + "replication.count"]
        self.fsync = settings[PREFIX + "fsync"]
        self.store_id = self._read_store_id() if context.on_supervisor else self._store_id()
        self._ctx = context
        context.local_dir.mkdir(parents=True, exist_ok=True)

    @hookimpl
    def upload(self, dir_path: Path, topology_id: str) -> Path:
        bundle = self._bundle(topology_id)
        self._check_share(f"upload of {topology_id}")
        staging = self.root / f".incoming-{topology_id}-{uuid.uuid4().hex[:8]}"
        try:
            entries = []
            for rel in list_files(dir_path):
                target = staging / rel
                size, digest = copy_hashed(dir_path / rel, target, self.fsync)
                # Read the copy back: a share that lost or mangled bytes fails here, on the
                # leader, instead of on every nimbus that downloads it later.
                if hash_file(target) != (size, digest):
                    raise CodeVerificationError(
                        f"{topology_id}/{rel.as_posix()}: the copy written to {staging} "
                        "does not read back the same; check the share")
                entries.append({"path": rel.as_posix(), "size": size, "sha256": digest})
            meta = {"format": METAFILE_FORMAT, "distributor": NAME, "store": self.store_id,
                    "topology_id": topology_id, "files": entries}
            (staging / MANIFEST).write_text(json.dumps(meta, sort_keys=True))
            if bundle.exists():  # an abandoned earlier upload of this id
                self._remove(bundle)
            os.replace(staging, bundle)  # atomic: complete or absent
        except DistributorError:
            raise
        except OSError as exc:
            raise DistributorError(
                f"upload of {topology_id} to {self.root} failed: {exc}; check the share at "
                f"{PREFIX}path (mounted, writable, not full?)") from None
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        metafile = self._metafile(topology_id)
        metafile.write_text(json.dumps(meta, sort_keys=True))
        return metafile

    @hookimpl
    def download(self, dest_dir: Path, topology_id: str, metafile: Path) -> list[Path]:
        entries = self._read_metafile(metafile, topology_id)
        bundle = self._bundle(topology_id)
        self._check_share(f"download of {topology_id}")
        if not (bundle / MANIFEST).is_file():
            raise DistributorError(
                f"download of {topology_id}: its code is not in {self.root} (the topology "
                f"was removed from the share, or {PREFIX}path differs between nimbuses)")
        try:
            with atomic_dir(dest_dir) as tmp:
                for entry in entries:
                    size, digest = copy_hashed(safe_join(bundle, entry["path"]),
                                               safe_join(tmp, entry["path"]), fsync=False)
                    if (size, digest) != (entry["size"], entry["sha256"]):
                        raise CodeVerificationError(
                            f"{topology_id}/{entry['path']}: the copy in {self.root} does not "
                            f"match its metafile ({size} bytes, sha256 {digest[:12]}...; "
                            f"expected {entry['size']} bytes, sha256 "
                            f"{entry['sha256'][:12]}...); refusing it")
        except DistributorError:
            raise
        except OSError as exc:
            raise DistributorError(
                f"download of {topology_id} from {self.root} failed: {exc}; check the share "
                f"at {PREFIX}path (mounted, readable?)") from None
        return [dest_dir / e["path"] for e in entries]

    @hookimpl
    def get_replication_count(self, topology_id: str) -> int:
        try:
            complete = (self._bundle(topology_id) / MANIFEST).is_file()
        except (OSError, ValueError) as exc:  # a bad id, or the share is gone
            log.warning("replication count of %s unknown: %s", topology_id, exc)
            return 0
        return self.replication if complete else 0

    @hookimpl
    def cleanup(self, topology_id: str) -> None:
        # This host's metafile only: the bundle on the share belongs to every nimbus.
        self._metafile(topology_id).unlink(missing_ok=True)

    @hookimpl
    def delete_shared(self, topology_id: str) -> None:
        bundle = self._bundle(topology_id)
        if bundle.exists():
            self._remove(bundle)

    @hookimpl
    def list_shared(self) -> list[str]:
        # Bundles only: .incoming-* (an upload under way) and .deleting-* are not ids.
        found = []
        for entry in self.root.iterdir():
            try:
                found.append(check_topology_id(entry.name))
            except ValueError:
                continue
        return sorted(found)

    @hookimpl
    def close(self, conf: dict[str, Any]) -> None:
        self._ctx = None  # nothing to release: no threads, no sessions

    # -- internals ------------------------------------------------------------------------
    def _store_id(self) -> str:
        """The share's id, created once by the first nimbus; every other one reads it.

        It appears whole or not at all: it is written to a file of its own, then
        linked under its name. A link is made only while the name is free, so one nimbus
        wins a race of several, and none reads an id half written. With O_EXCL alone, a
        nimbus starting beside the winner read the file empty and took "" for the id."""
        path = self.root / STORE_ID
        if not path.exists():
            temp = self.root / f"{STORE_ID}.{uuid.uuid4().hex}.tmp"
            try:
                with open(temp, "w", encoding="utf-8") as handle:
                    handle.write(uuid.uuid4().hex + "\n")
                    if self.fsync:
                        handle.flush()
                        os.fsync(handle.fileno())
                os.link(temp, path)
            except FileExistsError:
                pass  # another nimbus's id is in place
            finally:
                temp.unlink(missing_ok=True)
        found = path.read_text(encoding="utf-8").strip()
        if not found:
            raise DistributorError(
                f"{PREFIX}path {self.root}: its {STORE_ID} is empty (a nimbus of an "
                "older release died while writing it); remove it and start again")
        return found

    def _check_share(self, what: str) -> None:
        """The share ``prepare`` found is still mounted at ``path``: its ``.store-id`` reads
        back the same. Raises a DistributorError naming the setting otherwise."""
        try:
            found = (self.root / STORE_ID).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise DistributorError(
                f"{what}: the share at {PREFIX}path {self.root} is unreachable: its "
                f"{STORE_ID} cannot be read ({exc.strerror or exc}); is the share still "
                "mounted there?") from None
        if found != self.store_id:
            raise DistributorError(
                f"{what}: {PREFIX}path {self.root} holds another share now (store {found}, "
                f"not {self.store_id}); is the right share mounted there?")

    def _read_store_id(self) -> str:
        """The share's id, as a supervisor reads it (it never creates it)."""
        try:
            return (self.root / STORE_ID).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise DistributorError(
                f"{PREFIX}path {self.root} holds no {STORE_ID} ({exc.strerror}): no nimbus "
                "has used this share yet, or it is another directory than the nimbuses' "
                "share") from None

    def _bundle(self, topology_id: str) -> Path:
        return self.root / check_topology_id(topology_id)

    def _metafile(self, topology_id: str) -> Path:
        if self._ctx is None:
            raise DistributorError(f"{NAME} distributor used before prepare()")
        return self._ctx.local_dir / f"{check_topology_id(topology_id)}.meta"

    def _remove(self, bundle: Path) -> None:
        """Rename the bundle away first (atomic: nobody counts or fetches it from then
        on), then delete it."""
        doomed = self.root / f".deleting-{bundle.name}-{uuid.uuid4().hex[:8]}"
        try:
            os.replace(bundle, doomed)
        except FileNotFoundError:
            return  # another nimbus got there first
        shutil.rmtree(doomed, ignore_errors=True)

    def _read_metafile(self, metafile: Path, topology_id: str) -> list[dict[str, Any]]:
        """The file list of a metafile this store wrote for ``topology_id``, or
        MetafileError before anything is fetched."""
        try:
            meta = json.loads(Path(metafile).read_text(encoding="utf-8"))
            if meta["format"] != METAFILE_FORMAT or meta["distributor"] != NAME:
                raise ValueError("not a shareddir metafile")
            if meta["topology_id"] != topology_id:
                raise ValueError(f"written for {meta['topology_id']}")
            if meta["store"] != self.store_id:
                raise ValueError(f"written for another share (store {meta['store']}, "
                                 f"this is {self.store_id} at {self.root})")
            for entry in meta["files"]:
                if not (isinstance(entry["path"], str) and isinstance(entry["size"], int)
                        and isinstance(entry["sha256"], str) and len(entry["sha256"]) == 64):
                    raise ValueError(f"bad entry {entry!r:.80}")
                check_relative_path(entry["path"])
            return meta["files"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise MetafileError(
                f"{metafile}: not a {NAME} metafile for {topology_id}: {exc}") from None
