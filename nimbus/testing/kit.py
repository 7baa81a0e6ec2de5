"""The plugin authors' test kit: the conformance suite with everything it needs.

A plugin's whole test module (pytest finds this kit by itself once nimbus-ha is
installed; see docs/plugins.md)::

    import pytest
    from nimbus.testing.kit import STORE, DistributorKit, flip_byte

    class TestMyStore(DistributorKit):
        distributor = "mystore"            # entry-point name (or "module:Class")
        replication_model = STORE          # or PER_HOST
        store_replication = 2              # STORE only: the count of a complete bundle

        @pytest.fixture
        def settings(self, tmp_path):      # the plugin's configuration keys
            return {"nimbus.codedistributor.mystore.path": str(tmp_path / "store"),
                    "nimbus.codedistributor.mystore.replication.count": 2}

        def corrupt(self, host, topology_id):   # optional: enables the tamper test
            flip_byte(Path(host.conf["nimbus.codedistributor.mystore.path"])
                      / topology_id / "stormjar.jar")

The kit supplies a real ZooKeeper server (one per test session, a fresh root per test),
simulated nimbus hosts (each with its own ZooKeeper session, code directory and a real
Thrift server serving its code, as a nimbus does) and every test of
:class:`~nimbus.testing.conformance.DistributorConformance`, plus checks that the
plugin declares each of its settings with the right type under its own prefix. A
plugin that sets ``serves_supervisors = True`` is also run on simulated supervisors (the
supervisor role of ``DistributorContext``): their downloads must reproduce every byte and
never count as replicas.

Options (class attributes and fixtures of the subclass; docs/plugins.md, "The test kit"):

* ``stop_store`` (fixture) and ``store_setting``: for a plugin with a central store, a
  function that makes the store of ``settings`` unreachable (stops its server, unmounts
  its share), and the key that names the store's address or path. After a successful
  upload the kit stops the store: an upload and a download must then fail with a
  ``DistributorError`` naming the topology and ``store_setting``, within
  ``store_timeout_secs``, leaving nothing behind and counting nothing. The kit asks for
  ``stop_store`` in that one test only, so a module that shares one server among its
  tests can give that test a store of its own (``"stop_store" in
  request.fixturenames``). Without it the test is skipped; a plugin with no central
  store (every host keeps its own copies) sets ``no_store_reason`` to say so.
* ``not_secret``: keys that only look like credentials. Every declared key whose name
  looks like one (:func:`looks_like_credential`: password, token, secret, sas, sig,
  signature, auth, private, credentials, a name ending in ``key``, a key file, ...) must
  be marked secret, by its default wrapped in ``Secret(...)`` or by a name that
  :func:`nimbus.redaction.is_secret_key` recognises (``...secret.key``,
  ``...account.key``, ``...connection.string``); a key whose default is a bool or a
  number holds no credential and is not checked. ``key.prefix`` (words about keys) does
  not look like one; ``...keyfile.path`` does, and redaction masks it by name.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from nimbus.distribution.distributors import (
    CodeDistributor,
    DistributorError,
    MetafileError,
    resolve_distributor_class,
)
from nimbus.distribution.hookspecs import ENTRY_POINT_GROUP
from nimbus.testing.conformance import (
    PER_HOST,
    STORE,
    ConformanceHost,
    DistributorConformance,
    _assert_names,
    flip_byte,
    tree_digests,
    write_code,
)
from nimbus.testing.hosts import SimulatedHosts

__all__ = ["PER_HOST", "STORE", "ConformanceHost", "DistributorKit", "flip_byte",
           "looks_like_credential"]

HostFactory = Callable[[int], list[ConformanceHost]]

#: The topology that the kit tries to upload once the store is stopped.
UNREACHABLE_TOPOLOGY_ID = "unreachable-1-1700000000"

# Words of a key's name (split at ".", "_" and "-") that make it look like a credential
# wherever they stand. Broader than redaction's own rule on purpose: a key that matches
# these but not nimbus.redaction.is_secret_key must be marked with Secret(...).
CREDENTIAL_WORDS = frozenset({
    "password", "passwd", "pwd", "passphrase", "secret", "secrets", "secretkey",
    "token", "tokens", "credential", "credentials", "creds", "apikey", "accesskey",
    "privatekey", "private", "sas", "sig", "signature", "auth", "authorization", "bearer",
    "keyfile", "superacl"})
# A "key" word followed by one of these names a key file (``tls.key.file``,
# ``client.key.pem``); "key" as the last word names a key (``encryption.key``). "key"
# followed by anything else is about keys, not one (``key.prefix``, ``key.format``).
KEY_FILE_WORDS = frozenset({"file", "path", "pem"})
_WORD_SPLIT = re.compile(r"[._\-]+")


def looks_like_credential(key: str) -> bool:
    """True when the name of setting ``key`` looks like it holds a credential (see the
    module docstring): a word of :data:`CREDENTIAL_WORDS`, a name whose last word is
    ``key``, a key file (``...key.file``, ``...key.path``, ``...key.pem``), or a
    credential phrase of :mod:`nimbus.redaction` (``connection.string``,
    ``account.key``)."""
    from nimbus.redaction import SECRET_PHRASES

    words = [w for w in _WORD_SPLIT.split(str(key).lower()) if w]
    if CREDENTIAL_WORDS.intersection(words) or (words and words[-1] == "key"):
        return True
    if any(a == "key" and b in KEY_FILE_WORDS for a, b in pairwise(words)):
        return True
    return any(tuple(words[i:i + len(p)]) == p
               for p in SECRET_PHRASES for i in range(len(words) - len(p) + 1))


@pytest.fixture
def distributor_hosts(tmp_path: Path, zk_server: Any, zk_root: str) -> Iterator[Callable]:
    """Factory for tests of your own: ``distributor_hosts(name, settings, topology_ids=())``
    returns a :class:`SimulatedHosts` (call ``.make(n)`` for ``n`` prepared hosts) on the
    session's ZooKeeper; every one made is closed after the test."""
    made: list[SimulatedHosts] = []

    def make(distributor: str, settings: dict[str, Any] | None = None,
             topology_ids: tuple[str, ...] = ()) -> SimulatedHosts:
        simulated = SimulatedHosts(tmp_path / f"hosts-{len(made)}", zk_server.hosts, zk_root,
                                   distributor, settings, topology_ids=topology_ids)
        made.append(simulated)
        return simulated

    yield make
    for simulated in made:
        simulated.close()


