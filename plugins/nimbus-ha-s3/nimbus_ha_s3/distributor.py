"""Code distributor that keeps topology code in S3 or any S3-compatible store (s3fs).

The layout, manifest and verification are the core's ``ManifestStoreDistributor``; this
module supplies the settings, the s3fs connection, error messages that name the setting to
check, and the data path of :mod:`nimbus_ha_s3.transfer`: multipart uploads and ranged GETs,
``transfer.concurrency`` at a time, ``multipart.chunk.mb`` each, hashed with sha256 as
they go (memory about ``transfer.concurrency × multipart.chunk.mb``, whatever the size).

Every S3 request is bounded in time: botocore tries it at most ``max.attempts`` times,
each attempt waiting at most ``connect.timeout.secs`` for a connection and
``read.timeout.secs`` for each read; s3fs's own retry loop is off, so that it does not
multiply them. A store that is down fails a call within about
``max.attempts × (connect.timeout.secs + read.timeout.secs)``; one that refuses
connections, at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nimbus.plugin_api import (
    ManifestStoreDistributor,
    StoreCodeError,
    StoreVerificationError,
    TransferMeter,
    hookimpl,
)
from nimbus_ha_s3.transfer import MIN_PART_SIZE, ObjectMismatch, download_file, upload_file

PREFIX = "nimbus.codedistributor.s3."
S3CodeError = StoreCodeError
MB = 1024 * 1024
MAX_CONCURRENCY = 64


class S3CodeDistributor(ManifestStoreDistributor):
    """Topology code in an S3 bucket; see the module docstring."""

    name = "s3"
    PREFIX = PREFIX

    @hookimpl
    def config_defaults(self) -> dict[str, Any]:
        return {
            PREFIX + "endpoint": "",          # e.g. http://127.0.0.1:8333; "" = AWS
            PREFIX + "region": "",            # "" = from the environment / us-east-1
            PREFIX + "bucket": "",            # required
            PREFIX + "prefix": "nimbus-ha/code",
            PREFIX + "access.key": "",        # "" = AWS_ACCESS_KEY_ID / AWS profile
            PREFIX + "secret.key": "",        # "" = AWS_SECRET_ACCESS_KEY / AWS profile
            PREFIX + "multipart.chunk.mb": 8,     # part size of uploads and ranged GETs
            PREFIX + "transfer.concurrency": 4,   # parts / ranges of one file in flight
            PREFIX + "replication.count": 3,
            PREFIX + "connect.timeout.secs": 5,   # per attempt, to connect
            PREFIX + "read.timeout.secs": 30,     # per attempt, for each read
            PREFIX + "max.attempts": 3,           # tries of one request (1: no retry)
        }

    def connect(self, conf: dict[str, Any]) -> tuple[Any, str]:
        import s3fs

        bucket = self.setting("bucket")
        if not bucket:
            raise StoreCodeError(f"set {PREFIX}bucket to the bucket that holds topology code")
        self._check_transfer_settings()
        client_kwargs: dict[str, Any] = {}
        if self.setting("endpoint"):
            client_kwargs["endpoint_url"] = self.setting("endpoint")
        if self.setting("region"):
            client_kwargs["region_name"] = self.setting("region")
        fs = s3fs.S3FileSystem(
            key=self.setting("access.key") or None,
            secret=self.setting("secret.key") or None,
            client_kwargs=client_kwargs,
            config_kwargs={"connect_timeout": self.setting("connect.timeout.secs"),
                           "read_timeout": self.setting("read.timeout.secs"),
                           "retries": {"total_max_attempts": self.setting("max.attempts")},
                           "max_pool_connections": max(10, self.concurrency())},
            default_block_size=self.setting("multipart.chunk.mb") * 1024 * 1024,
            skip_instance_cache=True, use_listings_cache=False)
        # s3fs's own retry loop (not a constructor argument) around botocore's: one pass,
        # so that a dead endpoint fails within max.attempts × the timeouts.
        fs.retries = 1
        try:
            fs.ls(bucket, refresh=True)  # fail fast: endpoint, credentials, bucket
        except Exception as exc:
            raise self.explain(exc, "bucket") from None
        return fs, f"{bucket}/{self.setting('prefix').strip('/')}".rstrip("/")

    def part_size(self) -> int:
        """Bytes per multipart part and per ranged GET."""
        return int(self.setting("multipart.chunk.mb")) * MB

    def concurrency(self) -> int:
        """Parts or ranges of one file in flight at once."""
        return int(self.setting("transfer.concurrency"))

    def _check_transfer_settings(self) -> None:
        for key, low, high in (("multipart.chunk.mb", MIN_PART_SIZE // MB, 5 * 1024),
                               ("transfer.concurrency", 1, MAX_CONCURRENCY),
                               ("connect.timeout.secs", 1, 3600),
                               ("read.timeout.secs", 1, 3600),
                               ("max.attempts", 1, 20)):
            value = self.setting(key)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise StoreCodeError(f"{PREFIX}{key} must be an integer from {low} to {high}, "
                                     f"not {value!r}")

    def _store_file(self, local: Path, key: str, meter: TransferMeter) -> tuple[int, str]:
        result = upload_file(self.fs, key, local, self.part_size(), self.concurrency(),
                             meter.advance)
        return result.size, result.sha256

    def _fetch_file(self, key: str, target: Path, size: int,
                    meter: TransferMeter) -> tuple[int, str]:
        try:
            result = download_file(self.fs, key, target, size, self.part_size(),
                                   self.concurrency(), meter.advance)
        except ObjectMismatch as exc:
            raise StoreVerificationError(
                f"{key}: the stored object in {self.name}:{self.root} does not match its "
                f"manifest ({exc}; expected {size} bytes); refusing the copy") from None
        return result.size, result.sha256

    def explain(self, exc: BaseException, what: str) -> StoreCodeError:
        """An error naming the setting to check: the credentials, the bucket, or (when the
        store cannot be reached, or for anything else) the endpoint and the bucket."""
        endpoint = self.setting("endpoint") or "AWS default endpoint"
        text = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, PermissionError) or any(
                code in text for code in ("AccessDenied", "InvalidAccessKeyId",
                                          "SignatureDoesNotMatch")):
            hint = (f"credentials refused by {endpoint}: check {PREFIX}access.key/secret.key "
                    "or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY")
        elif "NoSuchBucket" in text or (isinstance(exc, FileNotFoundError) and what == "bucket"):
            hint = (f"bucket {self.setting('bucket')!r} does not exist at {endpoint}: "
                    f"create it or fix {PREFIX}bucket")
        elif "Connect" in text or "Endpoint" in text or isinstance(exc, OSError):
            hint = f"cannot reach {endpoint}: check {PREFIX}endpoint (is the store up?)"
        else:
            hint = (f"S3 error during {what} at {endpoint}, bucket "
                    f"{self.setting('bucket')!r}: check {PREFIX}endpoint and {PREFIX}bucket")
        return StoreCodeError(f"{hint} ({text})")
