"""The partition lab's network: one namespace per node, joined by a bridge in its own.

Nothing is added to the root namespace: the bridge lives in ``<prefix>-br``, each node's
namespace holds ``lo`` (up) and one end of a veth pair whose other end is a port of that
bridge, and the node's address comes from 198.18.0.0/24 (RFC 2544's benchmarking range,
never routed). There is no default route anywhere, so nothing in the lab can reach
beyond it, and the test process (root namespace) cannot reach the lab: whatever must
talk to the cluster runs inside the ``client`` node's namespace.

Namespace names carry a per-run prefix (``nhlab-<pid>``), so that two runs never share
one and :func:`remove_stale` can tell the leftovers of a dead run from a live one.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PREFIX = "nhlab"
SUBNET = "198.18.0"            # /24; .1 is left unused (no gateway: no default route)
NETNS_DIR = Path("/run/netns")
COMMAND_TIMEOUT_S = 20.0


class LabUnavailableError(RuntimeError):
    """This machine cannot build the lab (not root, no ``ip netns`` or no iptables)."""


@dataclass(frozen=True)
class Node:
    """One host of the lab: its namespace, its address, and its veth inside it."""

    name: str
    namespace: str
    address: str
    veth: str = "eth0"

    def argv(self, command: Sequence[str]) -> list[str]:
        """``command`` run inside this node's namespace."""
        return ["ip", "netns", "exec", self.namespace, *command]


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), capture_output=True, text=True,
                            timeout=COMMAND_TIMEOUT_S)
    if check and result.returncode != 0:
        raise LabUnavailableError(f"{' '.join(argv)} failed ({result.returncode}): "
                                  f"{result.stderr.strip() or result.stdout.strip()}")
    return result


def preflight() -> str | None:
    """Why the lab cannot run here, or None when it can: root, ``ip netns`` and iptables
    (checked by building and removing a throw-away namespace with a rule in it)."""
    if os.geteuid() != 0:
        return "the partition lab needs root (network namespaces and iptables)"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"the partition lab needs '{tool}' on PATH"
    probe = f"{PREFIX}-{os.getpid()}-preflight"
    try:
        _run(["ip", "netns", "add", probe])
    except (LabUnavailableError, OSError, subprocess.TimeoutExpired) as exc:
        return f"'ip netns add' does not work here: {exc}"
    try:
        _run(["ip", "netns", "exec", probe, "iptables", "-w", "5", "-A", "INPUT", "-s",
              f"{SUBNET}.1", "-j", "DROP"])
    except (LabUnavailableError, OSError, subprocess.TimeoutExpired) as exc:
        return f"iptables does not work inside a network namespace: {exc}"
    finally:
        _run(["ip", "netns", "del", probe], check=False)
    return None


def namespace_inode(namespace: str) -> int | None:
    """The inode of ``namespace``'s network namespace (what /proc/<pid>/ns/net links to)."""
    try:
        return os.stat(NETNS_DIR / namespace).st_ino
    except OSError:
        return None


