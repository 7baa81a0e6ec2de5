"""Selecting a code distributor by name, with errors that say what to do."""

import pytest

from nimbus.distributors import (
    CodeDistributor,
    DistributorError,
    installed_distributors,
    resolve_distributor_class,
)
from nimbus.hookspecs import hookimpl


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
    import nimbus.distributors as d

    monkeypatch.setattr(d, "installed_distributors", lambda: {})
    with pytest.raises(DistributorError, match="pip install nimbus-ha-hdfs"):
        resolve_distributor_class("org.apache.storm.hdfs.ha.codedistributor.HDFSCodeDistributor")


class Incomplete:
    name = "incomplete"

    @hookimpl
    def upload(self, dir_path, topology_id):
        return dir_path


def test_plugin_missing_hooks_is_refused():
    with pytest.raises(DistributorError, match="does not implement hooks: prepare, download"):
        CodeDistributor(Incomplete)


def test_broken_plugin_is_skipped_not_fatal(monkeypatch, caplog):
    import nimbus.distributors as d

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
