"""Hostile HTTP clients of the UI and of /metrics (issue 19: U12, U15, U16, U17, M2, M3).

A real UIServer (cheroot) and a real MetricsServer on 127.0.0.1, fed by a real ZooKeeper;
the clients are raw sockets, so each test sends exactly the bytes an attacker would: an
endless request line, headers past any sane size, connections that stall their TLS
handshake or trickle their headers, a Host name that DNS rebinding points at loopback.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest
import requests
from tls_certs import USER, CertificateAuthority
from ui_fixtures import conf_for, write_cluster

from nimbus.config import ConfigError
from nimbus.dev.zookeeper import free_port
from nimbus.metrics import MetricsServer, SupervisorMetrics, serve_metrics
from nimbus.state.cluster_state import StormClusterState
from nimbus.ui.server import UIServer

pytestmark = pytest.mark.zookeeper

SUMMARY = "/api/v1/cluster/summary"
# How long a legitimate request may take while hostile clients hold connections open.
ANSWER_WITHIN_S = 3.0
# The default ui.header.timeout.secs (5), the lingering close after a 408 (1 s) and a
# margin for a loaded machine.
DROPPED_WITHIN_S = 5.0 + 4.0


# -- raw HTTP ----------------------------------------------------------------------------
def read_answer(sock: socket.socket, within_s: float) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of the one answer on ``sock``; fails when none comes
    within ``within_s`` or the server closes without one."""
    deadline = time.monotonic() + within_s
    data = b""

    def more() -> bytes:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"no answer within {within_s} s (got {data[:200]!r})")
        sock.settimeout(remaining)
        try:
            return sock.recv(65536)
        except TimeoutError:
            raise AssertionError(f"no answer within {within_s} s (got {data[:200]!r})") \
                from None

    while b"\r\n\r\n" not in data:
        chunk = more()
        if not chunk:
            raise AssertionError(f"closed without an answer (got {data[:200]!r})")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip()
               for name, _, value in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        chunk = more()
        if not chunk:
            break
        body += chunk
    return int(lines[0].split(" ", 2)[1]), headers, body


def wait_closed(sock: socket.socket, within_s: float, trickle: bytes = b"") -> bytes:
    """Everything the server sends until it closes ``sock``; sends one byte of
    ``trickle`` every half second meanwhile. Fails if it is still open after
    ``within_s``."""
    deadline = time.monotonic() + within_s
    received = b""
    while time.monotonic() < deadline:
        if trickle:
            try:
                sock.send(trickle[:1])
            except OSError:
                return received  # closed under us
            trickle = trickle[1:] or trickle
        sock.settimeout(min(0.5, max(0.01, deadline - time.monotonic())))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            return received
        if not chunk:
            return received
        received += chunk
    raise AssertionError(f"still open after {within_s} s (got {received[:200]!r})")


@contextmanager
def connections(count: int, port: int, first_bytes: bytes) -> Iterator[list[socket.socket]]:
    """``count`` connections to ``port`` that each send ``first_bytes`` and then stall."""
    with ExitStack() as stack:
        socks = []
        for _ in range(count):
            sock = stack.enter_context(socket.create_connection(("127.0.0.1", port),
                                                                timeout=5))
            sock.sendall(first_bytes)
            socks.append(sock)
        yield socks


def request_head(path: str = SUMMARY, host: str = "127.0.0.1") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\n".encode()


# -- fixtures ----------------------------------------------------------------------------
@pytest.fixture
def cluster(make_zk, zk_server, zk_root):
    state = StormClusterState(make_zk(), zk_root)
    state.setup()
    ids = write_cluster(state)
    return {"zk": make_zk(), "ids": ids,
            "conf": lambda **extra: conf_for(zk_server, zk_root, **extra)}


@pytest.fixture
def start_ui(cluster):
    """start_ui(**conf) -> a started plain (or, with TLS keys, HTTPS) UIServer on a free
    port of 127.0.0.1; all stopped, and their threads checked gone, after the test."""
    servers: list[UIServer] = []

    def start(**extra) -> UIServer:
        server = UIServer(cluster["conf"](**extra), zk=cluster["zk"], port=0,
                          host="127.0.0.1")
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()
    left = [t.name for t in threading.enumerate() if t.name.startswith("ui-http")]
    assert left == [], "every thread of the UI's HTTP server is joined on stop"


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    return CertificateAuthority(tmp_path_factory.mktemp("hostile-ca"))


def tls_args(identity) -> dict:
    return {"cert": (str(identity.cert), str(identity.key)), "verify": str(identity.ca),
            "timeout": ANSWER_WITHIN_S}


