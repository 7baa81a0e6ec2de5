"""nimbus-ha-shareddir: topology code in a directory shared by all nimbuses (NFS, CephFS)."""

from nimbus_ha_shareddir.distributor import SharedDirCodeDistributor

__all__ = ["SharedDirCodeDistributor"]
