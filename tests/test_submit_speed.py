"""Submit at wire speed (issue 21): stored packing, archives sent as they are, the upload
stream beside the Thrift connection, and what a broken or refused upload leaves.

Packing is checked on real files and through the supervisor's own unpack (CodeCache).
Uploads run against a real ThriftServer and FileTransfers on loopback (with and without
TLS, with and without the upload stream), and the cut-off and end-to-end cases against
one real in-process nimbus leading a real ZooKeeper. Speed itself is measured by
benchmarks/bench_submit_bundles.py; nothing here is timed.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import select
import shutil
import socket
import struct
import tarfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from tls_certs import CertificateAuthority
from waiting import wait_for

from nimbus.cli import _bundle, main
from nimbus.config import load_config
from nimbus.daemons.nimbus import NimbusDaemon
from nimbus.dev.zookeeper import free_port
from nimbus.distribution import code_stream
from nimbus.distribution.archive import (
    ChangedWhilePackedError,
    FileSlice,
    PieceReader,
    bundle_kind,
    check_bundle,
    directory_pieces,
    pack_directory_file,
    packed_size,
)
from nimbus.distribution.file_transfer import FileTransfers
from nimbus.distribution.local_code import LocalCodeStore
from nimbus.supervisor.code_cache import CODE_FILES, CodeCache
from nimbus.thrift.client import NimbusClient, TransferRefusedError, connect
from nimbus.thrift.server import ThriftServer
from nimbus.thrift.tls import server_context

PROCESS_YAML = 'command: ["sleep", "3600"]\n'
WAIT_S = 15.0
MB = 1 << 20


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def zip_bytes(members: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def make_directory(root: Path) -> dict[str, bytes]:
    """A bundle directory with compressed members (a wheel, a jar, a .gz, and a zip that
    sorts last) beside text and a large incompressible file; returns name -> bytes."""
    text = b"".join(b"line %d of a module\n" % i for i in range(20000))
    files = {
        "topology.yaml": PROCESS_YAML.encode(),
        "lib/dep-1.0-py3-none-any.whl": zip_bytes({"dep/__init__.py": text}),
        "lib/storm-core.jar": zip_bytes({"org/A.class": os.urandom(100_000)}),
        "data/table.csv.gz": gzip.compress(text, compresslevel=6),
        "data/blob.bin": os.urandom(3 * MB + 123),
        "src/module.py": text,
        "zz-last.zip": zip_bytes({"inner/topology.py": b"def build(spark, conf): pass\n"}),
    }
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return files


def tar_members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path, "r:") as tf:  # "r:": refuses anything compressed
        return {m.name: tf.extractfile(m).read() for m in tf if m.isfile()}


# -- packing ---------------------------------------------------------------------------------
def test_a_directory_is_packed_stored_with_its_members_untouched(tmp_path):
    files = make_directory(tmp_path / "src")
    packed = tmp_path / "bundle.tar"
    size = pack_directory_file(tmp_path / "src", packed)
    # Stored: every member holds the very bytes of its file (the wheel, the jar and the
    # .gz are not deflated again), and the archive is the files plus tar's own blocks.
    assert tar_members(packed) == files
    assert size == packed_size(tmp_path / "src") == packed.stat().st_size
    headers = sum(512 + -len(data) % 512 for data in files.values())
    assert size - headers - sum(map(len, files.values())) < 2 * 65536 + 10240
    # A zip as the last member does not make the tar pass for that zip: the leader's
    # check and the supervisor's unpack ask zipfile first.
    assert not zipfile.is_zipfile(packed)
    assert bundle_kind(packed, 1 << 30) == "process"
    assert check_bundle(packed, 1 << 30) == sum(map(len, files.values()))


def test_the_supervisor_unpacks_a_packed_directory(tmp_path):
    files = make_directory(tmp_path / "src")
    served = tmp_path / "served"
    served.mkdir()
    pack_directory_file(tmp_path / "src", served / "stormjar.jar")
    (served / "stormconf.json").write_text("{}")
    (served / "stormcode.ser").write_bytes(b"")

    def fetch(peer: str, remote: str, dest: Path, timeout_s: float = 30.0) -> str:
        shutil.copyfile(served / remote.rsplit("/", 1)[1], dest)
        return sha(dest.read_bytes())

    cache = CodeCache(tmp_path / "stormdist", 1 << 30, fetch=fetch)
    code = cache.ensure("t-1-1", {f: sha((served / f).read_bytes()) for f in CODE_FILES},
                        ["127.0.0.1:1"])
    resources = code / "resources"
    assert {p.relative_to(resources).as_posix(): p.read_bytes()
            for p in resources.rglob("*") if p.is_file()} == files


def test_a_file_that_shrinks_while_it_is_packed_is_refused(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "topology.yaml").write_text(PROCESS_YAML)
    big = tmp_path / "src" / "big.bin"
    big.write_bytes(os.urandom(2 * MB))
    pieces = directory_pieces(tmp_path / "src")
    with PieceReader(pieces) as reader:
        reader.read(1024)  # into big.bin's header: the file is open, its size announced
        os.truncate(big, MB)
        with pytest.raises(ChangedWhilePackedError, match="big.bin shrank"):
            while reader.read(256 * 1024):
                pass


# -- the upload stream, against a real Thrift server -----------------------------------------
class UploadServer:
    """The upload half of the Nimbus service over a real FileTransfers, counting chunks."""

    def __init__(self, transfers: FileTransfers):
        self.transfers = transfers
        self.chunk_calls = 0

    def beginFileUpload(self) -> str:
        return self.transfers.begin_upload()

    def uploadChunk(self, location: str, chunk: bytes) -> None:
        self.chunk_calls += 1
        self.transfers.upload_chunk(location, chunk)

    def finishFileUpload(self, location: str) -> None:
        self.transfers.finish_upload(location)


@pytest.fixture
def upload_server(tmp_path):
    """upload_server(streams=True, max_bytes=1 GiB, tls=None) -> (server, handler)."""
    started: list[tuple[ThriftServer, FileTransfers]] = []

    def make(streams: bool = True, max_bytes: int = 1 << 30, tls=None):
        local = tmp_path / f"nimbus-{len(started)}"
        transfers = FileTransfers(local, LocalCodeStore(local), max_bytes)
        handler = UploadServer(transfers)
        server = ThriftServer(handler, "127.0.0.1", 0, ssl_context=tls,
                              downloads=transfers if streams else None)
        server.start()
        started.append((server, transfers))
        return server, handler

    yield make
    for server, transfers in started:
        server.stop()
        transfers.close()
    assert [t.name for t in threading.enumerate()
            if t.name.startswith(("thrift-", "upload-check-"))] == []


def upload(server: ThriftServer, source: Path | bytes,
           identity: dict[str, Any] | None = None) -> tuple[str, list[int]]:
    """Upload ``source`` as a client with ``identity``'s settings (its TLS files)."""
    client = NimbusClient(load_config(overrides={
        "nimbus.seeds": [f"127.0.0.1:{server.port}"], **(identity or {})}))
    sent: list[int] = []
    with connect(f"127.0.0.1:{server.port}", security=client.security) as thrift:
        return client.upload_bundle(source, sent.append, thrift), sent


