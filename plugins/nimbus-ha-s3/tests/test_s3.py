"""nimbus-ha-s3 against a real SeaweedFS S3 server on 127.0.0.1 (credentials enforced)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from nimbus_ha_s3.distributor import PREFIX, S3CodeDistributor, S3CodeError
from nimbus_ha_s3.seaweed import SeaweedS3Server

from nimbus.distribution.distributors import (
    CodeDistributor,
    DistributorError,
    resolve_distributor_class,
)
from nimbus.distribution.hookspecs import DistributorContext
from nimbus.state.zkserver import free_port
from nimbus.testing.conformance import (
    STORE,
    ConformanceHost,
    DistributorConformance,
    _write_code,
)

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


class TestS3Conformance(DistributorConformance):
    replication_model = STORE
    store_replication = 2  # replication.count in s3_conf

    @pytest.fixture
    def tamper(self, s3):
        def corrupt(host: ConformanceHost, topology_id: str) -> None:
            fs = s3.filesystem()
            key = f"{BUCKET}/{host.conf[PREFIX + 'prefix']}/{topology_id}/stormjar.jar"
            data = bytearray(fs.cat_file(key))
            data[len(data) // 2] ^= 0xFF
            fs.pipe_file(key, bytes(data))

        return corrupt


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
    _write_code(code, big_bytes=1000)
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
