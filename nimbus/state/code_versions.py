"""Versions of a topology's code: the code keys and ``/code-versions/<topology-id>``.

Version 1 is what ``submit`` wrote: its code key is the topology id itself, so every
topology submitted before upgrades existed is version 1 with nothing changed. Version N
(N >= 2), written by ``nimbus-ha upgrade``, is stored, distributed and replicated under the
code key ``<topology-id>.v<N>``: a key of the same form everywhere code is kept
(``/code-distributor/<key>``, a nimbus's ``storm.local.dir``, a store, a supervisor's
cache), so the code sync, the replica count and the fetches treat it as they treat any
topology's code. A topology name cannot hold a ``.``, so no topology id ends in
``.v<N>``.

``/storms/<id>`` stays as submit wrote it (the seed keeps it static). What versions a
topology has, which one runs and the switch under way are in ``/code-versions/<id>``
(:class:`CodeVersions`), written by the leader only, fenced, with the version read. The
node exists from a topology's first upgrade on; without it the topology has version 1
alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from nimbus.state.records import Record

#: The suffix of a version's code key: ``<topology-id>.v<N>``.
VERSION_SUFFIX_RE = re.compile(r"^(?P<topology>.+)\.v(?P<version>[1-9][0-9]{0,5})$")

#: The states a version can be in, as ``history`` shows them.
RUNNING = "running"          # what the workers run (the target, once a switch is done)
SWITCHING = "switching"      # the target of a switch under way
PREVIOUS = "previous"        # what ran before the running version: the rollback target
OLD = "old"                  # kept, older than the previous one
ROLLED_BACK = "rolled back"  # switched away from by a rollback asked for by hand
FAILED = "failed"            # failed before its first commit and rolled back; see error
STATES = (RUNNING, SWITCHING, PREVIOUS, OLD, ROLLED_BACK, FAILED)

#: How workers switch: all at once, or one at a time, each after the previous one's
#: first commit on the new version.
ALL, ROLLING = "all", "rolling"
STRATEGIES = (ALL, ROLLING)
UPGRADE, ROLLBACK = "upgrade", "rollback"


def version_key(topology_id: str, version: int) -> str:
    """The code key of ``version`` of ``topology_id`` (version 1: the id itself)."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"a code version is an integer >= 1, not {version!r}")
    return topology_id if version == 1 else f"{topology_id}.v{version}"


def split_key(code_key: str) -> tuple[str, int]:
    """(topology id, version) of a code key; the inverse of :func:`version_key`."""
    match = VERSION_SUFFIX_RE.match(code_key)
    if match is None:
        return code_key, 1
    return match["topology"], int(match["version"])


def topology_of(code_key: str) -> str:
    """The topology a code key belongs to."""
    return split_key(code_key)[0]


def is_version_key(code_key: str) -> bool:
    """Whether ``code_key`` names a version 2 or later (not a topology id)."""
    return VERSION_SUFFIX_RE.match(code_key) is not None


_ENTRY_FIELDS: dict[str, type] = {"version": int, "sha256": dict, "submitter": str,
                                  "created_secs": int, "state": str, "error": str,
                                  "conf": dict}


@dataclass
class CodeVersions(Record):
    """/code-versions/<topology-id>: the topology's versions, newest last.

    ``versions``: one object per kept version: ``version`` (int), ``sha256`` (file name ->
    sha256, as Assignment.code_sha256), ``submitter``, ``created_secs``, ``state`` (one of
    :data:`STATES`), ``error`` (why it failed or was rolled back; "" if none) and
    ``conf`` (the topology conf it runs with).

    ``running``: the version the workers run once no switch is under way.

    ``switch``: {} when none is under way, else ``kind`` (upgrade or rollback), ``from``
    and ``to`` (versions), ``strategy`` (all or rolling), ``started_secs``,
    ``deadline_secs`` (when a switch that has not completed is rolled back), ``by`` (who
    asked) and ``switched`` (the executors that run ``to`` and committed on it).
    """

    versions: list[dict[str, Any]] = field(default_factory=list)
    running: int = 1
    switch: dict[str, Any] = field(default_factory=dict)

    def _invalid(self) -> str | None:
        seen = set()
        for i, entry in enumerate(self.versions):
            for name, kind in _ENTRY_FIELDS.items():
                value = entry.get(name)
                if not isinstance(value, kind) or isinstance(value, bool):
                    return f"versions[{i}] field {name!r} must be {kind.__name__}"
            if entry["version"] < 1 or entry["version"] in seen:
                return f"versions[{i}] has an unusable or repeated version number"
            if entry["state"] not in STATES:
                return f"versions[{i}] has an unknown state {entry['state'][:40]!r}"
            seen.add(entry["version"])
        if self.versions and self.running not in seen:
            return f"running version {self.running} is not among the versions"
        if self.switch:
            for name in ("from", "to", "started_secs", "deadline_secs"):
                value = self.switch.get(name)
                if not isinstance(value, int) or isinstance(value, bool):
                    return f"switch field {name!r} must be an integer"
            if self.switch.get("kind") not in (UPGRADE, ROLLBACK):
                return "switch field 'kind' must be upgrade or rollback"
            if self.switch.get("strategy") not in STRATEGIES:
                return "switch field 'strategy' must be all or rolling"
            switched = self.switch.get("switched", [])
            if not isinstance(switched, list) or not all(isinstance(e, str)
                                                         for e in switched):
                return "switch field 'switched' must be a list of executors"
            if self.switch["to"] not in seen:
                return f"switch target {self.switch['to']} is not among the versions"
        return None

    def entry(self, version: int) -> dict[str, Any] | None:
        """The entry of ``version``, or None if it is not kept."""
        for entry in self.versions:
            if entry["version"] == version:
                return entry
        return None

    def newest(self) -> int:
        """The highest version number recorded (1 when none is)."""
        return max((e["version"] for e in self.versions), default=1)

    def keys(self, topology_id: str) -> list[str]:
        """The code keys of every kept version (all of which a leader must hold)."""
        return [version_key(topology_id, e["version"]) for e in self.versions]
