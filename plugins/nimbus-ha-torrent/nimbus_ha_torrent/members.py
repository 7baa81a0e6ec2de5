"""Hosts still downloading a topology's code, so that downloaders find each other.

A complete copy is announced in the core's replica registry (whose count is the
replication count). If a downloader only looked there, hosts fetching the same bundle at
the same time would each pull all of it from the seeders and never trade pieces with one
another: client-server, not a swarm (a private torrent has no peer exchange). So while it
downloads, a host also announces its BitTorrent endpoint with an ephemeral node
``<root>/torrent-swarm/<topology-id>/<nimbus host:port>``, removed when the download ends
(the host is then a registered replica, or it failed).

This is a hint for finding peers, never a replica: a failure to write or read it is logged
and the download goes on with the registered replicas.

Every downloader lists the announcements about twice a second, so what a listing costs is
paid N times over by a fleet of N downloaders. :meth:`SwarmMembers.endpoints` therefore
reads an announcement's endpoint once, not at every listing: one ``getChildren`` (whose
reply carries the directory's ``cversion``) tells whether anything changed since the last
listing. An announcement removed and made again between two listings (a host restarted,
perhaps on another port) leaves the names as they were but moves ``cversion`` by two, so
then every endpoint is read again. Without this, 32 downloaders made about 2,200
ZooKeeper reads a second, and 200 would make 80,000. A supervisor stays announced while
it seeds; after a session expiry its announcements are made again on the new session
(``SessionRenewal``), or it would seed to no one until its next download.
"""

from __future__ import annotations

import logging
import posixpath
import threading
from dataclasses import dataclass, field

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError, NotEmptyError

from nimbus.plugin_api import SessionRenewal

log = logging.getLogger(__name__)

SUBTREE = "torrent-swarm"


@dataclass
class _Listing:
    """A topology's announcements as last listed: the directory's identity and child
    version, the names listed, and the endpoints read (a name whose node was empty or
    gone when read has none)."""

    czxid: int
    cversion: int
    names: frozenset[str]
    endpoints: dict[str, str] = field(default_factory=dict)


class SwarmMembers:
    """This host's in-progress announcements, and the other hosts' ones."""

    def __init__(self, zk: KazooClient, zk_root: str, host: str):
        self._zk = zk
        self._root = posixpath.join("/" + zk_root.strip("/"), SUBTREE)
        self._host = host
        self._lock = threading.Lock()
        self._announced: dict[str, str] = {}  # topology id -> endpoint, until left
        self._listings: dict[str, _Listing] = {}  # see endpoints()
        self._renewal = SessionRenewal(zk, "torrent-swarm", self._announce_again)

    def close(self) -> None:
        """Stop making announcements again after a session expiry (the ephemeral nodes go
        with the session)."""
        self._renewal.close()

    def _announce_again(self) -> None:
        with self._lock:
            announced = dict(self._announced)
        for topology_id, endpoint in announced.items():
            self._create(topology_id, endpoint)
        if announced:
            log.info("announced %d downloads and seeds again on the new ZooKeeper session",
                     len(announced))

    def _dir(self, topology_id: str) -> str:
        return posixpath.join(self._root, topology_id)

    def join(self, topology_id: str, endpoint: str) -> None:
        """Announce that this host is downloading (or seeding) ``topology_id`` at
        ``endpoint``, until :meth:`leave`, across session expiries."""
        with self._lock:
            self._announced[topology_id] = endpoint
        self._create(topology_id, endpoint)

    def _create(self, topology_id: str, endpoint: str) -> None:
        path = posixpath.join(self._dir(topology_id), self._host)
        reason = "its directory kept disappearing"
        for _ in range(3):  # another host may remove the empty directory in between
            try:
                self._zk.retry(self._zk.create, path, endpoint.encode(), ephemeral=True,
                               makepath=True)
                return
            except NodeExistsError:  # left by this host's previous session: make it ours
                self._remove(path)
            except NoNodeError:
                continue
            except KazooException as exc:
                reason = str(exc) or type(exc).__name__
                break
        log.warning("cannot announce the download of %s to other downloaders: %s",
                    topology_id, reason)

    def leave(self, topology_id: str) -> None:
        """Withdraw this host's announcement, and the topology's directory once empty."""
        with self._lock:
            self._announced.pop(topology_id, None)
        self._remove(posixpath.join(self._dir(topology_id), self._host))
        self.forget(topology_id)

    def forget(self, topology_id: str) -> None:
        """Remove the topology's directory if no download is announced in it (and drop
        what this host remembers of its listing)."""
        with self._lock:
            self._listings.pop(topology_id, None)
        self._remove(self._dir(topology_id))

    def endpoints(self, topology_id: str) -> dict[str, str]:
        """host -> BitTorrent endpoint of every host announced as downloading (or as
        seeding, for supervisors); one ZooKeeper read when nothing changed (see the
        module docstring)."""
        directory = self._dir(topology_id)
        try:
            names, stat = self._zk.retry(self._zk.get_children, directory,
                                         include_data=True)
        except NoNodeError:
            with self._lock:
                self._listings.pop(topology_id, None)
            return {}
        except KazooException as exc:
            log.warning("cannot list the other downloaders of %s: %s", topology_id, exc)
            return {}
        listed = frozenset(names)
        with self._lock:
            last = self._listings.get(topology_id)
        if last is not None and last.czxid != stat.czxid:
            last = None   # the directory was removed and made again: nothing carries over
        if last is not None and last.cversion == stat.cversion:
            return dict(last.endpoints)
        if last is None:
            unread = listed
        else:
            added, removed = listed - last.names, last.names - listed
            # Each create and each delete of a child moves cversion by one: more moves
            # than the names show means an announcement was removed and made again.
            hidden = stat.cversion - last.cversion - len(added) - len(removed)
            unread = listed if hidden > 0 else added
        out = {host: endpoint for host, endpoint in (last.endpoints if last else {}).items()
               if host in listed and host not in unread}
        for host in unread:
            try:
                data, _ = self._zk.retry(self._zk.get, posixpath.join(directory, host))
            except NoNodeError:  # that download just ended
                continue
            except KazooException as exc:
                log.warning("cannot read the announcement of %s for %s: %s", host,
                            topology_id, exc)
                return out   # not remembered: the next listing reads it all again
            if data:
                out[host] = data.decode("utf-8", "replace")
        with self._lock:
            self._listings[topology_id] = _Listing(stat.czxid, stat.cversion, listed, out)
        return dict(out)

    def _remove(self, path: str) -> None:
        try:
            self._zk.retry(self._zk.delete, path)
        except (NoNodeError, NotEmptyError):
            pass
        except KazooException as exc:  # an ephemeral node goes with the session anyway
            log.debug("could not remove %s: %s", path, exc)
