"""A supervisor's code through the code distributor (nimbus.supervisor.distributor_source):
when it is used, when it falls back to the nimbuses, and what it never trusts. Stand-in
plugins on a real ZooKeeper (the metafile is read from it); the real plugins are proven in
their kit suites and in integration/test_supervisor_code.py."""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path

import pytest

from nimbus.distribution import distributors as distributors_module
from nimbus.distribution.distributors import CodeDistributor, DistributorError
from nimbus.distribution.hookspecs import ROLE_SUPERVISOR, hookimpl
from nimbus.state.records import CodeMeta
from nimbus.supervisor.code_cache import CODE_FILES, CodeCache
from nimbus.supervisor.distributor_source import DistributorSource
from nimbus.thrift.client import fetch_file

TOPOLOGY = "demo-1-1700000000"
FILES = {"stormjar.jar": b"not really a jar", "stormconf.json": b"{}", "stormcode.ser": b""}
SHA = {name: hashlib.sha256(data).hexdigest() for name, data in FILES.items()}


class ServingPlugin:
    """Writes FILES (or what ``served`` says) on download; records every call."""

    name = "stand-in"
    serves_supervisors = True
    served = FILES
    calls: list[str] = []

    @hookimpl
    def config_defaults(self):
        return {}

    @hookimpl
    def prepare(self, conf, context):
        assert context.role == ROLE_SUPERVISOR and context.on_supervisor
        assert context.address.startswith("supervisor-")
        self.calls.append("prepare")

    @hookimpl
    def upload(self, dir_path, topology_id):
        raise AssertionError("a supervisor never uploads")

    @hookimpl
    def download(self, dest_dir, topology_id, metafile):
        self.calls.append(f"download {topology_id} {Path(metafile).read_bytes().decode()}")
        dest_dir.mkdir()
        for name, data in self.served.items():
            (dest_dir / name).write_bytes(data)
        return [dest_dir / name for name in self.served]

    @hookimpl
    def get_replication_count(self, topology_id):
        raise AssertionError("a supervisor never counts replicas")

    @hookimpl
    def cleanup(self, topology_id):
        self.calls.append(f"cleanup {topology_id}")

    @hookimpl
    def close(self, conf):
        self.calls.append("close")


class NonServingPlugin(ServingPlugin):
    name = "nimbus-only"
    serves_supervisors = False


class TamperedPlugin(ServingPlugin):
    served = {**FILES, "stormjar.jar": b"something else"}


@pytest.fixture
def source(tmp_path, make_zk, zk_root, monkeypatch):
    """make(plugin class, published by) -> a DistributorSource on a real ZooKeeper with
    TOPOLOGY's metafile published by that distributor's name."""
    zk = make_zk()
    made = []

    def make(plugin: type, published_by: str | None = None) -> DistributorSource:
        plugin.calls = []
        monkeypatch.setattr(distributors_module, "resolve_distributor_class",
                            lambda _name: plugin)
        meta = CodeMeta(distributor=published_by or plugin.name,
                        metafile_b64=CodeMeta.pack(b"the metafile"), uploaded_by="n:1",
                        created_secs=0)
        path = f"{zk_root}/code-distributor/{TOPOLOGY}"
        if zk.exists(path):
            zk.set(path, meta.encode())
        else:
            zk.create(path, meta.encode(), makepath=True)
        src = DistributorSource({"storm.codedistributor.class": plugin.name}, zk, zk_root,
                                "sup-1", tmp_path / "supervisor", fetch_file=fetch_file)
        made.append(src)
        return src

    yield make
    for src in made:
        src.close()


def test_a_serving_distributor_delivers_linked_verified_files(source, tmp_path):
    src = source(ServingPlugin)
    staging = tmp_path / "staging"
    staging.mkdir()
    assert src.fetch(TOPOLOGY, SHA, staging, CODE_FILES) is True
    assert {p.name: p.read_bytes() for p in staging.iterdir()} == FILES
    # Hard links: the distributor's copy (what a swarm seeds) costs no second copy.
    assert os.stat(staging / "stormjar.jar").st_ino == \
        os.stat(src.copies / TOPOLOGY / "stormjar.jar").st_ino
    assert ServingPlugin.calls == ["prepare", f"download {TOPOLOGY} the metafile"]
    assert src.delivered == 1


def test_private_copies_are_copies_not_links(source, tmp_path, make_zk, zk_root):
    src = source(ServingPlugin)
    src._private = True
    staging = tmp_path / "staging"
    staging.mkdir()
    assert src.fetch(TOPOLOGY, SHA, staging, CODE_FILES) is True
    assert os.stat(staging / "stormjar.jar").st_ino != \
        os.stat(src.copies / TOPOLOGY / "stormjar.jar").st_ino


def test_a_plugin_that_does_not_serve_supervisors_is_never_prepared(source, tmp_path, caplog):
    src = source(NonServingPlugin)
    staging = tmp_path / "staging"
    staging.mkdir()
    with caplog.at_level(logging.WARNING):
        assert src.fetch(TOPOLOGY, SHA, staging, CODE_FILES) is False
        assert src.fetch(TOPOLOGY, SHA, staging, CODE_FILES) is False
    said = [r.getMessage() for r in caplog.records if "serves_supervisors" in r.getMessage()]
    assert said == ["code distributor 'nimbus-only' does not serve supervisors (its plugin "
                    "does not set serves_supervisors): fetching code from the nimbuses over "
                    "Thrift instead"], "said once, not at every fetch"
    assert NonServingPlugin.calls == []
    assert list(staging.iterdir()) == []


