"""The conformance suite itself: it passes a correct distributor and catches wrong ones.

``MemoryDistributor`` is a per-host distributor held in memory (no servers), so the whole
suite runs here in well under a second. Each broken variant below passed the earlier,
lax suite (``after >= before``, ``<= before``, any ``Exception``); the exact one fails it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from nimbus.distribution.distributors import (
    CodeDistributor,
    CodeVerificationError,
    DistributorError,
    MetafileError,
)
from nimbus.distribution.hookspecs import DistributorContext, hookimpl
from nimbus.distribution.local_code import atomic_dir, list_files
from nimbus.testing.conformance import PER_HOST, ConformanceHost, DistributorConformance


class MemoryDistributor:
    """Code kept in a dict shared by the hosts: backend[topology][host] = {path: bytes}."""

    name = "memory"

    @hookimpl
    def config_defaults(self):
        return {}

    @hookimpl
    def prepare(self, conf, context):
        self.ctx = context
        self.backend = context.extra["backend"]
        context.local_dir.mkdir(parents=True, exist_ok=True)

    def _metafile(self, topology_id: str) -> Path:
        return self.ctx.local_dir / f"{topology_id}.meta"

    def register(self, topology_id: str, files: dict) -> None:
        self.backend.setdefault(topology_id, {})[self.ctx.address] = files

    @hookimpl
    def upload(self, dir_path, topology_id):
        files = {rel.as_posix(): (dir_path / rel).read_bytes() for rel in list_files(dir_path)}
        self.register(topology_id, files)
        self._metafile(topology_id).write_text(json.dumps({
            "topology_id": topology_id,
            "files": {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()}}))
        return self._metafile(topology_id)

    def read_metafile(self, metafile: Path, topology_id: str) -> dict:
        try:
            meta = json.loads(Path(metafile).read_text())
            if meta["topology_id"] != topology_id:
                raise ValueError("another topology")
            return meta["files"]
        except (ValueError, KeyError, TypeError) as exc:
            raise MetafileError(f"{metafile}: not a memory metafile for {topology_id}: "
                                f"{exc}") from None

    @hookimpl
    def download(self, dest_dir, topology_id, metafile):
        digests = self.read_metafile(metafile, topology_id)
        holders = [files for host, files in self.backend.get(topology_id, {}).items()
                   if host != self.ctx.address]
        if not holders:
            raise DistributorError(f"no host holds a copy of {topology_id}")
        source = holders[0]
        for rel, digest in digests.items():
            if hashlib.sha256(source[rel]).hexdigest() != digest:
                raise CodeVerificationError(f"{topology_id}/{rel}: sha256 mismatch")
        with atomic_dir(dest_dir) as tmp:
            for rel in digests:
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                (tmp / rel).write_bytes(source[rel])
        self.register(topology_id, dict(source))
        return [dest_dir / rel for rel in digests]

    @hookimpl
    def get_replication_count(self, topology_id):
        return len(self.backend.get(topology_id, {}))

    @hookimpl
    def cleanup(self, topology_id):
        self.backend.get(topology_id, {}).pop(self.ctx.address, None)
        self._metafile(topology_id).unlink(missing_ok=True)

    @hookimpl
    def close(self, conf):
        pass


def memory_hosts(tmp_path: Path, plugin_class: type = MemoryDistributor):
    backend: dict = {}
    made: list[ConformanceHost] = []

    def make(n: int) -> list[ConformanceHost]:
        group = []
        for _ in range(n):
            root = tmp_path / f"host-{len(made)}"
            distributor = CodeDistributor(plugin_class)
            distributor.prepare({}, DistributorContext(
                zk=None, zk_root="/storm", address=f"host-{len(made)}:6627",
                local_dir=root / "meta", code_dir=root / "code",
                extra={"backend": backend}))
            host = ConformanceHost(distributor, root / "code", {})
            made.append(host)
            group.append(host)
        return group

    make.backend = backend
    return make


def corrupt_in_memory(host: ConformanceHost, topology_id: str) -> None:
    plugin = host.distributor._pm.get_plugins().pop()
    files = plugin.backend[topology_id][plugin.ctx.address]
    data = bytearray(files["stormjar.jar"])
    data[len(data) // 2] ^= 0xFF
    files["stormjar.jar"] = bytes(data)


class TestMemoryConformance(DistributorConformance):
    replication_model = PER_HOST

    @pytest.fixture
    def hosts(self, tmp_path):
        return memory_hosts(tmp_path)

    @pytest.fixture
    def tamper(self):
        return corrupt_in_memory


# -- distributors that break the contract, each in one way ----------------------------
class NeverCounted(MemoryDistributor):
    """A download that does not register the host that now holds the copy."""

    def register(self, topology_id, files):
        if topology_id not in self.backend:
            super().register(topology_id, files)


class CountedTwice(MemoryDistributor):
    """A download that registers its host under two names."""

    def register(self, topology_id, files):
        super().register(topology_id, files)
        if len(self.backend[topology_id]) > 1:
            self.backend[topology_id][self.ctx.address + "-again"] = files


class CleanupKeepsRegistration(MemoryDistributor):
    @hookimpl
    def cleanup(self, topology_id):
        self._metafile(topology_id).unlink(missing_ok=True)


class VagueErrors(MemoryDistributor):
    """Any failure is a bare RuntimeError that names nothing."""

    @hookimpl
    def download(self, dest_dir, topology_id, metafile):
        try:
            return super().download(dest_dir, topology_id, metafile)
        except DistributorError:
            raise RuntimeError("download failed") from None


@pytest.mark.parametrize("plugin_class, test_name", [
    (NeverCounted, "test_download_raises_replication_count"),
    (CountedTwice, "test_download_raises_replication_count"),
    (CleanupKeepsRegistration, "test_cleanup_forgets_the_topology"),
    (VagueErrors, "test_corrupt_metafile_fails_and_leaves_nothing"),
    (VagueErrors, "test_tampered_copy_is_never_counted"),
])
def test_the_suite_rejects_a_broken_distributor(tmp_path, plugin_class, test_name):
    suite = TestMemoryConformance()
    hosts = memory_hosts(tmp_path, plugin_class)
    uploaded = suite.upload_sample(hosts, big_bytes=1000)
    with pytest.raises((AssertionError, RuntimeError)) as err:
        if test_name == "test_tampered_copy_is_never_counted":
            getattr(suite, test_name)(uploaded, corrupt_in_memory, tmp_path)
        else:
            getattr(suite, test_name)(uploaded, tmp_path)
    # Rejected by one of the suite's assertions, or (VagueErrors) by letting the vague
    # error through where the suite demands a MetafileError or CodeVerificationError
    # (the core wraps it in a plain DistributorError): nothing else.
    assert isinstance(err.value, AssertionError) or (
        plugin_class is VagueErrors and type(err.value) is DistributorError
        and str(err.value).endswith("failed: RuntimeError: download failed")), repr(err.value)


def test_a_vague_error_is_named_by_the_core(tmp_path):
    """Where any DistributorError will do, the core's wrapping of a plugin's stray error
    (naming the distributor, the operation and the topology) satisfies the suite."""
    suite = TestMemoryConformance()
    hosts = memory_hosts(tmp_path, VagueErrors)
    uploaded = suite.upload_sample(hosts, big_bytes=1000)
    suite.test_code_gone_everywhere_fails_cleanly(uploaded, tmp_path)


def test_a_01_test_class_without_a_model_passes_and_is_warned_once(tmp_path):
    """A test class written for 0.1 (no replication_model; its own hosts fixture) keeps
    passing on 0.1's looser count checks, with one DeprecationWarning that says what to
    add. tests/kit_01/test_old_plugin.py is such a module, run for real by the suite."""
    with pytest.warns(DeprecationWarning) as caught:
        class TestUndeclared(DistributorConformance):
            pass

    assert len(caught) == 1
    assert str(caught[0].message) == (
        "test_a_01_test_class_without_a_model_passes_and_is_warned_once.<locals>."
        "TestUndeclared declares no replication_model, so its replication counts are "
        "checked only loosely, as in 0.1: add `replication_model = PER_HOST` (each host "
        "holding a verified copy counts one) or `replication_model = STORE` with "
        "`store_replication = <the count of a complete bundle>` to the class (from "
        "nimbus.testing.kit import PER_HOST, STORE)")
    suite = TestUndeclared()
    hosts = memory_hosts(tmp_path)
    uploaded = suite.upload_sample(hosts, big_bytes=1000)
    suite.test_declares_a_replication_model()
    suite.test_upload_returns_metafile_and_counts_a_replica(uploaded)
    suite.test_cleanup_forgets_the_topology(uploaded, tmp_path)


def test_an_unknown_replication_model_fails_clearly(tmp_path):
    class Misspelt(DistributorConformance):
        replication_model = "per_host"

    with pytest.raises(pytest.fail.Exception, match="use PER_HOST, or STORE"):
        Misspelt().upload_sample(memory_hosts(tmp_path), big_bytes=1000)
