"""A code distributor for the watchdog and alert tests: localfs, except that

* deleting the shared code of a topology named ``hang-*`` does not return (a plugin call
  stuck inside a leader duty): for ever, or, with ``HANGING_RELEASE_DIR`` set, until the
  file ``release-hang`` appears there;
* with ``HANGING_RELEASE_DIR`` set, downloading a topology named ``nosync-*`` fails (a
  follower's code sync that keeps failing) until ``release-nosync`` appears there.

Selected with ``storm.codedistributor.class: hanging_distributor:HangingDistributor``
and this directory on PYTHONPATH."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from nimbus_ha_localfs.distributor import LocalFileSystemCodeDistributor

from nimbus.plugin_api import DistributorError, hookimpl

RELEASE_DIR = "HANGING_RELEASE_DIR"


def _released(name: str) -> bool:
    directory = os.environ.get(RELEASE_DIR)
    return directory is not None and (Path(directory) / f"release-{name}").exists()


class HangingDistributor(LocalFileSystemCodeDistributor):
    name = "hanging"

    @hookimpl
    def delete_shared(self, topology_id: str) -> None:
        if topology_id.startswith("hang-"):
            stop = threading.Event()
            while not _released("hang"):
                if os.environ.get(RELEASE_DIR) is None:
                    stop.wait()  # forever
                stop.wait(0.2)

    @hookimpl
    def download(self, dest_dir: Path, topology_id: str, metafile: Path) -> list[Path]:
        if topology_id.startswith("nosync-") and os.environ.get(RELEASE_DIR) \
                and not _released("nosync"):
            raise DistributorError(f"{topology_id}: downloads refused until released "
                                   "(the alert test's failing code sync)")
        return super().download(dest_dir, topology_id, metafile)