def test_a_directory_goes_over_the_upload_stream_without_a_chunk_call(upload_server, tmp_path):
    make_directory(tmp_path / "src")
    server, handler = upload_server()
    location, sent = upload(server, tmp_path / "src")
    stored = handler.transfers.take_upload(location)
    pack_directory_file(tmp_path / "src", tmp_path / "expected.tar")
    assert stored.read_bytes() == (tmp_path / "expected.tar").read_bytes()
    assert handler.chunk_calls == 0
    assert sum(sent) == packed_size(tmp_path / "src")
    assert handler.transfers.uploads_in_progress() == 0


@pytest.mark.parametrize("kind", ["storm.jar", "bundle.tar.gz", "bundle.zip"])
def test_an_archive_is_sent_as_it_is(upload_server, tmp_path, kind):
    archive = tmp_path / kind
    if kind.endswith(".tar.gz"):
        with tarfile.open(archive, "w:gz") as tf:
            info = tarfile.TarInfo("topology.yaml")
            info.size = len(PROCESS_YAML)
            tf.addfile(info, io.BytesIO(PROCESS_YAML.encode()))
    else:
        archive.write_bytes(zip_bytes({"topology.yaml": PROCESS_YAML.encode(),
                                       "lib/x.bin": os.urandom(2 * MB)}))
    with _bundle(archive) as (source, size):
        assert (source, size) == (archive, archive.stat().st_size)
    server, handler = upload_server()
    location, sent = upload(server, archive)
    assert handler.transfers.take_upload(location).read_bytes() == archive.read_bytes()
    assert handler.chunk_calls == 0 and sum(sent) == archive.stat().st_size


