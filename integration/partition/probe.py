"""One call to the lab's cluster, made from inside the client node; prints one JSON line.

    python probe.py --conf client.yaml submit NAME BUNDLE_DIR [--conf-json JSON] [--inactive]
    python probe.py --conf client.yaml kill NAME | activate NAME | deactivate NAME
    python probe.py --conf client.yaml leaders          # what each nimbus says
    python probe.py --conf client.yaml topologies       # the leader's topology summaries
    python probe.py --conf client.yaml assignment TOPOLOGY_ID
    python probe.py --conf client.yaml trail            # the audit trail of leader writes

Leader-only calls go through :class:`nimbus.thrift.client.NimbusClient` (it finds the
leader and follows redirects). A failure prints ``{"error": ...}`` and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nimbus.config import Config
from nimbus.distribution.distributors import load_cluster_config
from nimbus.thrift.client import NimbusClient, connect

ReadZk = Callable[[Any], Any]


def _with_zk(conf: Config, read: ReadZk) -> Any:
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=conf.zk_hosts, timeout=conf.session_timeout_s)
    zk.start(timeout=30)
    try:
        return read(zk)
    finally:
        zk.stop()
        zk.close()


def submit(conf: Config, args: argparse.Namespace) -> dict[str, Any]:
    from nimbus.distribution.archive import pack_directory

    client = NimbusClient(conf, deadline_s=args.deadline)
    sent = time.time()
    topology_id = client.submit(args.name, pack_directory(Path(args.bundle)),
                                json.loads(args.conf_json), active=not args.inactive)
    return {"id": topology_id, "sent": sent, "received": time.time()}


def leaders(conf: Config, args: argparse.Namespace) -> dict[str, Any]:
    """Each nimbus's getLeader answer and the leaders its getClusterInfo flags."""
    out = {}
    for seed in conf.seeds:
        try:
            with connect(seed, args.timeout) as client:
                leader = client.getLeader()
                info = client.getClusterInfo()
            out[str(seed)] = {"leader": f"{leader.host}:{leader.port}",
                              "flagged": [f"{n.host}:{n.port}" for n in info.nimbuses
                                          if n.isLeader]}
        except Exception as exc:
            out[str(seed)] = {"error": f"{type(exc).__name__}: {exc}"}
    return {"answers": out}


def topologies(conf: Config, args: argparse.Namespace) -> dict[str, Any]:
    info = NimbusClient(conf, deadline_s=args.deadline).cluster_info()
    return {"topologies": [{"id": t.id, "name": t.name, "status": t.status,
                            "replication_count": t.replication_count,
                            "workers": t.num_workers} for t in info.topologies],
            "supervisors": [s.supervisor_id for s in info.supervisors]}


def assignment(conf: Config, args: argparse.Namespace) -> dict[str, Any]:
    from kazoo.exceptions import NoNodeError

    def read(zk: Any) -> Any:
        try:
            data, _ = zk.get(f"{conf.zk_root}/assignments/{args.topology_id}")
        except NoNodeError:
            return None
        return json.loads(data)

    found = _with_zk(conf, read)
    return {"assignment": found}


def trail(conf: Config, _args: argparse.Namespace) -> dict[str, Any]:
    from kazoo.exceptions import NoNodeError

    from nimbus.state.leader_audit import read_trail

    def read(zk: Any) -> Any:
        try:
            return read_trail(zk, conf.zk_root)
        except NoNodeError:
            return []

    writes = _with_zk(conf, read)
    return {"writes": [{"order": w.order, "lock": w.lock, "by": w.by, "time": w.time}
                       for w in writes]}


def leader_call(action: str) -> Callable[[Config, argparse.Namespace], dict[str, Any]]:
    def call(conf: Config, args: argparse.Namespace) -> dict[str, Any]:
        client = NimbusClient(conf, deadline_s=args.deadline)
        sent = time.time()
        if action == "kill":
            client.kill(args.name, wait_secs=0)
        else:
            getattr(client, action)(args.name)
        return {"sent": sent, "received": time.time()}
    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conf", required=True, type=Path)
    parser.add_argument("--deadline", type=float, default=60.0,
                        help="seconds a leader-only call may keep retrying")
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="seconds one Thrift call may take")
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("submit")
    p.add_argument("name")
    p.add_argument("bundle")
    p.add_argument("--conf-json", default="{}")
    p.add_argument("--inactive", action="store_true")
    p.set_defaults(run=submit)
    for action in ("kill", "activate", "deactivate"):
        p = commands.add_parser(action)
        p.add_argument("name")
        p.set_defaults(run=leader_call(action))
    commands.add_parser("leaders").set_defaults(run=leaders)
    commands.add_parser("topologies").set_defaults(run=topologies)
    p = commands.add_parser("assignment")
    p.add_argument("topology_id")
    p.set_defaults(run=assignment)
    commands.add_parser("trail").set_defaults(run=trail)
    args = parser.parse_args()
    conf = load_cluster_config(args.conf)
    try:
        print(json.dumps(args.run(conf, args)), flush=True)
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
