"""A broken plugin costs its author one ``Error:`` line, never a pluggy traceback.

A hook with an argument its specification lacks, a method marked ``@hookimpl`` that is
no hook, a plugin whose import fails and a misspelled distributor name each fail with
one line naming the plugin and the cause (with a "did you mean" where one fits). An
installed plugin that fails to import still leaves its configuration keys readable,
so commands that do not need it keep working.

The broken plugins are real distributions: a ``.dist-info`` with an ``entry_points.txt``
on ``sys.path``, found by ``importlib.metadata`` like any installed one.
"""

from __future__ import annotations

import logging
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from nimbus.cli import main
from nimbus.config import ConfigError
from nimbus.dev.zookeeper import free_port
from nimbus.distribution.distributors import (
    CodeDistributor,
    DistributorError,
    PluginImportError,
    installed_distributors,
    load_cluster_config,
    resolve_distributor_class,
)
from nimbus.distribution.hookspecs import hookimpl

# A plugin module whose class has every hook right except ``upload``, which takes
# ``dirpath`` where the specification says ``dir_path``.
WRONG_ARGUMENT_PLUGIN = """
from nimbus.distribution.hookspecs import hookimpl


class Dist:
    name = "x"

    @hookimpl
    def upload(self, dirpath, topology_id):
        return dirpath

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
"""


@pytest.fixture
def install_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable]:
    """``install_plugin(entry_name, module_source)`` installs a distribution
    ``nimbus-ha-test-<entry_name>`` whose module ``nimbus_ha_test_<entry_name>`` holds
    ``module_source`` and whose entry point ``<entry_name>`` names its class ``Dist``."""
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)

    def install(entry_name: str, module_source: str) -> str:
        module = f"nimbus_ha_test_{entry_name}"
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(module_source))
        info = tmp_path / f"{module}-0.1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: nimbus-ha-test-{entry_name}\nVersion: 0.1.0\n")
        (info / "entry_points.txt").write_text(
            f"[nimbus_ha.codedistributor]\n{entry_name} = {module}:Dist\n")
        return module

    yield install
    for name in set(sys.modules) - before:
        if name.startswith("nimbus_ha_test_"):
            del sys.modules[name]


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("Error:")]


# -- hooks that pluggy would refuse with a page of traceback ---------------------------
class WrongArgument:
    name = "wrongarg"

    @hookimpl
    def upload(self, dirpath, topology_id):
        return dirpath


class MisspelledHook:
    name = "misspelled"

    @hookimpl
    def uplaod(self, dir_path, topology_id):
        return dir_path


def test_a_wrong_argument_name_is_one_line_with_a_suggestion():
    with pytest.raises(DistributorError) as err:
        CodeDistributor(WrongArgument)
    assert str(err.value) == (
        f"code distributor 'wrongarg' ({__name__}:WrongArgument): hook "
        "'upload' takes argument 'dirpath', which its specification upload(dir_path, "
        "topology_id) does not have (did you mean 'dir_path'?); arguments are passed by name")


def test_a_misspelled_hook_is_one_line_with_a_suggestion():
    with pytest.raises(DistributorError) as err:
        CodeDistributor(MisspelledHook)
    assert str(err.value) == (
        f"code distributor 'misspelled' ({__name__}:MisspelledHook): method "
        "'uplaod' is marked @hookimpl but there is no such hook (did you mean 'upload'?); "
        "hooks: config_defaults, prepare, upload, download, get_replication_count, cleanup, "
        "close, delete_shared, list_shared")


def test_the_nimbus_command_reports_an_invalid_hook_as_one_error_line(install_plugin):
    install_plugin("wrongarg", WRONG_ARGUMENT_PLUGIN)
    result = CliRunner().invoke(main, [
        "nimbus", "--set", "storm.codedistributor.class=wrongarg"])
    assert result.exit_code == 1
    assert error_lines(result.output) == [
        "Error: code distributor 'x' (nimbus_ha_test_wrongarg:Dist): hook 'upload' takes "
        "argument 'dirpath', which its specification upload(dir_path, topology_id) does "
        "not have (did you mean 'dir_path'?); arguments are passed by name"]
    assert "Traceback" not in result.output


def test_a_plugin_with_an_invalid_hook_leaves_its_keys_readable(install_plugin, caplog):
    """config_defaults cannot be called on a plugin pluggy refuses: its prefix is
    accepted unchecked, with a warning that says why."""
    install_plugin("wrongarg", WRONG_ARGUMENT_PLUGIN)
    with caplog.at_level(logging.WARNING):
        conf = load_cluster_config(overrides={"nimbus.codedistributor.wrongarg.path": "/x"})
    assert conf["nimbus.codedistributor.wrongarg.path"] == "/x"
    assert "key 'nimbus.codedistributor.wrongarg.path' accepted unchecked: code " \
           "distributor 'wrongarg' could not report its settings" in caplog.text


