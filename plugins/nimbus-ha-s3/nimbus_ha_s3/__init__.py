"""nimbus-ha-s3: topology code in S3 or any S3-compatible object store."""

from nimbus_ha_s3.distributor import S3CodeDistributor

__all__ = ["S3CodeDistributor"]
