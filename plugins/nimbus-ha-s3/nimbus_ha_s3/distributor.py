"""Code distributor that keeps topology code in S3 or any S3-compatible store (s3fs).

Layout: ``s3://<bucket>/<prefix>/<topology-id>/<file>`` for the code and
``.../<topology-id>/.manifest.json`` written *last*, so a bundle is complete exactly when
its manifest exists. The metafile is that manifest: sizes and sha256 of every file.

* ``upload`` streams each file to the store (s3fs switches to multipart above the block
  size), then writes the manifest.
* ``download`` streams each object into a temporary directory, hashing as it goes, and
  moves the copy into place only when every size and sha256 matches.
* ``get_replication_count`` is the store's own redundancy (a setting; S3 keeps several
  copies) once the manifest exists, and 0 before: no replica hunting between nimbuses.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from nimbus.hookspecs import DistributorContext, hookimpl
from nimbus.local_code import (
    atomic_dir,
    check_relative_path,
    check_topology_id,
    list_files,
    safe_join,
)
from nimbus.transfer_meter import TransferMeter

log = logging.getLogger(__name__)

PREFIX = "nimbus.codedistributor.s3."
MANIFEST = ".manifest.json"
MANIFEST_FORMAT = 1
STREAM_BLOCK = 8 * 1024 * 1024


class S3CodeError(RuntimeError):
    """The store is unreachable, refuses us, or holds data that fails verification."""


def _explain(exc: BaseException, what: str, conf: dict[str, Any]) -> S3CodeError:
    """Turn botocore/s3fs errors into messages that say what to check."""
    endpoint = conf.get(PREFIX + "endpoint") or "AWS default endpoint"
    bucket = conf.get(PREFIX + "bucket")
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, PermissionError) or "AccessDenied" in text or "InvalidAccessKeyId" in text \
            or "SignatureDoesNotMatch" in text:
        hint = (f"credentials refused by {endpoint}: check {PREFIX}access.key/secret.key "
                "or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY")
    elif "NoSuchBucket" in text or (isinstance(exc, FileNotFoundError) and what == "bucket"):
        hint = f"bucket {bucket!r} does not exist at {endpoint}: create it or fix {PREFIX}bucket"
    elif "Connect" in text or "Endpoint" in text or isinstance(exc, (ConnectionError, OSError)):
        hint = f"cannot reach {endpoint}: check {PREFIX}endpoint"
    else:
        hint = f"S3 error during {what}"
    return S3CodeError(f"{hint} ({text})")


class S3CodeDistributor:
    """Topology code in an S3 bucket; see the module docstring."""

    name = "s3"

    def __init__(self) -> None:
        self._conf: dict[str, Any] = {}
        self._fs: Any = None
        self._root = ""
        self._ctx: DistributorContext | None = None

    @hookimpl
    def config_defaults(self) -> dict[str, Any]:
        return {
            PREFIX + "endpoint": "",          # e.g. http://127.0.0.1:8333; "" = AWS
            PREFIX + "region": "",            # "" = from the environment / us-east-1
            PREFIX + "bucket": "",            # required
            PREFIX + "prefix": "nimbus-ha/code",
            PREFIX + "access.key": "",        # "" = AWS_ACCESS_KEY_ID / AWS profile
            PREFIX + "secret.key": "",        # "" = AWS_SECRET_ACCESS_KEY / AWS profile
            PREFIX + "multipart.chunk.mb": 16,
            PREFIX + "replication.count": 3,
            PREFIX + "connect.timeout.secs": 5,
        }

    @hookimpl
    def prepare(self, conf: dict[str, Any], context: DistributorContext) -> None:
        import s3fs

        defaults = self.config_defaults()
        self._conf = {**defaults, **{k: v for k, v in conf.items() if k.startswith(PREFIX)}}
        self._ctx = context
        bucket = self._conf[PREFIX + "bucket"]
        if not bucket:
            raise S3CodeError(f"set {PREFIX}bucket to the bucket that holds topology code")
        client_kwargs: dict[str, Any] = {}
        if self._conf[PREFIX + "endpoint"]:
            client_kwargs["endpoint_url"] = self._conf[PREFIX + "endpoint"]
        if self._conf[PREFIX + "region"]:
            client_kwargs["region_name"] = self._conf[PREFIX + "region"]
        timeout = self._conf[PREFIX + "connect.timeout.secs"]
        self._fs = s3fs.S3FileSystem(
            key=self._conf[PREFIX + "access.key"] or None,
            secret=self._conf[PREFIX + "secret.key"] or None,
            client_kwargs=client_kwargs,
            config_kwargs={"connect_timeout": timeout, "read_timeout": 60,
                           "retries": {"max_attempts": 2}},
            default_block_size=self._conf[PREFIX + "multipart.chunk.mb"] * 1024 * 1024,
            skip_instance_cache=True, use_listings_cache=False)
        self._fs.retries = 2  # s3fs's own retry count (not a constructor argument)
        self._root = f"{bucket}/{self._conf[PREFIX + 'prefix'].strip('/')}".rstrip("/")
        try:
            self._fs.ls(bucket, refresh=True)  # fail fast: endpoint, credentials, bucket
        except Exception as exc:
            raise _explain(exc, "bucket", self._conf) from None

    def _key(self, topology_id: str, rel: str = "") -> str:
        check_topology_id(topology_id)
        return f"{self._root}/{topology_id}" + (f"/{rel}" if rel else "")

    @hookimpl
    def upload(self, dir_path: Path, topology_id: str) -> Path:
        files = list_files(dir_path)
        total = sum((dir_path / rel).stat().st_size for rel in files)
        entries = []
        try:
            with TransferMeter(f"upload {topology_id} to s3://{self._root}", total) as meter:
                for rel in files:
                    entries.append(self._put(dir_path / rel, rel.as_posix(), topology_id, meter))
            manifest = json.dumps({"format": MANIFEST_FORMAT, "topology_id": topology_id,
                                   "root": self._root, "files": entries}, sort_keys=True)
            self._fs.pipe_file(self._key(topology_id, MANIFEST), manifest.encode())
        except S3CodeError:
            raise
        except Exception as exc:
            raise _explain(exc, f"upload of {topology_id}", self._conf) from None
        metafile = self._local_dir() / f"{topology_id}.meta"
        metafile.write_text(manifest)
        return metafile

    def _put(self, local: Path, rel: str, topology_id: str, meter: TransferMeter) -> dict:
        digest = hashlib.sha256()
        size = 0
        with open(local, "rb") as src, self._fs.open(self._key(topology_id, rel), "wb") as dst:
            for block in iter(lambda: src.read(STREAM_BLOCK), b""):
                dst.write(block)
                digest.update(block)
                size += len(block)
                meter.advance(len(block))
        return {"path": rel, "size": size, "sha256": digest.hexdigest()}

    @hookimpl
    def download(self, dest_dir: Path, topology_id: str, metafile: Path) -> list[Path]:
        entries = self._read_manifest(metafile, topology_id)
        total = sum(e["size"] for e in entries)
        try:
            with atomic_dir(dest_dir) as tmp, TransferMeter(
                    f"download {topology_id} from s3://{self._root}", total) as meter:
                for entry in entries:
                    self._get(entry, topology_id, tmp, meter)
        except S3CodeError:
            raise
        except Exception as exc:
            raise _explain(exc, f"download of {topology_id}", self._conf) from None
        return [dest_dir / e["path"] for e in entries]

    def _get(self, entry: dict, topology_id: str, root: Path, meter: TransferMeter) -> None:
        target = safe_join(root, entry["path"])
        target.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        size = 0
        with self._fs.open(self._key(topology_id, entry["path"]), "rb",
                           block_size=STREAM_BLOCK) as src, open(target, "wb") as dst:
            for block in iter(lambda: src.read(STREAM_BLOCK), b""):
                dst.write(block)
                digest.update(block)
                size += len(block)
                meter.advance(len(block))
        if size != entry["size"] or digest.hexdigest() != entry["sha256"]:
            raise S3CodeError(f"{topology_id}/{entry['path']}: the object in s3://{self._root} "
                              f"does not match its manifest ({size} bytes, sha256 "
                              f"{digest.hexdigest()[:12]}...); refusing the copy")

    def _read_manifest(self, metafile: Path, topology_id: str) -> list[dict]:
        try:
            meta = json.loads(Path(metafile).read_text(encoding="utf-8"))
            if meta["format"] != MANIFEST_FORMAT or meta["topology_id"] != topology_id:
                raise ValueError("wrong format or topology")
            if meta["root"] != self._root:
                raise ValueError(f"written for s3://{meta['root']}, not s3://{self._root}")
            for e in meta["files"]:
                if not (isinstance(e["path"], str) and isinstance(e["size"], int)
                        and isinstance(e["sha256"], str) and len(e["sha256"]) == 64):
                    raise ValueError(f"bad entry {e!r:.80}")
                check_relative_path(e["path"])
            return meta["files"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise S3CodeError(f"{metafile}: not an s3 manifest for {topology_id}: {exc}") from None

    @hookimpl
    def get_replication_count(self, topology_id: str) -> int:
        try:
            complete = self._fs.exists(self._key(topology_id, MANIFEST))
        except Exception as exc:
            log.warning("replication count of %s unknown: %s", topology_id, exc)
            return 0
        return self._conf[PREFIX + "replication.count"] if complete else 0

    @hookimpl
    def cleanup(self, topology_id: str) -> None:
        (self._local_dir() / f"{topology_id}.meta").unlink(missing_ok=True)
        try:
            # Manifest first: from that moment on nobody counts or fetches the bundle.
            self._fs.rm(self._key(topology_id, MANIFEST))
        except FileNotFoundError:
            pass
        except Exception as exc:
            log.warning("could not delete the manifest of %s: %s", topology_id, exc)
            return
        try:
            self._fs.rm(self._key(topology_id), recursive=True)
        except FileNotFoundError:
            pass
        except Exception as exc:
            log.warning("could not delete the code of %s: %s", topology_id, exc)

    @hookimpl
    def close(self, conf: dict[str, Any]) -> None:
        self._fs = None

    def _local_dir(self) -> Path:
        assert self._ctx is not None, "prepare() first"
        path = self._ctx.local_dir
        os.makedirs(path, exist_ok=True)
        return path
