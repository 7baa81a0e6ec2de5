"""Benchmark: the scale figures of issue 9 (N topologies, S supervisors), each beside
its baseline at a small number of topologies measured in the same run.

    .venv/bin/python benchmarks/bench_scale.py [--topologies 5000] [--supervisors 100] \
        [--baseline 100] [--nimbuses 2] [--session-timeout-ms 4000]

What runs: one real ZooKeeper, ``--nimbuses`` real ``nimbus-ha nimbus`` processes (localfs,
so every nimbus holds every bundle) and ``--supervisors`` supervisors, each with its own
ZooKeeper session: ``--real-supervisors`` real ``nimbus-ha supervisor`` processes (they
also watch and read every assignment, as supervisors do), the rest lightweight ones
played by a few helper processes of this script (one kazoo session each, registering an
ephemeral SupervisorInfo like a supervisor, rewriting it every
``supervisor.heartbeat.frequency.secs`` and making the lease's ``exists`` round trip every
second; they run no workers and read no assignments).

Topologies are small bundles submitted INACTIVE over real Thrift (upload, then
submitTopologyWithOpts, as ``storm jar`` does) from ``--submit-threads`` client threads.
Inactive, because the supervisors run no workers: an active topology would be placed, then
moved after every ``nimbus.task.launch.secs`` for ever, a churn no real cluster has. The
scheduler still reads every topology's StormBase, Assignment and worker beats on each pass,
so its pass costs what it costs at that size; only the placements are missing.

Figures, measured at ``--baseline`` topologies and again at ``--topologies``:

* has-all-code check: ``CodeSync.check_code`` (what the elector calls before it takes the
  lock) run here against a follower's own storm.local.dir and the real ZooKeeper;
* getClusterInfo latency over Thrift on the leader and on a follower (p50/p99/max),
  also with this client's garbage collector off (its own collections apart);
* ZooKeeper requests per submit: the server's per-connection "recved" counters (4lw
  ``cons``), attributed to processes through /proc, during ``--probe-submits`` sequential
  submits (until every nimbus holds their code), minus the rate of an idle window just
  before, divided by the submits. The lightweight supervisors stop rewriting their
  heartbeats for both windows (their sessions and nodes stay): every nimbus re-reads a
  rewritten node, and 1,000 supervisors' beats would swamp what the submits cost. 40
  submits by default: each nimbus's view audit checks nodes in bursts of about 100, and
  one burst in the window of ten submits moved the figure by about 10 a submit;
* CPU per submit of each daemon (leader, follower, real supervisor): its user + system
  time during the same probe submits, minus its idle window's rate, divided by the
  submits;
* bulk submit rate: of the first ``--baseline`` submits and of the last ``--baseline``;
* one scheduler pass: the leader's own DEBUG line "scheduler pass: ... in X ms";
* nimbus RSS (VmRSS) of the leader and a follower;
* the nimbuses' full garbage collections while measured (their /metrics
  ``nimbus_gc_pause_seconds{generation="2"}``): how many, and the slowest's bucket.
  ``--gc-freeze-secs 0`` turns the heap freeze off (``nimbus.gc.freeze.secs``), for
  the figures without it;
* with ``--soak-minutes M``: M minutes at ``--topologies`` before the failover trials,
  with each nimbus's RSS and full collections every 30 s, and what each thaw of the
  heap freeze found to free;
* at ``--topologies`` only: kill -9 failover time over ``--failover-trials`` trials, as a
  ratio to the session timeout (until a survivor answers getLeader naming itself), and
  from the survivor's own "gained leadership" log line.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from prometheus_client.parser import text_string_to_metric_families

from nimbus.dev.cluster import LocalCluster, NimbusProcess, sample_topology, wait_for
from nimbus.distribution.archive import pack_directory
from nimbus.thrift import storm
from nimbus.thrift.client import connect

ROOT = "/storm"
SUPERVISOR_PORTS = [6700, 6701, 6702, 6703]  # advertised by the lightweight supervisors only
PASS_LINE = re.compile(r"^(\S+ \S+) (?:DEBUG|INFO) .*scheduler pass: (\d+) topologies, (\d+) "
                       r"supervisors, (\d+) assignments written in ([\d.]+) ms")
GAINED_LINE = re.compile(r"^(\S+ \S+) INFO .* gained leadership as ")
THAW_LINE = re.compile(r"full garbage collection \(thaw\) took (\d+) ms, found (\d+) unreachable")


# -- processes ------------------------------------------------------------------------------
def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used (its threads included)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_by_role(roles: dict[int, str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for pid, role in roles.items():
        out[role] = out.get(role, 0.0) + cpu_s(pid)
    return out


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def group_pids(pid: int) -> set[int]:
    """Every live process in ``pid``'s process group (the daemons run in their own)."""
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pid:
                    out.add(int(entry))
            except OSError:
                continue
    return out


def pin(pids: set[int], cpus: set[int]) -> None:
    """Every thread of each process in ``pids`` (and of its process group) onto ``cpus``;
    threads made later inherit it."""
    for pid in {p for leader in pids for p in group_pids(leader) | {leader}}:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(tid), cpus)


