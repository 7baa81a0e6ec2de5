"""Who may change a topology: Storm's SimpleACLAuthorizer rules, by TLS identity.

The rules themselves are :mod:`nimbus.topology_acl`, shared by every door of the cluster
(this Thrift service, the web UI, the supervisors' logviewers); their names are offered
here too, where the Thrift handler and the UI have always imported them. What is the
Thrift service's own: the warning a nimbus gives when its authorizer will refuse every
supervisor's code download (:func:`supervisors_refused`).

Every call but the topology operations and the reads (submit, listing) is open to any
client the TLS handshake let in, as in Storm; code downloads follow their own rule
(docs/security.md, "Tenants").
"""

from __future__ import annotations

from nimbus.config import Config
from nimbus.topology_acl import (
    AUTHORIZER_KEY,
    READONLY_USERS_KEY,
    SIMPLE_ACL,
    SUBMITTER_KEY,
    TOPOLOGY_OPERATIONS,
    USERS_KEY,
    SimpleAclAuthorizer,
    authorizer_from_conf,
    read_refusal,
    refusal,
    topology_users,
)

__all__ = ["AUTHORIZER_KEY", "READONLY_USERS_KEY", "SIMPLE_ACL", "SUBMITTER_KEY",
           "TOPOLOGY_OPERATIONS", "USERS_KEY", "SimpleAclAuthorizer", "authorizer_from_conf",
           "read_refusal", "refusal", "supervisors_refused", "topology_users"]


def supervisors_refused(conf: Config) -> str:
    """The warning a nimbus logs at start when its authorizer will refuse every
    supervisor's code download ("" when it will not)."""
    if conf[AUTHORIZER_KEY] in (None, "") or conf["nimbus.supervisor.users"]:
        return ""
    return ("nimbus.authorizer is set but nimbus.supervisor.users is empty: every "
            "supervisor that fetches code from this nimbus over Thrift (with localfs, or "
            "when its distributor cannot deliver) will be refused and run nothing; list "
            "the supervisors' certificate names there (docs/security.md)")
