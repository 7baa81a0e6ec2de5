"""Run one ZooKeeper server bound to a lab address; started inside the zk node's namespace.

    ip netns exec <ns> python zknode.py --dir DIR --host 198.18.0.2 --port 2181

Prints ``serving <host:port>`` once the server answers, then runs until SIGTERM and
stops the server. The server's own log is ``DIR/zookeeper.out``: with SLF4J's simple
binding (Debian's ``libslf4j-java``) on the classpath it holds every session's
negotiated timeout and expiry, stamped with the wall clock.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from nimbus.dev.zookeeper import ZooKeeperServer, find_classpath

SLF4J_SIMPLE = Path("/usr/share/java/slf4j-simple.jar")
# Read by every JVM at start; a date format without spaces, since the variable is split
# on them. ZooKeeperServer logs each session's negotiated timeout at DEBUG.
LOGGING_OPTIONS = ("-Dorg.slf4j.simpleLogger.showDateTime=true "
                   "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd_HH:mm:ss,SSS "
                   "-Dorg.slf4j.simpleLogger.log.org.apache.zookeeper.server.ZooKeeperServer"
                   "=debug")


def enable_server_log() -> None:
    """Give the server a logger (Debian's jar has none, so it logs nothing) when the
    simple binding is installed; without it the lab still works, it only falls back to
    the session timeout it asked for."""
    if not SLF4J_SIMPLE.exists():
        return
    os.environ["NIMBUS_HA_ZOOKEEPER_CLASSPATH"] = f"{find_classpath()}:{SLF4J_SIMPLE}"
    os.environ["JAVA_TOOL_OPTIONS"] = LOGGING_OPTIONS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, default=2181)
    parser.add_argument("--tick-ms", type=int, default=200)
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    enable_server_log()
    server = ZooKeeperServer(args.dir, port=args.port, tick_ms=args.tick_ms, host=args.host)
    server.start(timeout_s=60)
    print(f"serving {server.hosts}", flush=True)
    try:
        while not stop.wait(1.0):
            if not server.alive:
                print("ZooKeeper exited", flush=True)
                sys.exit(1)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
