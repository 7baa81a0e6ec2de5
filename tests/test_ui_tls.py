"""The UI over HTTPS with client certificates, applying nimbus.authorizer's rules to its
callers: a real nimbus (TLS, SimpleACLAuthorizer, ZooKeeper digest auth) on a real
ZooKeeper, and `nimbus-ha ui` as a separate process; requests presents each user's
certificate, as curl --cert or a browser would."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid

import pytest
import requests
import yaml
from tls_certs import DAEMON, SERVER, USER, CertificateAuthority
from waiting import wait_for

from nimbus.config import ConfigError, load_config
from nimbus.dev.zookeeper import free_port
from nimbus.distribution.archive import pack_directory
from nimbus.thrift import storm

pytestmark = pytest.mark.zookeeper
SIMPLE_ACL = "org.apache.storm.security.auth.authorizer.SimpleACLAuthorizer"
SECRET = "hunter2-secret"
ZK_AUTH = {"storm.zookeeper.auth.scheme": "digest",
           "storm.zookeeper.auth.payload": f"cluster:{SECRET}"}
# Daemons serve and call (serverAuth and clientAuth), people only call (clientAuth).
DAEMONS = ("nimbus-1", "ui", "webui")
USERS = (*DAEMONS, "alice", "bob", "carol", "dave", "ops")


class UIProcess:
    """`nimbus-ha ui --config FILE` in its own process; stderr kept in a file."""

    def __init__(self, directory, conf: dict, scheme: str = "https"):
        self.port = free_port()
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self.config = directory / f"ui-{self.port}.yaml"
        self.config.write_text(yaml.safe_dump({**conf, "ui.port": self.port,
                                               "ui.host": "127.0.0.1"}))
        self.log = directory / f"ui-{self.port}.log"
        self._log_file = self.log.open("w")
        self.proc = subprocess.Popen([sys.executable, "-m", "nimbus.cli", "ui", "--config",
                                      str(self.config)], stdout=self._log_file,
                                     stderr=subprocess.STDOUT)

    def wait_serving(self, **request_args) -> None:
        def up() -> bool:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                return requests.get(self.url + "/api/v1/cluster/summary",
                                    **{**request_args, "timeout": 5}).status_code == 200
            except requests.ConnectionError:
                return False
        wait_for(up, 60, f"the UI on {self.url}", interval_s=0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log_file.close()


@pytest.fixture(scope="module")
def env(zk_server, tmp_path_factory):
    """One TLS nimbus with alice's topology "alices" (topology.users [carol],
    topology.readonly.users [dave]) and bob's "bobs"; the UI runs as "ui", an admin."""
    from nimbus.daemons.nimbus import NimbusDaemon
    from nimbus.thrift.client import NimbusClient

    tmp = tmp_path_factory.mktemp("ui-tls")
    ca = CertificateAuthority(tmp / "ca")
    ids = {name: ca.issue(name, DAEMON if name in DAEMONS else USER) for name in USERS}
    host, _, zk_port = zk_server.hosts.rpartition(":")
    port = free_port()
    base = {"storm.zookeeper.servers": [host], "storm.zookeeper.port": int(zk_port),
            "storm.zookeeper.root": f"/ui-tls-{uuid.uuid4().hex[:8]}",
            "nimbus.seeds": [f"127.0.0.1:{port}"], "nimbus.authorizer": SIMPLE_ACL,
            "nimbus.admins": ["ops", "ui"], **ZK_AUTH}
    daemon = NimbusDaemon(load_config(overrides={
        **base, "nimbus.thrift.port": port, "storm.local.dir": str(tmp / "nimbus"),
        **ids["nimbus-1"].conf()}))
    daemon.start()
    ui = None
    try:
        wait_for(daemon.master.elector.is_leader, 20, "the nimbus to lead")

        def client(name: str) -> NimbusClient:
            conf = load_config(overrides={**base, **ids[name].conf()})
            return NimbusClient(conf, deadline_s=10)  # presenting name's certificate

        directory = tmp / "topology"
        directory.mkdir()
        (directory / "topology.yaml").write_text('command: ["sleep", "3600"]\n')
        bundle = pack_directory(directory)
        topologies = {
            "alices": client("alice").submit("alices", bundle, {
                "topology.users": ["carol"], "topology.readonly.users": ["dave"]}),
            "bobs": client("bob").submit("bobs", bundle, {})}
        ui = UIProcess(tmp, {**base, **ids["ui"].conf()})
        env = {"ca": ca, "ids": ids, "base": base, "topologies": topologies, "ui": ui,
               "daemon": daemon, "tmp": tmp, "client": client}
        ui.wait_serving(**as_user(env, "ops"))
        yield env
    finally:
        if ui is not None:
            ui.stop()
        daemon.stop()


