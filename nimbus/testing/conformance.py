"""Conformance suite for code distributors: subclass it in your plugin's tests.

Usage (in a plugin's ``tests/test_conformance.py``)::

    from nimbus.testing.conformance import ConformanceHost, DistributorConformance

    class TestMyDistributor(DistributorConformance):
        @pytest.fixture
        def hosts(self, tmp_path):
            # Return a factory: hosts(n) -> n ConformanceHost sharing one backend, each
            # with a *prepared* CodeDistributor and its own code_dir.
            ...

        @pytest.fixture
        def tamper(self):
            # Optional: return a function (host, topology_id) that corrupts the stored
            # copy that other hosts download from; the default skips that test.
            ...

Every hook is exercised through ``nimbus.distributors.CodeDistributor`` (so through
pluggy), exactly as the nimbus calls it.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from nimbus.distributors import CodeDistributor
from nimbus.hookspecs import DISTRIBUTOR_HOOKS


@dataclass
class ConformanceHost:
    """One simulated nimbus host: a prepared distributor and its code directory."""

    distributor: CodeDistributor
    code_dir: Path
    conf: dict


def _write_code(root: Path, seed: int = 0, big_bytes: int = 3 * 1024 * 1024 + 17,
                ) -> dict[str, str]:
    """A topology's code: nested files, an empty file and one large file; returns hashes."""
    rng = random.Random(seed)
    files = {
        "stormjar.jar": rng.randbytes(big_bytes),
        "stormconf.json": b'{"topology.workers": 2}',
        "lib/deps/empty.txt": b"",
        "resources/data.csv": b"a,b\n1,2\n" * 100,
    }
    digests = {}
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        digests[rel] = hashlib.sha256(data).hexdigest()
    return digests


def flip_byte(path: Path) -> None:
    """Corrupt a file in place (one byte in its middle): a "tampered copy" for tests."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _digests(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*") if p.is_file()}


class DistributorConformance:
    """The behaviour every code distributor must show; see the module docstring."""

    topology_id = "conformance-1-1700000000"

    @pytest.fixture
    def tamper(self) -> Callable[[ConformanceHost, str], None] | None:
        return None

    @pytest.fixture
    def uploaded(self, hosts: Callable[[int], list[ConformanceHost]]):
        group = hosts(2)
        source = group[0].code_dir / self.topology_id
        digests = _write_code(source)
        metafile = group[0].distributor.upload(source, self.topology_id)
        return group, metafile.read_bytes(), digests

    def _metafile(self, tmp_path: Path, data: bytes) -> Path:
        path = tmp_path / f"{self.topology_id}.meta"
        path.write_bytes(data)
        return path

    def test_implements_every_hook(self, hosts: Callable[[int], list[ConformanceHost]]) -> None:
        distributor = hosts(1)[0].distributor
        for hook in DISTRIBUTOR_HOOKS:
            assert getattr(distributor._pm.hook, hook).get_hookimpls(), hook

    def test_upload_returns_metafile_and_counts_a_replica(self, uploaded) -> None:
        group, metafile, _ = uploaded
        assert metafile, "upload must return a non-empty metafile"
        assert group[0].distributor.get_replication_count(self.topology_id) >= 1

    def test_download_reproduces_every_byte(self, uploaded, tmp_path: Path) -> None:
        group, metafile, digests = uploaded
        dest = group[1].code_dir / self.topology_id
        files = group[1].distributor.download(dest, self.topology_id,
                                              self._metafile(tmp_path, metafile))
        assert _digests(dest) == digests
        assert {f.relative_to(dest).as_posix() for f in files} == set(digests)

    def test_download_raises_replication_count(self, uploaded, tmp_path: Path) -> None:
        group, metafile, _ = uploaded
        before = group[0].distributor.get_replication_count(self.topology_id)
        group[1].distributor.download(group[1].code_dir / self.topology_id, self.topology_id,
                                      self._metafile(tmp_path, metafile))
        after = group[0].distributor.get_replication_count(self.topology_id)
        assert after >= before >= 1

    def test_corrupt_metafile_fails_and_leaves_nothing(self, uploaded, tmp_path: Path) -> None:
        group, metafile, _ = uploaded
        dest = group[1].code_dir / self.topology_id
        before = group[0].distributor.get_replication_count(self.topology_id)
        for bad in (b"", b"\x00garbage" * 10, metafile[: len(metafile) // 2]):
            with pytest.raises(Exception):  # noqa: B017 - any clear error will do
                group[1].distributor.download(dest, self.topology_id,
                                              self._metafile(tmp_path, bad))
            assert not dest.exists(), "a failed download must leave no directory behind"
        assert group[0].distributor.get_replication_count(self.topology_id) == before

    def test_tampered_copy_is_never_counted(self, uploaded, tamper, tmp_path: Path) -> None:
        if tamper is None:
            pytest.skip("this distributor's tests give no way to corrupt a stored copy")
        group, metafile, _ = uploaded
        before = group[0].distributor.get_replication_count(self.topology_id)
        tamper(group[0], self.topology_id)
        dest = group[1].code_dir / self.topology_id
        with pytest.raises(Exception):  # noqa: B017
            group[1].distributor.download(dest, self.topology_id,
                                          self._metafile(tmp_path, metafile))
        assert not dest.exists()
        # Never more: a source that detects its own corruption may even withdraw itself.
        assert group[0].distributor.get_replication_count(self.topology_id) <= before

    def test_unknown_topology_fails_cleanly(self, hosts, tmp_path: Path) -> None:
        group = hosts(1)
        dest = group[0].code_dir / "never-1-1"
        with pytest.raises(Exception):  # noqa: B017
            group[0].distributor.download(dest, "never-1-1", self._metafile(tmp_path, b"{}"))
        assert not dest.exists()
        assert group[0].distributor.get_replication_count("never-1-1") == 0

    def test_cleanup_forgets_the_topology(self, uploaded, tmp_path: Path) -> None:
        group, metafile, _ = uploaded
        group[1].distributor.download(group[1].code_dir / self.topology_id, self.topology_id,
                                      self._metafile(tmp_path, metafile))
        before = group[0].distributor.get_replication_count(self.topology_id)
        group[1].distributor.cleanup(self.topology_id)
        group[1].distributor.cleanup(self.topology_id)  # idempotent
        assert group[0].distributor.get_replication_count(self.topology_id) <= before
