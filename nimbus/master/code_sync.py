"""Code sync: make this host hold the code of every live topology, and nothing else.

Code is held by *code key*: a topology's id for its submitted code (version 1), and
``<id>.v<N>`` for a later version (:mod:`nimbus.state.code_versions`). What a live
topology needs is the code of every version its ``/code-versions`` keeps (the id alone
for a topology never upgraded): that is what a nimbus must hold to lead
(:func:`nimbus.master.version_rules.required_code_keys`), and what the sync fetches.

One named loop (``code-sync``) per nimbus. It is woken by ZooKeeper watches (a topology
appears under ``storms`` or ``code-distributor``, its metafile is published, a replica
registers) and runs at least every ``nimbus.code.sync.freq.secs`` as a safety net.
Storm's design notes that its watch "pretty much never results in code download"; here
the watch path is the primary one, so replication completes within a download's time of
a submit.

A failed download is retried with a growing pause (capped by the sync period) and at
once when a new replica registers, since that host may serve what the others could not.

Removal is the dangerous half. A copy is removed only when ZooKeeper positively lists the
live topologies and this one is not among them: an absent ``storms`` directory, or a
root that now holds another cluster's id (:class:`LayoutMissingError`), stops the pass
before anything is removed, and a store that holds another cluster's code
(``cleanup_blocked``) is never cleaned. Removal here only drops *this host's* copy (the
``cleanup`` hook); shared storage is the leader's to delete. A code node whose metafile
this release cannot read (``RecordError``) fetches nothing but keeps the copy held here.
"""

from __future__ import annotations

import logging
import math
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kazoo.exceptions import KazooException

from nimbus.background_loop import BackgroundLoop
from nimbus.distribution.distributors import CodeDistributor
from nimbus.distribution.local_code import LocalCodeStore
from nimbus.master.needed_code import NeededCode
from nimbus.master.version_rules import required_code_keys
from nimbus.state.cluster_state import LayoutMissingError, StormClusterState, is_topology_id
from nimbus.state.cluster_view import ClusterView, ViewNotLoadedError
from nimbus.state.code_versions import is_version_key, topology_of
from nimbus.state.records import CodeMeta, RecordError
from nimbus.state.view_changes import ViewChanges

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CodeCheck:
    """One reading of whether this host holds every live topology's code: the code keys
    the live topologies need, read from ZooKeeper (their ids, and their kept versions'
    keys), and, of those, the ones missing on disk right after.

    True when nothing is missing. The elector grants leadership on such a reading and logs
    this very reading (``str()``), so the log shows the evidence the decision used, not a
    second look taken afterwards.
    """

    live: frozenset[str]
    missing: frozenset[str] = frozenset()
    # Missing topologies whose code no nimbus or store has offered for the grace period
    # (nimbus.code.lost.grace.secs): leading without them is allowed, degraded.
    lost: frozenset[str] = frozenset()

    @property
    def held(self) -> frozenset[str]:
        return self.live - self.missing

    @property
    def degraded(self) -> bool:
        """True when leading on this reading means leading without some code."""
        return bool(self.missing & self.lost)

    def __bool__(self) -> bool:
        return not (self.missing - self.lost)

    def __str__(self) -> str:
        held = len(self.live) - len(self.missing)
        if any(is_version_key(k) for k in self.live):
            topologies = len({topology_of(k) for k in self.live})
            text = (f"held {held} of {len(self.live)} code versions of "
                    f"{topologies} live topologies [{','.join(sorted(self.live))}]")
        else:
            text = (f"held {held} of {len(self.live)} live topologies "
                    f"[{','.join(sorted(self.live))}]")
        if self.degraded:
            text += (f"; DEGRADED, code lost on every nimbus: "
                     f"[{','.join(sorted(self.missing & self.lost))}]")
        return text


