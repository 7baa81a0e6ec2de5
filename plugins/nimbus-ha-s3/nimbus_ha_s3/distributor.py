"""Code distributor that keeps topology code in S3 or any S3-compatible store (s3fs).

The layout, manifest and verification are the core's ``ManifestStoreDistributor``; this
module supplies the settings, the s3fs connection (multipart above the part size) and
error messages that name the setting to check.
"""

from __future__ import annotations

from typing import Any

from nimbus.distribution.hookspecs import hookimpl
from nimbus.distribution.manifest_store import ManifestStoreDistributor, StoreCodeError

PREFIX = "nimbus.codedistributor.s3."
S3CodeError = StoreCodeError


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
            PREFIX + "multipart.chunk.mb": 16,
            PREFIX + "replication.count": 3,
            PREFIX + "connect.timeout.secs": 5,
        }

    def connect(self, conf: dict[str, Any]) -> tuple[Any, str]:
        import s3fs

        bucket = self.setting("bucket")
        if not bucket:
            raise StoreCodeError(f"set {PREFIX}bucket to the bucket that holds topology code")
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
                           "read_timeout": 60, "retries": {"max_attempts": 2}},
            default_block_size=self.setting("multipart.chunk.mb") * 1024 * 1024,
            skip_instance_cache=True, use_listings_cache=False)
        fs.retries = 2  # s3fs's own retry count (not a constructor argument)
        try:
            fs.ls(bucket, refresh=True)  # fail fast: endpoint, credentials, bucket
        except Exception as exc:
            raise self.explain(exc, "bucket") from None
        return fs, f"{bucket}/{self.setting('prefix').strip('/')}".rstrip("/")

    def explain(self, exc: BaseException, what: str) -> StoreCodeError:
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
            hint = f"cannot reach {endpoint}: check {PREFIX}endpoint"
        else:
            hint = f"S3 error during {what}"
        return StoreCodeError(f"{hint} ({text})")
