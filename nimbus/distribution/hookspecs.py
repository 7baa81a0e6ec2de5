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
    Thrift ``beginFileDownload`` and returns its sha256 (presenting the certificate of
    the process's security, which its root bound to it).

    ``role`` is :data:`ROLE_NIMBUS` on a nimbus and :data:`ROLE_SUPERVISOR` on a
    supervisor, which prepares only a plugin whose class sets ``serves_supervisors =
    True`` and then calls nothing but ``download``, ``cleanup`` and ``close``. There
    ``address`` is ``supervisor-<supervisor id>`` (unique, never a nimbus's) and a
    download must not count toward the replication count (docs/hooks.md).
    """

    zk: Any
    zk_root: str
    address: str
    local_dir: Path
    code_dir: Path
    fetch_file: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
    role: str = "nimbus"

    @property
    def on_supervisor(self) -> bool:
        """True when this host runs workers (a supervisor), not a nimbus."""
        return self.role == ROLE_SUPERVISOR


#: ``DistributorContext.role`` of a nimbus: every hook may be called.
ROLE_NIMBUS = "nimbus"
#: ``DistributorContext.role`` of a supervisor: only download, cleanup and close.
ROLE_SUPERVISOR = "supervisor"
#: The class attribute by which a plugin says it can run on supervisors (default False).
SERVES_SUPERVISORS = "serves_supervisors"
#: The hooks a supervisor calls, after ``prepare``.
SUPERVISOR_HOOKS = ("download", "cleanup", "close")


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
def list_shared() -> list[str]:
    """Return the topology ids whose code, whole or partial, is in shared storage
    (leader only; optional, with ``delete_shared``)."""


@hookspec(firstresult=True)
def close(conf: dict[str, Any]) -> None:
    """Release every resource (threads, sessions, registrations)."""


DISTRIBUTOR_HOOKS = ("prepare", "upload", "download", "get_replication_count", "cleanup", "close")
# Hooks a distributor implements only when it has what they act on.
OPTIONAL_HOOKS = ("delete_shared", "list_shared")
ALL_HOOKS = ("config_defaults", *DISTRIBUTOR_HOOKS, *OPTIONAL_HOOKS)
