"""The local code store's listing (``LocalCodeStore.topologies``): answered again from
memory while the directory is unchanged, and never stale, whoever changes it."""

from __future__ import annotations

import os
import time

import pytest

from nimbus.distribution.local_code import LocalCodeStore, atomic_dir

OLD = 1_600_000_000  # seconds: a directory last changed long ago


@pytest.fixture
def store(tmp_path):
    return LocalCodeStore(tmp_path)


def quiet(store: LocalCodeStore) -> None:
    """Make the directory look unchanged for a long time (as between two submits)."""
    os.utime(store.root, (OLD, OLD))


def add(store: LocalCodeStore, topology_id: str) -> None:
    with atomic_dir(store.path(topology_id)) as building:
        (building / "stormcode.ser").write_bytes(b"x")


def counted_scans(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    scans: list[str] = []
    real = os.scandir

    def scandir(path):
        scans.append(str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    return scans


def test_an_unchanged_directory_is_not_listed_again(store, monkeypatch):
    add(store, "a-1-1")
    add(store, "b-2-2")
    quiet(store)
    scans = counted_scans(monkeypatch)
    assert store.topologies() == {"a-1-1", "b-2-2"}
    assert store.topologies() == {"a-1-1", "b-2-2"}
    assert len(scans) == 1
    held = store.topologies()
    held.add("mine")  # each caller gets its own set
    assert store.topologies() == {"a-1-1", "b-2-2"}


@pytest.mark.parametrize("change", ["added", "removed", "wiped by hand", "renamed in"])
def test_any_change_is_seen_at_the_next_call(store, tmp_path, change):
    add(store, "a-1-1")
    quiet(store)
    assert store.topologies() == {"a-1-1"}
    if change == "added":
        add(store, "b-2-2")
        expected = {"a-1-1", "b-2-2"}
    elif change == "removed":
        store.remove("a-1-1")
        expected = set()
    elif change == "wiped by hand":  # an operator empties storm.local.dir
        import shutil

        shutil.rmtree(store.root)
        store.root.mkdir()
        expected = set()
    else:  # a distributor's own download, renamed into place
        staged = tmp_path / "staged"
        staged.mkdir()
        os.rename(staged, store.root / "c-3-3")
        expected = {"a-1-1", "c-3-3"}
    assert store.topologies() == expected


def test_a_listing_of_a_directory_just_changed_is_not_kept(store, monkeypatch):
    """A file system stamps a change with a coarse clock: one made right after a listing
    could leave the mtime that listing saw. So a listing is kept only once the
    directory has been quiet for a while; until then each call lists again."""
    add(store, "a-1-1")
    now = time.time()
    os.utime(store.root, (now, now))
    scans = counted_scans(monkeypatch)
    store.topologies()
    os.utime(store.root, (now, now))  # a change within the same clock tick
    (store.root / "b-2-2").mkdir()
    os.utime(store.root, (now, now))
    assert store.topologies() == {"a-1-1", "b-2-2"}
    assert len(scans) == 2


def test_a_recent_listing_is_answered_when_asked_for_and_never_names_a_copy_it_removed(
        store, monkeypatch):
    """``max_age_s``: a listing that young is answered though the directory changed
    (a leader's directory changes at every submit). It lacks what was added since (the
    caller stats those) and never names a copy this store removed; an older one is
    listed again."""
    add(store, "a-1-1")
    add(store, "b-2-2")
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    scans = counted_scans(monkeypatch)
    assert store.topologies(max_age_s=10) == {"a-1-1", "b-2-2"}
    add(store, "c-3-3")
    clock[0] += 5
    assert store.topologies(max_age_s=10) == {"a-1-1", "b-2-2"}, "added since: not yet"
    assert store.has("c-3-3") and not store.has("x-9-9")
    assert store.topologies(max_age_s=10) == {"a-1-1", "b-2-2", "c-3-3"}, "found: kept"
    store.remove("c-3-3")
    add(store, "c-3-3")
    assert store.topologies() == {"a-1-1", "b-2-2", "c-3-3"}, "exact when not asked"
    assert scans.count(str(store.root)) == 2
    store.remove("b-2-2")
    add(store, "d-4-4")
    clock[0] += 5
    assert store.topologies(max_age_s=10) == {"a-1-1", "c-3-3"}, "removed here: gone"
    clock[0] += 6
    assert store.topologies(max_age_s=10) == {"a-1-1", "c-3-3", "d-4-4"}
    assert scans.count(str(store.root)) == 3  # (removing a copy scans that copy)


@pytest.mark.parametrize("how", ["made again", "replaced by a file"])
def test_a_wiped_directory_is_listed_at_once_however_recent_the_listing(store, how):
    """Age answers only for the same directory: one an operator wiped and made again,
    or replaced, is listed at once even when a recent listing was asked for."""
    import shutil

    add(store, "a-1-1")
    assert store.topologies(max_age_s=3600) == {"a-1-1"}
    store.root.rename(store.root.with_name("stormdist.lost"))
    shutil.rmtree(store.root.with_name("stormdist.lost"))
    if how == "made again":
        store.root.mkdir()
    else:
        store.root.write_bytes(b"")
    assert store.topologies(max_age_s=3600) == set()
    assert not store.has("a-1-1")
