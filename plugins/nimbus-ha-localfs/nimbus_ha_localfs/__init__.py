"""nimbus-ha-localfs: topology code on the nimbus hosts' local disks (the default)."""

from nimbus_ha_localfs.distributor import LocalFileSystemCodeDistributor

__all__ = ["LocalFileSystemCodeDistributor"]
