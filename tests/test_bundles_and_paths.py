"""Bad bundles and paths are refused before anything is written."""

import io
import os
import tarfile
import zipfile

import pytest

from nimbus.distribution.archive import BundleError, check_bundle, pack_directory
from nimbus.distribution.local_code import LocalCodeStore, UnsafePathError, atomic_dir, safe_join


def tar_with(tmp_path, member: tarfile.TarInfo, data: bytes = b"x"):
    path = tmp_path / "bad.tgz"
    with tarfile.open(path, "w:gz") as tf:
        member.size = len(data) if member.isfile() else 0
        tf.addfile(member, io.BytesIO(data) if member.isfile() else None)
    return path


@pytest.mark.parametrize("name", ["../evil.py", "/etc/passwd", "a/../../b"])
def test_tar_entries_that_leave_are_refused(tmp_path, name):
    with pytest.raises(BundleError, match="absolute|leaves"):
        check_bundle(tar_with(tmp_path, tarfile.TarInfo(name)), 1 << 20)


def test_tar_symlink_refused(tmp_path):
    link = tarfile.TarInfo("link")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    with pytest.raises(BundleError, match="is a link"):
        check_bundle(tar_with(tmp_path, link), 1 << 20)


def test_zip_entries_that_leave_are_refused(tmp_path):
    path = tmp_path / "bad.jar"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("../../escape.class", b"x")
    with pytest.raises(BundleError, match="leaves its directory"):
        check_bundle(path, 1 << 20)


def test_damaged_compressed_archive(tmp_path):
    path = tmp_path / "cut.tgz"
    with tarfile.open(path, "w:gz") as tf:
        info = tarfile.TarInfo("big")
        info.size = 100_000
        tf.addfile(info, io.BytesIO(os.urandom(100_000)))
    path.write_bytes(path.read_bytes()[:5000])  # a truncated download
    with pytest.raises(BundleError, match="damaged|not a zip or tar"):
        check_bundle(path, 1 << 20)


def test_not_an_archive(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("just text")
    with pytest.raises(BundleError, match="not a zip or tar archive"):
        check_bundle(path, 1 << 20)


def test_size_limit(tmp_path):
    path = tmp_path / "ok.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("big", b"0" * 1000)
    assert check_bundle(path, 1000) == 1000
    with pytest.raises(BundleError, match="more than 999 bytes"):
        check_bundle(path, 999)


def test_pack_directory_round_trips_and_refuses_symlinks(tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text("print(1)")
    data = pack_directory(src)
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        assert tf.getnames() == ["pkg/a.py"]
    os.symlink("/etc/passwd", src / "pkg" / "link")
    with pytest.raises(UnsafePathError, match="symlink"):
        pack_directory(src)


@pytest.mark.parametrize("rel", ["../x", "/abs", "a/../../x", ""])
def test_safe_join_refuses(tmp_path, rel):
    with pytest.raises(UnsafePathError):
        safe_join(tmp_path, rel)


def test_safe_join_refuses_symlinked_component(tmp_path):
    (tmp_path / "out").mkdir()
    os.symlink(tmp_path / "out", tmp_path / "in")
    with pytest.raises(UnsafePathError, match="symlink"):
        safe_join(tmp_path, "in/file")


def test_atomic_dir_leaves_nothing_on_failure(tmp_path):
    dest = tmp_path / "code" / "t-1-1"
    with pytest.raises(RuntimeError), atomic_dir(dest) as tmp:
        (tmp / "half").write_text("partial")
        raise RuntimeError("interrupted")
    assert not dest.exists()
    assert list((tmp_path / "code").iterdir()) == []


def test_served_files_stay_inside_the_code_dir(tmp_path):
    store = LocalCodeStore(tmp_path)
    (store.root / "t-1-1").mkdir()
    (store.root / "t-1-1" / "stormjar.jar").write_bytes(b"jar")
    assert store.resolve_served_file("t-1-1/stormjar.jar").read_bytes() == b"jar"
    assert store.resolve_served_file(str(store.root / "t-1-1" / "stormjar.jar"))
    # An assignment's master_code_dir names the leader's path: served from this store.
    assert store.resolve_served_file(
        "/var/elsewhere/nimbus/stormdist/t-1-1/stormjar.jar").read_bytes() == b"jar"
    for bad in ("../../etc/passwd", "/etc/passwd", "t-1-1/../../x", "nosuch-1-1/f",
                "/x/nimbus/stormdist/t-1-1/../../../etc/passwd"):
        with pytest.raises((UnsafePathError, FileNotFoundError)):
            store.resolve_served_file(bad)


def test_topology_ids_are_checked(tmp_path):
    store = LocalCodeStore(tmp_path)
    for bad in ("..", "../x-1-1", "a/b-1-1", ""):
        with pytest.raises(UnsafePathError):
            store.path(bad)
