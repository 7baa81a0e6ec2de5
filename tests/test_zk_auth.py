"""ZooKeeper authentication against a real server: a nimbus with digest credentials
creates every node closed to clients without them (storm.zookeeper.auth.*)."""

from __future__ import annotations

import posixpath
import subprocess
import sys

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import make_digest_acl, make_digest_acl_credential
from waiting import wait_for

from nimbus.config import ConfigError, load_config
from nimbus.dev.zookeeper import free_port
from nimbus.distribution.archive import pack_directory
from nimbus.state.cluster_state import StormClusterState
from nimbus.state.zk_auth import zk_security
from nimbus.state.zk_client import make_zk_client

pytestmark = pytest.mark.zookeeper

PAYLOAD = "nimbus:s3cret"
ADMIN = "admin:adminpw"


def auth_conf(zk_server, zk_root, tmp_path, **extra):
    host, _, zk_port = zk_server.hosts.rpartition(":")
    return load_config(overrides={
        "storm.zookeeper.servers": [host], "storm.zookeeper.port": int(zk_port),
        "storm.zookeeper.root": zk_root, "nimbus.thrift.port": free_port(),
        "nimbus.seeds": ["127.0.0.1"], "storm.local.dir": str(tmp_path / "local"),
        "storm.zookeeper.auth.scheme": "digest", "storm.zookeeper.auth.payload": PAYLOAD,
        **extra})


def client(zk_server, auth: str | None = None) -> KazooClient:
    zk = KazooClient(hosts=zk_server.hosts, auth_data=[("digest", auth)] if auth else None)
    zk.start(timeout=15)
    return zk


def walk(zk: KazooClient, root: str) -> list[str]:
    found, todo = [], [root]
    while todo:
        path = todo.pop()
        found.append(path)
        todo.extend(posixpath.join(path, c) for c in zk.get_children(path))
    return sorted(found)


def test_every_node_a_nimbus_makes_is_closed_to_others(zk_server, zk_root, tmp_path):
    from nimbus.daemons.nimbus import NimbusDaemon
    from nimbus.thrift.client import NimbusClient

    admin_id = make_digest_acl_credential(*ADMIN.split(":"))
    conf = auth_conf(zk_server, zk_root, tmp_path,
                     **{"storm.zookeeper.superACL": f"digest:{admin_id}",
                        "nimbus.seeds": ["127.0.0.1"]})
    conf = load_config(overrides={**conf.as_dict(), "nimbus.seeds": [
        f"127.0.0.1:{conf['nimbus.thrift.port']}"]})
    daemon = NimbusDaemon(conf)
    daemon.start()
    owner = anonymous = intruder = admin = None
    try:
        bundle = tmp_path / "topology"
        bundle.mkdir()
        (bundle / "topology.yaml").write_text('command: ["sleep", "3600"]\n')
        topology_id = NimbusClient(conf).submit("guarded", pack_directory(bundle), {})

        owner = client(zk_server, PAYLOAD)
        nodes = walk(owner, zk_root)
        for sub in ("storms", "assignments", "code-distributor", "leader-lock", "nimbuses"):
            assert posixpath.join(zk_root, sub) in nodes
        assert posixpath.join(zk_root, "storms", topology_id) in nodes
        expected = [make_digest_acl(*PAYLOAD.split(":"), all=True),
                    make_digest_acl(*ADMIN.split(":"), all=True)]
        wrong_acl = [n for n in nodes if owner.get_acls(n)[0] != expected]
        assert wrong_acl == [], "every node carries exactly the cluster's ACL"

        anonymous, intruder = client(zk_server), client(zk_server, "nimbus:guess")
        for other in (anonymous, intruder):
            for node in nodes:
                with pytest.raises(NoAuthError):
                    other.get(node)
            with pytest.raises(NoAuthError):
                other.get_children(zk_root)
            with pytest.raises(NoAuthError):
                other.set(posixpath.join(zk_root, "storms", topology_id), b"{}")
            with pytest.raises(NoAuthError):
                other.create(posixpath.join(zk_root, "storms", "planted"), b"{}")
            with pytest.raises(NoAuthError):
                other.delete(posixpath.join(zk_root, "storms", topology_id))
        admin = client(zk_server, ADMIN)  # storm.zookeeper.superACL's identity
        assert admin.get(posixpath.join(zk_root, "storms", topology_id))[0] == \
            owner.get(posixpath.join(zk_root, "storms", topology_id))[0]
    finally:
        for zk in (owner, anonymous, intruder, admin):
            if zk is not None:
                zk.stop()
                zk.close()
        daemon.stop()


