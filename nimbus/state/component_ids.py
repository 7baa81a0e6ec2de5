"""Component and topology ids: the rules for names that become ZooKeeper path parts
(and, for a topology id, a directory of every host's code).

A component id names a node, ``/storm/errors/<topology-id>/<component>``, and comes from
a tenant's code (a pipeline's ``build()`` names its queries; a worker reports errors and
progress under them over its status pipe). So it is checked wherever it enters: a
bounded charset and length, never ``.``/``..``, never a ``/``. Storm's own ids
(``spout``, ``split-bolt``, ``__system``) all pass.
"""

from __future__ import annotations

import re

#: A topology id, ``<name>-<counter>-<launch time>`` (Storm's form), or the code key of a
#: topology's version 2 or later, ``<topology id>.v<N>`` (:mod:`nimbus.state.code_versions`):
#: every place that stores or fetches code by id takes both. ``..`` is refused apart (see
#: :func:`is_topology_id`). A name cannot hold a ``.``, so no topology id ends in ``.v<N>``.
TOPOLOGY_ID_RE = re.compile(
    r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,200}-[0-9]+-[0-9]+(?:\.v[1-9][0-9]{0,5})?$")


def is_topology_id(name: object) -> bool:
    """Whether ``name`` has a topology id's form (and no ``..``)."""
    return isinstance(name, str) and TOPOLOGY_ID_RE.fullmatch(name) is not None \
        and ".." not in name


#: The longest component id accepted.
MAX_COMPONENT_ID = 64
_COMPONENT_ID = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_.-]{{0,{MAX_COMPONENT_ID - 1}}}")


class InvalidComponentError(ValueError):
    """A component id that may not become a path part."""


def is_component_id(name: object) -> bool:
    """Whether ``name`` is a valid component id (letters, digits, ``_ . -``; starting
    with a letter, digit or ``_``; at most 64 characters)."""
    return isinstance(name, str) and _COMPONENT_ID.fullmatch(name) is not None


def check_component_id(name: object) -> str:
    """``name`` if it is a valid component id; InvalidComponentError naming it otherwise."""
    if not is_component_id(name):
        shown = repr(name)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        raise InvalidComponentError(
            f"component id {shown} is not valid: use at most {MAX_COMPONENT_ID} letters, "
            "digits, '_', '.' or '-', starting with a letter, digit or '_'")
    return name  # type: ignore[return-value]
