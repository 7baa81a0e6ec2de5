"""Who may read a topology's worker logs here: the topology read rule of every door of
the cluster (nimbus/topology_acl.py), applied to the identity of the caller's client
certificate.

With ``nimbus.authorizer`` set (which needs ``storm.thrift.transport: tls``): the
admins (``nimbus.admins``), the read-all roles (``nimbus.ui.users``: a UI shows the logs
to its own users by their rights; ``nimbus.daemon.users``), the topology's submitter,
its ``topology.users`` and its ``topology.readonly.users``, as its supervisor recorded
them when it started a worker of it here (nimbus/supervisor/log_dirs.py: the topology's
code, and its configuration with it, may have left the host while its logs stay). Logs
of which no record is readable are for the admins only: the logviewer does not guess.
Without an authorizer every caller the handshake let in may read every log, as with the
Thrift port and the UI.
"""

from __future__ import annotations

from nimbus.config import Config
from nimbus.state.worker_logs import META_FILE
from nimbus.supervisor.log_dirs import LogMeta
from nimbus.supervisor.logviewer.files import LogFileError, LogRoot
from nimbus.topology_acl import SimpleAclAuthorizer, read_refusal


class LogAccess:
    """The read rule for the logs under ``root``, with the supervisor's ``authorizer``
    (None: every caller may read every log)."""

    def __init__(self, conf: Config, root: LogRoot, authorizer: SimpleAclAuthorizer | None):
        self.authorizer = authorizer
        self._root = root
        # Who reads every topology, as on the Thrift port: the UIs (their own users'
        # rights checked by them) and the nimbuses.
        self._read_all = {str(u) for u in [*(conf["nimbus.ui.users"] or []),
                                           *(conf["nimbus.daemon.users"] or [])]}

    def may_read(self, identity: str | None, topology_id: str) -> bool:
        """Whether ``identity`` may read ``topology_id``'s logs."""
        return self.refusal(identity, topology_id) == ""

    def check(self, identity: str | None, topology_id: str) -> None:
        """LogFileError 403, saying why, unless ``identity`` may read them."""
        why = self.refusal(identity, topology_id)
        if why:
            raise LogFileError(403, why)

    def refusal(self, identity: str | None, topology_id: str) -> str:
        """Why ``identity`` may not read ``topology_id``'s logs; "" if it may."""
        authorizer = self.authorizer
        if authorizer is None or authorizer.is_admin(identity) or (
                identity is not None and identity in self._read_all):
            return ""
        meta = LogMeta.load(self._root.root / topology_id / META_FILE)
        if meta is None or meta.topology_id != topology_id:
            return (f"{identity or 'an unauthenticated client'} may not read the logs of "
                    f"{topology_id}: this host has no readable record of who may (only "
                    "nimbus.admins may read them)")
        if authorizer.permit_read(identity, meta.submitter, meta.users,
                                  meta.readonly_users):
            return ""
        return read_refusal(identity, f"the logs of {topology_id}")