def test_a_nimbus_without_upload_streams_gets_the_same_bytes_in_chunks(upload_server, tmp_path):
    make_directory(tmp_path / "src")
    server, handler = upload_server(streams=False)
    location, sent = upload(server, tmp_path / "src")
    pack_directory_file(tmp_path / "src", tmp_path / "expected.tar")
    assert handler.transfers.take_upload(location).read_bytes() == \
        (tmp_path / "expected.tar").read_bytes()
    assert handler.chunk_calls == len(sent) > 1
    assert sum(sent) == packed_size(tmp_path / "src")


def test_an_upload_over_the_size_limit_is_refused_and_leaves_nothing(upload_server):
    server, handler = upload_server(max_bytes=MB)
    # Zeros read as an empty tar: only the size limit can refuse them.
    with pytest.raises(TransferRefusedError, match="larger than nimbus.max.topology.bytes"):
        upload(server, bytes(3 * MB))
    assert handler.transfers.uploads_in_progress() == 0
    assert list(handler.transfers.inbox.iterdir()) == []


def hostile_tar_start() -> bytes:
    """A tar whose first entry leaves its directory, cut after that entry's header."""
    info = tarfile.TarInfo("../evil.sh")
    info.size = 64 * MB
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def raw_stream(port: int, location: str) -> socket.socket:
    """A connection that has asked for upload ``location`` and been told to send."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    encoded = location.encode()
    sock.sendall(code_stream.UPLOAD_MAGIC + struct.pack("!H", len(encoded)) + encoded)
    assert sock.recv(1) == bytes([code_stream.OK])
    return sock


def read_refusal(sock: socket.socket) -> str:
    assert sock.recv(1) == bytes([code_stream.REFUSED])
    (length,) = struct.unpack("!H", sock.recv(2))
    return sock.recv(length).decode()


def test_an_unsafe_tar_is_refused_while_it_arrives(upload_server):
    """The check runs as the bytes land: the refusal comes while the client is still
    sending, never having sent the end frame."""
    server, handler = upload_server()
    with connect(f"127.0.0.1:{server.port}") as thrift:
        location = thrift.beginFileUpload()
    with raw_stream(server.port, location) as sock:
        sock.sendall(struct.pack("!Q", len(hostile_tar_start())) + hostile_tar_start())
        deadline = time.monotonic() + WAIT_S
        while not select.select([sock], [], [], 0.05)[0]:
            assert time.monotonic() < deadline, "no refusal while the upload went on"
            block = bytes(64 * 1024)
            sock.sendall(struct.pack("!Q", len(block)) + block)
        assert "'../evil.sh' leaves its directory" in read_refusal(sock)
    wait_for(lambda: handler.transfers.uploads_in_progress() == 0, WAIT_S, "the session to go")
    assert list(handler.transfers.inbox.iterdir()) == []


def test_an_unsafe_bundle_is_refused_through_the_client(upload_server, tmp_path):
    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as tf:
        for name in ("topology.yaml", "../../etc/cron.d/x"):
            info = tarfile.TarInfo(name)
            info.size = 4
            tf.addfile(info, io.BytesIO(b"boom"))
    server, handler = upload_server()
    with pytest.raises(TransferRefusedError, match="leaves its directory"):
        upload(server, evil)
    assert handler.transfers.uploads_in_progress() == 0
    assert list(handler.transfers.inbox.iterdir()) == []


def test_over_tls_the_upload_stream_carries_the_bundle(upload_server, tmp_path):
    ca = CertificateAuthority(tmp_path / "ca")
    server, handler = upload_server(tls=server_context(load_config(
        overrides=ca.issue("nimbus-1").conf())))
    make_directory(tmp_path / "src")
    location, _sent = upload(server, tmp_path / "src", ca.issue("submitter").conf())
    pack_directory_file(tmp_path / "src", tmp_path / "expected.tar")
    assert handler.transfers.take_upload(location).read_bytes() == \
        (tmp_path / "expected.tar").read_bytes()
    assert handler.chunk_calls == 0


# -- against a real nimbus and ZooKeeper -----------------------------------------------------
@pytest.fixture
def nimbus(zk_server, zk_root, tmp_path, make_zk):
    """(daemon, storm.yaml path, a ZooKeeper session of the test's) with one leading nimbus."""
    host, _, zk_port = zk_server.hosts.rpartition(":")
    port = free_port()
    conf_file = tmp_path / "storm.yaml"
    conf_file.write_text(yaml.safe_dump({
        "storm.zookeeper.servers": [host], "storm.zookeeper.port": int(zk_port),
        "storm.zookeeper.root": zk_root, "storm.zookeeper.session.timeout": 4000,
        "nimbus.thrift.port": port, "nimbus.seeds": [f"127.0.0.1:{port}"],
        "storm.local.dir": str(tmp_path / "local")}))
    daemon = NimbusDaemon(load_config(str(conf_file)))
    daemon.start()
    try:
        wait_for(daemon.master.elector.is_leader, 30, "the nimbus to lead")
        yield daemon, conf_file, make_zk()
    finally:
        daemon.stop()


def assert_nothing_left(daemon: NimbusDaemon, zk, zk_root: str) -> None:
    wait_for(lambda: daemon.transfers.uploads_in_progress() == 0
             and not any(daemon.transfers.inbox.iterdir()), WAIT_S,
             "the upload's session and file to go")
    assert zk.get_children(f"{zk_root}/code-distributor") == []
    assert zk.get_children(f"{zk_root}/storms") == []
    assert [p for p in daemon.master.store.root.iterdir() if p.is_dir()] == []


def test_a_stream_cut_off_halfway_leaves_nothing_behind(nimbus, zk_root, tmp_path):
    daemon, _conf_file, zk = nimbus
    make_directory(tmp_path / "src")
    packed = tmp_path / "bundle.tar"
    size = pack_directory_file(tmp_path / "src", packed)
    with connect(f"127.0.0.1:{daemon.conf['nimbus.thrift.port']}") as thrift:
        location = thrift.beginFileUpload()
    with raw_stream(daemon.conf["nimbus.thrift.port"], location) as sock:
        sock.sendall(struct.pack("!Q", size) + packed.read_bytes()[:size // 2])
        staged = Path(location)
        wait_for(lambda: staged.exists() and staged.stat().st_size > 0, WAIT_S,
                 "the first half to land")
    # The client is gone without its end frame: what it sent is deleted, the session
    # forgotten, and no topology or code node was ever made.
    assert_nothing_left(daemon, zk, zk_root)


def test_a_client_that_fails_while_packing_leaves_nothing_behind(nimbus, zk_root, tmp_path):
    daemon, _conf_file, zk = nimbus
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "topology.yaml").write_text(PROCESS_YAML)
    (tmp_path / "src" / "big.bin").write_bytes(os.urandom(8 * MB))

    class ShrinkingSlice:
        """Packs the directory but truncates big.bin once its slice is about to be sent."""

        def __iter__(self):
            for piece in directory_pieces(tmp_path / "src"):
                if isinstance(piece, FileSlice):
                    os.truncate(tmp_path / "src" / "big.bin", 3 * MB)
                yield piece

    client = NimbusClient(daemon.conf)
    with connect(f"127.0.0.1:{daemon.conf['nimbus.thrift.port']}") as thrift, \
            pytest.raises(ChangedWhilePackedError, match="big.bin shrank while it was sent"):
        location = thrift.beginFileUpload()
        with socket.create_connection(("127.0.0.1", daemon.conf["nimbus.thrift.port"]),
                                      timeout=WAIT_S) as sock:
            code_stream.send_upload(sock, location, ShrinkingSlice())
    assert client.cluster_info().topologies == []
    assert_nothing_left(daemon, zk, zk_root)


def test_the_cli_submits_a_directory_and_an_archive_as_they_are(nimbus, tmp_path):
    daemon, conf_file, _zk = nimbus
    make_directory(tmp_path / "src")
    archive = tmp_path / "storm.jar"
    archive.write_bytes(zip_bytes({"topology.yaml": PROCESS_YAML.encode(),
                                   "lib/x.bin": os.urandom(MB)}))
    pack_directory_file(tmp_path / "src", tmp_path / "expected.tar")
    for name, path, expected in (("from-dir", tmp_path / "src", tmp_path / "expected.tar"),
                                 ("from-jar", archive, archive)):
        done = CliRunner().invoke(main, ["submit", name, str(path), "--config", str(conf_file)])
        assert done.exit_code == 0, done.output
        topology_id = done.output.strip().splitlines()[-1]
        stored = daemon.master.store.path(topology_id) / "stormjar.jar"
        assert stored.read_bytes() == expected.read_bytes()
    assert daemon.transfers.uploads_in_progress() == 0
    assert list(daemon.transfers.inbox.iterdir()) == []
