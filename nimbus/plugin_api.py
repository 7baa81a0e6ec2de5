"""The public API for code-distributor plugins: everything a plugin (and its tests) may
import, in one module. docs/plugins.md ("The plugin API") documents each name, its
signature and the errors it raises, and says what is stable and how a name is
deprecated; ``tests/test_plugin_api.py`` keeps this list and that page in step.

The test kit's names (``DistributorKit``, ``PER_HOST``, ``STORE``, ``ConformanceHost``,
``flip_byte``) are here too, loaded only when asked for, so that a plugin importing this
module at run time does not import pytest.
"""

from __future__ import annotations

from typing import Any

from nimbus.distribution.distributors import (
    CodeVerificationError,
    DistributorError,
    MetafileError,
)
from nimbus.distribution.hookspecs import (
    ENTRY_POINT_GROUP,
    ROLE_NIMBUS,
    ROLE_SUPERVISOR,
    DistributorContext,
    hookimpl,
)
from nimbus.distribution.local_code import (
    UnsafePathError,
    atomic_dir,
    check_relative_path,
    check_topology_id,
    discard_copy,
    leftover_copies,
    list_files,
    safe_join,
    sha256_file,
)
from nimbus.distribution.manifest_store import (
    ManifestStoreDistributor,
    StoreCodeError,
    StoreMetafileError,
    StoreVerificationError,
)
from nimbus.distribution.replicas import ReplicaReader, ReplicaRegistry, supervisor_rank
from nimbus.distribution.transfer_meter import TransferMeter
from nimbus.redaction import Secret
from nimbus.state.session_renewal import SessionRenewal

_KIT = ("DistributorKit", "PER_HOST", "STORE", "ConformanceHost", "flip_byte")

__all__ = [
    "ENTRY_POINT_GROUP", "ROLE_NIMBUS", "ROLE_SUPERVISOR", "CodeVerificationError",
    "DistributorContext", "DistributorError", "ManifestStoreDistributor", "MetafileError",
    "ReplicaReader", "ReplicaRegistry", "Secret", "SessionRenewal", "StoreCodeError",
    "StoreMetafileError",
    "StoreVerificationError", "TransferMeter", "UnsafePathError", "atomic_dir",
    "check_relative_path", "check_topology_id", "discard_copy", "hookimpl",
    "leftover_copies", "list_files", "safe_join", "sha256_file", "supervisor_rank", *_KIT]


def __getattr__(name: str) -> Any:
    if name in _KIT:
        from nimbus.testing import kit  # pytest: only for a plugin's tests

        return getattr(kit, name)
    raise AttributeError(f"module 'nimbus.plugin_api' has no attribute {name!r}")
