"""The POST actions (activate, deactivate, rebalance, kill, a switch of code version)
and the history of a topology's versions, sent to the leader.

They go through :class:`NimbusClient`, exactly as the CLI's commands do (so ZooKeeper
changes exactly as after ``nimbus-ha deactivate NAME``), and it finds the leader,
follows redirects and retries across a failover until its deadline. Thrift's answers
become HTTP statuses here: no leader -> 503, unknown -> 404, wrong state (being killed,
REBALANCING for anything but kill, a switch of code version under way for deactivate
and rebalance) -> 409, bad value -> 400.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from thriftpy2.thrift import TApplicationException, TException

from nimbus.redaction import mask
from nimbus.state.records import KILLED, REBALANCING
from nimbus.thrift import storm
from nimbus.thrift.client import CONNECTION_ERRORS, NimbusClient, NimbusUnavailableError


class ApiError(Exception):
    """An answer other than success: HTTP ``status``, Storm's ``error`` title and a
    message (``errorMessage``)."""

    def __init__(self, status: int, error: str, message: str):
        super().__init__(message)
        self.status = status
        self.error = error
        self.message = message


def not_found(topology_id: str) -> ApiError:
    return ApiError(404, "Not Found", f"no topology with id {topology_id!r}")


def forbidden(message: str) -> ApiError:
    return ApiError(403, "Forbidden", message)


def no_leader(detail: str) -> ApiError:
    return ApiError(503, "Service Unavailable", f"no nimbus leader reachable: {detail}")


def run_action(client: NimbusClient, action: str, name: str, status: str,
               wait_secs: int | None = None, num_workers: int | None = None,
               own_identity: str | None = None) -> None:
    """Send ``action`` for topology ``name`` (now in ``status``) to the leader; raises
    :class:`ApiError` for anything but success. ``own_identity`` (the UI's certificate)
    only words the answer when the leader refuses the UI itself."""
    if status == KILLED:
        raise ApiError(409, "Conflict", f"topology {name!r} is being killed")
    if status == REBALANCING and action != "kill":
        raise ApiError(409, "Conflict", f"topology {name!r} is {REBALANCING}: {action} is "
                                        "refused until the rebalance completes; kill is "
                                        "allowed")
    with leader_errors(name, own_identity):
        if action == "activate":
            client.activate(name)
        elif action == "deactivate":
            client.deactivate(name)
        elif action == "kill":
            client.kill(name, wait_secs)
        elif action == "rebalance":
            client.rebalance(name, num_workers, wait_secs)  # type: ignore[arg-type]
        else:  # routing allows no other name
            raise ApiError(404, "Not Found", f"no action {action!r}")


def switch_version(client: NimbusClient, name: str, status: str, version: int,
                   own_identity: str | None = None) -> dict[str, Any]:
    """Ask the leader to switch topology ``name`` (now in ``status``) to its kept
    ``version`` (rollbackTopology, as ``nimbus-ha rollback NAME --to N``); its answer
    ({"topology_id", "version"}). :class:`ApiError` as :func:`run_action`; a switch
    the leader refuses (a switch or a rebalance under way, a version not kept) is 409."""
    if status == KILLED:
        raise ApiError(409, "Conflict", f"topology {name!r} is being killed")
    if status == REBALANCING:
        raise ApiError(409, "Conflict", f"topology {name!r} is {REBALANCING}: a switch of "
                                        "version is refused until the rebalance "
                                        "completes")
    with leader_errors(name, own_identity, refused_status=409):
        return dict(client.rollback(name, version))


def topology_history(client: NimbusClient, name: str,
                     own_identity: str | None = None) -> dict[str, Any]:
    """The versions of topology ``name`` as the leader keeps them (getTopologyHistory,
    as ``nimbus-ha history NAME --json``); :class:`ApiError` as :func:`run_action`."""
    with leader_errors(name, own_identity):
        return dict(client.history(name))


@contextlib.contextmanager
def leader_errors(name: str, own_identity: str | None,
                  refused_status: int = 400) -> Iterator[None]:
    """Thrift's answers to a call about topology ``name`` as :class:`ApiError`: no
    leader 503, unknown 404, the UI's own identity refused 403, a wrong state 409, any
    other refusal (InvalidTopologyException) ``refused_status``."""
    try:
        yield
    except NimbusUnavailableError as exc:
        raise no_leader(mask(str(exc))) from None
    except CONNECTION_ERRORS as exc:
        raise no_leader(mask(str(exc) or type(exc).__name__)) from None
    except storm.AuthorizationException as exc:
        # The caller passed the UI's check; the leader refused the UI's own certificate.
        raise forbidden(mask(f"the leader refused the UI's own identity "
                             f"({own_identity or 'its storm.thrift.tls.cert.file'}): "
                             f"{exc.msg}; put it in nimbus.admins (docs/security.md)")) \
            from None
    except storm.NotAliveException as exc:
        raise ApiError(404, "Not Found", mask(exc.msg or f"no topology named {name!r}")) \
            from None
    except storm.InvalidTopologyException as exc:
        message = mask(exc.msg or "invalid request")
        # The leader refuses a KILLED or REBALANCING topology, or one switching code
        # version, with these words (lifecycle.py): a state, not a bad value, so 409 (it
        # may have changed since we looked).
        if "being killed" in message or _rebalancing(message) or _switching(message):
            raise ApiError(409, "Conflict", message) from None
        raise ApiError(refused_status, "Conflict" if refused_status == 409
                       else "Bad Request", message) from None
    except TApplicationException as exc:
        if _rebalancing(exc.message or "") or _switching(exc.message or ""):
            # activate/deactivate declare no InvalidTopologyException: the refusal comes
            # as an internal error carrying the leader's message.
            raise ApiError(409, "Conflict", mask(exc.message)) from None
        # A concurrent change the leader gave up on, or a leader lost mid-call.
        raise ApiError(503, "Service Unavailable", mask(exc.message or str(exc))) \
            from None
    except TException as exc:
        raise ApiError(502, "Bad Gateway", mask(getattr(exc, "msg", None) or repr(exc))) \
            from None


def _switching(message: str) -> bool:
    """Whether the leader's ``message`` refuses an action because a switch of code
    version is under way (TopologyLifecycle._refuse_during_switch's words)."""
    return "is switching from code version" in message and \
        "refused until the switch ends" in message


def _rebalancing(message: str) -> bool:
    """Whether the leader's ``message`` refuses an action because the topology is
    REBALANCING (nimbus.master.rebalancing.refusal's words)."""
    return f"is {REBALANCING} (" in message and "refused until the rebalance" in message
