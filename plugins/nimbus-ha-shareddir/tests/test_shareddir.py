"""nimbus-ha-shareddir through the kit (a real ZooKeeper, simulated nimbus hosts), plus
what is particular to a shared directory: bad settings, a foreign share's metafile,
a bundle that appears only complete."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from nimbus_ha_shareddir.distributor import PREFIX, SharedDirCodeDistributor

from nimbus.distribution.distributors import DistributorError, MetafileError
from nimbus.testing.kit import STORE, ConformanceHost, DistributorKit, flip_byte


def unmount(share: Path) -> None:
    """What unmounting ``share`` leaves (no umount in a test, and chmod stops no root): its
    contents move away, and an empty mount point stays at the path."""
    share.rename(share.with_name(share.name + "-unmounted"))
    share.mkdir()


class TestSharedDir(DistributorKit):
    distributor = "shareddir"
    replication_model = STORE
    store_replication = 2
    store_setting = PREFIX + "path"

    @pytest.fixture
    def stop_store(self, settings: dict):
        return lambda: unmount(Path(settings[PREFIX + "path"]))

    @pytest.fixture
    def settings(self, tmp_path: Path) -> dict:
        share = tmp_path / "share"
        share.mkdir()
        return {PREFIX + "path": str(share), PREFIX + "replication.count": 2}

    def corrupt(self, host: ConformanceHost, topology_id: str) -> None:
        flip_byte(Path(host.conf[PREFIX + "path"]) / topology_id / "stormjar.jar")

    @pytest.fixture
    def other_store(self, tmp_path: Path) -> dict:
        other = tmp_path / "other-share"
        other.mkdir()
        return {PREFIX + "path": str(other), PREFIX + "replication.count": 2}

    @pytest.fixture
    def bad_settings(self, tmp_path: Path) -> list:
        return [({PREFIX + "path": ""}, PREFIX + "path"),
                ({PREFIX + "path": str(tmp_path / "not-mounted")}, PREFIX + "path"),
                ({PREFIX + "path": str(tmp_path), PREFIX + "replication.count": 0},
                 PREFIX + "replication.count")]


@pytest.fixture
def share(tmp_path: Path) -> Path:
    path = tmp_path / "share"
    path.mkdir()
    return path


@pytest.mark.parametrize("settings, message", [
    ({}, "code distributor 'shareddir' cannot start: set nimbus.codedistributor.shareddir.path "
         "to the directory shared by all nimbuses"),
    ({PREFIX + "path": "{missing}"},
     "code distributor 'shareddir' cannot start: nimbus.codedistributor.shareddir.path "
     "{missing} is not a directory (is the share mounted?)"),
    ({PREFIX + "path": "{share}", PREFIX + "replication.count": 0},
     "code distributor 'shareddir' cannot start: nimbus.codedistributor.shareddir."
     "replication.count must be at least 1"),
])
def test_bad_settings_fail_at_prepare(distributor_hosts, share, tmp_path, settings, message):
    places = {"missing": tmp_path / "not-mounted", "share": share}
    settings = {k: v.format(**places) if isinstance(v, str) else v for k, v in settings.items()}
    with pytest.raises(DistributorError) as err:
        distributor_hosts("shareddir", settings).make(1)
    assert str(err.value) == message.format(**places)


def test_a_metafile_of_another_share_is_refused(distributor_hosts, tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    [source] = distributor_hosts("shareddir", {PREFIX + "path": str(first)}).make(1)
    [other] = distributor_hosts("shareddir", {PREFIX + "path": str(second)}).make(1)
    code = source.code_dir / "t-1-1"
    code.mkdir()
    (code / "stormjar.jar").write_bytes(b"jar")
    metafile = source.distributor.upload(code, "t-1-1")
    with pytest.raises(MetafileError, match="written for another share"):
        other.distributor.download(other.code_dir / "t-1-1", "t-1-1", metafile)
    assert not (other.code_dir / "t-1-1").exists()


def test_the_bundle_is_renamed_into_place_complete(distributor_hosts, share):
    """Nothing but the finished bundle (and the store id) is left on the share, and its
    manifest lists every file with the sha256 the metafile holds."""
    [host] = distributor_hosts("shareddir", {PREFIX + "path": str(share)}).make(1)
    code = host.code_dir / "t-1-1"
    (code / "lib").mkdir(parents=True)
    (code / "stormjar.jar").write_bytes(b"x" * 5000)
    (code / "lib" / "dep.jar").write_bytes(b"")
    metafile = host.distributor.upload(code, "t-1-1")
    assert sorted(p.name for p in share.iterdir()) == [".store-id", "t-1-1"]
    manifest = json.loads((share / "t-1-1" / ".manifest.json").read_text())
    assert manifest == json.loads(metafile.read_text())
    assert [f["path"] for f in manifest["files"]] == ["lib/dep.jar", "stormjar.jar"]


def test_selected_by_entry_point_name():
    from nimbus.distribution.distributors import resolve_distributor_class

    assert resolve_distributor_class("shareddir") is SharedDirCodeDistributor


@pytest.mark.parametrize("change", ["gone", "another share"])
def test_a_share_gone_or_replaced_fails_naming_the_path(distributor_hosts, share, tmp_path,
                                                        change):
    """The directory itself is gone (renamed away, nothing left), or another share is
    mounted in its place: uploads and downloads fail naming the setting, and the code is
    not written under the path."""
    [source, target] = distributor_hosts("shareddir", {PREFIX + "path": str(share)}).make(2)
    code = source.code_dir / "t-1-1"
    code.mkdir()
    (code / "stormjar.jar").write_bytes(b"jar")
    metafile = source.distributor.upload(code, "t-1-1")
    share.rename(tmp_path / "moved")
    if change == "another share":
        share.mkdir()
        (share / ".store-id").write_text("0" * 32 + "\n")
    other = source.code_dir / "u-1-1"
    other.mkdir()
    (other / "stormjar.jar").write_bytes(b"jar")
    with pytest.raises(DistributorError, match=f"upload of u-1-1: .*{PREFIX}path"):
        source.distributor.upload(other, "u-1-1")
    with pytest.raises(DistributorError, match=f"download of t-1-1: .*{PREFIX}path"):
        target.distributor.download(target.code_dir / "t-1-1", "t-1-1", metafile)
    assert list(target.code_dir.iterdir()) == []
    if change == "gone":
        assert not share.exists()   # not created again by the upload
    else:
        assert sorted(p.name for p in share.iterdir()) == [".store-id"]  # nothing written
    assert target.distributor.get_replication_count("t-1-1") == 0


def test_nimbuses_starting_at_once_agree_on_the_share_id(tmp_path):
    """Several nimbuses prepare the same empty share at the same moment: every one
    reads the winner's whole id (none takes a half-written, empty one), and no
    temporary file is left behind."""
    import threading

    def prepare(share: Path, start: threading.Barrier, ids: list[str]) -> None:
        plugin = SharedDirCodeDistributor()
        plugin.root, plugin.fsync = share, False
        start.wait()
        ids.append(plugin._store_id())

    for attempt in range(20):
        share = tmp_path / f"share-{attempt}"
        share.mkdir()
        ids: list[str] = []
        start = threading.Barrier(6)
        threads = [threading.Thread(target=prepare, args=(share, start, ids),
                                    name=f"prepare-{n}") for n in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert len(ids) == 6 and len(set(ids)) == 1 and len(ids[0]) == 32, ids
        assert [p.name for p in share.iterdir()] == [".store-id"]


def test_an_empty_share_id_is_refused_with_a_clear_error(tmp_path):
    (tmp_path / ".store-id").write_text("")
    plugin = SharedDirCodeDistributor()
    plugin.root, plugin.fsync = tmp_path, False
    with pytest.raises(DistributorError, match=r"\.store-id is empty"):
        plugin._store_id()