def as_user(env, name: str) -> dict:
    """requests' arguments for a caller presenting ``name``'s certificate."""
    identity = env["ids"][name]
    return {"cert": (str(identity.cert), str(identity.key)), "verify": str(identity.ca),
            "timeout": 30}


def get(env, name: str, path: str) -> requests.Response:
    return requests.get(env["ui"].url + path, **as_user(env, name))


def post(env, name: str, path: str, **kwargs) -> requests.Response:
    return requests.post(env["ui"].url + path, **as_user(env, name), **kwargs)


def status_of(env, name: str) -> tuple[str, int]:
    base = env["daemon"].master.state.storm_base(env["topologies"][name])
    return base.status, base.num_workers


def forbidden(message: str) -> dict:
    return {"error": "Forbidden", "errorMessage": message}


def test_only_certificates_of_the_cluster_ca_get_an_answer(env, tmp_path):
    url = env["ui"].url + "/api/v1/cluster/summary"
    ca_file = str(env["ca"].ca_file)
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(url, verify=ca_file, timeout=10)  # no client certificate
    stranger = CertificateAuthority(tmp_path / "other", name="other CA").issue("mallory")
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(url, verify=ca_file, cert=(str(stranger.cert), str(stranger.key)),
                     timeout=10)
    plain = requests.get(url.replace("https://", "http://"), timeout=10)
    assert plain.status_code == 400
    assert plain.json() == {"error": "Bad Request",
                            "errorMessage": "this port speaks HTTPS only: use https://"}
    answer = get(env, "bob", "/api/v1/cluster/summary")
    assert answer.status_code == 200 and answer.json()["topologies"] == 2


def test_summaries_are_open_to_every_user_a_topology_page_is_not(env):
    alices = env["topologies"]["alices"]
    names = [t["name"] for t in get(env, "bob", "/api/v1/topology/summary").json()[
        "topologies"]]
    assert names == ["alices", "bobs"], "Storm's getClusterInfo: any authenticated user"
    refused = get(env, "bob", f"/api/v1/topology/{alices}")
    assert refused.status_code == 403
    assert refused.json() == forbidden(
        "bob may not read alices: not its submitter, not in its topology.users or "
        "topology.readonly.users, not in nimbus.admins")
    for reader in ("alice", "carol", "dave", "ops"):  # owner, users, readonly.users, admin
        page = get(env, reader, f"/api/v1/topology/{alices}")
        assert page.status_code == 200, (reader, page.text)
        assert page.json()["configuration"]["topology.users"] == ["carol"]
    assert get(env, "bob", f"/api/v1/topology/{env['topologies']['bobs']}").status_code \
        == 200


def test_actions_follow_the_leaders_rules_for_the_caller(env):
    alices = env["topologies"]["alices"]
    # The very message the leader gives bob over Thrift.
    with pytest.raises(storm.AuthorizationException) as thrift_refusal:
        env["client"]("bob").deactivate("alices")
    refused = post(env, "bob", f"/api/v1/topology/{alices}/deactivate")
    assert (refused.status_code, refused.json()) == (403, forbidden(thrift_refusal.value.msg))
    assert thrift_refusal.value.msg == ("bob may not deactivate alices: not its submitter, "
                                        "not in its topology.users, not in nimbus.admins")
    for caller, action in (("bob", "kill/0"), ("bob", "rebalance/0"),
                           ("dave", "deactivate")):  # readonly.users may not change it
        answer = post(env, caller, f"/api/v1/topology/{alices}/{action}",
                      json={"rebalanceOptions": {"numWorkers": 3}})
        verb = action.split("/")[0]
        assert (answer.status_code, answer.json()) == (403, forbidden(
            f"{caller} may not {verb} alices: not its submitter, not in its "
            "topology.users, not in nimbus.admins"))
    assert status_of(env, "alices") == ("ACTIVE", 1), "nothing refused reached the leader"

    ok = {"topologyOperation": "deactivate", "topologyId": alices, "status": "success"}
    assert post(env, "carol", f"/api/v1/topology/{alices}/deactivate").json() == ok
    assert status_of(env, "alices") == ("INACTIVE", 1)
    assert post(env, "alice", f"/api/v1/topology/{alices}/activate").status_code == 200
    assert post(env, "ops", f"/api/v1/topology/{alices}/rebalance/0",
                json={"rebalanceOptions": {"numWorkers": 2}}).status_code == 200
    assert status_of(env, "alices") == ("ACTIVE", 2)


