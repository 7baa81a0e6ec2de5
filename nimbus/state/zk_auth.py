"""ZooKeeper authentication and node ACLs, from Storm's keys.

With ``storm.zookeeper.auth.scheme: digest`` and ``storm.zookeeper.auth.payload:
user:password`` every client nimbus-ha makes (nimbus, supervisor, CLI, UI) authenticates
with those credentials, and every node it creates carries an ACL that gives all
permissions to that identity alone (plus ``storm.zookeeper.superACL``, if set): a client
without them can neither read nor change anything under the cluster's root. Nodes that
existed before auth was turned on keep the ACL they were made with; :func:`secure_tree`
(``nimbus-ha secure-zookeeper``) sets the ACL on all of them.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.security import ACL, Id, Permissions, make_digest_acl

from nimbus.config import Config, ConfigError

SCHEME_KEY = "storm.zookeeper.auth.scheme"
PAYLOAD_KEY = "storm.zookeeper.auth.payload"
SUPER_ACL_KEY = "storm.zookeeper.superACL"


@dataclass(frozen=True)
class ZkSecurity:
    """What a client needs: credentials to add and the ACL of the nodes it creates."""

    auth_data: list[tuple[str, str]]
    acl: list[ACL]


def zk_security(conf: Config) -> ZkSecurity | None:
    """The security settings of ``conf``, None when auth is off; raises ConfigError with
    the key's name for anything it cannot use (never showing the payload)."""
    scheme = conf[SCHEME_KEY]
    payload = conf[PAYLOAD_KEY]
    super_acl = conf[SUPER_ACL_KEY]
    if scheme in (None, ""):
        if payload not in (None, ""):
            raise ConfigError(f"{PAYLOAD_KEY} is set but {SCHEME_KEY} is not: set it to "
                              "\"digest\"")
        return None
    if scheme != "digest":
        raise ConfigError(f"{SCHEME_KEY}: only \"digest\" is supported, got {scheme!r}")
    if not isinstance(payload, str) or ":" not in payload or payload.startswith(":"):
        raise ConfigError(f"{PAYLOAD_KEY} must be \"user:password\" when {SCHEME_KEY} is "
                          "digest")
    user, _, password = payload.partition(":")
    acl = [make_digest_acl(user, password, all=True)]
    if super_acl not in (None, ""):
        if not isinstance(super_acl, str) or ":" not in super_acl:
            raise ConfigError(f"{SUPER_ACL_KEY} must be \"scheme:id\", got {super_acl!r}")
        super_scheme, _, super_id = super_acl.partition(":")
        acl.append(ACL(Permissions.ALL, Id(super_scheme, super_id)))
    return ZkSecurity(auth_data=[("digest", payload)], acl=acl)


class ForeignAclError(ConfigError):
    """With auth on, the cluster's root (or a directory of its layout) carries an ACL
    other than the cluster's: someone created it first, open to anyone, or the cluster
    ran without auth before."""


def check_layout_acl(zk: KazooClient, paths: list[str], acl: list[ACL]) -> None:
    """Raise :class:`ForeignAclError` naming every path in ``paths`` that exists with an
    ACL other than ``acl``; paths that do not exist yet are fine (they will be made with
    ``acl``). Nothing is changed: adopting a node made by someone else would leave it,
    and whatever they put below it, open to them."""
    wanted = sorted(acl)
    foreign = []
    for path in paths:
        try:
            found, _stat = zk.get_acls(path)
        except NoNodeError:
            continue
        if sorted(found) != wanted:
            schemes = sorted({f"{a.id.scheme}:{a.id.id}" if a.id.scheme != "digest"
                              else "digest:(another identity)" for a in found
                              if a not in acl})
            foreign.append(f"{path} ({', '.join(schemes) or 'fewer rights'})")
    if foreign:
        raise ForeignAclError(
            f"ZooKeeper nodes carry an ACL other than this cluster's: {'; '.join(foreign)}. "
            "They were made by a client without the cluster's credentials (someone may "
            "have created the root first), or before storm.zookeeper.auth.* was set. "
            "Check who made them; to take them over run `nimbus-ha secure-zookeeper "
            "--config <this storm.yaml>`, then start again")


def secure_tree(zk: KazooClient, root: str, acl: list[ACL]) -> int:
    """Set ``acl`` on ``root`` and every node below it; returns how many were set.

    For a cluster that ran without auth: its nodes were created open to everyone. The
    client must be allowed to change them (an open node allows anyone)."""
    count = 0
    todo = [root]
    while todo:
        path = todo.pop()
        try:
            zk.set_acls(path, acl)
            count += 1
            todo.extend(posixpath.join(path, child) for child in zk.get_children(path))
        except NoNodeError:
            continue  # ephemeral nodes come and go while this runs
    return count
