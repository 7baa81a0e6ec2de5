"""The ZooKeeper client every daemon uses (nimbus, supervisor, UI, CLI), made from a
``storm.yaml`` configuration."""

from __future__ import annotations

from kazoo.client import KazooClient
from kazoo.retry import KazooRetry

from nimbus.config import Config
from nimbus.state.connection_watchdog import WatchedKazooClient
from nimbus.state.zk_auth import zk_security
from nimbus.state.zk_handler import PollingThreadingHandler


def make_zk_client(conf: Config, name: str = "zk") -> KazooClient:
    """A started kazoo client for ``conf``; raises if ZooKeeper is unreachable.

    It tracks the negotiated session timeout (``zk.session_timeout``) and has a watchdog
    that drops a connection over which nothing is answered (nimbus.state.
    connection_watchdog); ``name`` names the watchdog's thread.

    With ZooKeeper auth configured (``storm.zookeeper.auth.*``) the client authenticates
    and every node it creates carries the cluster's ACL (nimbus.state.zk_auth)."""
    security = zk_security(conf)
    zk = WatchedKazooClient(
        watchdog_name=name,
        hosts=conf.zk_hosts,
        # kazoo's own handler builds an epoll selector per wait (see zk_handler)
        handler=PollingThreadingHandler(),
        auth_data=security.auth_data if security else None,
        default_acl=security.acl if security else None,
        timeout=conf.session_timeout_s,
        connection_retry=KazooRetry(max_tries=-1, max_delay=1.0),
        command_retry=KazooRetry(max_tries=conf["storm.zookeeper.retry.times"],
                                 delay=conf["storm.zookeeper.retry.interval"] / 1000.0,
                                 max_delay=5.0),
    )
    try:
        zk.start(timeout=conf.connection_timeout_s)
    except Exception as exc:
        zk.stop()
        zk.close()
        raise ConnectionError(
            f"cannot connect to ZooKeeper at {conf.zk_hosts} within "
            f"{conf.connection_timeout_s:.0f}s (storm.zookeeper.servers/port): {exc}") from None
    return zk