def pids_in_namespaces(inodes: set[int]) -> list[int]:
    """Pids of live processes whose network namespace is one of ``inodes``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.stat(entry / "ns" / "net").st_ino in inodes:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _lab_namespaces() -> list[str]:
    return sorted(p.name for p in NETNS_DIR.iterdir()) if NETNS_DIR.is_dir() else []


def _remove(namespace: str) -> None:
    """Kill what runs inside ``namespace``, then delete it."""
    inode = namespace_inode(namespace)
    for pid in pids_in_namespaces({inode} if inode is not None else set()):
        _kill(pid)
    _run(["ip", "netns", "del", namespace], check=False)


def remove_stale() -> list[str]:
    """Delete the namespaces of lab runs whose process is gone (a run killed before its
    teardown); returns their names. Processes still inside them are killed first."""
    pattern = re.compile(rf"^{PREFIX}-(\d+)-")
    removed = []
    for namespace in _lab_namespaces():
        match = pattern.match(namespace)
        if match is not None and not _pid_alive(int(match.group(1))):
            _remove(namespace)
            removed.append(namespace)
    return removed


def remove_own() -> list[str]:
    """Delete every namespace of this process's runs still there (a finalizer's job after
    a run that was interrupted before its own teardown); returns their names."""
    own = f"{PREFIX}-{os.getpid()}-"
    removed = [ns for ns in _lab_namespaces() if ns.startswith(own)]
    for namespace in removed:
        _remove(namespace)
    return removed


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class LabNetwork:
    """The namespaces, veths and bridge of one lab run; :meth:`up`, then :meth:`down`."""

    def __init__(self, names: Sequence[str], prefix: str | None = None):
        """``names``: the nodes, in the order their addresses are handed out (from
        198.18.0.2). ``prefix``: the namespace prefix (default ``nhlab-<pid>``)."""
        self.prefix = prefix or f"{PREFIX}-{os.getpid()}"
        self.bridge_namespace = f"{self.prefix}-br"
        self.nodes = {name: Node(name, f"{self.prefix}-{name}", f"{SUBNET}.{2 + i}")
                      for i, name in enumerate(names)}
        self._made: list[str] = []   # namespaces created, in order (down() deletes them)

    def __getitem__(self, name: str) -> Node:
        return self.nodes[name]

    def up(self) -> LabNetwork:
        """Build everything; on any failure what was built is removed and the error
        raised."""
        try:
            self._add_namespace(self.bridge_namespace)
            _run(["ip", "-n", self.bridge_namespace, "link", "set", "lo", "up"])
            _run(["ip", "-n", self.bridge_namespace, "link", "add", "br0", "type", "bridge"])
            _run(["ip", "-n", self.bridge_namespace, "link", "set", "br0", "up"])
            for index, node in enumerate(self.nodes.values()):
                self._add_node(index, node)
        except BaseException:
            self.down()
            raise
        return self

    def _add_namespace(self, namespace: str) -> None:
        _run(["ip", "netns", "add", namespace])
        self._made.append(namespace)

    def _add_node(self, index: int, node: Node) -> None:
        self._add_namespace(node.namespace)
        port = f"port{index}"
        ns = ["ip", "-n", node.namespace]
        _run([*ns, "link", "set", "lo", "up"])
        # Both ends are created directly in their namespaces: the root namespace never
        # holds either, not even for a moment.
        _run(["ip", "-n", self.bridge_namespace, "link", "add", port, "type", "veth",
              "peer", "name", node.veth, "netns", node.namespace])
        _run(["ip", "-n", self.bridge_namespace, "link", "set", port, "master", "br0"])
        _run(["ip", "-n", self.bridge_namespace, "link", "set", port, "up"])
        _run([*ns, "addr", "add", f"{node.address}/24", "dev", node.veth])
        _run([*ns, "link", "set", node.veth, "up"])

    def run(self, node: Node, command: Sequence[str],
            check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``command`` in ``node``'s namespace and wait for it."""
        return _run(node.argv(command), check=check)

    def inodes(self) -> set[int]:
        found = {namespace_inode(ns) for ns in self._made}
        return {inode for inode in found if inode is not None}

    def kill_leftovers(self, grace_s: float = 5.0) -> list[int]:
        """SIGKILL every process still inside the lab's namespaces (workers of a killed
        supervisor, a JVM that ignored SIGTERM); returns their pids."""
        inodes = self.inodes()
        pids = pids_in_namespaces(inodes)
        for pid in pids:
            _kill(pid)
        deadline = time.monotonic() + grace_s
        while pids_in_namespaces(inodes) and time.monotonic() < deadline:
            time.sleep(0.1)  # the kernel reaps asynchronously; nothing to wait on
        return pids

    def down(self) -> list[str]:
        """Kill what still runs inside, delete every namespace made (the veths and the
        bridge go with them); returns the problems met, if any."""
        problems = []
        self.kill_leftovers()
        for namespace in reversed(self._made):
            result = _run(["ip", "netns", "del", namespace], check=False)
            if result.returncode != 0 and (NETNS_DIR / namespace).exists():
                problems.append(f"{namespace}: {result.stderr.strip()}")
        self._made.clear()
        return problems