def split_cpus(cluster: LocalCluster, fakes: FakeSupervisors) -> str:
    """--split-cpus: the nimbuses and this client on the last CPU, ZooKeeper and the
    supervisors (real and lightweight) on the others, as if those ran on hosts of their
    own. A kernel's work for one process then cannot hold up the other side's CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--split-cpus needs at least 2 CPUs")
    measured, rest = {cpus[-1]}, set(cpus[:-1])
    pin({n.process.pid for n in cluster.nimbuses} | {os.getpid()}, measured)
    others = {s.process.pid for s in cluster.supervisors} | fakes.pids
    if cluster.zk.process is not None:
        others.add(cluster.zk.process.pid)
    pin(others, rest)
    return f"nimbuses and client on CPU {cpus[-1]}, the rest on {sorted(rest)}"


# -- lightweight supervisors ------------------------------------------------------------------
def fake_supervisors_main(spec: dict[str, Any]) -> None:
    """Helper process: ``spec["count"]`` supervisor sessions until SIGTERM."""
    from kazoo.retry import KazooRetry

    from nimbus import __version__
    from nimbus.state.records import SupervisorInfo
    from nimbus.state.zk_handler import PollingThreadingHandler

    if spec.get("nice"):
        os.nice(spec["nice"])  # see --fleet-nice
    stop = threading.Event()
    paused = threading.Event()  # SIGUSR1: no heartbeat writes until SIGUSR2
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, lambda *_: paused.set())
    signal.signal(signal.SIGUSR2, lambda *_: paused.clear())
    started = time.time()

    def info(sid: str, host: str) -> bytes:
        return SupervisorInfo(time_secs=int(time.time()), hostname=host, assignment_id=sid,
                              used_ports=[], meta=list(SUPERVISOR_PORTS),
                              uptime_secs=int(time.time() - started),
                              version=__version__).encode()

    sessions = []
    try:
        for i in range(spec["count"]):
            if stop.is_set():
                return
            # The handler of a real supervisor's client (make_zk_client).
            zk = KazooClient(hosts=spec["hosts"], timeout=spec["timeout_s"],
                             handler=PollingThreadingHandler(),
                             connection_retry=KazooRetry(max_tries=-1, max_delay=1.0))
            zk.start(timeout=30)
            sid = str(uuid.uuid4())
            host = f"lightweight-{spec['index']}-{i}"
            path = f"{ROOT}/supervisors/{sid}"
            zk.create(path, info(sid, host), ephemeral=True)
            sessions.append((zk, sid, host, path))
        print("ready", flush=True)
        next_beat = time.monotonic() + spec["heartbeat_s"]
        while not stop.wait(1.0):
            # The lease's round trip of every supervisor, every second.
            pending = [(s, s[0].exists_async(s[3])) for s in sessions]
            beat = time.monotonic() >= next_beat
            if beat:
                next_beat += spec["heartbeat_s"]
                beat = not paused.is_set()
            for (zk, sid, host, path), result in pending:
                try:
                    stat = result.get(timeout=10)
                    if stat is None:  # a new session after an expiry: register again
                        zk.create(path, info(sid, host), ephemeral=True)
                    elif beat:
                        zk.set_async(path, info(sid, host))
                except Exception as exc:  # noqa: BLE001 - keep beating the others
                    print(f"supervisor {sid}: {exc!r}", file=sys.stderr, flush=True)
    finally:
        for zk, *_ in sessions:
            try:
                zk.stop()
                zk.close()
            except Exception:  # noqa: BLE001 - closing what is left
                pass


class FakeSupervisors:
    """``total`` lightweight supervisors spread over ``procs`` helper processes."""

    def __init__(self, work_dir: Path, hosts: str, total: int, procs: int, timeout_s: float,
                 heartbeat_s: float, nice: int = 0):
        self.processes: list[subprocess.Popen[bytes]] = []
        self._specs = []
        procs = max(1, min(procs, total)) if total else 0
        for index in range(procs):
            count = total // procs + (index < total % procs)
            self._specs.append({"hosts": hosts, "count": count, "timeout_s": timeout_s,
                                "heartbeat_s": heartbeat_s, "index": index, "nice": nice})
        self._logs = [work_dir / f"lightweight-supervisors-{i}.log" for i in range(procs)]

    def start(self) -> None:
        for spec, log_file in zip(self._specs, self._logs, strict=True):
            with open(log_file, "ab") as log:
                self.processes.append(subprocess.Popen(
                    [sys.executable, __file__, "--lightweight-supervisors", json.dumps(spec)],
                    stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                    start_new_session=True))
        for process, log_file in zip(self.processes, self._logs, strict=True):
            line = process.stdout.readline()
            if line.strip() != b"ready":
                raise RuntimeError(f"lightweight supervisors failed:\n{log_file.read_text()}")

    @property
    def pids(self) -> set[int]:
        return {p.pid for p in self.processes}

    def pause_heartbeats(self, paused: bool) -> None:
        """Stop (or resume) rewriting the SupervisorInfos; the sessions, their nodes and
        their lease round trips go on. A nimbus re-reads each rewritten node, so 1,000
        heartbeats are 200 reads a second on every nimbus: that swamps what a few
        submits cost, in the count of requests per submit."""
        for process in self.processes:
            process.send_signal(signal.SIGUSR2 if not paused else signal.SIGUSR1)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
            if process.stdout is not None:
                process.stdout.close()


# -- ZooKeeper request counting ---------------------------------------------------------------
def four_letter(port: int, command: str) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(command.encode())
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


CONS_LINE = re.compile(r"/127\.0\.0\.1:(\d+)\[\d+\]\(.*?recved=(\d+)")


def zk_received_by_port(zk_port: int) -> dict[int, int]:
    """client port -> requests ZooKeeper received on that connection (pings included)."""
    return {int(p): int(n) for p, n in CONS_LINE.findall(four_letter(zk_port, "cons"))}


def zk_client_ports(zk_port: int, pids: dict[int, str]) -> dict[int, str]:
    """client port -> the role of the process (``pids``: pid -> role) owning it."""
    inodes: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], fields[9]
            if int(remote.rsplit(":", 1)[1], 16) == zk_port:
                inodes[inode] = int(local.rsplit(":", 1)[1], 16)
    out = {}
    for pid, role in pids.items():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                port = inodes.get(target[8:-1])
                if port is not None:
                    out[port] = role
    return out


class RequestCounter:
    """ZooKeeper requests received per role between two readings."""

    def __init__(self, zk_port: int, roles: Callable[[], dict[int, str]]):
        self._zk_port = zk_port
        self._roles = roles

    def read(self) -> dict[int, int]:
        return zk_received_by_port(self._zk_port)

    def since(self, before: dict[int, int]) -> dict[str, int]:
        after = self.read()
        owners = zk_client_ports(self._zk_port, self._roles())
        out: dict[str, int] = {}
        for port, count in after.items():
            role = owners.get(port, "other")
            # A connection made meanwhile counts from zero.
            out[role] = out.get(role, 0) + count - before.get(port, 0)
        out["other"] = out.get("other", 0)
        return out


# -- Thrift ----------------------------------------------------------------------------------
def leader_of(cluster: LocalCluster, timeout_s: float = 120) -> NimbusProcess:
    """The nimbus that answers getLeader naming itself (cheap: the summary cache only)."""
    def find() -> NimbusProcess | None:
        for nimbus in cluster.nimbuses:
            if nimbus.alive() and names_itself(nimbus):
                return nimbus
        return None
    return wait_for(find, timeout_s, "a leader", interval_s=0.1)


def names_itself(nimbus: NimbusProcess) -> bool:
    try:
        with connect(nimbus.address, timeout_s=5) as client:
            leader = client.getLeader()
    except Exception:  # noqa: BLE001 - not up, or no leader yet
        return False
    return f"{leader.host}:{leader.port}" == nimbus.address


def named_leader(nimbus: NimbusProcess, answers: list[tuple[float, str, str]]) -> str:
    """The leader ``nimbus`` names over getLeader ("" if it does not answer); each answer
    is noted in ``answers``."""
    try:
        with connect(nimbus.address, timeout_s=5) as client:
            leader = client.getLeader()
        named = f"{leader.host}:{leader.port}"
    except Exception:  # noqa: BLE001 - no leader yet
        named = ""
    answers.append((time.time(), nimbus.address, named))
    return named


def submit_raw(client: Any, name: str, bundle: bytes) -> None:
    """Upload and submit as ``storm jar`` does (no getClusterInfo afterwards)."""
    location = client.beginFileUpload()
    client.uploadChunk(location, bundle)
    client.finishFileUpload(location)
    client.submitTopologyWithOpts(
        name, location, json.dumps({"topology.min.replication.count": 1}),
        storm.StormTopology(spouts={}, bolts={}, state_spouts={}),
        storm.SubmitOptions(initial_status=storm.TopologyInitialStatus.INACTIVE))


def submit_many(leader: NimbusProcess, names: list[str], bundle: bytes, threads: int) -> float:
    """Submit ``names`` from ``threads`` client threads; returns the seconds it took."""
    queue = list(reversed(names))
    lock = threading.Lock()
    errors: list[str] = []

    def worker() -> None:
        with connect(leader.address, timeout_s=120) as client:
            while True:
                with lock:
                    if not queue or len(errors) > 5:
                        return
                    name = queue.pop()
                try:
                    submit_raw(client, name, bundle)
                except Exception as exc:  # noqa: BLE001 - reported below
                    with lock:
                        errors.append(f"{name}: {exc!r}")
                    return

    started = time.monotonic()
    pool = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, threads))]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise RuntimeError("submits failed: " + "; ".join(errors[:5]))
    return time.monotonic() - started


def held(nimbus: NimbusProcess) -> int:
    root = nimbus.local_dir / "nimbus" / "stormdist"
    return sum(1 for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) \
        if root.is_dir() else 0


def wait_replicated(cluster: LocalCluster, count: int, timeout_s: float) -> float:
    started = time.monotonic()
    wait_for(lambda: all(held(n) >= count for n in cluster.nimbuses if n.alive()),
             timeout_s, f"every nimbus to hold {count} topologies", interval_s=0.2)
    return time.monotonic() - started


def cluster_info_latencies(nimbus: NimbusProcess, calls: int, expected: int,
                           budget_s: float, client_collects: bool = True) -> list[float]:
    """``calls`` sequential getClusterInfo calls over one connection, or as many as
    ``budget_s`` allows (at least 20). ``client_collects`` False: this process's garbage
    collector is off meanwhile, so that what is timed is the nimbus's answer, the
    transfer and the decoding, without this client's own collections (a 1.2 MB answer
    at 10,000 topologies is 11,000 structs, which a Python client collects often)."""
    out: list[float] = []
    was_enabled = gc.isenabled()
    # This benchmark's own objects (its clients, results, ZooKeeper session) are frozen
    # out of its collections meanwhile: a user's client process has none of them, and
    # each full collection here walked them (15-25 ms, in the timed calls).
    gc.collect()
    gc.freeze()
    if not client_collects:
        gc.disable()
    try:
        return _timed_cluster_info(nimbus, calls, expected, budget_s, out)
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()


def _timed_cluster_info(nimbus: NimbusProcess, calls: int, expected: int,
                        budget_s: float, out: list[float]) -> list[float]:
    with connect(nimbus.address, timeout_s=300) as client:
        listed = len(client.getClusterInfo().topologies)  # warm-up, and a check
        if listed != expected:
            raise AssertionError(f"{nimbus.address} lists {listed} topologies, not "
                                 f"{expected}")
        # Not kept: a reply held meanwhile (11,000 structs at 10,000 topologies) would be
        # walked by each of this client's full collections in the timed calls.
        deadline = time.monotonic() + budget_s
        while len(out) < calls and (len(out) < 20 or time.monotonic() < deadline):
            started = time.perf_counter()
            client.getClusterInfo()
            out.append(time.perf_counter() - started)
    return out


def full_collections(nimbus: NimbusProcess) -> dict[str, Any]:
    """The nimbus's full garbage collections so far, from its /metrics: how many, their
    seconds in all, and each bucket's cumulative count."""
    with urllib.request.urlopen(nimbus.metrics_url, timeout=30) as answer:
        text = answer.read().decode()
    out: dict[str, Any] = {"count": 0, "sum": 0.0, "buckets": {}}
    for family in text_string_to_metric_families(text):
        if family.name != "nimbus_gc_pause_seconds":
            continue
        for sample in family.samples:
            if sample.labels.get("generation") != "2":
                continue
            if sample.name.endswith("_count"):
                out["count"] = sample.value
            elif sample.name.endswith("_sum"):
                out["sum"] = sample.value
            elif sample.name.endswith("_bucket"):
                out["buckets"][float(sample.labels["le"])] = sample.value
    return out


