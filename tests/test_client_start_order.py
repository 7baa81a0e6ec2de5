"""Clients started before any nimbus: they wait (bounded by nimbus.client.wait.secs, said
once), then give up in one line; a root that holds something else fails at once."""

from __future__ import annotations

import logging

import pytest
from click.testing import CliRunner

from nimbus.cli import main
from nimbus.config import ConfigError, load_config
from nimbus.dev.zookeeper import free_port
from nimbus.state.cluster_state import (
    ClusterNotSetUpError,
    LayoutMissingError,
    StormClusterState,
)
from nimbus.thrift.client import NimbusClient, NimbusUnavailableError


def _conf(zk_server, zk_root: str, wait_s: int, **extra):
    return load_config(overrides={
        "storm.zookeeper.servers": ["127.0.0.1"], "storm.zookeeper.port": zk_server.port,
        "storm.zookeeper.root": zk_root, "nimbus.seeds": [f"127.0.0.1:{free_port()}"],
        "nimbus.client.wait.secs": wait_s, **extra})


def test_a_reader_waits_for_the_first_nimbus_to_set_the_cluster_up(make_zk, zk_root):
    zk = make_zk()
    state = StormClusterState(zk, zk_root)
    told: list[str] = []

    def waiting(message: str) -> None:
        told.append(message)
        # What the first nimbus does, while the reader waits: its watch wakes the reader.
        StormClusterState(make_zk(), zk_root).setup()

    cluster_id = state.wait_set_up(60, waiting)
    assert cluster_id == state.cluster_id()
    assert told == [f"no nimbus has set the cluster up under {zk_root} yet (start a nimbus, "
                    "or check storm.zookeeper.root and storm.zookeeper.servers): waiting up "
                    "to 60s (nimbus.client.wait.secs)"]
    # Set up: no wait, nothing said.
    assert state.wait_set_up(0, told.append) == cluster_id
    assert len(told) == 1


def test_a_root_without_an_id_is_not_set_up_and_the_wait_ends(make_zk, zk_root):
    zk = make_zk()
    zk.create(zk_root)  # a nimbus between creating the root and writing the id
    state = StormClusterState(zk, zk_root)
    told: list[str] = []
    with pytest.raises(ClusterNotSetUpError, match="gave up after 0s"):
        state.wait_set_up(0.0, told.append)
    assert told == []  # no time to wait: nothing said but the error
    with pytest.raises(ClusterNotSetUpError):
        state.wait_set_up(0.3, told.append)
    assert len(told) == 1
    assert zk.get(zk_root)[0] == b""  # a reader creates nothing


def test_a_root_of_something_else_fails_at_once(make_zk, zk_root):
    zk = make_zk()
    zk.create(zk_root, b"<html>not a cluster</html>")
    with pytest.raises(LayoutMissingError) as err:
        StormClusterState(zk, zk_root).wait_set_up(60, pytest.fail)
    assert not isinstance(err.value, ClusterNotSetUpError)
    assert "check storm.zookeeper.root" in str(err.value)


@pytest.mark.parametrize("command", [["topology-info", "etl"], ["errors", "etl"],
                                     ["top", "--once"]])
def test_reading_commands_ask_a_nimbus_and_say_none_answers_in_one_line(command):
    """The read commands need nimbus.seeds only: with no nimbus up and no wait, one line
    naming the seed, and no ZooKeeper is asked (none is configured that answers)."""
    seed = f"127.0.0.1:{free_port()}"
    result = CliRunner().invoke(main, [
        *command, "--set", f"nimbus.seeds=['{seed}']",
        "--set", f"storm.zookeeper.port={free_port()}", "--set", "nimbus.client.wait.secs=0"])
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"Error: no nimbus reachable via nimbus.seeds ({seed}: "), lines


def test_a_thrift_client_waits_says_so_once_and_gives_up_in_one_line(
        zk_server, zk_root, caplog):
    conf = _conf(zk_server, zk_root, 1)
    seed = conf["nimbus.seeds"][0]
    for call in (NimbusClient(conf).cluster_info, NimbusClient(conf).leader,
                 lambda: NimbusClient(conf).activate("etl")):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="nimbus.thrift.client"), \
                pytest.raises(NimbusUnavailableError) as err:
            call()
        message = str(err.value)
        assert "\n" not in message
        assert "within 1s (nimbus.client.wait.secs)" in message and seed in message
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 1 and said[0].endswith(
            f"via nimbus.seeds ({seed}): waiting up to 1s (nimbus.client.wait.secs)"), said


def test_a_wait_of_zero_tries_once_and_says_nothing(zk_server, zk_root, caplog):
    conf = _conf(zk_server, zk_root, 0)
    with caplog.at_level(logging.WARNING, logger="nimbus.thrift.client"), \
            pytest.raises(NimbusUnavailableError, match="^no nimbus reachable via"):
        NimbusClient(conf).cluster_info()
    assert caplog.records == []


def test_a_negative_wait_is_refused():
    with pytest.raises(ConfigError, match="'nimbus.client.wait.secs' must be 0"):
        load_config(overrides={"nimbus.client.wait.secs": -1})


def test_a_seed_that_answers_something_else_is_not_waited_for(zk_server, zk_root, caplog):
    """Waiting is for a cluster that is not up yet: a server that takes the connection
    and drops it (another protocol, a TLS server to a plain client) fails at once."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def drop_every_connection() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.close()

    thread = threading.Thread(target=drop_every_connection, name="dropper", daemon=True)
    thread.start()
    try:
        conf = _conf(zk_server, zk_root, 60,
                     **{"nimbus.seeds": [f"127.0.0.1:{listener.getsockname()[1]}"]})
        with caplog.at_level(logging.WARNING, logger="nimbus.thrift.client"), \
                pytest.raises(NimbusUnavailableError) as err:
            NimbusClient(conf).cluster_info()
        assert str(err.value).startswith("no nimbus reachable via nimbus.seeds")
        assert caplog.records == []  # never said it waits
    finally:
        stop.set()
        thread.join(5)
        listener.close()