def test_code_distributed_by_another_distributor_is_not_downloaded(source, tmp_path):
    src = source(ServingPlugin, published_by="s3")
    staging = tmp_path / "staging"
    staging.mkdir()
    assert src.fetch(TOPOLOGY, SHA, staging, CODE_FILES) is False
    assert ServingPlugin.calls == ["prepare"]


def test_a_copy_that_is_not_the_assigned_code_is_dropped(source, tmp_path):
    src = source(TamperedPlugin)
    staging = tmp_path / "staging"
    staging.mkdir()
    assert src.fetch(TOPOLOGY, SHA, staging, CODE_FILES) is False
    assert list(staging.iterdir()) == [], "nothing of a refused copy is left to run"
    assert not (src.copies / TOPOLOGY).exists()
    assert TamperedPlugin.calls[-1] == f"cleanup {TOPOLOGY}"
    assert src.delivered == 0


def test_the_code_cache_falls_back_to_the_nimbuses(source, tmp_path):
    src = source(TamperedPlugin)
    fetched = []

    def fetch(peer, remote, dest, timeout_s=30.0):
        fetched.append((peer, remote))
        data = FILES[remote.split("/", 1)[1]]
        dest.write_bytes(data)
        return hashlib.sha256(data).hexdigest()

    # The stand-in bundle is no archive: the fall-back is shown up to the unpacking.
    cache = CodeCache(tmp_path / "stormdist", 1 << 20, fetch, distributor=src)
    with pytest.raises(Exception, match="unsafe bundle|cannot unpack"):
        cache.ensure(TOPOLOGY, SHA, ["n:1"])
    assert fetched == [("n:1", f"{TOPOLOGY}/{name}") for name in CODE_FILES]


def test_remove_except_cleans_up_copies_no_longer_wanted(source, tmp_path):
    src = source(ServingPlugin)
    staging = tmp_path / "staging"
    staging.mkdir()
    assert src.fetch(TOPOLOGY, SHA, staging, CODE_FILES)
    assert src.remove_except({TOPOLOGY}) == []
    assert src.remove_except(set()) == [TOPOLOGY]
    assert not (src.copies / TOPOLOGY).exists()
    assert ServingPlugin.calls[-1] == f"cleanup {TOPOLOGY}"


def test_a_prepare_that_fails_is_tried_again_at_the_next_fetch(source, tmp_path, monkeypatch):
    src = source(ServingPlugin)
    staging = tmp_path / "staging"
    staging.mkdir()

    def refuse(self, conf, context):
        raise DistributorError("the store is down")

    monkeypatch.setattr(CodeDistributor, "prepare", refuse)
    assert src.fetch(TOPOLOGY, SHA, staging, CODE_FILES) is False
    assert ServingPlugin.calls == ["close"], "a failed prepare is closed"
    monkeypatch.undo()
    monkeypatch.setattr(distributors_module, "resolve_distributor_class",
                        lambda _name: ServingPlugin)
    assert src.fetch(TOPOLOGY, SHA, staging, CODE_FILES) is True


def test_prepare_readies_the_distributor_before_any_fetch(source, tmp_path):
    """What the fetch thread calls as it starts: the plugin is prepared once, and the
    fetch after it downloads without preparing it again. A prepare that fails for a
    reason of this host's (its copies' directory cannot be made) is closed, reported,
    and tried again."""
    src = source(ServingPlugin)
    blocker = tmp_path / "supervisor" / "code"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("a file where the copies go")
    assert src.prepare() is False
    assert ServingPlugin.calls == ["close"]
    blocker.unlink()
    ServingPlugin.calls = []
    assert src.prepare() is True
    assert ServingPlugin.calls == ["prepare"]
    staging = tmp_path / "staging"
    staging.mkdir()
    assert src.fetch(TOPOLOGY, SHA, staging, CODE_FILES) is True
    assert ServingPlugin.calls == ["prepare", f"download {TOPOLOGY} the metafile"]


class SlowPreparingPlugin(ServingPlugin):
    """Prepares until ``release`` is set (a swarm hash-checking the copies it kept)."""

    entered = threading.Event()
    release = threading.Event()

    @hookimpl
    def prepare(self, conf, context):
        self.calls.append("prepare")
        self.entered.set()
        assert self.release.wait(10)


def test_while_it_prepares_copies_stay_and_a_close_is_not_outlived(source, tmp_path):
    """The reconcile thread's clean-up leaves the copies alone while the plugin may be
    taking them up (it would delete them behind the plugin's back), and a close() that
    comes during the prepare closes the plugin once the prepare ends: no session or
    port outlives the supervisor."""
    SlowPreparingPlugin.entered.clear()
    SlowPreparingPlugin.release.clear()
    src = source(SlowPreparingPlugin)
    kept = tmp_path / "supervisor" / "code" / "gone-1-1"
    kept.mkdir(parents=True)
    (kept / "stormjar.jar").write_bytes(b"kept from an earlier run")
    result = []
    thread = threading.Thread(target=lambda: result.append(src.prepare()),
                              name="test-prepare")
    thread.start()
    try:
        assert SlowPreparingPlugin.entered.wait(10)
        assert src.remove_except(set()) == []
        assert kept.is_dir()
        src.close()
    finally:
        SlowPreparingPlugin.release.set()
        thread.join(10)
    assert result == [False]
    assert SlowPreparingPlugin.calls == ["prepare", "close"]
    assert src.prepare() is False   # closed: nothing is prepared again
    assert SlowPreparingPlugin.calls == ["prepare", "close"]