# -- a plugin whose import fails ------------------------------------------------------
BROKEN_IMPORT = "import nimbus_ha_test_missing_dependency\n\nclass Dist:\n    name = 'b'\n"
BROKEN_MESSAGE = (
    "code distributor 'brokenimport' is installed but cannot be imported: "
    "ModuleNotFoundError: No module named 'nimbus_ha_test_missing_dependency' (entry point "
    "brokenimport = nimbus_ha_test_brokenimport:Dist of nimbus-ha-test-brokenimport 0.1.0)")


def test_selecting_a_plugin_that_fails_to_import_names_the_failure(install_plugin):
    install_plugin("brokenimport", BROKEN_IMPORT)
    with pytest.raises(PluginImportError) as err:
        resolve_distributor_class("brokenimport")
    assert str(err.value) == BROKEN_MESSAGE
    assert isinstance(err.value.__cause__, ModuleNotFoundError)


def test_the_nimbus_command_reports_the_import_failure_as_one_error_line(install_plugin):
    install_plugin("brokenimport", BROKEN_IMPORT)
    result = CliRunner().invoke(main, [
        "nimbus", "--set", "storm.codedistributor.class=brokenimport",
        "--set", "nimbus.codedistributor.brokenimport.path=/srv/code"])
    assert result.exit_code == 1
    assert error_lines(result.output) == [f"Error: {BROKEN_MESSAGE}"]


def test_keys_of_a_plugin_that_fails_to_import_are_accepted_with_a_warning(
        install_plugin, caplog):
    install_plugin("brokenimport", BROKEN_IMPORT)
    with caplog.at_level(logging.WARNING):
        conf = load_cluster_config(overrides={"nimbus.codedistributor.brokenimport.path": "/srv",
                                      "nimbus.codedistributor.brokenimport.copies": 2})
    assert conf["nimbus.codedistributor.brokenimport.copies"] == 2
    assert (f"overrides: key 'nimbus.codedistributor.brokenimport.path' accepted unchecked: "
            f"{BROKEN_MESSAGE}") in caplog.text
    # Only that plugin's prefix: any other unknown key is still an error.
    with pytest.raises(ConfigError, match="unknown key 'nimbus.codedistributor.other.path'"):
        load_cluster_config(overrides={"nimbus.codedistributor.other.path": "/srv"})


def test_list_reads_a_yaml_with_the_keys_of_a_plugin_that_fails_to_import(
        install_plugin, tmp_path):
    """The issue's case: `nimbus-ha list` failed with "unknown key". Now it gets as far
    as asking the cluster (here: nobody listens on the seed, so that is the error)."""
    install_plugin("brokenimport", BROKEN_IMPORT)
    port = free_port()
    conf_file = tmp_path / "storm.yaml"
    conf_file.write_text(yaml.safe_dump({
        "storm.codedistributor.class": "brokenimport",
        "nimbus.codedistributor.brokenimport.path": "/srv/code",
        "nimbus.seeds": [f"127.0.0.1:{port}"], "nimbus.client.wait.secs": 0}))
    result = CliRunner().invoke(main, ["list", "--config", str(conf_file)])
    assert result.exit_code == 1
    [line] = error_lines(result.output)
    assert line.startswith(f"Error: no nimbus reachable via nimbus.seeds (127.0.0.1:{port}: ")


# -- a misspelled name ----------------------------------------------------------------
@pytest.mark.parametrize("typo, meant", [("lcoalfs", "localfs"), ("torrnet", "torrent")])
def test_a_misspelled_distributor_name_gets_a_suggestion(typo, meant):
    installed = ", ".join(sorted(installed_distributors()))
    with pytest.raises(DistributorError) as err:
        resolve_distributor_class(typo)
    assert str(err.value) == (
        f"unknown code distributor {typo!r} in storm.codedistributor.class (did you mean "
        f"{meant!r}?); installed: {installed} (or give a dotted path 'module:Class')")


def test_the_nimbus_command_reports_a_misspelled_name_as_one_error_line():
    result = CliRunner().invoke(main, ["nimbus", "--set", "storm.codedistributor.class=lcoalfs"])
    assert result.exit_code == 1
    [line] = error_lines(result.output)
    assert line.startswith("Error: unknown code distributor 'lcoalfs' in "
                           "storm.codedistributor.class (did you mean 'localfs'?); installed: ")
