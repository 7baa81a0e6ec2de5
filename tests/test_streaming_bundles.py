"""Bundles are streamed, never held whole in memory; transfer sessions do not block each other.

Memory use itself is measured by benchmarks/bench_bundle_memory.py; here the packer is
shown to hand its output over in small blocks, a packed directory to travel through the
chunked upload into an archive the nimbus accepts, and file-transfer sessions to do their
disk I/O in parallel.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
import threading
from pathlib import Path

import pytest

from nimbus.config import load_config
from nimbus.distribution import file_transfer
from nimbus.distribution.archive import (
    PACK_BLOCK,
    check_bundle,
    pack_directory,
    pack_directory_file,
    pack_directory_to,
)
from nimbus.distribution.file_transfer import FileTransfers, TransferError
from nimbus.distribution.local_code import LocalCodeStore, UnsafePathError
from nimbus.thrift.client import CHUNK_BYTES, NimbusClient, connect
from nimbus.thrift.server import ThriftServer

WAIT_S = 10.0


def make_tree(root: Path, big_bytes: int = 6 * 1024 * 1024) -> dict[str, str]:
    """A bundle directory: one large incompressible file and a few small ones."""
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("print(1)\n")
    (root / "pkg" / "sub" / "empty.txt").write_bytes(b"")
    with open(root / "data.bin", "wb") as fh:
        for _ in range(big_bytes // (1 << 20)):
            fh.write(os.urandom(1 << 20))
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*") if p.is_file()}


def archive_digests(path: Path) -> dict[str, str]:
    with tarfile.open(path) as tf:
        return {m.name: hashlib.sha256(tf.extractfile(m).read()).hexdigest()
                for m in tf if m.isfile()}


class RecordingSink:
    """A write-only, unseekable file-like that keeps only a hash and the largest write."""

    def __init__(self) -> None:
        self.largest = 0
        self.total = 0
        self.digest = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.largest = max(self.largest, len(data))
        self.total += len(data)
        self.digest.update(data)
        return len(data)

    def flush(self) -> None:
        pass


# -- packing ------------------------------------------------------------------------------
def test_packer_hands_over_small_blocks_only(tmp_path):
    expected = make_tree(tmp_path / "src", big_bytes=8 * 1024 * 1024)
    sink = RecordingSink()
    pack_directory_to(tmp_path / "src", sink)
    assert sink.total > 8 * 1024 * 1024  # random data: the archive is as large as the input
    # Every write is one stream record; the last adds what the compressor still held.
    assert sink.largest <= PACK_BLOCK + 64 * 1024, sink.largest
    assert sink.largest < sink.total // 64
    # The in-memory helper (small bundles of tests and the demo) packs the same archive.
    in_memory = tmp_path / "in-memory.tgz"
    in_memory.write_bytes(pack_directory(tmp_path / "src"))
    assert archive_digests(in_memory) == expected


def test_packed_file_round_trips_and_passes_check_bundle(tmp_path):
    expected = make_tree(tmp_path / "src")
    packed = tmp_path / "bundle.tgz"
    size = pack_directory_file(tmp_path / "src", packed)
    assert size == packed.stat().st_size
    assert archive_digests(packed) == expected
    assert check_bundle(packed, 1 << 30) == 6 * 1024 * 1024 + len("print(1)\n")


def test_packing_refuses_symlinks(tmp_path):
    make_tree(tmp_path / "src", big_bytes=1 << 20)
    os.symlink("/etc/passwd", tmp_path / "src" / "pkg" / "link")
    with pytest.raises(UnsafePathError, match="symlink"):
        pack_directory_file(tmp_path / "src", tmp_path / "x.tgz")


def test_cli_sends_a_directory_as_it_is_packed_and_writes_nothing(tmp_path):
    """Issue 21: the directory is the upload's source, packed while it is sent (a stored
    tar of the size given); no packed copy is written first."""
    from nimbus.cli import _bundle
    from nimbus.distribution.archive import pack_directory_file

    make_tree(tmp_path / "src", big_bytes=1 << 20)
    before = sorted(p.name for p in tmp_path.iterdir())
    with _bundle(tmp_path / "src") as (path, size):
        assert path == tmp_path / "src"
        assert size == pack_directory_file(tmp_path / "src", tmp_path / "packed.tar")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*before, "packed.tar"])


# -- upload through the Thrift API --------------------------------------------------------
class UploadServer:
    """The upload half of the Nimbus service, over a real FileTransfers."""

    def __init__(self, transfers: FileTransfers):
        self.transfers = transfers

    def beginFileUpload(self) -> str:
        return self.transfers.begin_upload()

    def uploadChunk(self, location: str, chunk: bytes) -> None:
        self.transfers.upload_chunk(location, chunk)

    def finishFileUpload(self, location: str) -> None:
        self.transfers.finish_upload(location)


def test_streamed_upload_of_a_packed_directory_is_accepted(tmp_path):
    expected = make_tree(tmp_path / "src")
    packed = tmp_path / "bundle.tgz"
    size = pack_directory_file(tmp_path / "src", packed)
    transfers = FileTransfers(tmp_path / "nimbus", LocalCodeStore(tmp_path / "code"), 1 << 30)
    server = ThriftServer(UploadServer(transfers), "127.0.0.1", 0)
    server.start()
    try:
        client = NimbusClient(load_config(overrides={
            "nimbus.seeds": [f"127.0.0.1:{server.port}"]}))
        sent = []
        with connect(f"127.0.0.1:{server.port}") as thrift:
            location = client.upload_bundle(packed, sent.append, thrift)
    finally:
        server.stop()
    assert sum(sent) == size and max(sent) <= CHUNK_BYTES and len(sent) > 1
    uploaded = transfers.take_upload(location)
    transfers.close()
    # What lifecycle.submit checks before it accepts a bundle:
    assert check_bundle(uploaded, 1 << 30) > 0
    assert archive_digests(uploaded) == expected


# -- per-session locking ------------------------------------------------------------------
class GatedFile:
    """Wraps a real file; I/O blocks on ``gate`` once ``armed`` (set by the test)."""

    def __init__(self, inner, gate: threading.Event, entered: threading.Event):
        self.inner = inner
        self.gate = gate
        self.entered = entered
        self.armed = False
        self.closed_while_blocked = False
        self._blocked = False

    def _hold(self) -> None:
        if self.armed:
            self._blocked = True
            self.entered.set()
            assert self.gate.wait(WAIT_S), "test gate never opened"
            self._blocked = False

    def write(self, data: bytes) -> int:
        self._hold()
        return self.inner.write(data)

    def read(self, n: int = -1) -> bytes:
        self._hold()
        return self.inner.read(n)

    def close(self) -> None:
        if self._blocked:
            self.closed_while_blocked = True
        self.inner.close()


@pytest.fixture
def gated(monkeypatch, tmp_path):
    """FileTransfers whose files are GatedFiles; yields (transfers, files, gate, entered)."""
    gate, entered = threading.Event(), threading.Event()
    files: list[GatedFile] = []

    def gated_open(path, mode="r", *args, **kwargs):
        wrapper = GatedFile(open(path, mode, *args, **kwargs), gate, entered)
        files.append(wrapper)
        return wrapper

    monkeypatch.setattr(file_transfer, "open", gated_open, raising=False)
    store = LocalCodeStore(tmp_path / "code")
    transfers = FileTransfers(tmp_path / "nimbus", store, 1 << 30)
    try:
        yield transfers, store, files, gate, entered
    finally:
        gate.set()  # never leave a thread blocked, even when an assertion failed
        transfers.close()


def in_thread(func, *args) -> tuple[threading.Thread, list]:
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(("ok", func(*args)))
        except BaseException as exc:  # reported by the test
            outcome.append(("error", exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_a_blocked_upload_write_does_not_block_another_upload(gated):
    transfers, _, files, gate, entered = gated
    slow, fast = transfers.begin_upload(), transfers.begin_upload()
    files[0].armed = True
    blocked, blocked_outcome = in_thread(transfers.upload_chunk, slow, b"s" * 1000)
    assert entered.wait(WAIT_S), "the slow write never started"

    other, outcome = in_thread(transfers.upload_chunk, fast, b"f" * 1000)
    other.join(WAIT_S)
    assert not other.is_alive(), "an upload waited for another session's disk write"
    assert outcome == [("ok", None)]
    transfers.finish_upload(fast)
    assert transfers.take_upload(fast).read_bytes() == b"f" * 1000
    assert blocked.is_alive()  # still inside its write

    gate.set()
    blocked.join(WAIT_S)
    assert blocked_outcome == [("ok", None)]
    transfers.finish_upload(slow)
    assert transfers.take_upload(slow).read_bytes() == b"s" * 1000


def test_a_blocked_download_read_does_not_block_another_download(gated, monkeypatch):
    transfers, store, files, gate, entered = gated
    code = store.path("t-1-1")
    code.mkdir(parents=True)
    (code / "stormjar.jar").write_bytes(b"j" * 3000)
    monkeypatch.setattr(file_transfer, "DOWNLOAD_CHUNK_BYTES", 1000)
    slow, fast = (transfers.begin_download("t-1-1/stormjar.jar") for _ in range(2))
    files[0].armed = True
    blocked, _ = in_thread(transfers.download_chunk, slow)
    assert entered.wait(WAIT_S)

    def download_all() -> bytes:
        return b"".join(iter(lambda: transfers.download_chunk(fast), b""))

    other, outcome = in_thread(download_all)
    other.join(WAIT_S)
    assert not other.is_alive(), "a download waited for another session's disk read"
    assert outcome == [("ok", b"j" * 3000)]
    gate.set()
    blocked.join(WAIT_S)
    assert not blocked.is_alive()


def test_expiry_spares_a_session_in_use(gated, monkeypatch):
    transfers, _, files, gate, entered = gated
    busy, idle = transfers.begin_upload(), transfers.begin_upload()
    files[0].armed = True
    blocked, blocked_outcome = in_thread(transfers.upload_chunk, busy, b"b" * 10)
    assert entered.wait(WAIT_S)

    monkeypatch.setattr(file_transfer, "IDLE_EXPIRY_S", -1.0)  # everything is overdue
    fresh = transfers.begin_upload()  # runs the expiry
    assert not files[0].closed_while_blocked
    assert files[1].inner.closed and not Path(idle).exists()  # the idle one went
    with pytest.raises(TransferError, match="no open upload"):
        transfers.upload_chunk(idle, b"late")

    gate.set()
    blocked.join(WAIT_S)
    assert blocked_outcome == [("ok", None)]
    transfers.finish_upload(busy)
    assert transfers.take_upload(busy).read_bytes() == b"b" * 10
    assert not files[0].closed_while_blocked
    assert fresh


def test_close_waits_for_the_last_user_of_a_session(gated):
    transfers, _, files, gate, entered = gated
    busy = transfers.begin_upload()
    files[0].armed = True
    blocked, blocked_outcome = in_thread(transfers.upload_chunk, busy, b"c")
    assert entered.wait(WAIT_S)
    transfers.close()  # returns at once; the busy file is left to its user
    assert not files[0].inner.closed
    gate.set()
    blocked.join(WAIT_S)
    assert blocked_outcome == [("ok", None)]
    assert files[0].inner.closed and not files[0].closed_while_blocked


def test_limits_still_hold(tmp_path, monkeypatch):
    monkeypatch.setattr(file_transfer, "MAX_UPLOADS", 2)
    transfers = FileTransfers(tmp_path / "nimbus", LocalCodeStore(tmp_path / "code"), 10)
    try:
        first, _ = transfers.begin_upload(), transfers.begin_upload()
        with pytest.raises(TransferError, match="too many uploads"):
            transfers.begin_upload()
        assert len(list(transfers.inbox.iterdir())) == 2  # the refused one left no file
        transfers.upload_chunk(first, b"x" * 10)
        with pytest.raises(TransferError, match="larger than"):
            transfers.upload_chunk(first, b"y")
        assert not Path(first).exists()
        with pytest.raises(TransferError, match="no open upload"):
            transfers.upload_chunk(first, b"y")
        transfers.begin_upload()  # the discarded upload freed its slot
    finally:
        transfers.close()