def test_the_dashboard_shows_each_user_what_it_may_read_and_change(env):
    alices, bobs = env["topologies"]["alices"], env["topologies"]["bobs"]

    def rows(name: str) -> dict:
        data = get(env, name, "/api/v1/ui/dashboard").json()
        assert data["user"] == name
        return {t["name"]: t for t in data["topologies"]}

    # dave's rights come from alices' configuration, which the UI fetches in the background
    wait_for(lambda: rows("dave")["alices"]["mayRead"], 30, "alices' conf in the UI")
    bob = rows("bob")
    assert (bob["alices"]["mayRead"], bob["alices"]["mayChange"]) == (False, False)
    assert {k: bob["alices"][k] for k in ("workersAlive", "recordsPerSecond", "history",
                                          "restarts", "newestError", "errorCount")} == {
        "workersAlive": None, "recordsPerSecond": None, "history": [], "restarts": None,
        "newestError": None, "errorCount": 0}
    assert (bob["alices"]["id"], bob["alices"]["status"]) == (alices, "ACTIVE")
    assert (bob["bobs"]["mayRead"], bob["bobs"]["mayChange"]) == (True, True)
    assert isinstance(bob["bobs"]["recordsPerSecond"], float)
    dave = rows("dave")
    assert (dave["alices"]["mayRead"], dave["alices"]["mayChange"]) == (True, False)
    assert (dave["bobs"]["mayRead"], dave["bobs"]["mayChange"]) == (False, False)
    for name in ("alice", "carol"):
        assert (rows(name)["alices"]["mayRead"], rows(name)["alices"]["mayChange"]) == \
            (True, True)
    ops = rows("ops")
    assert all(t["mayRead"] and t["mayChange"] for t in ops.values()) and set(ops) == {
        "alices", "bobs"}
    assert bobs in {t["id"] for t in ops.values()}


def test_no_secret_leaves_the_ui(env):
    configuration = get(env, "bob", "/api/v1/cluster/configuration")
    assert configuration.json()["storm.zookeeper.auth.payload"] == "********"
    pages = [configuration.text, get(env, "ops", "/api/v1/ui/dashboard").text,
             get(env, "ops", f"/api/v1/topology/{env['topologies']['alices']}").text]
    assert all(SECRET not in page for page in pages)
    assert SECRET not in env["ui"].log.read_text()


def test_a_client_stalling_its_handshake_holds_up_no_one(env):
    """cheroot's own TLS adapter shakes hands in its accepting thread, so a client that
    connects and sends nothing would delay every other connection by 10 s."""
    stalled = [socket.create_connection(("127.0.0.1", env["ui"].port), timeout=30)
               for _ in range(3)]
    try:
        started = time.monotonic()
        assert get(env, "bob", "/api/v1/cluster/summary").status_code == 200
        assert time.monotonic() - started < 2.0
    finally:
        for sock in stalled:
            sock.close()


def test_the_leader_refusing_the_uis_own_identity_is_403(env):
    """A UI whose certificate is not in nimbus.admins: the caller passes the UI's check,
    and the leader, which sees the UI, refuses."""
    ui = UIProcess(env["tmp"], {**env["base"], **env["ids"]["webui"].conf()})
    try:
        ui.wait_serving(**as_user(env, "alice"))
        bobs = env["topologies"]["bobs"]
        answer = requests.post(f"{ui.url}/api/v1/topology/{bobs}/deactivate",
                               **as_user(env, "bob"))
        assert (answer.status_code, answer.json()) == (403, forbidden(
            "the leader refused the UI's own identity (webui): webui may not deactivate "
            "bobs: not its submitter, not in its topology.users, not in nimbus.admins; "
            "put it in nimbus.admins (docs/security.md)"))
        assert status_of(env, "bobs") == ("ACTIVE", 1)
    finally:
        ui.stop()
    assert "the UI calls the leader as 'webui', which is not in nimbus.admins" in \
        ui.log.read_text()