def collections_between(before: dict[str, Any], after: dict[str, Any],
                        seconds: float) -> dict[str, float]:
    """Full collections from ``before`` to ``after``: count, mean and the bound of the
    slowest's bucket (nan when none)."""
    count = after["count"] - before["count"]
    slowest = next((bound for bound in sorted(after["buckets"])
                    if after["buckets"][bound] - before["buckets"].get(bound, 0) >= count),
                   float("nan")) if count else float("nan")
    return {"count": count, "seconds": seconds,
            "mean": (after["sum"] - before["sum"]) / count if count else float("nan"),
            "slowest_le": slowest}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


# -- the has-all-code check -------------------------------------------------------------------
def time_code_check(zk: KazooClient, nimbus: NimbusProcess, expected: int,
                    trials: int = 5) -> list[float]:
    """Seconds of ``CodeSync.check_code`` (the elector's has_all_code) against
    ``nimbus``'s own copies; asserts that it finds them all."""
    from nimbus.distribution.local_code import LocalCodeStore
    from nimbus.master.code_sync import CodeSync
    from nimbus.state.cluster_state import StormClusterState

    state = StormClusterState(zk, ROOT)
    sync = CodeSync(state, LocalCodeStore(nimbus.local_dir), distributor=None,  # type: ignore[arg-type]
                    period_s=300, cluster_id=state.cluster_id())
    out = []
    for _ in range(trials):
        started = time.perf_counter()
        check = sync.check_code()
        out.append(time.perf_counter() - started)
        if not check or len(check.live) != expected:
            raise AssertionError(f"{nimbus.address}: {check}")
    return out


