"""nimbus-ha-torrent: topology code shared by BitTorrent between nimbus hosts."""

from nimbus_ha_torrent.distributor import TorrentCodeDistributor

__all__ = ["TorrentCodeDistributor"]
