"""Conformance suite for code distributors: subclass it in your plugin's tests.

Usage (in a plugin's ``tests/test_conformance.py``)::

    from nimbus.testing.conformance import (
        PER_HOST, ConformanceHost, DistributorConformance)

    class TestMyDistributor(DistributorConformance):
        # How get_replication_count counts: PER_HOST (each host holding a verified copy
        # registers itself) or STORE (the store's own redundancy; set store_replication).
        replication_model = PER_HOST

        @pytest.fixture
        def hosts(self, tmp_path):
            # Return a factory: hosts(n) -> n ConformanceHost sharing one backend, each
            # with a *prepared* CodeDistributor and its own code_dir.
            ...

        @pytest.fixture
        def tamper(self):
            # Optional: return a function (host, topology_id) that corrupts the stored
            # copy of ``stormjar.jar`` that other hosts download from; the default skips
            # that test.
            ...

Every hook is exercised through ``nimbus.distribution.distributors.CodeDistributor`` (so through
pluggy), exactly as the nimbus calls it. Counts are checked exactly, and every failure
must be a ``nimbus.distribution.distributors.DistributorError`` of the documented kind
(``MetafileError``, ``CodeVerificationError``) whose message names the topology (and,
for a refused copy, the file); see docs/hooks.md.
"""

from __future__ import annotations

import hashlib
import random
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from nimbus.distribution.distributors import (
    CodeDistributor,
    CodeVerificationError,
    DistributorError,
    MetafileError,
)
from nimbus.distribution.hookspecs import DISTRIBUTOR_HOOKS

#: Replication models (``DistributorConformance.replication_model``).
PER_HOST = "per-host"
STORE = "store"

LEGACY_WARNING = (
    "{name} declares no replication_model, so its replication counts are checked only "
    "loosely, as in 0.1: add `replication_model = PER_HOST` (each host holding a verified "
    "copy counts one) or `replication_model = STORE` with `store_replication = <the count "
    "of a complete bundle>` to the class (from nimbus.testing.kit import PER_HOST, STORE)")


@dataclass
class ConformanceHost:
    """One simulated nimbus host: a prepared distributor and its code directory."""

    distributor: CodeDistributor
    code_dir: Path
    conf: dict


def write_code(root: Path, seed: int = 0, big_bytes: int = 3 * 1024 * 1024 + 17,
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


def tree_digests(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``root``: what a copy is compared by."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*") if p.is_file()}


# The names plugins' tests written for 0.1 imported (docs/plugins.md): kept working.
_write_code = write_code
_digests = tree_digests


def _assert_names(error: BaseException, *needles: str) -> None:
    message = str(error)
    for needle in needles:
        assert needle in message, f"the error must name {needle!r}, got: {message!r}"