def client_context(identity) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(identity.ca))
    context.check_hostname = False
    context.load_cert_chain(str(identity.cert), str(identity.key))
    return context


# -- U12: sizes ---------------------------------------------------------------------------
def test_a_request_line_over_the_limit_is_414_before_it_ends(start_ui):
    """U12: a 32 MiB request line cost 326 MiB: it was buffered to its end. Now the
    answer comes once the line passes ui.max.request.line.bytes, line unfinished."""
    ui = start_ui()
    with socket.create_connection(("127.0.0.1", ui.port), timeout=5) as sock:
        sock.sendall(b"GET /" + b"a" * (64 * 1024))  # no end of line, ever
        status, headers, body = read_answer(sock, ANSWER_WITHIN_S)
    assert status == 414
    assert headers["connection"] == "close"
    assert body == (b'{"error":"URI Too Long","errorMessage":"the request line is longer '
                    b'than 8192 bytes: shorten the URL"}')
    # A line within the limit is served as before (no such path: 404, not 414).
    answer = requests.get(f"{ui.url}/{'b' * 8000}", timeout=ANSWER_WITHIN_S)
    assert answer.status_code == 404


def test_headers_over_the_limit_are_431(start_ui):
    ui = start_ui()
    pad = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"p" * 1000) for i in range(40))  # 40 KiB
    with socket.create_connection(("127.0.0.1", ui.port), timeout=5) as sock:
        sock.sendall(request_head() + pad)  # no blank line: the headers never end
        status, headers, body = read_answer(sock, ANSWER_WITHIN_S)
    assert status == 431
    assert body == (b'{"error":"Request Header Fields Too Large","errorMessage":"the request '
                    b'headers are longer than 32768 bytes: send fewer or shorter headers"}')
    # 20 KiB of headers are within the limit.
    fine = {f"X-Pad-{i}": "p" * 1000 for i in range(20)}
    assert requests.get(ui.url + SUMMARY, headers=fine,
                        timeout=ANSWER_WITHIN_S).status_code == 200


