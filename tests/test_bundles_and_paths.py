"""Bad bundles and paths are refused before anything is written: every kind of
hostile archive (names that leave, links, devices, fifos, bombs of size, entries and
headers) in every format, by check_bundle and by a supervisor unpacking it."""

import io
import os
import struct
import tarfile
import zipfile
from pathlib import Path

import pytest
from fuzzing import Entry, write_archive, write_tar_header_bomb

from nimbus.distribution.archive import (
    MAX_BUNDLE_ENTRIES,
    BundleError,
    check_bundle,
    pack_directory,
)
from nimbus.distribution.local_code import LocalCodeStore, UnsafePathError, atomic_dir, safe_join
from nimbus.supervisor.code_cache import CodeCache, CodeVerificationError


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


# -- every kind of hostile archive, refused by name; nothing unpacked anywhere --------------
def refused_everywhere(tmp_path, path, message: str, max_bytes: int = 1 << 20,
                       max_entries: int = MAX_BUNDLE_ENTRIES) -> None:
    """check_bundle refuses ``path`` with exactly ``message``, and a supervisor unpacking
    it (CodeCache._unpack, which checks first) refuses it too, writing nothing at all."""
    with pytest.raises(BundleError) as err:
        check_bundle(path, max_bytes, max_entries=max_entries)
    assert str(err.value) == message
    if max_entries != MAX_BUNDLE_ENTRIES:
        return  # the supervisor checks at the default limit
    code = tmp_path / "sandbox" / "code"
    code.mkdir(parents=True)
    with pytest.raises(CodeVerificationError) as err:
        CodeCache(code, max_bytes)._unpack("t-1-1", path, code / "t-1-1" / "resources")
    assert str(err.value) == f"t-1-1: unsafe bundle: {message}"
    assert list((tmp_path / "sandbox").rglob("*")) == [code]
    assert not (tmp_path / "escape-marker").exists()


def archive(tmp_path, fmt: str, *entries: Entry) -> Path:
    path = tmp_path / f"bad.{fmt}"
    write_archive(path, fmt, [Entry("topology.yaml", b"command: [true]\n"), *entries])
    return path


@pytest.mark.parametrize("fmt", ["tar", "tar.gz", "tar.bz2", "tar.xz", "zip"])
@pytest.mark.parametrize("name, problem", [
    ("../escape-marker", "leaves its directory"),
    ("pkg/../../escape-marker", "leaves its directory"),
    ("/tmp/escape-marker", "has an absolute path"),
    ("C:escape-marker", "has an absolute path"),
])
def test_names_that_leave_are_refused_in_every_format(tmp_path, fmt, name, problem):
    path = archive(tmp_path, fmt, Entry(name, b"evil"))
    refused_everywhere(tmp_path, path, f"bad.{fmt}: entry {name!r} {problem}")


@pytest.mark.parametrize("special, problem", [
    ("symlink", "is a link"), ("hardlink", "is a link"), ("chardev", "is not a file"),
    ("blockdev", "is not a file"), ("fifo", "is not a file")])
def test_tar_links_devices_and_fifos_are_refused(tmp_path, special, problem):
    path = archive(tmp_path, "tar.gz", Entry("special", special=special))
    refused_everywhere(tmp_path, path, f"bad.tar.gz: entry 'special' {problem}")


@pytest.mark.parametrize("special, problem", [
    ("symlink", "is a symlink"), ("chardev", "is not a file (mode 20000)"),
    ("blockdev", "is not a file (mode 60000)"), ("fifo", "is not a file (mode 10000)"),
    ("socket", "is not a file (mode 140000)")])
def test_zip_links_devices_and_fifos_are_refused(tmp_path, special, problem):
    path = archive(tmp_path, "zip", Entry("special", special=special))
    refused_everywhere(tmp_path, path, f"bad.zip: entry 'special' {problem}")


def test_names_longer_than_a_file_system_takes_are_refused(tmp_path):
    path = archive(tmp_path, "tar.gz", Entry("pkg/" + "x" * 256, b"x"))
    refused_everywhere(tmp_path, path, f"bad.tar.gz: entry {'pkg/' + 'x' * 56!r}... has a name "
                                       "longer than a file system takes (4096 bytes, 255 per "
                                       "component)")


@pytest.mark.parametrize("fmt", ["tar.gz", "zip"])
def test_a_compression_bomb_is_refused_at_its_declared_size(tmp_path, fmt):
    path = archive(tmp_path, fmt, Entry("zeros", bytes(4 << 20)))
    assert path.stat().st_size < (4 << 20) // 100  # over 100:1
    refused_everywhere(tmp_path, path, f"bad.{fmt}: unpacks to more than 1048576 bytes")