class DistributorConformance:
    """The behaviour every code distributor must show; see the module docstring."""

    topology_id = "conformance-1-1700000000"
    #: The file that ``tamper`` corrupts; a refused copy's error must name it.
    tampered_file = "stormjar.jar"
    #: How ``get_replication_count`` counts; it fixes every expected count exactly.
    #: PER_HOST: each host holding a verified copy registers itself (localfs, torrent):
    #: upload counts 1, each download exactly one more, each host's cleanup one less.
    #: STORE: the store's own redundancy, ``store_replication``, from the upload on
    #: (s3, hdfs): downloads and a host's cleanup do not change it (the bundle is
    #: shared); ``delete_shared`` (the leader's, after a removal) makes it 0.
    replication_model: str = ""
    store_replication: int = 0
    #: The size of the sample's largest file: raise it past a multi-part threshold (a
    #: store's part size) so that the conformance tests cross that path too.
    bundle_bytes: int = 3 * 1024 * 1024 + 17

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        # A test class written for 0.1 declares no model: it keeps passing on 0.1's
        # looser count checks, and is told once, when it is defined, what to add.
        if not cls.replication_model and not cls.__dict__.get("_abstract", False) \
                and cls.__name__.startswith("Test"):
            warnings.warn(LEGACY_WARNING.format(name=cls.__qualname__), DeprecationWarning,
                          stacklevel=2)

    @property
    def _legacy(self) -> bool:
        """True for a 0.1 test class: no replication model declared."""
        return not self.replication_model

    def expected_count(self, holders: int) -> int | None:
        """The exact count while ``holders`` hosts (the uploader included) hold a copy;
        None for a 0.1 test class that declares no model (counts are then checked as 0.1
        did: at least 1 while anyone holds a copy)."""
        if self.replication_model == PER_HOST:
            return holders
        if self.replication_model == STORE and self.store_replication >= 1:
            return self.store_replication if holders else 0
        if self._legacy:
            return None
        pytest.fail(f"{type(self).__name__} sets replication_model = "
                    f"{self.replication_model!r}: use PER_HOST, or STORE with "
                    "store_replication = the count of a complete bundle")

    def _assert_count(self, host: ConformanceHost, holders: int,
                      topology_id: str | None = None) -> None:
        count = self._count(host, topology_id)
        expected = self.expected_count(holders)
        if expected is not None:
            assert count == expected, f"replication count {count}, expected {expected}"
        elif holders:
            assert count >= 1, f"replication count {count} while {holders} hosts hold a copy"

    @pytest.fixture
    def tamper(self) -> Callable[[ConformanceHost, str], None] | None:
        return None

    @pytest.fixture
    def uploaded(self, hosts: Callable[[int], list[ConformanceHost]]):
        return self.upload_sample(hosts)

    def upload_sample(self, hosts: Callable[[int], list[ConformanceHost]], n: int = 2,
                      **code_args):
        """``n`` hosts, the first having uploaded a sample topology: (hosts, metafile
        bytes, sha256 of every file). Its largest file has :attr:`bundle_bytes`."""
        self.expected_count(1)  # fail at once, and clearly, if no model is declared
        group = hosts(n)
        source = group[0].code_dir / self.topology_id
        code_args.setdefault("big_bytes", self.bundle_bytes)
        digests = write_code(source, **code_args)
        metafile = group[0].distributor.upload(source, self.topology_id)
        return group, metafile.read_bytes(), digests

    def _metafile(self, tmp_path: Path, data: bytes) -> Path:
        path = tmp_path / f"{self.topology_id}.meta"
        path.write_bytes(data)
        return path

    def _count(self, host: ConformanceHost, topology_id: str | None = None) -> int:
        return host.distributor.get_replication_count(topology_id or self.topology_id)

    def test_declares_a_replication_model(self) -> None:
        if self._legacy:
            return  # a 0.1 test class: warned when it was defined
        assert self.expected_count(1) >= 1
        assert self.expected_count(0) == 0

    def test_implements_every_hook(self, hosts: Callable[[int], list[ConformanceHost]]) -> None:
        distributor = hosts(1)[0].distributor
        for hook in DISTRIBUTOR_HOOKS:
            assert getattr(distributor._pm.hook, hook).get_hookimpls(), hook

    def test_upload_returns_metafile_and_counts_a_replica(self, uploaded) -> None:
        group, metafile, _ = uploaded
        assert metafile, "upload must return a non-empty metafile"
        self._assert_count(group[0], 1)
        self._assert_count(group[1], 1)   # every host sees the count

    def test_download_reproduces_every_byte(self, uploaded, tmp_path: Path) -> None:
        group, metafile, digests = uploaded
        dest = group[1].code_dir / self.topology_id
        files = group[1].distributor.download(dest, self.topology_id,
                                              self._metafile(tmp_path, metafile))
        assert tree_digests(dest) == digests
        assert {f.relative_to(dest).as_posix() for f in files} == set(digests)

    def test_download_raises_replication_count(self, uploaded, tmp_path: Path) -> None:
        """PER_HOST: exactly one more (the downloader); STORE: unchanged."""
        group, metafile, _ = uploaded
        self._assert_count(group[0], 1)
        group[1].distributor.download(group[1].code_dir / self.topology_id, self.topology_id,
                                      self._metafile(tmp_path, metafile))
        self._assert_count(group[0], 2)
        self._assert_count(group[1], 2)

    def test_corrupt_metafile_fails_and_leaves_nothing(self, uploaded, tmp_path: Path) -> None:
        group, metafile, _ = uploaded
        dest = group[1].code_dir / self.topology_id
        for bad in (b"", b"\x00garbage" * 10, metafile[: len(metafile) // 2]):
            with pytest.raises(MetafileError) as err:
                group[1].distributor.download(dest, self.topology_id,
                                              self._metafile(tmp_path, bad))
            _assert_names(err.value, self.topology_id)
            assert not dest.exists(), "a failed download must leave no directory behind"
        self._assert_count(group[0], 1)

    def test_metafile_of_another_topology_is_refused(self, uploaded, tmp_path: Path) -> None:
        group, metafile, _ = uploaded
        other = "other-1-1700000000"
        dest = group[1].code_dir / other
        with pytest.raises(MetafileError) as err:
            group[1].distributor.download(dest, other, self._metafile(tmp_path, metafile))
        _assert_names(err.value, other)
        assert not dest.exists()
        assert self._count(group[0], other) == 0
        self._assert_count(group[0], 1)

    def test_tampered_copy_is_never_counted(self, uploaded, tamper, tmp_path: Path) -> None:
        if tamper is None:
            pytest.skip("this distributor's tests give no way to corrupt a stored copy")
        group, metafile, _ = uploaded
        tamper(group[0], self.topology_id)
        dest = group[1].code_dir / self.topology_id
        with pytest.raises(CodeVerificationError) as err:
            group[1].distributor.download(dest, self.topology_id,
                                          self._metafile(tmp_path, metafile))
        _assert_names(err.value, self.topology_id, self.tampered_file)
        assert not dest.exists()
        # The refused copy adds nothing; the source's count is what it was.
        self._assert_count(group[0], 1)
        self._assert_count(group[1], 1)

    def test_unknown_topology_fails_cleanly(self, hosts, tmp_path: Path) -> None:
        self.expected_count(0)
        group = hosts(1)
        dest = group[0].code_dir / "never-1-1"
        with pytest.raises(MetafileError) as err:
            group[0].distributor.download(dest, "never-1-1", self._metafile(tmp_path, b"{}"))
        _assert_names(err.value, "never-1-1")
        assert not dest.exists()
        assert self._count(group[0], "never-1-1") == 0
        group[0].distributor.cleanup("never-1-1")  # must not fail for an unknown topology

    def test_code_gone_everywhere_fails_cleanly(self, uploaded, tmp_path: Path) -> None:
        """A valid metafile whose code no host or store holds any more: a plain
        DistributorError (nothing is corrupt) naming the topology, and nothing left."""
        group, metafile, _ = uploaded
        group[0].distributor.cleanup(self.topology_id)
        shutil.rmtree(group[0].code_dir / self.topology_id)  # as the nimbus does
        group[0].distributor.delete_shared(self.topology_id)  # as the leader does
        assert self._count(group[0]) == 0
        dest = group[1].code_dir / self.topology_id
        with pytest.raises(DistributorError) as err:
            group[1].distributor.download(dest, self.topology_id,
                                          self._metafile(tmp_path, metafile))
        assert not isinstance(err.value, (MetafileError, CodeVerificationError)), err.value
        _assert_names(err.value, self.topology_id)
        assert not dest.exists()
        assert self._count(group[1]) == 0

    def test_cleanup_on_one_host_leaves_the_code_to_the_others(self, hosts,
                                                               tmp_path: Path) -> None:
        """cleanup runs on every nimbus, leader or not, whenever its own copy goes: it
        must never take away what other hosts fetch from (shared objects, their copies)."""
        group, metafile, digests = self.upload_sample(hosts, n=3)
        meta = self._metafile(tmp_path, metafile)
        group[1].distributor.download(group[1].code_dir / self.topology_id,
                                      self.topology_id, meta)
        group[0].distributor.cleanup(self.topology_id)
        shutil.rmtree(group[0].code_dir / self.topology_id)  # as the nimbus does next
        dest = group[2].code_dir / self.topology_id
        group[2].distributor.download(dest, self.topology_id, meta)
        assert tree_digests(dest) == digests
        self._assert_count(group[2], 2)

    def test_cleanup_forgets_the_topology(self, uploaded, tmp_path: Path) -> None:
        """PER_HOST: each host's cleanup withdraws exactly its own copy. STORE: a host's
        cleanup never touches the shared bundle; the leader's delete_shared removes it.
        Both idempotent; 0 once every host has cleaned up and delete_shared has run."""
        group, metafile, _ = uploaded
        group[1].distributor.download(group[1].code_dir / self.topology_id, self.topology_id,
                                      self._metafile(tmp_path, metafile))
        self._assert_count(group[0], 2)
        group[1].distributor.cleanup(self.topology_id)
        group[1].distributor.cleanup(self.topology_id)  # idempotent
        self._assert_count(group[0], 1)
        self._assert_count(group[1], 1)
        group[0].distributor.cleanup(self.topology_id)
        # PER_HOST: nobody holds a copy; STORE: the bundle is still there until deleted.
        if not self._legacy:
            left = 0 if self.replication_model == PER_HOST else self.store_replication
            assert self._count(group[0]) == left
        group[0].distributor.delete_shared(self.topology_id)
        group[0].distributor.delete_shared(self.topology_id)  # idempotent
        assert self._count(group[0]) == 0
        assert self._count(group[1]) == 0
