"""Selecting a code distributor by name, with errors that say what to do."""

import pytest

from nimbus.distribution.distributors import (
    CodeDistributor,
    DistributorError,
    installed_distributors,
    resolve_distributor_class,
)
from nimbus.distribution.hookspecs import hookimpl


def test_localfs_is_installed_under_its_entry_point():
    assert "localfs" in installed_distributors()


@pytest.mark.parametrize("name", [
    "localfs",
    "org.apache.storm.codedistributor.LocalFileSystemCodeDistributor",
    "nimbus_ha_localfs:LocalFileSystemCodeDistributor",
    "nimbus_ha_localfs.LocalFileSystemCodeDistributor",
])
def test_names_that_select_localfs(name):
    assert resolve_distributor_class(name).name == "localfs"


def test_unknown_name_lists_installed():
    with pytest.raises(DistributorError) as err:
        resolve_distributor_class("com.example.Nope")
    assert "unknown code distributor 'com.example.Nope'" in str(err.value)
    assert "localfs" in str(err.value)


def test_known_backend_not_installed_names_the_distribution(monkeypatch):
    import nimbus.distribution.distributors as d

    monkeypatch.setattr(d, "_load_entry_points", lambda: ({}, {}))
    with pytest.raises(DistributorError, match="pip install nimbus-ha-hdfs"):
        resolve_distributor_class("org.apache.storm.hdfs.ha.codedistributor.HDFSCodeDistributor")


class Incomplete:
    name = "incomplete"

    @hookimpl
    def upload(self, dir_path, topology_id):
        return dir_path


class Complete(Incomplete):
    """Every hook, doing nothing; tests override the one they are about."""

    name = "complete"

    @hookimpl
    def prepare(self, conf, context):
        pass

    @hookimpl
    def download(self, dest_dir, topology_id, metafile):
        return []

    @hookimpl
    def get_replication_count(self, topology_id):
        return 0

    @hookimpl
    def cleanup(self, topology_id):
        pass

    @hookimpl
    def close(self, conf):
        pass


def test_plugin_missing_hooks_is_refused():
    with pytest.raises(DistributorError, match="does not implement hooks: prepare, download"):
        CodeDistributor(Incomplete)


def test_broken_plugin_is_skipped_not_fatal(monkeypatch, caplog):
    import nimbus.distribution.distributors as d

    class EP:
        name, value = "broken", "broken_pkg:Thing"

        def load(self):
            raise ImportError("no module named broken_pkg")

    class Good(EP):
        name, value = "good", "x:Y"

        def load(self):
            return Incomplete

    monkeypatch.setattr(d, "entry_points", lambda group: [EP(), Good()])
    assert list(installed_distributors()) == ["good"]
    assert "failed to load and is skipped" in caplog.text


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """A directory on sys.path for throw-away distributor modules (unloaded afterwards)."""
    import sys

    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.startswith("nimbus_ha_test_"):
            del sys.modules[name]


@pytest.mark.parametrize("path", ["nimbus_ha_test_broken:Dist", "nimbus_ha_test_broken.Dist"])
def test_dotted_path_whose_import_fails_shows_the_import_error(plugin_dir, path):
    (plugin_dir / "nimbus_ha_test_broken.py").write_text(
        "import nimbus_ha_test_missing_dependency\n\nclass Dist:\n    name = 'x'\n")
    with pytest.raises(DistributorError) as err:
        resolve_distributor_class(path)
    message = str(err.value)
    assert "unknown code distributor" not in message
    assert "importing module 'nimbus_ha_test_broken' failed" in message
    assert "No module named 'nimbus_ha_test_missing_dependency'" in message
    assert isinstance(err.value.__cause__, ImportError)


def test_dotted_path_whose_module_raises_import_error_itself(plugin_dir):
    (plugin_dir / "nimbus_ha_test_raises.py").write_text(
        "raise ImportError('libfoo.so.1: cannot open shared object file')\n")
    with pytest.raises(DistributorError, match="libfoo.so.1: cannot open shared object"):
        resolve_distributor_class("nimbus_ha_test_raises:Dist")


def test_dotted_path_without_the_attribute_names_attribute_and_module(plugin_dir):
    (plugin_dir / "nimbus_ha_test_empty.py").write_text("class Other:\n    pass\n")
    with pytest.raises(DistributorError) as err:
        resolve_distributor_class("nimbus_ha_test_empty:Dist")
    assert "module 'nimbus_ha_test_empty' has no attribute 'Dist'" in str(err.value)


def test_dotted_path_of_a_missing_module_is_unknown(plugin_dir):
    with pytest.raises(DistributorError, match="unknown code distributor"):
        resolve_distributor_class("nimbus_ha_test_absent.sub:Dist")


def test_selecting_an_entry_point_that_fails_to_import_shows_why(monkeypatch):
    import nimbus.distribution.distributors as d

    class EP:
        name, value = "broken", "broken_pkg:Thing"

        def load(self):
            raise ImportError("No module named 'libbroken'")

    monkeypatch.setattr(d, "entry_points", lambda group: [EP()])
    with pytest.raises(DistributorError,
                       match="'broken' is installed but cannot be imported: "
                             "ImportError: No module named 'libbroken'"):
        resolve_distributor_class("broken")


def test_prepare_failure_names_the_plugin_even_for_a_distributor_error():
    """A plugin's own DistributorError (e.g. a store's) still says which plugin failed."""
    from nimbus.distribution.hookspecs import DistributorContext

    class StoreRefused(DistributorError):
        pass

    class FailsToStart(Complete):
        name = "failing"

        @hookimpl
        def prepare(self, conf, context):
            raise StoreRefused("set some.setting to the bucket")

    distributor = CodeDistributor(FailsToStart)
    with pytest.raises(DistributorError) as err:
        distributor.prepare({}, DistributorContext(None, "/storm", "h:1", None, None))
    assert str(err.value) == ("code distributor 'failing' cannot start: "
                              "set some.setting to the bucket")
    assert isinstance(err.value.__cause__, StoreRefused)


def test_a_plugins_stray_exception_becomes_a_distributor_error(tmp_path):
    class Sloppy(Complete):
        """Its upload and download fail with a library's own errors."""

        name = "sloppy"

        @hookimpl
        def upload(self, dir_path, topology_id):
            raise KeyError("bucket")

        @hookimpl
        def download(self, dest_dir, topology_id, metafile):
            raise OSError("disk on fire")

    distributor = CodeDistributor(Sloppy)
    with pytest.raises(DistributorError, match=r"sloppy: upload of t-1-1 failed: KeyError"):
        distributor.upload(tmp_path, "t-1-1")
    with pytest.raises(DistributorError,
                       match=r"sloppy: download of t-1-1 failed: OSError: disk on fire"):
        distributor.download(tmp_path / "x", "t-1-1", tmp_path / "m")