def test_a_zip_entry_that_inflates_beyond_its_declared_size_is_cut_and_refused(tmp_path):
    path = archive(tmp_path, "zip", Entry("zeros", bytes(4 << 20)))
    data = bytearray(path.read_bytes())
    # The file_size fields of its local header and of its central directory entry.
    for at in (data.find(b"zeros") - 30 + 22, data.rfind(b"zeros") - 46 + 24):
        assert struct.unpack_from("<L", data, at) == (4 << 20,)
        struct.pack_into("<L", data, at, 10)
    path.write_bytes(bytes(data))
    assert check_bundle(path, 1 << 20) == 16 + 10  # the declared sizes
    dest = tmp_path / "code" / "t-1-1" / "resources"
    dest.parent.mkdir(parents=True)
    with pytest.raises(CodeVerificationError) as err:
        CodeCache(tmp_path / "code", 1 << 20)._unpack("t-1-1", path, dest)
    assert str(err.value) == "t-1-1: cannot unpack its bundle: Bad CRC-32 for file 'zeros'"
    assert (dest / "zeros").stat().st_size <= 10


@pytest.mark.parametrize("fmt", ["tar", "tar.gz", "tar.bz2", "tar.xz"])
def test_a_long_name_header_bomb_is_refused_before_it_is_read(tmp_path, fmt):
    path = tmp_path / f"bad.{fmt}"
    write_tar_header_bomb(path, fmt, 64 << 20)  # 64 MiB of name
    refused_everywhere(tmp_path, path, f"bad.{fmt}: an entry header claims more than 1048576 "
                                       "bytes (a long name or pax header bomb?)")


@pytest.mark.parametrize("fmt", ["tar.gz", "zip"])
def test_entries_beyond_the_limit_are_refused(tmp_path, fmt):
    path = archive(tmp_path, fmt, *[Entry(f"f{i}") for i in range(64)])  # 65 in all
    assert check_bundle(path, 1 << 20, max_entries=65) == 16
    suffix = " (65 by its central directory)" if fmt == "zip" else ""
    refused_everywhere(tmp_path, path, f"bad.{fmt}: more than 64 entries{suffix}",
                       max_entries=64)


def test_a_zip_whose_end_record_understates_its_entries_is_counted_anyway(tmp_path):
    path = archive(tmp_path, "zip", *[Entry(f"f{i}") for i in range(64)])
    data = bytearray(path.read_bytes())
    struct.pack_into("<HH", data, data.rfind(b"PK\x05\x06") + 8, 1, 1)  # "1 entry"
    path.write_bytes(bytes(data))
    refused_everywhere(tmp_path, path, "bad.zip: more than 64 entries", max_entries=64)


def test_a_zip_claiming_a_million_entries_is_refused_before_zipfile_parses_it(tmp_path):
    """The central directory's count is read first: zipfile would otherwise build an object
    per entry before anything is checked. (benchmarks/fuzz.py checks real archives of a
    million entries, tar.gz and zip.)"""
    path = archive(tmp_path, "zip")
    data = path.read_bytes()
    at = data.rfind(b"PK\x05\x06")
    cd_size, cd_offset = struct.unpack_from("<LL", data, at + 12)
    trailer = (struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, 1_000_001,
                           1_000_001, cd_size, cd_offset)
               + struct.pack("<4sLQL", b"PK\x06\x07", 0, at, 1)
               + struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF,
                             0xFFFFFFFF, 0))
    path.write_bytes(data[:at] + trailer)
    refused_everywhere(tmp_path, path, f"bad.zip: more than {MAX_BUNDLE_ENTRIES} entries "
                                       "(1000001 by its central directory)")


@pytest.mark.parametrize("offset, value, problem", [
    (10, 99, "uses compression method 99, which cannot be unpacked"),
    (8, 0x1, "is encrypted")])
def test_zip_entries_that_cannot_be_unpacked_are_refused(tmp_path, offset, value, problem):
    path = archive(tmp_path, "zip", Entry("data", b"x"))
    data = bytearray(path.read_bytes())
    struct.pack_into("<H", data, data.rfind(b"data") - 46 + offset, value)  # central entry
    path.write_bytes(bytes(data))
    refused_everywhere(tmp_path, path, f"bad.zip: entry 'data' {problem}")
