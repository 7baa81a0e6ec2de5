"""Who may change a topology: Storm's SimpleACLAuthorizer rules, by TLS identity.

``nimbus.authorizer: org.apache.storm.security.auth.authorizer.SimpleACLAuthorizer``
turns it on (it needs ``storm.thrift.transport: tls``, which says who is calling).
Then kill, activate, deactivate and rebalance of a topology are allowed to

* every identity in ``nimbus.admins``,
* the topology's submitter (the identity that submitted it),
* every identity in the topology's ``topology.users``;

anyone else gets ``AuthorizationException``. Every other call (submit, listing, code
downloads) is open to any client the TLS handshake let in, as in Storm.
"""

from __future__ import annotations

from collections.abc import Iterable

from nimbus.config import Config, ConfigError
from nimbus.thrift.tls import TRANSPORT_KEY, tls_enabled

AUTHORIZER_KEY = "nimbus.authorizer"
SIMPLE_ACL = ("org.apache.storm.security.auth.authorizer.SimpleACLAuthorizer",
              "simple-acl")
TOPOLOGY_OPERATIONS = ("kill", "activate", "deactivate", "rebalance")


class SimpleAclAuthorizer:
    """``permit(identity, owner, users)`` for a topology operation."""

    def __init__(self, admins: Iterable[str]):
        self.admins = frozenset(str(a) for a in admins)

    def permit(self, identity: str | None, owner: str, users: Iterable[str]) -> bool:
        if not identity:
            return False
        return identity in self.admins or identity == owner or identity in set(users)


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