class DistributorKit(DistributorConformance):
    """The conformance suite, ready to run: set :attr:`distributor`, the replication model
    and (as a fixture) :meth:`settings`; optionally override :meth:`corrupt`,
    :meth:`stop_store` (with :attr:`store_setting`) and :attr:`not_secret` (see the
    module docstring)."""

    #: The distributor under test: its entry-point name, or ``package.module:Class``.
    distributor: str = ""
    #: The key naming the store's address or path (``...s3.endpoint``, ``...path``):
    #: with :meth:`stop_store`, the errors of an unreachable store must name it.
    store_setting: str = ""
    #: The longest an upload or a download may take to fail once the store is stopped.
    store_timeout_secs: float = 60.0
    #: Why the plugin has no store to stop (the skip message says it); e.g. "every host
    #: keeps its own copy: there is no central store".
    no_store_reason: str = ""
    #: Declared keys that look like credentials (:func:`looks_like_credential`) but hold
    #: none, e.g. ``("nimbus.codedistributor.mystore.signature.version",)``.
    not_secret: tuple[str, ...] = ()

    @pytest.fixture
    def settings(self) -> dict[str, Any]:
        """The configuration the simulated nimbuses run with (override as a fixture)."""
        return {}

    def corrupt(self, host: ConformanceHost, topology_id: str) -> None:
        """Corrupt the stored copy of ``stormjar.jar`` that other hosts download (e.g.
        with :func:`flip_byte`). ``host.conf`` is :meth:`settings`. Not overridden: the
        tamper test is skipped."""
        raise NotImplementedError

    @pytest.fixture
    def tamper(self) -> Callable[[ConformanceHost, str], None] | None:
        if type(self).corrupt is DistributorKit.corrupt:
            return None
        return self.corrupt

    @pytest.fixture
    def hosts(self, tmp_path: Path, zk_server: Any, zk_root: str,
              settings: dict[str, Any]) -> Iterator[HostFactory]:
        if not self.distributor:
            pytest.fail(f"{type(self).__name__} must set distributor = the entry-point name "
                        "of the code distributor under test", pytrace=False)
        simulated = SimulatedHosts(tmp_path / "hosts", zk_server.hosts, zk_root,
                                   self.distributor, settings,
                                   topology_ids=(self.topology_id, UNREACHABLE_TOPOLOGY_ID))
        yield simulated.make
        simulated.close()

    @pytest.fixture
    def supervisor(self, tmp_path: Path, zk_server: Any, zk_root: str,
                   settings: dict[str, Any]) -> Iterator[Callable[[], ConformanceHost]]:
        """Factory of simulated supervisors (the distributor in the supervisor role), on
        the same ZooKeeper root as :meth:`hosts`; skips when the plugin does not serve
        supervisors (they then fetch from the nimbuses over Thrift)."""
        cls = resolve_distributor_class(self.distributor)
        if not CodeDistributor(cls).serves_supervisors:
            pytest.skip(f"{self.distributor!r} does not set serves_supervisors: supervisors "
                        "fetch its code from the nimbuses over Thrift")
        simulated = SimulatedHosts(tmp_path / "supervisors", zk_server.hosts, zk_root,
                                   self.distributor, settings)
        yield simulated.make_supervisor
        simulated.close()

    def test_supervisor_download_reproduces_every_byte_and_counts_nothing(
            self, uploaded, supervisor, tmp_path: Path) -> None:
        """A supervisor's copy is complete and verified, and never a replica: the
        replication count stays what the nimbuses hold."""
        group, metafile, digests = uploaded
        host = supervisor()
        dest = host.code_dir / self.topology_id
        files = host.distributor.download(dest, self.topology_id,
                                          self._metafile(tmp_path, metafile))
        assert tree_digests(dest) == digests
        assert {f.relative_to(dest).as_posix() for f in files} == set(digests)
        self._assert_count(group[0], 1)
        # A nimbus that downloads after it still adds exactly itself.
        group[1].distributor.download(group[1].code_dir / self.topology_id, self.topology_id,
                                      self._metafile(tmp_path, metafile))
        self._assert_count(group[0], 2)

    def test_supervisor_cleanup_leaves_the_nimbuses_copies(
            self, uploaded, supervisor, tmp_path: Path) -> None:
        """A supervisor's cleanup forgets its own copy only: the count is unchanged and
        another supervisor still downloads the code."""
        group, metafile, digests = uploaded
        first, second = supervisor(), supervisor()
        dest = first.code_dir / self.topology_id
        first.distributor.download(dest, self.topology_id, self._metafile(tmp_path, metafile))
        first.distributor.cleanup(self.topology_id)
        shutil.rmtree(dest)
        self._assert_count(group[0], 1)
        other = second.code_dir / self.topology_id
        second.distributor.download(other, self.topology_id,
                                    self._metafile(tmp_path, metafile))
        assert tree_digests(other) == digests

    @pytest.fixture
    def other_store(self) -> dict[str, Any] | None:
        """Settings of a second store of the same kind (override as a fixture): a
        metafile written for one store must be refused by a host of the other."""
        return None

    @pytest.fixture
    def bad_settings(self) -> list[tuple[dict[str, Any], str]]:
        """(settings, the key its error must name) of configurations ``prepare`` must
        refuse (override as a fixture)."""
        return []

    def test_a_metafile_of_another_store_is_refused(self, uploaded, other_store,
                                                    tmp_path: Path, zk_server: Any,
                                                    zk_root: str) -> None:
        if other_store is None:
            pytest.skip("no other_store fixture: give the settings of a second store")
        group, metafile, _ = uploaded
        simulated = SimulatedHosts(tmp_path / "other", zk_server.hosts, zk_root,
                                   self.distributor, other_store,
                                   topology_ids=(self.topology_id,))
        try:
            (host,) = simulated.make(1)
            dest = host.code_dir / self.topology_id
            with pytest.raises(MetafileError) as err:
                host.distributor.download(dest, self.topology_id,
                                          self._metafile(tmp_path, metafile))
            assert self.topology_id in str(err.value)
            assert not dest.exists()
            self._assert_count(group[0], 1)
        finally:
            simulated.close()

    def test_prepare_names_the_setting_it_refuses(self, bad_settings, tmp_path: Path,
                                                  zk_server: Any, zk_root: str) -> None:
        if not bad_settings:
            pytest.skip("no bad_settings fixture: give configurations prepare refuses")
        for index, (settings, key) in enumerate(bad_settings):
            simulated = SimulatedHosts(tmp_path / f"bad-{index}", zk_server.hosts, zk_root,
                                       self.distributor, settings)
            try:
                with pytest.raises(DistributorError) as err:
                    simulated.make(1)
                assert key in str(err.value), (key, str(err.value))
            finally:
                simulated.close()

    @pytest.fixture
    def stop_store(self) -> Callable[[], None] | None:
        """A function that makes the store of :meth:`settings` unreachable, for real:
        stop its server, move its share away (override as a fixture; set
        :attr:`store_setting` too). None (the default) skips the test."""
        return None

    def test_an_unreachable_store_fails_naming_its_setting(
            self, stop_store, hosts, tmp_path: Path) -> None:
        """The store stops after an upload. Then an upload of another topology and a
        download of the uploaded one each raise a DistributorError naming the topology
        and :attr:`store_setting`, within :attr:`store_timeout_secs`; the download leaves
        nothing in the code directory, and neither counts: the new topology's count is 0,
        the uploaded one's is the uploader's alone (PER_HOST) or 0 (STORE: a store that
        cannot be asked vouches for no copy; get_replication_count returns 0, never
        raises)."""
        if stop_store is None:
            pytest.skip(self.no_store_reason or (
                "no stop_store fixture: give a function that makes the store unreachable "
                "(stop its server, move its share away) and set store_setting = the key "
                "of the store's address or path"))
        if not self.store_setting:
            pytest.fail(f"{type(self).__name__} gives stop_store: set store_setting = the "
                        "key of the store's address or path, which the errors of an "
                        "unreachable store must name", pytrace=False)
        group, metafile, _ = self.upload_sample(hosts)
        stop_store()

        other = UNREACHABLE_TOPOLOGY_ID
        source = group[0].code_dir / other
        write_code(source, seed=1, big_bytes=64 * 1024)
        start = time.monotonic()
        with pytest.raises(DistributorError) as err:
            group[0].distributor.upload(source, other)
        self._assert_failed_in_time("upload", other, start)
        _assert_names(err.value, other, self.store_setting)
        self._assert_count(group[0], 0, other)

        code_dir = group[1].code_dir
        before = sorted(p.name for p in code_dir.iterdir())
        dest = code_dir / self.topology_id
        meta = self._metafile(tmp_path, metafile)
        start = time.monotonic()
        with pytest.raises(DistributorError) as err:
            group[1].distributor.download(dest, self.topology_id, meta)
        self._assert_failed_in_time("download", self.topology_id, start)
        _assert_names(err.value, self.topology_id, self.store_setting)
        assert not dest.exists(), "a failed download must leave no directory behind"
        assert sorted(p.name for p in code_dir.iterdir()) == before, \
            "a failed download must leave nothing in the code directory"
        self._assert_count(group[1], 1 if self.replication_model == PER_HOST else 0)

    def _assert_failed_in_time(self, what: str, topology_id: str, start: float) -> None:
        took = time.monotonic() - start
        assert took <= self.store_timeout_secs, (
            f"the {what} of {topology_id} took {took:.1f}s to fail on an unreachable store "
            f"(store_timeout_secs = {self.store_timeout_secs}): bound the plugin's connect "
            "and read timeouts and its retries")

    def test_list_shared_names_what_the_store_holds(self, uploaded) -> None:
        """``list_shared`` (optional, with ``delete_shared``): the uploaded topology is
        listed until ``delete_shared``; nothing that is not a topology id is."""
        group, _, _ = uploaded
        listed = group[0].distributor.list_shared()
        if listed is None:
            pytest.skip(f"{self.distributor!r} does not implement list_shared")
        assert listed == [self.topology_id]
        group[0].distributor.delete_shared(self.topology_id)
        assert group[1].distributor.list_shared() == []

    def _declared(self) -> tuple[str, dict[str, Any]]:
        """(entry-point name or "", the keys the plugin declares in config_defaults)."""
        cls = resolve_distributor_class(self.distributor)
        name = self.distributor if ":" not in self.distributor and "." not in \
            self.distributor else ""
        return name, CodeDistributor(cls).config_defaults()

    def test_settings_are_declared_with_their_types(self, settings: dict[str, Any]) -> None:
        """The settings load as a nimbus configuration: every key is a built-in one or
        declared by the plugin's ``config_defaults``, with a value of the default's type."""
        from nimbus.config import load_config

        _, declared = self._declared()
        conf = load_config(overrides=settings, extra_defaults=declared)
        for key, value in settings.items():
            assert conf[key] == value

    def test_declared_keys_use_the_plugin_prefix(self) -> None:
        """One prefix per plugin, ``nimbus.codedistributor.<entry-point name>.``: the
        configuration loader accepts exactly that prefix for a plugin that fails to
        import, so ``nimbus-ha list`` still reads a YAML that holds its keys."""
        name, declared = self._declared()
        if not name:
            pytest.skip(f"{self.distributor!r} is a dotted path, not an entry-point name "
                        f"in {ENTRY_POINT_GROUP}")
        prefix = f"nimbus.codedistributor.{name}."
        assert [k for k in declared if not k.startswith(prefix)] == []

    def test_credential_looking_settings_are_secret(self) -> None:
        """Every declared key that looks like a credential (:func:`looks_like_credential`)
        is marked secret: its default wrapped in ``Secret(...)``, or a name that
        redaction masks anyway. Exempt: bool and number defaults, and :attr:`not_secret`."""
        from nimbus.redaction import Secret, is_secret_key

        cls = resolve_distributor_class(self.distributor)
        raw: dict[str, Any] = {}
        for part in CodeDistributor(cls)._pm.hook.config_defaults():
            raw.update(part or {})
        unknown = sorted(set(self.not_secret) - set(raw))
        if unknown:
            pytest.fail(f"{type(self).__name__}.not_secret names keys that "
                        f"{self.distributor!r} does not declare: {', '.join(unknown)}",
                        pytrace=False)
        exposed = sorted(
            key for key, default in raw.items()
            if key not in self.not_secret and looks_like_credential(key)
            and not isinstance(default, Secret) and not is_secret_key(key)
            and not isinstance(default, (bool, int, float)))
        if exposed:
            pytest.fail(
                f"{self.distributor!r} declares settings that look like credentials but are "
                f"not marked secret, so their values would be shown by getNimbusConf, the "
                f"CLI and the logs: {', '.join(exposed)}. In config_defaults, wrap each "
                f"default in Secret(...) (from nimbus.plugin_api import Secret), e.g. "
                f"{exposed[0]!r}: Secret({raw[exposed[0]]!r}); a key that only looks like "
                f"a credential goes in {type(self).__name__}.not_secret = "
                f"({exposed[0]!r},)", pytrace=False)
