"""A supervisor's logviewer (nimbus/supervisor/logviewer) served for real on loopback, over
a log root laid out as workers leave it, with hostile files planted in it: Storm's paths
and JSON, no file outside the root whatever the path, and over TLS the topology read
rule for the caller's certificate."""

from __future__ import annotations

import http.client
import json
import os
import ssl
import time
from pathlib import Path

import pytest
import requests
from tls_certs import DAEMON, USER, CertificateAuthority

from nimbus.config import load_config
from nimbus.state.worker_logs import INDEX_RECORD, META_FILE
from nimbus.supervisor.log_dirs import LogMeta
from nimbus.supervisor.logviewer.server import Logviewer
from nimbus.web.logviewer_client import LogviewerClient, LogviewerError

ALPHA, BETA = "alpha-1-100", "beta-2-200"
SECRET = "the secret outside the log root\n"
CURRENT = "".join(f"{i:04d} current line of alpha <b>bold</b>\n" for i in range(100))
OLDER = "".join(f"{i:04d} older line of alpha\n" for i in range(50))


def _lay_out(base: Path) -> Path:
    """A log root with two topologies' logs, and traps."""
    root = base / "workers-artifacts"
    (base / "secret.txt").write_text(SECRET)
    alpha = root / ALPHA / "6700"
    alpha.mkdir(parents=True)
    (alpha / "worker.log").write_text(CURRENT)
    (alpha / "worker.log.1").write_text(OLDER)
    now = time.time()
    # worker.log's index: its first half written an hour ago, its second half now.
    half = len(CURRENT) // 2
    (alpha / "worker.log.idx").write_bytes(INDEX_RECORD.pack(0, now - 3600) +
                                           INDEX_RECORD.pack(half, now))
    os.utime(alpha / "worker.log.1", (now - 7200, now - 7200))
    (root / ALPHA / "6701").mkdir()
    (root / ALPHA / "6701" / "worker.log").write_text("0000 alpha's second slot\n")
    LogMeta(ALPHA, submitter="alice", users=["bob"], readonly_users=["carol"],
            ports={"6700": [0], "6701": [1]}).save(root / ALPHA / META_FILE)
    beta = root / BETA / "6702"
    beta.mkdir(parents=True)
    (beta / "worker.log").write_text("beta's own line\n")   # no record: admins only
    # Traps: links out of the root and across topologies, a FIFO, a directory.
    (alpha / "out.log").symlink_to(base / "secret.txt")
    (alpha / "worker.log.2").symlink_to(beta / "worker.log")
    (root / ALPHA / "6703").symlink_to(beta)
    (root / "gamma-3-300").symlink_to(root / BETA)
    os.mkfifo(alpha / "fifo.log")
    (alpha / "dir.log").mkdir()
    return root


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    base = tmp_path_factory.mktemp("logviewer")
    root = _lay_out(base)
    viewer = Logviewer(load_config(overrides={}), root, "127.0.0.1", 0, "127.0.0.1").start()
    yield viewer, base
    viewer.stop()


def _get(viewer: Logviewer, path: str, **kwargs) -> requests.Response:
    return requests.get(f"{viewer.url}{path}", timeout=10, **kwargs)


def _raw(viewer: Logviewer, target: str, method: str = "GET") -> tuple[int, bytes]:
    """A request whose target goes out as written (no client-side normalising)."""
    connection = http.client.HTTPConnection("127.0.0.1", viewer.port, timeout=10)
    try:
        connection.putrequest(method, target, skip_accept_encoding=True)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