def read_answers(sock: socket.socket, count: int, within_s: float) -> list[tuple[int, bytes]]:
    """(status, body) of the next ``count`` answers on ``sock`` (kept alive)."""
    sock.settimeout(within_s)
    stream = sock.makefile("rb")
    answers = []
    for _ in range(count):
        status = int(stream.readline().split(b" ", 2)[1])
        length = 0
        while (line := stream.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        answers.append((status, stream.read(length)))
    return answers


def test_kept_alive_and_pipelined_requests_pass_the_gate(start_ui, cluster, ca):
    """Each request of a kept-alive connection goes through the gate again, the bytes
    it read first (a pipelined request, a body) included."""
    ui = start_ui()
    body = b'{"rebalanceOptions": {"numWorkers": 0}}'
    rebalance = (f"POST /api/v1/topology/{cluster['ids'][0]}/rebalance/0 HTTP/1.1\r\n"
                 f"Host: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    with socket.create_connection(("127.0.0.1", ui.port), timeout=5) as sock:
        sock.sendall(request_head() + b"\r\n" + rebalance + request_head() + b"\r\n")
        answers = read_answers(sock, 3, ANSWER_WITHIN_S)
        assert [status for status, _ in answers] == [200, 400, 200]
        assert b"numWorkers" in answers[1][1]
        sock.sendall(request_head() + b"\r\n")  # the same connection, later
        assert read_answers(sock, 1, ANSWER_WITHIN_S)[0][0] == 200
    tls_ui = start_ui(**ca.issue("ui").conf())
    with requests.Session() as session:
        for _ in range(3):
            assert session.get(tls_ui.url + SUMMARY, **tls_args(ca.issue("bob", USER))) \
                .status_code == 200


# -- U15/U16: slow clients -----------------------------------------------------------------
def test_sixteen_header_tricklers_do_not_starve_a_request(start_ui):
    """U16: each stalled connection held one of cheroot's 8 worker threads."""
    ui = start_ui()
    with connections(16, ui.port, request_head() + b"X-Slow: "):
        answer = requests.get(ui.url + SUMMARY, timeout=ANSWER_WITHIN_S)
        assert answer.status_code == 200 and answer.json()["topologies"] == 1


def test_a_trickler_is_dropped_when_its_headers_take_too_long(start_ui):
    """U16: a byte every half second reset a per-read timeout forever; the headers now
    have ui.header.timeout.secs in all."""
    ui = start_ui()
    with socket.create_connection(("127.0.0.1", ui.port), timeout=5) as sock:
        sock.sendall(request_head())
        started = time.monotonic()
        received = wait_closed(sock, DROPPED_WITHIN_S, trickle=b"X-Slow: aaaaaaaa")
        assert time.monotonic() - started >= 4.0, "not before ui.header.timeout.secs"
    assert received.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), received
    assert received.endswith(b'"errorMessage":"the request headers did not arrive '
                             b'within 5 seconds"}')


def test_stalled_tls_handshakes_and_trickling_users_do_not_starve_a_request(start_ui, ca):
    """U15: 16 connections that send one byte of a ClientHello; U16: 8 users who
    complete their handshake and then trickle headers."""
    ui = start_ui(**ca.issue("ui").conf())
    bob = ca.issue("bob", USER)
    with ExitStack() as stack:
        stack.enter_context(connections(16, ui.port, b"\x16"))
        for _ in range(8):
            raw = socket.create_connection(("127.0.0.1", ui.port), timeout=5)
            tls = stack.enter_context(client_context(bob).wrap_socket(raw))
            tls.sendall(request_head() + b"X-Slow: ")
        answer = requests.get(ui.url + SUMMARY, **tls_args(bob))
        assert answer.status_code == 200 and answer.json()["topologies"] == 1


def test_a_stalled_tls_handshake_is_dropped(start_ui, ca):
    ui = start_ui(**ca.issue("ui").conf())
    with socket.create_connection(("127.0.0.1", ui.port), timeout=5) as sock:
        sock.sendall(b"\x16")
        assert wait_closed(sock, DROPPED_WITHIN_S) == b""
    # Plain HTTP on the HTTPS port still gets its 400, from the same place.
    plain = requests.get(f"http://127.0.0.1:{ui.port}{SUMMARY}", timeout=ANSWER_WITHIN_S)
    assert (plain.status_code, plain.json()) == (400, {
        "error": "Bad Request", "errorMessage": "this port speaks HTTPS only: use https://"})


# -- U17: the Host header -------------------------------------------------------------------
def misdirected(host: str, allowed: str) -> dict:
    return {"error": "Misdirected Request",
            "errorMessage": f"this UI does not answer to the host name {host!r} (the Host "
                            f"header); it answers to {allowed}: add the name you use to "
                            "ui.allowed.hosts"}


def test_a_host_name_dns_rebinding_points_here_is_refused(start_ui):
    """U17: a page on rebind.example whose name now resolves to 127.0.0.1 passed the
    Origin check (its Origin matches its Host); the Host itself is now checked."""
    ui = start_ui()
    allowed = ", ".join(f"{name}, {name}:{ui.port}" for name in ("localhost", "127.0.0.1",
                                                                  "[::1]"))
    evil = f"rebind.example:{ui.port}"
    answer = requests.get(ui.url + SUMMARY, headers={"Host": evil}, timeout=ANSWER_WITHIN_S)
    assert (answer.status_code, answer.json()) == (421, misdirected(evil, allowed))
    killed = requests.post(f"{ui.url}/api/v1/topology/topo0-1-1/kill/0",
                           headers={"Host": evil, "Origin": f"http://{evil}"},
                           timeout=ANSWER_WITHIN_S)
    assert (killed.status_code, killed.json()) == (421, misdirected(evil, allowed))
    for host in (f"127.0.0.1:{ui.port}", "127.0.0.1", f"localhost:{ui.port}",
                 f"LOCALHOST:{ui.port}", f"[::1]:{ui.port}", "[::1]"):
        answer = requests.get(ui.url + SUMMARY, headers={"Host": host},
                              timeout=ANSWER_WITHIN_S)
        assert answer.status_code == 200, host
    for host in (f"localhost:{ui.port + 1}", f"127.0.0.1.rebind.example:{ui.port}"):
        answer = requests.get(ui.url + SUMMARY, headers={"Host": host},
                              timeout=ANSWER_WITHIN_S)
        assert answer.status_code == 421, host


def test_ui_allowed_hosts_names_the_hosts_the_ui_answers_to(start_ui):
    ui = start_ui(**{"ui.allowed.hosts": ["ui.example.org", "proxy.example.org:443"]})

    def status(host: str) -> int:
        return requests.get(ui.url + SUMMARY, headers={"Host": host},
                            timeout=ANSWER_WITHIN_S).status_code

    assert status("ui.example.org") == 200
    assert status(f"ui.example.org:{ui.port}") == 200
    assert status("proxy.example.org:443") == 200
    assert status(f"127.0.0.1:{ui.port}") == 200, "the address it binds is always allowed"
    assert status("ui.example.org:1") == 421
    assert status("proxy.example.org") == 421
    assert status(f"localhost:{ui.port}") == 421


@pytest.mark.parametrize(("value", "message"), [
    ([], "ui.allowed.hosts is empty: the UI would refuse every request; list the host "
         "names it is reached by"),
    (["ui example.org"], "ui.allowed.hosts: 'ui example.org' is not a host name, "
                         "[IPv6 address] or '*', optionally with :port"),
    (["ui.example.org:99999"], "ui.allowed.hosts: 'ui.example.org:99999' is not a host "
                               "name, [IPv6 address] or '*', optionally with :port"),
])
def test_bad_allowed_hosts_fail_the_start_before_any_thread(cluster, value, message):
    before = {t.name for t in threading.enumerate()}
    server = UIServer(cluster["conf"](**{"ui.allowed.hosts": value}), zk=cluster["zk"],
                      port=0, host="127.0.0.1")
    with pytest.raises(ConfigError) as caught:
        server.start()
    assert str(caught.value) == message
    assert {t.name for t in threading.enumerate()} <= before


@pytest.mark.parametrize(("extra", "message"), [
    ({"ui.max.request.line.bytes": 0},
     "ui.max.request.line.bytes must be at least 256 (got 0)"),
    ({"ui.max.header.bytes": 4096, "ui.max.request.line.bytes": 8192},
     "ui.max.header.bytes (4096) must be at least ui.max.request.line.bytes (8192)"),
    ({"ui.header.timeout.secs": 0}, "ui.header.timeout.secs must be at least 1 (got 0)"),
])
def test_bad_limits_fail_the_start(cluster, extra, message):
    server = UIServer(cluster["conf"](**extra), zk=cluster["zk"], port=0, host="127.0.0.1")
    with pytest.raises(ConfigError) as caught:
        server.start()
    assert str(caught.value) == message


# -- M2/M3: /metrics -----------------------------------------------------------------------
@pytest.fixture
def metrics_servers():
    servers: list[MetricsServer] = []
    yield servers
    for server in servers:
        server.stop()
    for server in servers:
        prefix = f"test-metrics-{server.port}"
        assert [t.name for t in threading.enumerate() if t.name.startswith(prefix)] == []


def test_a_stalled_client_does_not_block_a_scrape(metrics_servers):
    """M3: one thread served every scrape in turn, so one silent client stopped them."""
    server = MetricsServer(SupervisorMetrics(list, dict).registry, "127.0.0.1", 0,
                           "test-metrics")
    metrics_servers.append(server)
    server.start()
    with connections(16, server.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n"):
        scrape = requests.get(server.url, timeout=ANSWER_WITHIN_S)
        assert scrape.status_code == 200 and "supervisor_workers 0.0" in scrape.text
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(b"GET /" + b"m" * 64 * 1024)
        assert read_answer(sock, ANSWER_WITHIN_S)[0] == 414


def test_with_tls_metrics_are_served_over_https_to_cluster_certificates(
        metrics_servers, ca, tmp_path, cluster):
    """M2: /metrics was plain HTTP although the cluster uses TLS."""
    conf = cluster["conf"](**ca.issue("supervisor-1").conf())
    port = free_port()
    server = serve_metrics(SupervisorMetrics(list, dict).registry, "127.0.0.1", port,
                           "test-metrics", conf=conf)
    assert server is not None
    metrics_servers.append(server)
    server.start()
    assert server.url == f"https://127.0.0.1:{port}/metrics"
    prometheus = ca.issue("prometheus", USER)
    scrape = requests.get(server.url, **tls_args(prometheus))
    assert scrape.status_code == 200 and "supervisor_workers 0.0" in scrape.text
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(server.url, verify=str(ca.ca_file), timeout=ANSWER_WITHIN_S)
    stranger = CertificateAuthority(tmp_path / "other", name="other CA").issue("mallory")
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(server.url, verify=str(ca.ca_file), timeout=ANSWER_WITHIN_S,
                     cert=(str(stranger.cert), str(stranger.key)))
    plain = requests.get(server.url.replace("https://", "http://"), timeout=ANSWER_WITHIN_S)
    assert (plain.status_code, plain.json()) == (400, {
        "error": "Bad Request", "errorMessage": "this port speaks HTTPS only: use https://"})
    # M3 over TLS: handshakes that stall hold up no scrape.
    with connections(16, port, b"\x16"):
        assert requests.get(server.url, **tls_args(prometheus)).status_code == 200


def test_metrics_with_tls_and_no_certificate_is_a_clear_error(cluster):
    conf = cluster["conf"](**{"storm.thrift.transport": "tls"})
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(ConfigError) as caught:
        serve_metrics(SupervisorMetrics(list, dict).registry, "127.0.0.1", free_port(),
                      "test-metrics", conf=conf)
    assert str(caught.value) == ("storm.thrift.tls.ca.file must name a PEM file when "
                                 "storm.thrift.transport is tls (got None)")
    assert {t.name for t in threading.enumerate()} <= before
