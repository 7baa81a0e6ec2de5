"""Hook specifications of a code distributor (Storm's ``ICodeDistributor``).

A plugin is a class whose methods are marked with :data:`hookimpl`; it is published under
the entry-point group :data:`ENTRY_POINT_GROUP`. The nimbus creates one instance, registers
it alone in a pluggy ``PluginManager`` and calls it only through these hooks. Each hook is
documented in full in ``docs/hooks.md``; a test keeps the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pluggy

PROJECT = "nimbus_ha"
ENTRY_POINT_GROUP = "nimbus_ha.codedistributor"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@dataclass
class DistributorContext:
    """What the nimbus gives a distributor in ``prepare``.

    ``zk`` is the nimbus's started kazoo client (None when a distributor runs without
    ZooKeeper, e.g. in its own unit tests); ``zk_root`` the cluster's root znode;
    ``address`` this nimbus's ``host:port``; ``local_dir`` a directory owned by this
    distributor on this host; ``code_dir`` the directory under which the nimbus keeps
    the code of each topology (``code_dir / topology_id``);
    ``fetch_file(peer, remote_path, dest)`` downloads a file through a peer nimbus's
    Thrift ``beginFileDownload`` and returns its sha256.
    """

    zk: Any
    zk_root: str
    address: str
    local_dir: Path
    code_dir: Path
    fetch_file: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


@hookspec
def config_defaults() -> dict[str, Any]:
    """Return the configuration keys (with defaults) this distributor adds."""


@hookspec(firstresult=True)
def prepare(conf: dict[str, Any], context: DistributorContext) -> None:
    """Prepare the distributor for use; called once before any other hook."""


@hookspec(firstresult=True)
def upload(dir_path: Path, topology_id: str) -> Path:
    """Distribute the code in ``dir_path``; return the path of a metafile describing it."""


@hookspec(firstresult=True)
def download(dest_dir: Path, topology_id: str, metafile: Path) -> list[Path]:
    """Fetch the code described by ``metafile`` into ``dest_dir``; return the files."""


@hookspec(firstresult=True)
def get_replication_count(topology_id: str) -> int:
    """Return the number of hosts (or store replicas) holding a complete copy."""


@hookspec(firstresult=True)
def cleanup(topology_id: str) -> None:
    """Forget this host's copy of a topology: local files and this host's registrations."""


@hookspec(firstresult=True)
def delete_shared(topology_id: str) -> None:
    """Delete a removed topology's code from shared storage (leader only; optional)."""


@hookspec(firstresult=True)
def close(conf: dict[str, Any]) -> None:
    """Release every resource (threads, sessions, registrations)."""


DISTRIBUTOR_HOOKS = ("prepare", "upload", "download", "get_replication_count", "cleanup", "close")
# Hooks a distributor implements only when it has what they act on.
OPTIONAL_HOOKS = ("delete_shared",)
ALL_HOOKS = ("config_defaults", *DISTRIBUTOR_HOOKS, *OPTIONAL_HOOKS)
