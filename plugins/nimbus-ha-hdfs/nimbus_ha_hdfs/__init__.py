"""nimbus-ha-hdfs: topology code in HDFS through pyarrow."""

from nimbus_ha_hdfs.distributor import HDFSCodeDistributor

__all__ = ["HDFSCodeDistributor"]