class CodeSync:
    """Download missing code and remove code of removed topologies; see module doc."""

    MAX_RETRY_PAUSE_S = 30.0
    #: How old a listing of this host's copies may be when the leader's code check and
    #: the sync pass read it (LocalCodeStore.topologies): a copy added since is found by
    #: a stat of its own, a copy deleted by hand is seen up to this much later.
    LISTING_MAX_AGE_S = 10.0
    READS = ("storms", "code-distributor", "code-versions")

    def __init__(
        self,
        state: StormClusterState,
        store: LocalCodeStore,
        distributor: CodeDistributor,
        period_s: float,
        protected: Callable[[], set[str]] = set,
        on_synced: Callable[[], None] = lambda: None,
        cleanup_blocked: str = "",
        cluster_id: str | None = None,
        on_fetch: Callable[[str, float, Path | None], None] | None = None,
        lost_grace_s: float | None = None,
        view: ClusterView | None = None,
    ):
        """``view`` is where a sync pass reads storms and code nodes; only
        :meth:`check_code` may be used without one."""
        self._state = state
        self._view = view
        self._store = store
        self._distributor = distributor
        self._period_s = period_s
        self._protected = protected
        self._on_synced = on_synced
        self._cleanup_blocked = cleanup_blocked
        self._cluster_id = cluster_id
        # (topology id, seconds, code dir or None if it failed) after each download: metrics.
        self._on_fetch = on_fetch
        # STORM-3664: how long a live topology's code may be on no nimbus and in no store
        # before it counts as lost and a nimbus may lead without it (None: never).
        self._lost_grace_s = lost_grace_s
        self._unavailable_since: dict[str, float] = {}  # guarded by _lost_lock
        self._reported_lost: frozenset[str] = frozenset()  # guarded by _lost_lock
        self._lost_lock = threading.Lock()
        self._retry_at: dict[str, float] = {}
        self._protected_now: set[str] = set()  # read by each pass (see _begin)
        self._failures: dict[str, int] = {}
        self._complete: bool | None = None
        #: Live topologies whose code this host lacked after the last pass (a metric).
        self.missing_count = 0
        self._layout_error = ""  # logged once per distinct problem, not every retry
        # Set by kazoo's event thread, taken by the sync thread: a lock makes the
        # test-and-clear atomic, so a flag raised in between is never lost.
        self._retry_now = False
        self._retry_lock = threading.Lock()
        self._pause_s = period_s  # until the next pass; each pass sets it
        self._loop = BackgroundLoop("code-sync", self._pass, period=lambda: self._pause_s)
        self.runs = 0
        # What the live topologies need, and what changed, each kept for one thread from
        # the view's changes: a pass and a leader's check cost what changed since the
        # last, with a look at every topology at least every LISTING_MAX_AGE_S.
        self._needed = NeededCode(view) if view is not None else None  # the sync's
        self._changes = ViewChanges(view, self.READS) if view is not None else None
        self._missing: set[str] = set()  # needed keys not held after the last pass
        self._full_at = -math.inf  # when the last pass that looked at everything began
        self._full_asked = threading.Event()
        self._check_needed = NeededCode(view) if view is not None else None  # the cycle's
        self._check_missing: set[str] = set()
        self._check_full_at = -math.inf
        self._check_full_asked = threading.Event()

    def start(self) -> None:
        if self._view is not None:
            self._view.listen(self._on_view_change)
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop(join_timeout=30)  # a download under way is finished first

    def _on_view_change(self, directory: str, code_key: str) -> None:
        if directory == "code-distributor":
            if code_key and self._changes_nothing_here(code_key):
                return
            self._on_replica_change(None)  # maybe a new place to fetch from
        elif directory == "storms":
            self._loop.wake()

    def _changes_nothing_here(self, code_key: str) -> bool:
        """Whether a change under ``code_key``'s code node (told on the view's thread)
        can give a pass nothing to do: this host holds that code, the node is still
        published, and no download waits for a retry. So another nimbus's replica
        registering for code held here costs no pass: at a submit every nimbus
        registers, and a pass reads every topology's code key."""
        if self._retry_at or self._view is None:
            return False
        try:
            if self._view.code_meta(code_key) is None:
                return False  # removed, or no metafile yet
            return self._store.has(code_key)
        except Exception:  # unreadable, not loaded, not a code key: let a pass judge
            return False

    def wake(self, _event: object = None) -> None:
        """Ask for a run soon; also the callback of every watch this sync leaves."""
        self._loop.wake()

    def resync(self) -> None:
        """Ask for a run soon that looks at every topology and lists the disk afresh
        (the leader found code missing: a copy may have been deleted by hand)."""
        self._full_asked.set()
        self._loop.wake()

    def check_cluster(self) -> None:
        """Raise LayoutMissingError unless ZooKeeper's root still holds the cluster this
        nimbus joined (nothing to check when it was built without a cluster id)."""
        if self._cluster_id is not None:
            self._state.check_cluster(self._cluster_id)

    def check_code(self, leading: bool = False) -> CodeCheck:
        """Read the live topologies and the code keys they need (one listing of storms,
        one of code-versions and a read per upgraded topology), then which of those this
        host holds. Lost code (STORM-3664) is judged per code key.

        ``leading``: this nimbus leads (its view is loaded and watched) and checks at
        every cycle: the answer comes from the view after a barrier, brought up to date
        by what changed since the last check, with a look at every topology and a fresh
        listing of the disk at least every LISTING_MAX_AGE_S and whenever the store's
        directory was wiped whole. A nimbus about to take the lock lists ZooKeeper and
        the disk.

        Raises LayoutMissingError when that cannot be known (see the module docstring).
        """
        self.check_cluster()
        checked = self._leaders_check() if leading else None
        if checked is None:
            needed = required_code_keys(self._state, self._state.active_storms())
            self._store_replaced()  # told before this listing hides it from the others
            # About to take the lock: a listing now, not a recent one.
            missing = needed - self._store.topologies()  # one listing, not a stat per key
        else:
            needed, missing = checked
        return CodeCheck(live=needed, missing=missing,
                         lost=self._note_unavailable(missing))

    def _leaders_check(self) -> tuple[frozenset[str], frozenset[str]] | None:
        """(needed, missing) from the view, kept by change (see :meth:`check_code`); None
        when the view cannot answer (not loaded: the caller lists ZooKeeper instead)."""
        needs = self._check_needed
        if needs is None or self._view is None:
            return None
        now = time.monotonic()
        full = self._store_replaced() or self._check_full_asked.is_set() \
            or now - self._check_full_at >= self.LISTING_MAX_AGE_S
        if full:
            needs.everything()  # the needed keys computed afresh too, not only the disk
        try:
            self._view.barrier(directories=self.READS)
            delta = needs.update()
        except ViewNotLoadedError:
            return None
        try:
            if full or delta is None:
                missing = needs.keys - self._store.topologies()
            else:
                # Only what was missing and what was added can be missing now: a stat
                # each.
                missing = self._check_missing | delta[0]
            self._check_missing = {k for k in missing
                                   if k in needs and not self._store.has(k)}
        except BaseException:
            # The changes were taken: the next check looks at everything instead.
            needs.everything()
            self._check_full_asked.set()
            raise
        if full or delta is None:
            self._check_full_asked.clear()
            self._check_full_at = now
        return needs.keys, frozenset(self._check_missing)

    def _note_unavailable(self, missing: frozenset[str]) -> frozenset[str]:
        """Of ``missing`` (code keys), those no source has offered for the grace period.

        A code key with a replica anywhere (``get_replication_count`` > 0) is never lost:
        the sync fetches it. Its clock restarts whenever a replica appears.
        """
        if self._lost_grace_s is None or not missing:
            with self._lost_lock:
                self._unavailable_since.clear()
                self._reported_lost = frozenset()
            return frozenset()
        sources = {t: self._distributor.get_replication_count(t) for t in missing}
        now = time.monotonic()
        with self._lost_lock:
            for topology_id in list(self._unavailable_since):
                if topology_id not in missing or sources[topology_id] > 0:
                    del self._unavailable_since[topology_id]
            for topology_id, count in sources.items():
                if count == 0:
                    self._unavailable_since.setdefault(topology_id, now)
            lost = frozenset(t for t, since in self._unavailable_since.items()
                             if now - since >= self._lost_grace_s)
            changed, self._reported_lost = lost != self._reported_lost, lost
        if changed and lost:
            log.error("the code of %d live topologies has been on no nimbus and in no store "
                      "for %.0fs: counted as lost [%s]. A nimbus may now lead without it, "
                      "degraded: no submissions until the code returns (restore a nimbus's "
                      "storm.local.dir or the store) or those topologies are killed",
                      len(lost), self._lost_grace_s, ",".join(sorted(lost)))
        return lost

    def lost_topologies(self) -> frozenset[str]:
        """Code keys of live topologies that this host lacks and that counted as lost at
        the last check (see :meth:`check_code`): while any are, the leader is degraded."""
        if self._lost_grace_s is None:
            return frozenset()
        now = time.monotonic()
        with self._lost_lock:
            candidates = [t for t, since in self._unavailable_since.items()
                          if now - since >= self._lost_grace_s]
        return frozenset(t for t in candidates if not self._store.has(t))

    def missing(self) -> set[str]:
        """Code keys of topologies under /storms that this host lacks (see
        :meth:`check_code`)."""
        return set(self.check_code().missing)

    def _pass(self) -> None:
        """One pass of the ``code-sync`` loop; sets the pause before the next one.

        A wake-up that arrives while it runs makes the next pass begin at once."""
        pause = self._period_s
        try:
            self.sync_once()
            if self._layout_error:
                log.info("code sync resumed: the cluster layout is back")
                self._layout_error = ""
            if self._retry_at:
                pause = min(pause, max(0.05, min(self._retry_at.values()) - time.monotonic()))
        except LayoutMissingError as exc:
            if str(exc) != self._layout_error:
                log.error("code sync stopped, nothing fetched or removed: %s", exc)
            self._layout_error = str(exc)
            pause = min(pause, 5.0)
        except (KazooException, ViewNotLoadedError) as exc:
            log.warning("code sync could not read cluster state: %s", exc)
            pause = min(pause, 1.0)
        except Exception:
            log.exception("code sync run failed")
            pause = min(pause, 5.0)
        self._pause_s = pause
        try:
            self._on_synced()  # after every pass, failed ones too
        except Exception:
            log.exception("code sync callback failed")

    def _take_retry_now(self) -> bool:
        with self._retry_lock:
            flagged, self._retry_now = self._retry_now, False
            return flagged

    def sync_once(self) -> None:
        """One pass: fetch what is missing, drop what is gone.

        A pass looks at the code keys that changed since the last one (the topologies
        and code nodes named by the view's changes, and any download waiting to be
        retried). It looks at every topology, with a fresh listing of the disk, when
        the last such pass began LISTING_MAX_AGE_S ago or more, when the view was read
        again, when the store's directory was wiped whole or replaced, and when
        :meth:`resync` asked."""
        self.runs += 1
        if self._view is None or self._changes is None or self._needed is None:
            raise RuntimeError("CodeSync.sync_once needs a ClusterView")
        # Taken before anything is read (see ViewChanges); given back if the pass fails.
        changed = self._changes.take()
        try:
            if (self._store_replaced() or self._full_asked.is_set() or changed is None
                    or time.monotonic() - self._full_at >= self.LISTING_MAX_AGE_S):
                self._sync_everything()
            else:
                self._sync_changed(changed)
        except BaseException:
            self._changes.everything()
            raise

    def _store_replaced(self) -> bool:
        """Whether the store's directory was wiped whole or replaced (one stat). Then the
        next pass and the next leader's check both look at everything: whichever lists
        the new directory first hides the change from the other."""
        if not self._store.replaced():
            return False
        self._full_asked.set()
        self._check_full_asked.set()
        self._loop.wake()
        return True

    def _begin(self) -> None:
        """After the disk was read: the submissions in flight, then ZooKeeper. A copy on
        disk is then either still protected or already visible as a storm or a published
        metafile, never mistaken for the code of a removed topology."""
        self._protected_now = self._protected()
        self.check_cluster()
        if self._take_retry_now():
            self._retry_at = dict.fromkeys(self._retry_at, 0.0)
        # A constant number of round trips; the listing and the metafiles come from memory.
        assert self._view is not None
        self._view.barrier(directories=self.READS)

    def _sync_everything(self) -> None:
        assert self._view is not None and self._needed is not None
        self._full_asked.clear()
        self._full_at = time.monotonic()
        view, needs = self._view, self._needed
        held = self._store.topologies()  # the disk first (see _begin)
        self._begin()
        needs.everything()  # the needed keys computed afresh too, not only the disk
        needs.update()
        needed = needs.keys
        topologies = len(view.active_storms())  # counted with the keys, not after fetches
        # Set operations on the view's shared records. A code node this release cannot
        # read (logged by the state) gives nothing to fetch from, but a copy held here is
        # kept: an unreadable node (say, a newer release's) is not a removal.
        published = view.code_metas()
        wanted = needed | published.keys() | view.unreadable("code-distributor")
        missing_before = needed - held
        self._fetch_missing(sorted(wanted - held), published.get)
        self._remove_unwanted(sorted(held - wanted - self._protected_now))
        for code_key in list(self._retry_at):
            if code_key not in wanted or self._store.has(code_key):
                self._forget_retry(code_key)
        self._missing = {k for k in missing_before if not self._store.has(k)}
        self._report_completeness(missing_before, len(needed), topologies)

    def _sync_changed(self, changed: set[str]) -> None:
        """A pass over the code keys named by ``changed`` (topology ids and code keys)."""
        assert self._view is not None and self._needed is not None
        view, needs = self._view, self._needed
        keys = {name for name in changed if is_topology_id(name)}  # code keys, ids
        for topology_id in {topology_of(name) for name in keys}:
            keys |= needs.keys_of(topology_id)  # what it needed before the change
        held = {k for k in keys if self._store.has(k)}  # the disk first (see _begin)
        self._begin()
        delta = needs.update()
        if delta is None:  # the view was read again meanwhile
            self._sync_everything()
            return
        topologies = len(view.active_storms())  # counted with the keys, not after fetches
        unreadable = view.unreadable("code-distributor")
        metas = {k: self._published(k) for k in keys | delta[0] | self._retry_at.keys()}

        def wanted(code_key: str) -> bool:
            return (code_key in needs or metas.get(code_key) is not None
                    or code_key in unreadable)

        looked_at = (keys | delta[0] | self._missing) & needs.keys
        missing_before = {k for k in looked_at if not self._store.has(k)}
        self._fetch_missing(sorted(metas.keys() - held), metas.get)
        self._remove_unwanted(sorted(k for k in held - self._protected_now
                                     if not wanted(k)))
        for code_key in list(self._retry_at):
            if not wanted(code_key) or self._store.has(code_key):
                self._forget_retry(code_key)
        self._missing = {k for k in missing_before if not self._store.has(k)}
        self._report_completeness(missing_before, len(needs), topologies)

    def _published(self, code_key: str) -> CodeMeta | None:
        """``code_key``'s published metafile; None when it has none, or none that this
        release can read (``wanted`` then keeps a copy held here: see _sync_everything)."""
        assert self._view is not None
        try:
            return self._view.code_meta(code_key)
        except RecordError:
            return None

    def _fetch_missing(self, code_keys: list[str],
                       published: Callable[[str], CodeMeta | None]) -> None:
        for code_key in code_keys:
            meta = published(code_key)
            if meta is None:
                continue  # live, but no metafile yet: a submission in flight
            if self._store.has(code_key):
                continue  # arrived since the disk was read (this leader's own submission)
            if time.monotonic() >= self._retry_at.get(code_key, 0):
                self._fetch(code_key, meta.metafile)

    def _remove_unwanted(self, code_keys: list[str]) -> None:
        for code_key in code_keys:
            if self._cleanup_blocked:
                log.error("not removing code of %s: %s", code_key, self._cleanup_blocked)
                continue
            if self._still_there(code_key):
                continue  # the view trailed ZooKeeper; the next pass sees it
            log.info("removing code of %s: the topology is gone", code_key)
            try:
                self._distributor.cleanup(code_key)
            finally:
                self._store.remove(code_key)

    def _forget_retry(self, code_key: str) -> None:
        self._retry_at.pop(code_key, None)
        self._failures.pop(code_key, None)

    def _still_there(self, code_key: str) -> bool:
        """Read ZooKeeper itself before removing anything: the code node of ``code_key``
        still exists, or its topology does and still needs it (a few round trips, for
        removals only)."""
        zk = self._state.zk
        if zk.retry(zk.exists, self._state.code_path(code_key)) is not None:
            return True
        topology_id = topology_of(code_key)
        if zk.retry(zk.exists, self._state.storm_path(topology_id)) is None:
            return False
        return code_key in required_code_keys(self._state, [topology_id])

    def _report_completeness(self, missing_before: set[str], needed: int,
                             topologies: int) -> None:
        # Logged when it changes, and after a pass that fetched missing code, so that an
        # operator (or a test) sees the moment this host became able to lead.
        missing = sorted(self._missing)
        self.missing_count = len(missing)
        versions = f" ({needed} code versions)" if needed != topologies else ""
        if missing:
            if self._complete is not False:
                if versions:
                    log.info("code incomplete: missing %d of %d code versions of %d live "
                             "topologies [%s]", len(missing), needed, topologies,
                             ",".join(missing))
                else:
                    log.info("code incomplete: missing %d of %d live topologies [%s]",
                             len(missing), topologies, ",".join(missing))
            self._complete = False
        elif self._complete is not True or missing_before:
            log.info("code complete: holds all %d live topologies%s", topologies, versions)
            self._complete = True

    def _on_replica_change(self, _event: object) -> None:
        # kazoo's event thread: only flag; the sync thread owns _retry_at.
        with self._retry_lock:
            self._retry_now = True
        self._loop.wake()

    def _fetch(self, topology_id: str, metafile: bytes) -> None:
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="metafile-") as tmp:
            meta_path = Path(tmp) / f"{topology_id}.meta"
            meta_path.write_bytes(metafile)
            try:
                files = self._distributor.download(
                    self._store.path(topology_id), topology_id, meta_path)
                if not self._store.has(topology_id):
                    raise RuntimeError(f"{self._distributor.name} returned without the code "
                                       f"of {topology_id} in place")
            except Exception as exc:
                failures = self._failures.get(topology_id, 0) + 1
                self._failures[topology_id] = failures
                pause = min(self.MAX_RETRY_PAUSE_S, self._period_s, 0.5 * 2 ** failures)
                self._retry_at[topology_id] = time.monotonic() + pause
                log.warning("download of %s failed (attempt %d, next in %.1fs): %s",
                            topology_id, failures, pause, exc)
                self._report_fetch(topology_id, started, None)
                return
        log.info("downloaded %s: %d files in %.2fs", topology_id, len(files),
                 time.monotonic() - started)
        self._report_fetch(topology_id, started, self._store.path(topology_id))

    def _report_fetch(self, topology_id: str, started: float, code_dir: Path | None) -> None:
        if self._on_fetch is None:
            return
        try:
            self._on_fetch(topology_id, time.monotonic() - started, code_dir)
        except Exception:
            log.exception("code sync fetch callback failed")
