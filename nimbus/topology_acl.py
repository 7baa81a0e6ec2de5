"""Who may change or read a topology: Storm's SimpleACLAuthorizer rules, by TLS identity.

``nimbus.authorizer: org.apache.storm.security.auth.authorizer.SimpleACLAuthorizer``
turns them on (it needs ``storm.thrift.transport: tls``, which says who is calling).
Then kill, activate, deactivate and rebalance of a topology are allowed to

* every identity in ``nimbus.admins``,
* the topology's submitter (the identity that submitted it),
* every identity in the topology's ``topology.users``;

and reading it (Storm's ``topoReadOnlyCommands``) also to every identity in its
``topology.readonly.users``. Anyone else is refused.

One rule for every door: the Thrift handler (nimbus/thrift/authorizer.py), the web UI
(nimbus/ui) and each supervisor's logviewer (nimbus/supervisor/logviewer) use this code,
which is on the ground floor (docs/architecture.md) so that all of them can.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from nimbus.cluster_tls import TRANSPORT_KEY, tls_enabled
from nimbus.config import Config, ConfigError

AUTHORIZER_KEY = "nimbus.authorizer"
SIMPLE_ACL = ("org.apache.storm.security.auth.authorizer.SimpleACLAuthorizer",
              "simple-acl")
TOPOLOGY_OPERATIONS = ("kill", "activate", "deactivate", "rebalance")
USERS_KEY = "topology.users"
READONLY_USERS_KEY = "topology.readonly.users"
SUBMITTER_KEY = "topology.submitter.user"


def topology_users(topo_conf: Mapping[str, Any], key: str = USERS_KEY) -> list[Any]:
    """``topo_conf[key]`` when it is a list, else [] (what the Thrift handler checks)."""
    users = topo_conf.get(key) or []
    return users if isinstance(users, list) else []


def refusal(identity: str | None, operation: str, name: str) -> str:
    """The message of a refused ``operation`` (Thrift's AuthorizationException and the
    UI's 403 say the same)."""
    return (f"{identity or 'an unauthenticated client'} may not {operation} {name}: "
            "not its submitter, not in its topology.users, not in nimbus.admins")


def read_refusal(identity: str | None, name: str) -> str:
    return (f"{identity or 'an unauthenticated client'} may not read {name}: not its "
            "submitter, not in its topology.users or topology.readonly.users, not in "
            "nimbus.admins")


class SimpleAclAuthorizer:
    """``permit(identity, owner, users)`` for a topology operation."""

    def __init__(self, admins: Iterable[str]):
        self.admins = frozenset(str(a) for a in admins)

    def permit(self, identity: str | None, owner: str, users: Iterable[str]) -> bool:
        if not identity:
            return False
        return identity in self.admins or identity == owner or identity in set(users)

    def permit_read(self, identity: str | None, owner: str, users: Iterable[str],
                    readonly_users: Iterable[str]) -> bool:
        """May ``identity`` read a topology's own details (its page, configuration,
        errors, worker logs)? Storm's read-only topology operations: whoever may change
        it, and every identity in its ``topology.readonly.users``."""
        return self.permit(identity, owner, users) or (
            bool(identity) and identity in set(readonly_users))

    def is_admin(self, identity: str | None) -> bool:
        return bool(identity) and identity in self.admins


def authorizer_from_conf(conf: Config) -> SimpleAclAuthorizer | None:
    """The configured authorizer, None when ``nimbus.authorizer`` is unset; raises
    ConfigError for one this release does not have, or one without TLS."""
    name = conf[AUTHORIZER_KEY]
    if name in (None, ""):
        return None
    if name not in SIMPLE_ACL:
        raise ConfigError(f"{AUTHORIZER_KEY}: only {SIMPLE_ACL[0]} is supported, got {name!r}")
    if not tls_enabled(conf):
        raise ConfigError(f"{AUTHORIZER_KEY} needs callers with an identity: set "
                          f"{TRANSPORT_KEY} to tls")
    admins = conf["nimbus.admins"] or []
    return SimpleAclAuthorizer(admins)
