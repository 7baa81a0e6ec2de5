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
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
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
    _digests,
    flip_byte,
)
from nimbus.testing.hosts import SimulatedHosts

__all__ = ["PER_HOST", "STORE", "ConformanceHost", "DistributorKit", "flip_byte"]

HostFactory = Callable[[int], list[ConformanceHost]]


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
    and (as a fixture) :meth:`settings`; optionally override :meth:`corrupt`."""

    #: The distributor under test: its entry-point name, or ``package.module:Class``.
    distributor: str = ""

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
                                   topology_ids=(self.topology_id,))
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
        assert _digests(dest) == digests
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
        assert _digests(other) == digests

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