# Every way a path could leave the root or reach what is not a worker's log file: the
# answer is a 4xx JSON error, never the secret, never a 500.
HOSTILE = [
    "/api/v1/log?file=/etc/passwd",
    "/api/v1/log?file=../secret.txt",
    "/api/v1/log?file=../../secret.txt",
    f"/api/v1/log?file={ALPHA}/6700/../../../secret.txt",
    f"/api/v1/log?file={ALPHA}/6700/..%2F..%2F..%2Fsecret.txt",
    f"/api/v1/log?file={ALPHA}%2F6700%2F..%2F..%2F..%2Fsecret.txt",
    f"/api/v1/log?file={ALPHA}/6700/..%252F..%252Fsecret.txt",
    "/api/v1/log?file=%2Fetc%2Fpasswd",
    "/api/v1/log?file=..",
    f"/api/v1/log?file={ALPHA}/6700/out.log",            # a link out of the root
    f"/api/v1/log?file={ALPHA}/6700/worker.log.2",       # a link to another topology
    f"/api/v1/log?file={ALPHA}/6703/worker.log",         # a slot that is a link
    "/api/v1/log?file=gamma-3-300/6702/worker.log",     # a topology that is a link
    f"/api/v1/log?file={ALPHA}/6700/fifo.log",           # a FIFO: never opened to block
    f"/api/v1/log?file={ALPHA}/6700/dir.log",
    f"/api/v1/log?file={ALPHA}/6700/worker.log%00.txt",  # NUL
    f"/api/v1/log?file={ALPHA}/6700/" + "a" * 300,       # a long name
    f"/api/v1/log?file={ALPHA}/6700/" + "a" * 600,
    f"/api/v1/log?file={ALPHA}/6700/missing.log",
    f"/api/v1/log?file={ALPHA}/6700",
    "/api/v1/log",
    f"/api/v1/log?file={ALPHA}/6700/worker.log&start=-1",
    f"/api/v1/log?file={ALPHA}/6700/worker.log&length=abc",
    f"/api/v1/log?file={ALPHA}/6700/worker.log&format=xml",
    "/api/v1/download?file=/etc/passwd",
    f"/api/v1/download?file={ALPHA}/6700/out.log",
    f"/api/v1/download?file={ALPHA}/6700/..%2F..%2F..%2Fsecret.txt",
    "/api/v1/search?file=../secret.txt&search-string=secret",
    f"/api/v1/search?file={ALPHA}/6700/out.log&search-string=secret",
    f"/api/v1/search?file={ALPHA}/6700/worker.log&search-string=",
    f"/api/v1/search?file={ALPHA}/6700/worker.log&search-string=" + "s" * 1025,
    f"/api/v1/search?file={ALPHA}/6700/worker.log&search-string=x&num-matches=0",
    f"/api/v1/search?file={ALPHA}/6700/worker.log&search-string=x&start-byte-offset=99999",
    "/api/v1/deepSearch/..?search-string=secret",
    "/api/v1/deepSearch/..%2F..%2Fsecret.txt?search-string=secret",
    "/api/v1/deepSearch/%2E%2E?search-string=secret",
    "/api/v1/deepSearch/gamma-3-300?search-string=beta&search-archived=true",
    f"/api/v1/deepSearch/{ALPHA}?search-string=secret&port=6703",
    f"/api/v1/deepSearch/{ALPHA}?search-string=secret&port=../..",
    "/api/v1/listLogs?topoId=..",
    "/api/v1/listLogs?topoId=gamma-3-300%2F..",
    f"/api/v1/listLogs?topoId={ALPHA}&port=-1",
    "/api/v1/../../secret.txt",
    "/api/v1/log/../../../secret.txt",
    "/../secret.txt",
    "/secret.txt",
    "/",
]


@pytest.mark.parametrize("target", HOSTILE)
def test_hostile_paths_get_a_4xx_and_never_a_file_outside_the_root(plain, target):
    viewer, _ = plain
    status, body = _raw(viewer, target)
    assert b"secret outside" not in body and b"beta's own line" not in body
    assert 400 <= status < 500, (target, status, body[:300])
    error = json.loads(body)
    assert set(error) == {"error", "errorMessage"} and error["errorMessage"]


def test_a_link_is_refused_by_name_and_a_missing_file_is_404(plain):
    viewer, _ = plain
    answer = _get(viewer, "/api/v1/log", params={"file": f"{ALPHA}/6700/out.log"})
    assert answer.status_code == 403
    assert "symbolic link" in answer.json()["errorMessage"]
    missing = _get(viewer, "/api/v1/log", params={"file": f"{ALPHA}/6700/nope.log"})
    assert missing.status_code == 404 and missing.json()["error"] == "Not Found"


def test_a_very_long_request_line_is_414_unread(plain):
    viewer, _ = plain
    status, body = _raw(viewer, "/api/v1/log?file=" + "a" * 9000)
    assert status == 414 and b"request line" in body


def test_only_get_is_served(plain):
    viewer, _ = plain
    status, body = _raw(viewer, f"/api/v1/log?file={ALPHA}/6700/worker.log", method="POST")
    assert status == 405 and json.loads(body)["error"] == "Method Not Allowed"


def test_a_page_of_a_log_in_html_and_json(plain):
    viewer, _ = plain
    page = _get(viewer, "/api/v1/log", params={"file": f"{ALPHA}/6700/worker.log"})
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    assert "0099 current line of alpha &lt;b&gt;bold&lt;/b&gt;" in page.text
    assert "<b>bold</b>" not in page.text, "the log's text is escaped"
    part = _get(viewer, "/api/v1/log", params={"file": f"{ALPHA}/6700/worker.log",
                                               "start": 5, "length": 10,
                                               "format": "json"}).json()
    assert part == {"file": f"{ALPHA}/6700/worker.log", "start": 5, "length": 10,
                    "fileLength": len(CURRENT), "text": CURRENT[5:15]}
    tail = _get(viewer, "/api/v1/log", params={"file": f"{ALPHA}/6700/worker.log",
                                               "length": 20, "format": "json"}).json()
    assert tail["text"] == CURRENT[-20:] and tail["start"] == len(CURRENT) - 20


