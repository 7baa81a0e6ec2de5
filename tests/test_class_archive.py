"""The Spark class archive's rules, without a JVM (the real build:
integration/test_spark_class_archive.py)."""

from __future__ import annotations

import logging

from nimbus.supervisor.class_archive import ClassArchive, archive_key, archive_path
from nimbus.worker.class_archive import java_options


def test_java_options_name_an_existing_archive_after_the_topologys_own(tmp_path):
    archive = tmp_path / "a.jsa"
    assert java_options(str(archive), "-Dx=1") is None   # not built (yet)
    assert java_options("", None) is None
    archive.write_bytes(b"x")
    assert java_options(str(archive), None) == f"-XX:SharedArchiveFile={archive}"
    assert java_options(str(archive), "-Dx=1") == f"-Dx=1 -XX:SharedArchiveFile={archive}"
    spaced = tmp_path / "a b.jsa"
    spaced.write_bytes(b"x")
    assert java_options(str(spaced), None) is None   # Spark would split the option


def test_the_key_follows_the_jdk(monkeypatch, tmp_path):
    here = archive_key()
    assert here is not None and here == archive_key()
    fake = tmp_path / "jdk"
    (fake / "bin").mkdir(parents=True)
    (fake / "bin" / "java").write_text("")
    monkeypatch.setenv("JAVA_HOME", str(fake))
    assert archive_key() != here


def test_an_archive_already_built_is_used_and_others_are_removed(tmp_path):
    directory = tmp_path / "class-archive"
    directory.mkdir()
    target = archive_path(directory)
    target.write_bytes(b"built")
    stale = directory / "spark-classes-0123456789abcdef.jsa"
    partial = directory / f".{target.name}.77.partial"
    stale.write_bytes(b"old")
    partial.write_bytes(b"half")
    archive = ClassArchive(directory)
    archive.start()
    assert archive.path == str(target)
    assert sorted(p.name for p in directory.iterdir()) == [target.name]


def test_a_failed_build_leaves_workers_without_one(tmp_path, caplog):
    archive = ClassArchive(tmp_path / "class-archive", python="/bin/false")
    with caplog.at_level(logging.INFO, logger="nimbus.supervisor.class_archive"):
        archive.start()
        assert archive.path == "" and not archive._thread.is_alive()  # nothing wanted yet
        archive.needed()
        archive._thread.join(30)
    assert archive.path == ""
    assert "build failed (exit code 1" in caplog.text
    archive.stop()