def test_secure_zookeeper_closes_a_cluster_that_ran_without_auth(zk_server, zk_root,
                                                                 tmp_path):
    plain = client(zk_server)
    StormClusterState(plain, zk_root).setup()
    plain.create(posixpath.join(zk_root, "storms", "old-1-1"), b"{}")
    nodes = walk(plain, zk_root)
    conf = auth_conf(zk_server, zk_root, tmp_path)
    config = tmp_path / "storm.yaml"
    import yaml

    config.write_text(yaml.safe_dump({k: conf[k] for k in (
        "storm.zookeeper.servers", "storm.zookeeper.port", "storm.zookeeper.root",
        "storm.zookeeper.auth.scheme", "storm.zookeeper.auth.payload")}))
    done = subprocess.run([sys.executable, "-m", "nimbus.cli", "secure-zookeeper",
                           "--config", str(config)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"set the cluster's ACL on {len(nodes)} nodes under {zk_root}"
    assert PAYLOAD not in done.stdout + done.stderr
    for node in nodes:
        with pytest.raises(NoAuthError):
            plain.get(node)
    owner = make_zk_client(conf)
    try:
        assert walk(owner, zk_root) == nodes
    finally:
        owner.stop()
        owner.close()
        plain.stop()
        plain.close()


@pytest.mark.parametrize(("overrides", "message"), [
    ({"storm.zookeeper.auth.scheme": "sasl", "storm.zookeeper.auth.payload": "x:y"},
     "storm.zookeeper.auth.scheme: only \"digest\" is supported, got 'sasl'"),
    ({"storm.zookeeper.auth.scheme": "digest", "storm.zookeeper.auth.payload": "nocolon"},
     "storm.zookeeper.auth.payload must be \"user:password\" when "
     "storm.zookeeper.auth.scheme is digest"),
    ({"storm.zookeeper.auth.payload": "a:b"},
     "storm.zookeeper.auth.payload is set but storm.zookeeper.auth.scheme is not: set it "
     "to \"digest\""),
    ({"storm.zookeeper.auth.scheme": "digest", "storm.zookeeper.auth.payload": "a:b",
      "storm.zookeeper.superACL": "nocolon"},
     "storm.zookeeper.superACL must be \"scheme:id\", got 'nocolon'"),
])
def test_unusable_auth_settings_are_named(overrides, message):
    with pytest.raises(ConfigError) as caught:
        zk_security(load_config(overrides=overrides))
    assert str(caught.value) == message


def test_no_auth_leaves_clients_as_they_were():
    assert zk_security(load_config(overrides={})) is None


def test_a_supervisor_with_the_credentials_registers(zk_server, zk_root, tmp_path):
    """Supervisors, the CLI and the UI make their clients with the same function, so
    they authenticate too: a supervisor's registration is closed to others."""
    conf = auth_conf(zk_server, zk_root, tmp_path)
    zk = make_zk_client(conf)
    anonymous = client(zk_server)
    try:
        state = StormClusterState(zk, zk_root)
        state.setup()
        from nimbus.state.records import SupervisorInfo

        state.supervisor_heartbeat("sup-1", SupervisorInfo(time_secs=1, hostname="h"))
        path = posixpath.join(zk_root, "supervisors", "sup-1")
        wait_for(lambda: zk.exists(path), 10, "the registration")
        with pytest.raises(NoAuthError):
            anonymous.get(path)
    finally:
        for c in (zk, anonymous):
            c.stop()
            c.close()


def test_a_root_someone_else_made_is_not_adopted(zk_server, zk_root, tmp_path):
    """Issue 19, Z6: a root created before the cluster's first start by a client without
    its credentials (open to anyone) used to be adopted, ACL and all, without a word."""
    from nimbus.daemons.nimbus import NimbusDaemon
    from nimbus.state.zk_auth import ForeignAclError

    squatter = client(zk_server)
    squatter.create(zk_root, b"")
    squatter.create(posixpath.join(zk_root, "storms"), b"")
    try:
        conf = auth_conf(zk_server, zk_root, tmp_path)
        with pytest.raises(ForeignAclError) as refused:
            NimbusDaemon(conf)
        message = str(refused.value)
        assert message.startswith(
            f"ZooKeeper nodes carry an ACL other than this cluster's: {zk_root} "
            f"(world:anyone); {zk_root}/storms (world:anyone). ")
        assert "nimbus-ha secure-zookeeper" in message and PAYLOAD not in message
        assert sorted(squatter.get_children(zk_root)) == ["storms"]  # nothing was written
        # The documented way out: take the nodes over, then the nimbus starts.
        from nimbus.state.zk_auth import secure_tree

        owner = make_zk_client(conf)
        try:
            secure_tree(owner, zk_root, zk_security(conf).acl)
        finally:
            owner.stop()
            owner.close()
        daemon = NimbusDaemon(conf)
        daemon._release()
    finally:
        squatter.stop()
        squatter.close()
