"""nimbus-ha-s3 against a real SeaweedFS S3 server on 127.0.0.1 (credentials enforced)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from nimbus_ha_s3.distributor import PREFIX, S3CodeDistributor, S3CodeError
from nimbus_ha_s3.seaweed import SeaweedS3Server

from nimbus.dev.zookeeper import free_port
from nimbus.distribution.distributors import (
    CodeDistributor,
    DistributorError,
    resolve_distributor_class,
)
from nimbus.distribution.hookspecs import DistributorContext
from nimbus.testing.conformance import (
    STORE,
    ConformanceHost,
    write_code,
)
from nimbus.testing.kit import DistributorKit

BUCKET = "topologies"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = SeaweedS3Server(tmp_path_factory.mktemp("seaweed")).start()
    server.create_bucket(BUCKET)
    yield server
    server.stop()


def s3_conf(server: SeaweedS3Server, **overrides) -> dict:
    return {PREFIX + "endpoint": server.endpoint_url, PREFIX + "bucket": BUCKET,
            PREFIX + "access.key": server.access_key, PREFIX + "secret.key": server.secret_key,
            PREFIX + "prefix": f"test-{uuid.uuid4().hex[:8]}", PREFIX + "replication.count": 2,
            PREFIX + "multipart.chunk.mb": 5, **overrides}


def make_distributor(conf: dict, root: Path) -> CodeDistributor:
    distributor = CodeDistributor(S3CodeDistributor)
    distributor.prepare(conf, DistributorContext(
        zk=None, zk_root="/storm", address="127.0.0.1:0", local_dir=root / "meta",
        code_dir=root / "code"))
    return distributor


@pytest.fixture
def hosts(s3, tmp_path):
    conf = s3_conf(s3)
    made = []

    def make(n: int) -> list[ConformanceHost]:
        group = []
        for _ in range(n):
            root = tmp_path / f"host-{len(made)}"
            distributor = make_distributor(conf, root)
            made.append(distributor)
            group.append(ConformanceHost(distributor, root / "code", conf))
        return group

    yield make
    for distributor in made:
        distributor.close({})


class TestS3Conformance(DistributorKit):
    distributor = "s3"
    replication_model = STORE
    store_replication = 2  # replication.count in s3_conf
    # Past two 5 MiB parts (multipart.chunk.mb in s3_conf): uploads and ranged GETs go
    # through the multi-part path.
    bundle_bytes = 12 * 1024 * 1024 + 17
    store_setting = PREFIX + "endpoint"

    @pytest.fixture
    def server(self, request, tmp_path):
        """The module's server; the test that stops the store gets one of its own, so
        that stopping it leaves the module's to the other tests."""
        if "stop_store" not in request.fixturenames:
            return request.getfixturevalue("s3")
        own = SeaweedS3Server(tmp_path / "seaweed").start()
        request.addfinalizer(own.stop)
        own.create_bucket(BUCKET)
        return own

    @pytest.fixture
    def stop_store(self, server):
        return server.stop   # terminates weed: the endpoint refuses connections

    @pytest.fixture
    def other_store(self, s3) -> dict:
        return s3_conf(s3)   # the same server, another prefix: another store

    @pytest.fixture
    def bad_settings(self, s3) -> list:
        return [(s3_conf(s3, **{PREFIX + "bucket": ""}), PREFIX + "bucket")]

    @pytest.fixture
    def settings(self, server) -> dict:
        self._server = server
        return s3_conf(server)

    def corrupt(self, host: ConformanceHost, topology_id: str) -> None:
        fs = self._server.filesystem()
        key = f"{BUCKET}/{host.conf[PREFIX + 'prefix']}/{topology_id}/stormjar.jar"
        data = bytearray(fs.cat_file(key))
        data[len(data) // 2] ^= 0xFF
        fs.pipe_file(key, bytes(data))


def test_selected_by_entry_point_name():
    assert resolve_distributor_class("s3") is S3CodeDistributor


@pytest.mark.parametrize("change, message", [
    ({PREFIX + "endpoint": "http://127.0.0.1:{port}"}, "cannot reach"),
    ({PREFIX + "bucket": "no-such-bucket"}, "bucket 'no-such-bucket' does not exist"),
    ({PREFIX + "secret.key": "wrong-secret"}, "credentials refused"),
    ({PREFIX + "bucket": ""}, "set nimbus.codedistributor.s3.bucket"),
])
def test_bad_settings_fail_at_prepare_with_a_clear_error(s3, tmp_path, change, message):
    change = {k: v.format(port=free_port()) if isinstance(v, str) else v
              for k, v in change.items()}
    with pytest.raises(DistributorError, match=message):
        make_distributor(s3_conf(s3, **change), tmp_path)


def test_large_files_go_multipart(s3, tmp_path):
    conf = s3_conf(s3)
    distributor = make_distributor(conf, tmp_path)
    code = tmp_path / "code" / "big-1-1"
    code.mkdir(parents=True)
    (code / "stormjar.jar").write_bytes(b"x" * (12 * 1024 * 1024))
    distributor.upload(code, "big-1-1")
    info = s3.filesystem().info(f"{BUCKET}/{conf[PREFIX + 'prefix']}/big-1-1/stormjar.jar")
    assert info["size"] == 12 * 1024 * 1024
    assert "-" in info["ETag"], f"expected a multipart ETag, got {info['ETag']}"


def test_tampered_manifest_is_refused(s3, tmp_path):
    conf = s3_conf(s3)
    source, target = make_distributor(conf, tmp_path / "a"), make_distributor(conf, tmp_path / "b")
    code = tmp_path / "a" / "code" / "t-1-1"
    write_code(code, big_bytes=1000)
    meta = json.loads(source.upload(code, "t-1-1").read_text())
    meta["files"][0]["sha256"] = "0" * 64
    forged = tmp_path / "forged.meta"
    forged.write_text(json.dumps(meta))
    dest = tmp_path / "b" / "code" / "t-1-1"
    with pytest.raises(S3CodeError, match="does not match its manifest"):
        target.download(dest, "t-1-1", forged)
    assert not dest.exists()
    meta["files"][0]["path"] = "../../escape"
    forged.write_text(json.dumps(meta))
    with pytest.raises(S3CodeError, match="leaves its directory"):
        target.download(dest, "t-1-1", forged)
    assert not dest.exists() and not (tmp_path / "b" / "escape").exists()


def test_download_cut_off_half_way_leaves_nothing(tmp_path, monkeypatch):
    """Stop the store in the middle of a download: an error, and no partial copy."""
    import nimbus.distribution.manifest_store as store_module

    server = SeaweedS3Server(tmp_path / "seaweed").start()
    try:
        server.create_bucket(BUCKET)
        conf = s3_conf(server, **{PREFIX + "connect.timeout.secs": 2})
        source = make_distributor(conf, tmp_path / "a")
        target = make_distributor(conf, tmp_path / "b")
        code = tmp_path / "a" / "code" / "t-1-1"
        code.mkdir(parents=True)
        (code / "stormjar.jar").write_bytes(b"y" * (48 * 1024 * 1024))
        metafile = source.upload(code, "t-1-1")

        class CutOff(store_module.TransferMeter):
            """Stops the real server once 8 MB have arrived: deterministic, no race."""

            def advance(self, nbytes: int) -> None:
                super().advance(nbytes)
                if self.done >= 8 * 1024 * 1024 and server.process is not None:
                    server.stop()

        monkeypatch.setattr(store_module, "TransferMeter", CutOff)
        dest = tmp_path / "b" / "code" / "t-1-1"
        with pytest.raises(S3CodeError, match="download of t-1-1"):
            target.download(dest, "t-1-1", metafile)
        assert not dest.exists()
        assert not list(dest.parent.glob(".incoming-*"))
    finally:
        server.stop()


# -- the concurrent data path (nimbus_ha_s3.transfer) ---------------------------------------
MiB = 1024 * 1024
PART_MB = 5  # s3_conf's multipart.chunk.mb, S3's smallest part


def _bundle(root: Path, topology_id: str, files: dict[str, bytes]) -> Path:
    code = root / "code" / topology_id
    for rel, data in files.items():
        (code / rel).parent.mkdir(parents=True, exist_ok=True)
        (code / rel).write_bytes(data)
    return code


def _object_key(conf: dict, topology_id: str, rel: str) -> str:
    return f"{BUCKET}/{conf[PREFIX + 'prefix']}/{topology_id}/{rel}"


@pytest.mark.parametrize("concurrency", [1, 3])
def test_multi_part_bundle_round_trips_verified(s3, tmp_path, concurrency):
    """Sizes around the part boundary, parts and ranges in flight together: byte-exact."""
    import hashlib
    import os

    conf = s3_conf(s3, **{PREFIX + "transfer.concurrency": concurrency})
    source, target = make_distributor(conf, tmp_path / "a"), make_distributor(conf, tmp_path / "b")
    files = {"stormjar.jar": os.urandom(4 * PART_MB * MiB + 12345),   # 5 parts, short last
             "lib/exact.bin": os.urandom(PART_MB * MiB),              # one PutObject
             "lib/one-more.bin": os.urandom(PART_MB * MiB + 1),       # 2 parts, 1-byte last
             "empty.txt": b""}
    metafile = source.upload(_bundle(tmp_path / "a", "mp-1-1", files), "mp-1-1")
    manifest = {e["path"]: e for e in json.loads(metafile.read_text())["files"]}
    fs = s3.filesystem()
    for rel, data in files.items():
        assert manifest[rel]["size"] == len(data)
        assert manifest[rel]["sha256"] == hashlib.sha256(data).hexdigest()
        assert fs.cat_file(_object_key(conf, "mp-1-1", rel)) == data
    assert fs.info(_object_key(conf, "mp-1-1", "stormjar.jar"))["ETag"].endswith('-5"')
    dest = tmp_path / "b" / "code" / "mp-1-1"
    target.download(dest, "mp-1-1", metafile)
    for rel, data in files.items():
        assert (dest / rel).read_bytes() == data


def test_corrupted_part_is_detected(s3, tmp_path):
    """One flipped byte in the fourth of five ranges: refused, nothing left behind."""
    import os

    conf = s3_conf(s3, **{PREFIX + "transfer.concurrency": 3})
    source, target = make_distributor(conf, tmp_path / "a"), make_distributor(conf, tmp_path / "b")
    data = bytearray(os.urandom(4 * PART_MB * MiB + 999))
    metafile = source.upload(_bundle(tmp_path / "a", "bad-1-1", {"stormjar.jar": bytes(data)}),
                             "bad-1-1")
    data[3 * PART_MB * MiB + 77] ^= 0x01
    s3.filesystem().pipe_file(_object_key(conf, "bad-1-1", "stormjar.jar"), bytes(data))
    dest = tmp_path / "b" / "code" / "bad-1-1"
    with pytest.raises(S3CodeError, match="does not match its manifest"):
        target.download(dest, "bad-1-1", metafile)
    assert not dest.exists() and not list(dest.parent.glob(".incoming-*"))


@pytest.mark.parametrize("change", [-1, +1])
def test_object_of_another_size_is_refused(s3, tmp_path, change):
    """A stored object a byte shorter or longer than its manifest says: refused."""
    import os

    conf = s3_conf(s3, **{PREFIX + "transfer.concurrency": 2})
    source, target = make_distributor(conf, tmp_path / "a"), make_distributor(conf, tmp_path / "b")
    data = os.urandom(2 * PART_MB * MiB + 10)
    metafile = source.upload(_bundle(tmp_path / "a", "size-1-1", {"stormjar.jar": data}),
                             "size-1-1")
    stored = data[:change] if change < 0 else data + b"!"
    s3.filesystem().pipe_file(_object_key(conf, "size-1-1", "stormjar.jar"), stored)
    dest = tmp_path / "b" / "code" / "size-1-1"
    with pytest.raises(S3CodeError, match="does not match its manifest"):
        target.download(dest, "size-1-1", metafile)
    assert not dest.exists()


def test_parts_and_ranges_in_flight_never_exceed_the_concurrency(s3, tmp_path, monkeypatch):
    """Memory is bounded by transfer.concurrency × part size: count the calls in flight."""
    import os
    import threading

    import nimbus_ha_s3.transfer as transfer
    import s3fs

    conf = s3_conf(s3, **{PREFIX + "transfer.concurrency": 2})
    source, target = make_distributor(conf, tmp_path / "a"), make_distributor(conf, tmp_path / "b")
    lock = threading.Lock()
    counts = {"now": 0, "most": 0, "calls": 0}

    def counted(function):
        def wrapper(*args, **kwargs):
            with lock:
                counts["now"] += 1
                counts["calls"] += 1
                counts["most"] = max(counts["most"], counts["now"])
            try:
                return function(*args, **kwargs)
            finally:
                with lock:
                    counts["now"] -= 1
        return wrapper

    real_sync = transfer.sync
    monkeypatch.setattr(transfer, "sync", counted(real_sync))  # one call per range
    real_call = s3fs.S3FileSystem.call_s3

    def call_s3(self, method, *args, **kwargs):
        if method == "upload_part":
            return counted(real_call)(self, method, *args, **kwargs)
        return real_call(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "call_s3", call_s3)
    data = os.urandom(6 * PART_MB * MiB + 5)
    metafile = source.upload(_bundle(tmp_path / "a", "cap-1-1", {"stormjar.jar": data}),
                             "cap-1-1")
    assert counts["calls"] == 7 and counts["most"] <= 2
    counts.update(most=0, calls=0)
    target.download(tmp_path / "b" / "code" / "cap-1-1", "cap-1-1", metafile)
    assert counts["calls"] == 7 and counts["most"] <= 2


def _pending_uploads(server: SeaweedS3Server, prefix: str) -> list[dict]:
    fs = server.filesystem()
    return fs.call_s3("list_multipart_uploads", Bucket=BUCKET,
                      Prefix=prefix).get("Uploads", [])


def test_failed_upload_aborts_its_multipart_upload(s3, tmp_path, monkeypatch):
    """The local file fails to read mid-way: an error, no manifest, no pending upload."""
    import os

    import nimbus_ha_s3.transfer as transfer

    conf = s3_conf(s3, **{PREFIX + "transfer.concurrency": 2})
    source = make_distributor(conf, tmp_path / "a")
    code = _bundle(tmp_path / "a", "abort-1-1", {"stormjar.jar": os.urandom(5 * PART_MB * MiB)})
    real_read, reads = transfer._read_full, []

    def failing_read(src, view):
        reads.append(len(view))
        if len(reads) == 3:
            raise OSError("disk read error (injected)")
        return real_read(src, view)

    monkeypatch.setattr(transfer, "_read_full", failing_read)
    with pytest.raises(S3CodeError, match="upload of abort-1-1.*injected"):
        source.upload(code, "abort-1-1")
    prefix = f"{conf[PREFIX + 'prefix']}/abort-1-1/"
    assert _pending_uploads(s3, prefix) == []
    assert not s3.filesystem().exists(_object_key(conf, "abort-1-1", ".manifest.json"))


@pytest.mark.parametrize("key, value", [("transfer.concurrency", 0),
                                        ("transfer.concurrency", "4"),
                                        ("multipart.chunk.mb", 4),
                                        ("read.timeout.secs", 0),
                                        ("max.attempts", 0)])
def test_bad_transfer_settings_fail_at_prepare_naming_the_setting(s3, tmp_path, key, value):
    with pytest.raises(DistributorError, match=f"{PREFIX}{key} must be an integer"):
        make_distributor(s3_conf(s3, **{PREFIX + key: value}), tmp_path)


def test_a_silent_endpoint_fails_within_the_timeouts(tmp_path):
    """A store that accepts connections but never answers (its process stopped with
    SIGSTOP): every request gives up after max.attempts × read.timeout.secs, and the
    error says which setting to check; nothing hangs on s3fs's or botocore's retries."""
    import os
    import signal
    import time

    from waiting import wait_for

    server = SeaweedS3Server(tmp_path / "seaweed").start()
    try:
        server.create_bucket(BUCKET)
        conf = s3_conf(server, **{PREFIX + "read.timeout.secs": 1, PREFIX + "max.attempts": 2})
        source = make_distributor(conf, tmp_path / "a")
        code = tmp_path / "a" / "code" / "t-1-1"
        write_code(code, big_bytes=1000)
        metafile = source.upload(code, "t-1-1")
        os.kill(server.process.pid, signal.SIGSTOP)
        stat = Path(f"/proc/{server.process.pid}/stat")
        wait_for(lambda: stat.read_text().rsplit(")", 1)[1].split()[0] == "T", 10,
                 "weed to stop")
        dest = tmp_path / "a" / "code" / "copy" / "t-1-1"
        dest.parent.mkdir()
        start = time.monotonic()
        with pytest.raises(S3CodeError, match=f"download of t-1-1.*check {PREFIX}endpoint"):
            source.download(dest, "t-1-1", metafile)
        # Two attempts of one second each, plus botocore's backoff (under a second):
        # without the bounds, botocore and s3fs would retry for minutes.
        assert time.monotonic() - start < 10
        assert list(dest.parent.iterdir()) == []
    finally:
        if server.process is not None:
            os.kill(server.process.pid, signal.SIGCONT)
        server.stop()