def test_download_whole_or_from_an_offset(plain):
    viewer, _ = plain
    whole = _get(viewer, "/api/v1/download", params={"file": f"{ALPHA}/6700/worker.log"})
    assert whole.status_code == 200 and whole.text == CURRENT
    assert "attachment" in whole.headers["Content-Disposition"]
    part = _get(viewer, "/api/v1/download", params={"file": f"{ALPHA}/6700/worker.log"},
                headers={"Range": "bytes=100-"})
    assert part.status_code == 206 and part.text == CURRENT[100:]
    assert part.headers["Content-Range"] == f"bytes 100-{len(CURRENT) - 1}/{len(CURRENT)}"
    past = _get(viewer, "/api/v1/download", params={"file": f"{ALPHA}/6700/worker.log"},
                headers={"Range": f"bytes={len(CURRENT) + 5}-"})
    assert past.status_code == 416 and past.headers["Content-Range"] == \
        f"bytes */{len(CURRENT)}"


def test_a_download_of_a_file_rotated_since_it_was_listed_is_409(plain):
    viewer, _ = plain
    client = LogviewerClient("127.0.0.1", viewer.port, False)
    listed = {d["name"]: d["id"] for d in client.list_files(ALPHA, 6700)}
    path = f"{ALPHA}/6700/worker.log"
    assert b"".join(client.stream(path, 0, listed["worker.log"])) == CURRENT.encode()
    with pytest.raises(LogviewerError, match="409: .*is another file now") as caught:
        list(client.stream(path, 0, listed["worker.log.1"]))
    assert caught.value.status == 409


def test_search_in_one_file_in_storms_shape(plain):
    viewer, _ = plain
    found = _get(viewer, "/api/v1/search", params={
        "file": f"{ALPHA}/6700/worker.log", "search-string": "current line",
        "num-matches": 2}).json()
    assert found["isDaemon"] == "no" and found["searchString"] == "current line"
    assert found["startByteOffset"] == 0 and len(found["matches"]) == 2
    first = found["matches"][0]
    assert first["byteOffset"] == CURRENT.index("current line")
    assert first["matchString"] == "current line" and first["beforeString"] == "0000 "
    assert first["afterString"].startswith(" of alpha <b>bold</b>\n0001")
    assert first["logviewerURL"].startswith(f"{viewer.url}/api/v1/log?file=")
    assert found["nextByteOffset"] == found["matches"][1]["byteOffset"] + 12
    rest = _get(viewer, "/api/v1/search", params={
        "file": f"{ALPHA}/6700/worker.log", "search-string": "current line",
        "num-matches": 1000, "start-byte-offset": found["nextByteOffset"]}).json()
    assert len(rest["matches"]) == 98 and "nextByteOffset" not in rest


def test_deep_search_across_a_topologys_slots(plain):
    viewer, _ = plain
    every = _get(viewer, f"/api/v1/deepSearch/{ALPHA}", params={
        "search-string": "0000", "num-matches": 5}).json()
    assert [[m["fileName"] for m in per_port["matches"]] for per_port in every] == [
        [f"{ALPHA}/6700/worker.log"], [f"{ALPHA}/6701/worker.log"]]
    assert every[0]["matches"][0]["port"] == "6700"
    archived = _get(viewer, f"/api/v1/deepSearch/{ALPHA}", params={
        "search-string": "0049", "num-matches": 5, "port": 6700,
        "search-archived": "true"}).json()
    assert [m["fileName"] for m in archived["matches"]] == [
        f"{ALPHA}/6700/worker.log", f"{ALPHA}/6700/worker.log.1"]
    assert archived["fileOffset"] == 2


