"""The code keys the live topologies need, kept up to date from a view's changes.

A nimbus must hold the code of every version each live topology keeps
(:func:`nimbus.master.version_rules.view_code_keys`). The code sync and the leader's code
check ask at every submit; computing the answer from every topology then cost each
nimbus O(topologies) per submit, most of its CPU at 10,000 topologies. Kept here from the
change events of the topologies that changed, it costs what changed.
"""

from __future__ import annotations

from nimbus.master.version_rules import view_code_keys_of
from nimbus.state.cluster_state import is_topology_id
from nimbus.state.cluster_view import ClusterView
from nimbus.state.code_versions import topology_of
from nimbus.state.view_changes import ViewChanges

#: The directories whose changes can change what a topology needs: its StormBase (live
#: or not), its /code-versions, and its code nodes (read for an unreadable
#: /code-versions).
DIRECTORIES = ("storms", "code-versions", "code-distributor")


class NeededCode:
    """The code keys of every topology under /storms, for one reader (one thread).

    Call :meth:`update` after a barrier on :data:`DIRECTORIES`; it tells which keys
    entered and left the set since the last call. The first call, and the first after
    the view was read again, recompute from every topology.
    """

    def __init__(self, view: ClusterView):
        self._view = view
        # Registered now, before any read: a change from here on is never missed.
        self._changes = ViewChanges(view, DIRECTORIES)
        self._keys: set[str] = set()
        # Topologies whose keys are not just their id (upgraded ones): their keys.
        self._versioned: dict[str, frozenset[str]] = {}
        self._frozen: frozenset[str] | None = None

    @property
    def keys(self) -> frozenset[str]:
        """Every needed code key at the last :meth:`update` (a copy made once per
        change, shared by callers until the next)."""
        if self._frozen is None:
            self._frozen = frozenset(self._keys)
        return self._frozen

    def __contains__(self, code_key: str) -> bool:
        return code_key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def keys_of(self, topology_id: str) -> frozenset[str]:
        """The keys ``topology_id`` needed at the last update (none if it was not live)."""
        versioned = self._versioned.get(topology_id)
        if versioned is not None:
            return versioned
        return frozenset([topology_id]) if topology_id in self._keys else frozenset()

    def update(self) -> tuple[set[str], set[str]] | None:
        """Bring the keys up to date with the view (read after the caller's barrier).

        Returns (keys added, keys removed), or None when every topology was read again.
        Raises what the view raises (not loaded, layout missing); the next call then
        reads every topology again."""
        changed = self._changes.take()  # before any read: see ViewChanges
        try:
            if changed is None:
                self._recompute()
                return None
            return self._apply({topology_of(name) for name in changed if is_topology_id(name)})
        except BaseException:
            self._changes.everything()
            raise

    def everything(self) -> None:
        """Have the next :meth:`update` read every topology again."""
        self._changes.everything()

    def _recompute(self) -> None:
        view = self._view
        live = set(view.active_storms())
        upgraded = live.intersection(view.upgraded_topologies())
        keys = live - upgraded  # never upgraded: the key is the id (a set operation)
        versioned = {}
        for topology_id in upgraded:
            versioned[topology_id] = view_code_keys_of(view, topology_id)
            keys |= versioned[topology_id]
        self._keys, self._versioned, self._frozen = keys, versioned, None

    def _apply(self, topologies: set[str]) -> tuple[set[str], set[str]]:
        added: set[str] = set()
        removed: set[str] = set()
        for topology_id in topologies:
            old = self.keys_of(topology_id)
            new = (view_code_keys_of(self._view, topology_id)
                   if self._view.has_storm(topology_id) else frozenset())
            if new == old:
                continue
            self._versioned.pop(topology_id, None)
            if new and new != {topology_id}:
                self._versioned[topology_id] = new
            removed |= old - new
            added |= new - old
        if added or removed:
            self._keys -= removed
            self._keys |= added
            self._frozen = None
        return added, removed