# -- log readings -----------------------------------------------------------------------------
def log_time(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def scheduler_passes(nimbus: NimbusProcess, since: float, topologies: int) -> list[float]:
    """Durations (s) of the passes logged after ``since`` (epoch s) at ``topologies``."""
    out = []
    for line in nimbus.log_text().splitlines():
        m = PASS_LINE.match(line)
        if m and log_time(m.group(1)) >= since and int(m.group(2)) == topologies:
            out.append(float(m.group(5)) / 1000)
    return out


def gained_after(nimbus: NimbusProcess, since: float) -> float | None:
    for line in nimbus.log_text().splitlines():
        m = GAINED_LINE.match(line)
        if m and log_time(m.group(1)) >= since - 0.001:
            return log_time(m.group(1))
    return None


# -- one scale point --------------------------------------------------------------------------
def projected_fill_s(fills: list[tuple[int, int, float]], target: int) -> float | None:
    """Seconds to bulk-submit ``target`` topologies from none, if each submit costs
    a + b * (topologies already there), fitted to two measured fills."""
    if len(fills) < 2:
        return None
    (a0, a1, at), (b0, b1, bt) = fills[0], fills[-1]
    xa, ya = (a0 + a1) / 2, at / (a1 - a0)   # mean size, seconds per submit
    xb, yb = (b0 + b1) / 2, bt / (b1 - b0)
    if xb == xa:
        return None
    slope = max(0.0, (yb - ya) / (xb - xa))
    base = max(0.0, ya - slope * xa)
    return base * target + slope * target * target / 2


class Bench:
    def __init__(self, args: argparse.Namespace, cluster: LocalCluster, fakes: FakeSupervisors,
                 bundle: bytes, zk: KazooClient):
        self.args = args
        self.cluster = cluster
        self.fakes = fakes
        self.bundle = bundle
        self.zk = zk
        self.submitted = 0
        self.fills: list[tuple[int, int, float]] = []  # (from, to, seconds) of bulk submits
        self.results: dict[int, dict[str, Any]] = {}
        self.leader = leader_of(cluster)

    def roles(self) -> dict[int, str]:
        out = {}
        for nimbus in self.cluster.nimbuses:
            if nimbus.alive():
                out[nimbus.process.pid] = ("leader" if nimbus is self.leader
                                           else "follower(s)")
        for supervisor in self.cluster.supervisors:
            if supervisor.alive():
                out[supervisor.process.pid] = "real supervisor(s)"
        for pid in self.fakes.pids:
            out[pid] = "lightweight supervisors"
        out[os.getpid()] = "this benchmark"
        return out

    def storms(self) -> int:
        return len(self.zk.get_children(f"{ROOT}/storms"))

    def grow_to(self, count: int) -> dict[str, Any]:
        """Bulk-submit up to ``count`` topologies, in chunks of ``--baseline`` with the
        progress and the projected remaining time after each."""
        first, started = self.submitted, time.monotonic()
        nimbuses = [n for n in self.cluster.nimbuses if n.alive()]
        collected = {n.index: full_collections(n) for n in nimbuses}
        while self.submitted < count:
            end = min(count, self.submitted + self.args.baseline)
            names = [f"bench-{i:05d}" for i in range(self.submitted, end)]
            seconds = submit_many(self.leader, names, self.bundle, self.args.submit_threads)
            self.fills.append((self.submitted, end, seconds))
            self.submitted = end
            left = (projected_fill_s(self.fills, count) or 0) - (
                projected_fill_s(self.fills, end) or 0)
            print(f"  {end}/{count}: {len(names) / seconds:.1f} submits/s"
                  + (f", about {left / 60:.0f} min to go" if len(self.fills) > 1 and
                     end < count else ""), flush=True)
        seconds = time.monotonic() - started
        replicated = wait_replicated(self.cluster, count, timeout_s=max(600, count))
        if self.storms() != count:
            raise AssertionError(f"ZooKeeper lists {self.storms()} topologies, not {count}")
        print(f"  {count - first} submits in {seconds:.1f}s ({self.args.submit_threads} "
              f"threads); every nimbus held them {replicated:.1f}s later", flush=True)
        gc_fill = {("gc_leader" if n is self.leader else "gc_follower"): collections_between(
            collected[n.index], full_collections(n), time.monotonic() - started)
            for n in nimbuses}
        return {"rate": (count - first) / seconds, **gc_fill}

    def probe_requests(self) -> dict[str, Any]:
        """ZooKeeper requests per submit, by role, background subtracted; with the
        lightweight supervisors' heartbeats paused meanwhile (see pause_heartbeats)."""
        counter = RequestCounter(self.cluster.zk.port, self.roles)
        idle_s = self.args.idle_window
        self.fakes.pause_heartbeats(True)
        try:
            return self._probe_requests(counter, idle_s)
        finally:
            self.fakes.pause_heartbeats(False)

    def _probe_requests(self, counter: RequestCounter, idle_s: float) -> dict[str, Any]:
        time.sleep(2.0)  # the nimbuses' reads of the last heartbeats written
        before = counter.read()
        cpu_before = cpu_by_role(self.roles())
        time.sleep(idle_s)
        idle = counter.since(before)
        cpu_idle = {r: v - cpu_before.get(r, 0.0) for r, v in cpu_by_role(self.roles()).items()}
        names = [f"bench-{i:05d}" for i in range(self.submitted,
                                                 self.submitted + self.args.probe_submits)]
        latencies = []
        before = counter.read()
        cpu_before = cpu_by_role(self.roles())
        started = time.monotonic()
        window = [time.time()]
        with connect(self.leader.address, timeout_s=120) as client:
            for name in names:
                t0 = time.perf_counter()
                submit_raw(client, name, self.bundle)
                latencies.append(time.perf_counter() - t0)
        self.submitted += len(names)
        wait_replicated(self.cluster, self.submitted, timeout_s=600)
        time.sleep(1.0)  # watches fired by the last replica registrations
        probe_s = time.monotonic() - started
        probe = counter.since(before)
        window.append(time.time())
        per_submit = {role: (probe.get(role, 0) - idle.get(role, 0) * probe_s / idle_s)
                      / len(names) for role in set(probe) | set(idle)}
        # CPU each daemon spent on a submit: its CPU during the probe, less its idle rate.
        cpu_probe = {r: v - cpu_before.get(r, 0.0) for r, v in cpu_by_role(self.roles()).items()}
        cpu_per_submit = {role: (cpu_probe[role] - cpu_idle.get(role, 0.0) * probe_s / idle_s)
                          / len(names) for role in cpu_probe}
        background = {role: n / idle_s for role, n in idle.items()}
        return {"per_submit": per_submit, "background": background,
                "submit_latency": latencies, "cpu_per_submit": cpu_per_submit,
                "probe_window": window}

    def measure(self, label: str) -> None:
        count = self.submitted
        print(f"measuring at {count} topologies", flush=True)
        reached = time.time()
        followers = [n for n in self.cluster.nimbuses if n is not self.leader and n.alive()]
        follower = followers[0]
        result: dict[str, Any] = {"topologies": count}
        collected = {n.index: full_collections(n) for n in (self.leader, follower)}
        window_start = time.monotonic()
        result["check"] = time_code_check(self.zk, follower, count)
        for key, nimbus in (("gci_leader", self.leader), ("gci_follower", follower)):
            result[key] = cluster_info_latencies(nimbus, self.args.cluster_info_calls, count,
                                                 self.args.cluster_info_budget)
            result[f"{key}_no_client_gc"] = cluster_info_latencies(
                nimbus, self.args.cluster_info_calls, count, self.args.cluster_info_budget,
                client_collects=False)
        result["rss_leader"] = rss_mb(self.leader.process.pid)
        result["rss_follower"] = rss_mb(follower.process.pid)
        # At least two passes at this size (one starts on the leader every
        # nimbus.monitor.freq.secs, and is logged when it ends).
        result["passes"] = wait_for(
            lambda: (lambda p: p if len(p) >= 2 else None)(
                scheduler_passes(self.leader, reached, count)),
            6 * self.args.monitor_freq_secs + 600, "two scheduler passes")
        window_s = time.monotonic() - window_start
        for key, nimbus in (("gc_leader", self.leader), ("gc_follower", follower)):
            result[key] = collections_between(collected[nimbus.index],
                                              full_collections(nimbus), window_s)
        result.update(self.probe_requests())
        self.results[count] = result
        self.results[count]["label"] = label
        # Said at once: a later step (the failover trials) that fails loses nothing.
        print(f"  measured at {count}: {json.dumps(result, default=str)}", flush=True)

    def soak(self, minutes: float) -> None:
        """Leave the cluster at this size for ``minutes`` (the supervisors' heartbeats
        go on) and say, every 30 s, each nimbus's RSS and full collections so far; then
        what each thaw of the heap freeze found (nimbus/heap_freeze.py): the cyclic
        garbage that was held while frozen."""
        print(f"soak: {minutes:g} min at {self.submitted} topologies", flush=True)
        nimbuses = [n for n in self.cluster.nimbuses if n.alive()]
        started = time.monotonic()
        first = {n.index: full_collections(n) for n in nimbuses}
        rss_first = {n.index: rss_mb(n.process.pid) for n in nimbuses}
        while time.monotonic() - started < minutes * 60:
            time.sleep(min(30.0, max(0.0, minutes * 60 - (time.monotonic() - started))))
            parts = []
            for n in nimbuses:
                gc_ = collections_between(first[n.index], full_collections(n),
                                          time.monotonic() - started)
                role = "leader" if n is self.leader else "follower"
                parts.append(f"{role} RSS {rss_mb(n.process.pid):.0f} MB "
                             f"(from {rss_first[n.index]:.0f}), full collections "
                             f"{collections_text(gc_)}")
            print(f"  {time.monotonic() - started:4.0f}s: " + "; ".join(parts), flush=True)
        for n in nimbuses:
            thaws = THAW_LINE.findall(n.log_text())
            role = "leader" if n is self.leader else "follower"
            print(f"  {role} thaws: " + (", ".join(f"{ms} ms, {found} unreachable objects"
                                                   for ms, found in thaws) or "none"))

    def failover(self) -> dict[str, list[float]]:
        timeout_s = self.args.session_timeout_ms / 1000
        thrift: list[float] = []
        logged: list[float] = []
        stale_dead: list[float] = []
        for trial in range(self.args.failover_trials):
            leader = self.leader
            others = [n for n in self.cluster.nimbuses if n is not leader]
            wait_for(lambda o=others: {n.address for n in o} <= queued(self.zk), 600,
                     "every follower to queue")
            answers: list[tuple[float, str, str]] = []  # (wall time, asked, named)
            started_wall, started = time.time(), time.monotonic()
            leader.kill9()
            new = wait_for(lambda o=others, a=answers: next(
                (n for n in o if named_leader(n, a) == n.address), None),
                10 * timeout_s + 120, "a new leader", interval_s=0.02)
            thrift.append(time.monotonic() - started)
            gained = gained_after(new, started_wall)
            logged.append(gained - started_wall if gained is not None else float("nan"))
            # How long the new leader went on naming the dead one after it took the lock.
            stale = [t - gained for t, asked, named in answers
                     if gained is not None and t > gained and asked == new.address
                     and named == leader.address]
            stale_dead.append(max(stale, default=0.0))
            print(f"  trial {trial + 1}: {new.address} names itself leader "
                  f"{thrift[-1]:.2f}s after kill -9 of {leader.address}; its log says it took "
                  f"the lock at {logged[-1]:.2f}s; its getLeader still named the dead nimbus "
                  f"{stale_dead[-1]:.2f}s after that", flush=True)
            self.leader = new
            leader.start()  # back as a follower for the next trial
            wait_for(lambda a=leader.address: a in queued(self.zk), 600,
                     f"{leader.address} to rejoin")
        return {"thrift": thrift, "logged": logged, "stale": stale_dead}


def queued(zk: KazooClient) -> set[str]:
    from nimbus.state.cluster_state import StormClusterState

    return {address for _, address in StormClusterState(zk, ROOT).leader_queue()}


# -- report -----------------------------------------------------------------------------------
def report(args: argparse.Namespace, bench: Bench, fill: dict[int, dict[str, Any]],
           failover: dict[str, list[float]] | None) -> None:
    small, large = bench.results[min(bench.results)], bench.results[max(bench.results)]
    a, b = small["topologies"], large["topologies"]
    ms = 1000

    def row(figure: str, target: str, x: str, y: str, verdict: str = "") -> None:
        print(f"{figure:<38} {target:<22} {x:>14} {y:>14}  {verdict}")

    def ok(good: bool) -> str:
        return "ok" if good else "MISSED"

    print()
    niced = f", at nice {args.fleet_nice}" if args.fleet_nice else ""
    print(f"scale benchmark: {args.nimbuses} nimbuses (localfs), {args.supervisors} "
          f"supervisors ({args.real_supervisors} real, the others lightweight, each its own "
          f"session{niced}), "
          f"session timeout {args.session_timeout_ms} ms, "
          f"nimbus.monitor.freq.secs {args.monitor_freq_secs}, {args.bundle_kb} KB bundles, "
          "topologies INACTIVE")
    row("figure", "target", f"at {a}", f"at {b}", "ratio / verdict")
    row("-" * 38, "-" * 22, "-" * 14, "-" * 14, "-" * 16)
    ca, cb = statistics.median(small["check"]), statistics.median(large["check"])
    row("has-all-code check, median (max)", "< 1 s",
        f"{ca * ms:.1f} ms", f"{cb * ms:.1f} ms ({max(large['check']) * ms:.0f})",
        f"x{cb / ca:.1f}; {ok(max(large['check']) < 1)}")
    for key, who in (("gci_leader", "leader"), ("gci_follower", "follower")):
        pa, pb = pct(small[key], 0.99), pct(large[key], 0.99)
        row(f"getClusterInfo p99 on the {who} (p50)", "< 50 ms",
            f"{pa * ms:.1f} ms", f"{pb * ms:.1f} ms ({pct(large[key], 0.5) * ms:.0f})",
            f"x{pb / pa:.1f}; {ok(pb < 0.05)}")
        quiet = f"{key}_no_client_gc"
        if quiet in small and quiet in large:
            pa, pb = pct(small[quiet], 0.99), pct(large[quiet], 0.99)
            row("  the same, client's collector off", "(reported)", f"{pa * ms:.1f} ms",
                f"{pb * ms:.1f} ms ({pct(large[quiet], 0.5) * ms:.0f})", f"x{pb / pa:.1f}")
    sa, sb = statistics.median(small["passes"]), statistics.median(large["passes"])
    row("scheduler pass, median (max)", "< 200 ms", f"{sa * ms:.1f} ms",
        f"{sb * ms:.1f} ms ({max(large['passes']) * ms:.0f})",
        f"x{sb / sa:.1f}; {ok(max(large['passes']) < 0.2)}")
    roles = sorted(set(small["per_submit"]) | set(large["per_submit"]) - {"this benchmark"})
    # The lightweight supervisors watch nothing: what they send is their heartbeats and
    # lease checks, background that only the idle window's subtraction removes (at 1,000
    # sessions, ~2,000 requests a second of it swamp a submit's). They are listed apart.
    daemons = ("this benchmark", "lightweight supervisors")
    total_a = sum(v for r, v in small["per_submit"].items() if r not in daemons)
    total_b = sum(v for r, v in large["per_submit"].items() if r not in daemons)
    row("ZooKeeper requests per submit, daemons", "same at both sizes", f"{total_a:.0f}",
        f"{total_b:.0f}", f"x{total_b / total_a:.2f}; {ok(total_b <= 1.2 * total_a)}")
    for role in roles:
        va, vb = small["per_submit"].get(role, 0), large["per_submit"].get(role, 0)
        if role == "this benchmark" or role == "other" and abs(va) + abs(vb) < 1:
            continue
        quiet = role == "lightweight supervisors" or va < 5  # they watch nothing
        row(f"  of which {role}", "", f"{va:.0f}", f"{vb:.0f}",
            "(background noise)" if quiet else f"x{vb / va:.2f}")
    bga = sum(v for r, v in small["background"].items() if r != "this benchmark")
    bgb = sum(v for r, v in large["background"].items() if r != "this benchmark")
    row("ZooKeeper requests/s when idle", "(reported)", f"{bga:.0f}/s", f"{bgb:.0f}/s",
        f"x{bgb / bga:.1f}")
    la, lb = statistics.median(small["submit_latency"]), statistics.median(large["submit_latency"])
    row("submit latency, median (sequential)", "(reported)", f"{la * ms:.0f} ms",
        f"{lb * ms:.0f} ms", f"x{lb / la:.1f}")
    rates = [fill[k]["rate"] for k in sorted(fill)]
    row("bulk submit rate, whole fill", "(reported)", f"{rates[0]:.1f}/s", f"{rates[-1]:.1f}/s",
        f"{args.submit_threads} threads")
    (f0, f1, ft), (l0, l1, lt) = bench.fills[0], bench.fills[-1]
    first_rate, last_rate = (f1 - f0) / ft, (l1 - l0) / lt
    row(f"bulk submit rate, first {f1 - f0} / last {l1 - l0}", ">= 0.8x",
        f"{first_rate:.1f}/s", f"{last_rate:.1f}/s",
        f"x{last_rate / first_rate:.2f}; {ok(last_rate >= 0.8 * first_rate)}")
    for role in ("leader", "follower(s)", "real supervisor(s)"):
        ca_, cb_ = (small["cpu_per_submit"].get(role, float("nan")),
                    large["cpu_per_submit"].get(role, float("nan")))
        row(f"CPU per submit, {role}", "not growing", f"{ca_ * ms:.0f} ms", f"{cb_ * ms:.0f} ms",
            f"x{cb_ / ca_:.2f}" if ca_ > 0.002 else "(within the idle noise)")
    row("nimbus RSS, leader", "(reported)", f"{small['rss_leader']:.0f} MB",
        f"{large['rss_leader']:.0f} MB", f"x{large['rss_leader'] / small['rss_leader']:.2f}")
    row("nimbus RSS, follower", "(reported)", f"{small['rss_follower']:.0f} MB",
        f"{large['rss_follower']:.0f} MB",
        f"x{large['rss_follower'] / small['rss_follower']:.2f}")
    # With the heap freeze on, these include its own collection every
    # nimbus.gc.freeze.secs (short: it walks only what is not frozen yet).
    for key, who in (("gc_leader", "leader"), ("gc_follower", "follower")):
        if key in small and key in large:
            row(f"nimbus full collections, {who}", "(reported)",
                collections_text(small[key]), collections_text(large[key]),
                "count in the window, mean, slowest <=")
        last_fill = fill[max(fill)]
        if key in last_fill:
            row(f"  the same during the fill to {max(fill)}", "(reported)", "",
                collections_text(last_fill[key]), "")
    if failover:
        timeout_s = args.session_timeout_ms / 1000
        med, worst = statistics.median(failover["thrift"]), max(failover["thrift"])
        row(f"kill -9 failover at {b} / timeout", "<= 1.2", "",
            f"{med / timeout_s:.2f} ({worst / timeout_s:.2f})",
            f"median (max) of {len(failover['thrift'])}; {ok(worst / timeout_s <= 1.2)}")
        logged = [x for x in failover["logged"] if x == x]
        if logged:
            row("  lock taken, from the new leader's log", "", "",
                f"{statistics.median(logged) / timeout_s:.2f} "
                f"({max(logged) / timeout_s:.2f})", "")
        row("  then getLeader still named the dead", "", "",
            f"{statistics.median(failover['stale']):.2f} s ({max(failover['stale']):.2f})",
            "on the new leader itself")
    projected = projected_fill_s(bench.fills, args.full_size)
    if projected is not None:
        print(f"\nbulk submits cost a + b*n per submit here; {args.full_size} topologies "
              f"would take about {projected / 3600:.1f} h to submit "
              f"({args.submit_threads} threads)")


def collections_text(gc_: dict[str, float]) -> str:
    if not gc_["count"]:
        return f"0 in {gc_['seconds']:.0f}s"
    return (f"{gc_['count']:.0f}/{gc_['seconds']:.0f}s {gc_['mean'] * 1000:.0f}ms "
            f"<={gc_['slowest_le'] * 1000:.0f}")


def view_findings(work_dir: Path) -> None:
    """What the nimbuses' logs say about their views: answers the ordered tree cache
    dropped as older than what it held (each one kazoo's TreeCache would have applied,
    python-zk/kazoo#645), and nodes the background audit found stale."""
    text = "".join(log.read_text(errors="replace") for log in sorted(work_dir.glob("nimbus-*.log")))
    print(f"\nviews: {text.count('dropped an answer of version')} older answers dropped by "
          f"the ordered tree cache; {text.count('the view held')} nodes found stale by the "
          "audit")


# -- main -------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topologies", type=int, default=5000)
    parser.add_argument("--baseline", type=int, default=100,
                        help="topologies at the baseline measurement")
    parser.add_argument("--supervisors", type=int, default=100)
    parser.add_argument("--real-supervisors", type=int, default=1)
    parser.add_argument("--supervisor-procs", type=int, default=4,
                        help="helper processes sharing the lightweight supervisors")
    parser.add_argument("--nimbuses", type=int, default=2)
    parser.add_argument("--session-timeout-ms", type=int, default=4000)
    parser.add_argument("--monitor-freq-secs", type=int, default=10,
                        help="nimbus.monitor.freq.secs (the default)")
    parser.add_argument("--bundle-kb", type=int, default=4)
    parser.add_argument("--submit-threads", type=int, default=4)
    parser.add_argument("--probe-submits", type=int, default=40,
                        help="sequential submits whose ZooKeeper requests are counted")
    parser.add_argument("--idle-window", type=float, default=20.0,
                        help="seconds of the idle window whose rate is subtracted")
    parser.add_argument("--cluster-info-calls", type=int, default=200)
    parser.add_argument("--cluster-info-budget", type=float, default=60.0,
                        help="seconds of getClusterInfo calls per nimbus at most (>= 20 calls)")
    parser.add_argument("--failover-trials", type=int, default=3)
    parser.add_argument("--soak-minutes", type=float, default=0,
                        help="minutes to leave the cluster at --topologies before the "
                             "failover trials, saying RSS and collections (0: none)")
    parser.add_argument("--gc-freeze-secs", type=int, default=None,
                        help="nimbus.gc.freeze.secs of the nimbuses (0: no heap freeze; "
                             "default: the nimbus's own)")
    parser.add_argument("--fleet-nice", type=int, default=0,
                        help="niceness of the lightweight supervisors' processes (they "
                             "stand for other hosts; 0: as the daemons)")
    parser.add_argument("--split-cpus", action="store_true",
                        help="the nimbuses and this client on one CPU, ZooKeeper and the "
                             "supervisors on the others (nimbuses the failover trials "
                             "restart are not pinned)")
    parser.add_argument("--full-size", type=int, default=5000,
                        help="size whose submit time is projected from the measured fills")
    parser.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (logs)")
    parser.add_argument("--lightweight-supervisors", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.lightweight_supervisors:
        fake_supervisors_main(json.loads(args.lightweight_supervisors))
        return
    if not 0 < args.baseline < args.topologies:
        parser.error("need 0 < --baseline < --topologies")
    if args.nimbuses < 2:
        parser.error("need --nimbuses >= 2 (a follower, and a failover)")
    if not 0 <= args.real_supervisors <= args.supervisors:
        parser.error("need 0 <= --real-supervisors <= --supervisors")

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        run(args, work)
        if args.keep:
            print(f"logs kept in {work}")


def run(args: argparse.Namespace, work: Path) -> None:
    directory = sample_topology(work / "topology", args.bundle_kb * 1024)
    (directory / "topology.yaml").write_text('command: ["sleep", "3600"]\n')
    bundle = pack_directory(directory)
    freeze = {} if args.gc_freeze_secs is None else {"nimbus.gc.freeze.secs": args.gc_freeze_secs}
    cluster = LocalCluster(work / "cluster", args.nimbuses, supervisors=args.real_supervisors,
                           metrics=True,
                           conf={**freeze,
                                 "storm.zookeeper.session.timeout": args.session_timeout_ms,
                                 "nimbus.monitor.freq.secs": args.monitor_freq_secs,
                                 # The pass timing is a DEBUG line; DEBUG for everything
                                 # would cost the daemons CPU of its own (every kazoo
                                 # request makes a record, filtered only at the handler).
                                 "nimbus.log.levels": {"nimbus.master.scheduler": "DEBUG"}})
    fakes = FakeSupervisors(work, cluster.zk.hosts, args.supervisors - args.real_supervisors,
                            args.supervisor_procs, args.session_timeout_ms / 1000,
                            cluster.client_conf()["supervisor.heartbeat.frequency.secs"],
                            nice=args.fleet_nice)
    zk = None
    started = time.monotonic()
    daemons: set[int] = set()
    try:
        cluster.start()
        daemons = {p.process.pid for p in [*cluster.nimbuses, *cluster.supervisors]}
        fakes.start()
        zk = KazooClient(hosts=cluster.zk.hosts)
        zk.start(timeout=15)
        wait_for(lambda: len(zk.get_children(f"{ROOT}/supervisors")) == args.supervisors, 120,
                 f"{args.supervisors} supervisors to register")
        print(f"cluster up: {args.nimbuses} nimbuses, {args.supervisors} supervisors "
              f"registered ({time.monotonic() - started:.0f}s)", flush=True)
        if args.split_cpus:
            print(f"  {split_cpus(cluster, fakes)}", flush=True)
        bench = Bench(args, cluster, fakes, bundle, zk)
        fill = {}
        for size in (args.baseline, args.topologies):
            print(f"submitting up to {size} topologies", flush=True)
            fill[size] = bench.grow_to(size)
            bench.measure(f"at {size}")
        if args.soak_minutes:
            bench.soak(args.soak_minutes)
        failover = None
        if args.failover_trials:
            print(f"kill -9 failover at {bench.submitted} topologies", flush=True)
            try:
                failover = bench.failover()
            except Exception as exc:  # the figures measured so far are still reported
                print(f"  the failover trials failed: {exc!r}", flush=True)
        report(args, bench, fill, failover)
        view_findings(cluster.work_dir)
        print(f"\ntotal time {time.monotonic() - started:.0f}s")
    finally:
        if zk is not None:
            zk.stop()
            zk.close()
        daemons |= {d.process.pid for d in [*cluster.nimbuses, *cluster.supervisors]
                    if d.process is not None}  # restarted ones too
        if cluster.zk.process is not None:
            daemons.add(cluster.zk.process.pid)
        fakes.stop()
        cluster.stop()
        leftovers = {pid for d in daemons | fakes.pids for pid in group_pids(d)}
        if leftovers:
            print(f"warning: processes left behind: {sorted(leftovers)}", file=sys.stderr)


if __name__ == "__main__":
    main()