def test_list_logs_in_storms_shape_and_in_detail(plain):
    viewer, _ = plain
    listed = _get(viewer, "/api/v1/listLogs", params={"topoId": ALPHA}).json()
    assert listed == sorted([f"{ALPHA}/6700/worker.log", f"{ALPHA}/6700/worker.log.1",
                             f"{ALPHA}/6701/worker.log"]), "no link, FIFO or index listed"
    everything = _get(viewer, "/api/v1/listLogs").json()
    assert f"{BETA}/6702/worker.log" in everything
    detail = LogviewerClient("127.0.0.1", viewer.port, False).list_files(ALPHA, 6700, 1800)
    assert [(d["name"], d["generation"], d["workers"]) for d in detail] == [
        ("worker.log", 0, [0]), ("worker.log.1", 1, [0])]
    current, older = detail
    assert current["size"] == len(CURRENT) and current["id"].isdigit()
    # Half an hour back: the second half of worker.log (its index), nothing of .1.
    assert (current["sinceOffset"], older["sinceOffset"]) == (len(CURRENT) // 2, None)


def test_the_client_reads_a_file_from_an_offset(plain):
    viewer, _ = plain
    client = LogviewerClient("127.0.0.1", viewer.port, False)
    assert b"".join(client.stream(f"{ALPHA}/6700/worker.log", 10)) == CURRENT[10:].encode()
    with pytest.raises(LogviewerError, match="403: .*symbolic link"):
        list(client.stream(f"{ALPHA}/6700/out.log"))


# -- TLS: client certificates and the read rule ---------------------------------------------
@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    base = tmp_path_factory.mktemp("logviewer-tls")
    root = _lay_out(base)
    ca = CertificateAuthority(base / "ca")
    ids = {name: ca.issue(name, DAEMON if name == "supervisor" else USER)
           for name in ("supervisor", "admin", "alice", "bob", "carol", "mallory")}
    conf = load_config(overrides={
        **ids["supervisor"].conf(), "nimbus.admins": ["admin"],
        "nimbus.authorizer": "org.apache.storm.security.auth.authorizer.SimpleACLAuthorizer"})
    viewer = Logviewer(conf, root, "127.0.0.1", 0, "127.0.0.1").start()
    yield viewer, ids, ca
    viewer.stop()


def _as(secure, name: str, path: str, **params) -> requests.Response:
    viewer, ids, _ = secure
    identity = ids[name]
    return requests.get(f"{viewer.url}{path}", params=params, timeout=10,
                        cert=(str(identity.cert), str(identity.key)),
                        verify=str(identity.ca))


def test_with_tls_a_client_without_a_certificate_gets_no_answer(secure):
    viewer, ids, _ = secure
    assert viewer.url.startswith("https://")
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"{viewer.url}/api/v1/listLogs", timeout=10, verify=str(ids["alice"].ca))
    context = ssl.create_default_context(cafile=str(ids["alice"].ca))
    with pytest.raises(LogviewerError, match="cannot reach"):
        LogviewerClient("127.0.0.1", viewer.port, True, context).list_files(ALPHA)


def test_with_tls_plain_http_is_told_to_use_https(secure):
    viewer, _, _ = secure
    answer = requests.get(f"http://127.0.0.1:{viewer.port}/api/v1/listLogs", timeout=10)
    assert answer.status_code == 400 and "https://" in answer.json()["errorMessage"]


@pytest.mark.parametrize("name, may", [("alice", True), ("bob", True), ("carol", True),
                                       ("admin", True), ("mallory", False)])
def test_with_tls_the_topology_read_rule_decides(secure, name, may):
    page = _as(secure, name, "/api/v1/log", file=f"{ALPHA}/6700/worker.log", format="json")
    deep = _as(secure, name, f"/api/v1/deepSearch/{ALPHA}", **{"search-string": "0000"})
    listed = _as(secure, name, "/api/v1/listLogs", topoId=ALPHA)
    if may:
        assert (page.status_code, deep.status_code, listed.status_code) == (200, 200, 200)
        assert page.json()["text"].startswith("0000 current")
        return
    for answer in (page, deep, listed):
        assert answer.status_code == 403
        assert answer.json()["errorMessage"] == (
            f"{name} may not read the logs of {ALPHA}: not its submitter, not in its "
            "topology.users or topology.readonly.users, not in nimbus.admins")


def test_with_tls_logs_without_a_record_are_the_admins_only(secure):
    refused = _as(secure, "alice", "/api/v1/log", file=f"{BETA}/6702/worker.log")
    assert refused.status_code == 403 and "only nimbus.admins" in \
        refused.json()["errorMessage"]
    assert _as(secure, "admin", "/api/v1/download",
               file=f"{BETA}/6702/worker.log").text == "beta's own line\n"
    # A listing of everything shows each caller what it may read.
    assert _as(secure, "mallory", "/api/v1/listLogs").json() == []
    assert {f.split("/")[0] for f in _as(secure, "bob", "/api/v1/listLogs").json()} == {ALPHA}
    assert {f.split("/")[0] for f in _as(secure, "admin", "/api/v1/listLogs").json()} == \
        {ALPHA, BETA}


def test_with_tls_a_certificate_of_another_ca_gets_no_answer(secure, tmp_path):
    viewer, ids, _ = secure
    stranger = CertificateAuthority(tmp_path / "other", name="other CA").issue("alice")
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"{viewer.url}/api/v1/listLogs", timeout=10,
                     cert=(str(stranger.cert), str(stranger.key)), verify=str(ids["alice"].ca))