def test_insecure_http_gives_anonymous_callers_the_summaries_only(env):
    ui = UIProcess(env["tmp"], {**env["base"], **env["ids"]["ui"].conf(),
                                "ui.insecure.allow": True}, scheme="http")
    try:
        ui.wait_serving()
        alices = env["topologies"]["alices"]
        assert requests.get(f"{ui.url}/api/v1/topology/summary", timeout=30).status_code \
            == 200
        page = requests.get(f"{ui.url}/api/v1/topology/{alices}", timeout=30)
        assert (page.status_code, page.json()) == (403, forbidden(
            "an unauthenticated client may not read alices: not its submitter, not in its "
            "topology.users or topology.readonly.users, not in nimbus.admins"))
        action = requests.post(f"{ui.url}/api/v1/topology/{alices}/kill/0", timeout=30)
        assert (action.status_code, action.json()) == (403, forbidden(
            "an unauthenticated client may not kill alices: not its submitter, not in its "
            "topology.users, not in nimbus.admins"))
        rows = requests.get(f"{ui.url}/api/v1/ui/dashboard", timeout=30).json()
        assert rows["user"] is None
        assert [(t["mayRead"], t["mayChange"]) for t in rows["topologies"]] == [
            (False, False), (False, False)]
    finally:
        ui.stop()
    assert "ui.insecure.allow: the UI serves plain HTTP without client certificates" in \
        ui.log.read_text()


def test_the_ui_presents_ui_https_cert_file(env):
    """ui.https.cert.file: a certificate for the address browsers use, apart from the
    one the UI presents to the leader."""
    web = env["ca"].issue("ui.example.org", (SERVER,))  # browsers only connect to it
    ui = UIProcess(env["tmp"], {**env["base"], **env["ids"]["ui"].conf(),
                                "ui.https.cert.file": str(web.cert),
                                "ui.https.key.file": str(web.key)})
    try:
        ui.wait_serving(**as_user(env, "bob"))
        context = ssl.create_default_context(cafile=str(env["ca"].ca_file))
        context.check_hostname = False
        bob = env["ids"]["bob"]
        context.load_cert_chain(str(bob.cert), str(bob.key))
        with socket.create_connection(("127.0.0.1", ui.port), timeout=10) as raw:
            with context.wrap_socket(raw) as tls:
                subject = dict(rdn[0] for rdn in tls.getpeercert()["subject"])
        assert subject["commonName"] == "ui.example.org"
    finally:
        ui.stop()


@pytest.mark.parametrize(("overrides", "message"), [
    ({"ui.https.cert.file": "/nonexistent/ui.pem"},
     "ui.https.cert.file must name a PEM file for the UI's HTTPS (storm.thrift.transport "
     "is tls; got '/nonexistent/ui.pem')"),
    ({"storm.thrift.tls.ca.file": None},
     "storm.thrift.tls.ca.file must name a PEM file for the UI's HTTPS "
     "(storm.thrift.transport is tls; got None)"),
])
def test_unusable_https_settings_fail_the_start_before_any_thread(env, overrides, message):
    from nimbus.ui.server import UIServer

    conf = load_config(overrides={**env["base"], **env["ids"]["ui"].conf(), **overrides})
    before = {t.name for t in threading.enumerate()}
    server = UIServer(conf, port=0)
    with pytest.raises(ConfigError) as caught:
        server.start()
    assert str(caught.value) == message
    assert {t.name for t in threading.enumerate()} <= before
    assert server.zk is None, "nothing was connected"


def test_the_cli_names_the_setting_it_cannot_use(env):
    config = env["tmp"] / "bad-ui.yaml"
    config.write_text(yaml.safe_dump({**env["base"], **env["ids"]["ui"].conf(),
                                      "ui.https.key.file": "/nonexistent/ui.key"}))
    done = subprocess.run([sys.executable, "-m", "nimbus.cli", "ui", "--config", str(config)],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert done.returncode == 1
    assert done.stderr.strip().endswith(
        "Error: ui.https.key.file must name a PEM file for the UI's HTTPS "
        "(storm.thrift.transport is tls; got '/nonexistent/ui.key')")
