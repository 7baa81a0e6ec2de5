"""A code distributor for the watchdog test: localfs, except that deleting the shared
code of a topology named ``hang-*`` never returns (a plugin call stuck inside a leader
duty). Selected with ``storm.codedistributor.class:
hanging_distributor:HangingDistributor`` and this directory on PYTHONPATH."""

from __future__ import annotations

import threading

from nimbus_ha_localfs.distributor import LocalFileSystemCodeDistributor

from nimbus.distribution.hookspecs import hookimpl


class HangingDistributor(LocalFileSystemCodeDistributor):
    name = "hanging"

    @hookimpl
    def delete_shared(self, topology_id: str) -> None:
        if topology_id.startswith("hang-"):
            threading.Event().wait()  # forever
