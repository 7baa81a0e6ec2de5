"""The development commands of ``nimbus-ha``: ``zookeeper`` (a real ZooKeeper server or
ensemble on loopback) and ``dev-cluster`` (a whole cluster on loopback, and its demo).

nimbus/cli.py adds them to its group with :func:`register`, handing over the plumbing
every command shares (the --config and --set options, the configuration they make, and
expected errors as one line), so that they take their options and fail as every other
command does; this module does not import the CLI, which imports it.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from nimbus.config import Config

Decorator = Callable[[Any], Any]


def register(group: click.Group, *, conf: Callable[[str | None, tuple[str, ...]], Config],
             config_option: Decorator, set_option: Decorator,
             fail_cleanly: Decorator) -> None:
    """Add ``zookeeper`` and ``dev-cluster`` to ``group``: ``conf`` makes a command's
    configuration of its --config and --set values, ``config_option`` and ``set_option``
    are those options, and ``fail_cleanly`` turns expected errors into a message and exit
    status 1."""
    group.add_command(_zookeeper_command(fail_cleanly))
    group.add_command(_dev_cluster_command(conf, config_option, set_option, fail_cleanly))


def _zookeeper_command(fail_cleanly: Decorator) -> click.Command:
    @click.command()
    @click.option("--port", type=int, default=2181, show_default=True,
                  help="Client port (of the first server, with --ensemble; the others "
                       "follow).")
    @click.option("--dir", "data_dir", type=click.Path(file_okay=False, path_type=Path),
                  default=Path("zookeeper-data"), show_default=True)
    @click.option("--ensemble", type=click.IntRange(min=1), default=1, show_default=True,
                  help="Run this many servers as one ensemble (3 tolerates one failure).")
    @fail_cleanly
    def zookeeper(port: int, data_dir: Path, ensemble: int) -> None:
        """Run a real ZooKeeper server (or ensemble) on 127.0.0.1 for development
        (foreground)."""
        from nimbus.dev.zookeeper import (
            ZooKeeperEnsemble,
            ZooKeeperServer,
            ZooKeeperUnavailableError,
        )

        server: ZooKeeperServer | ZooKeeperEnsemble = (
            ZooKeeperServer(data_dir, port=port) if ensemble == 1 else
            ZooKeeperEnsemble(data_dir, size=ensemble,
                              ports=[port + i for i in range(ensemble)]))
        try:
            server.start()
        except ZooKeeperUnavailableError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(f"ZooKeeper listening on {server.hosts} (data in {data_dir}); "
                   "Ctrl-C stops it")
        processes = [server.process] if isinstance(server, ZooKeeperServer) else \
            [member.process for member in server.servers]
        try:
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
            for process in processes:
                process.wait()
        except (KeyboardInterrupt, SystemExit):
            pass
        finally:
            server.stop()

    return zookeeper


def _dev_cluster_command(conf: Callable[[str | None, tuple[str, ...]], Config],
                         config_option: Decorator, set_option: Decorator,
                         fail_cleanly: Decorator) -> click.Command:
    @click.command("dev-cluster")
    @click.option("--nimbuses", type=int, default=3, show_default=True)
    @click.option("--supervisors", type=int, default=0, show_default=True,
                  help="Also run this many supervisors, each with its own storm.local.dir "
                       "and two slot ports.")
    @click.option("--base-port", type=int, default=6627, show_default=True)
    @click.option("--dir", "work_dir", type=click.Path(file_okay=False, path_type=Path),
                  default=Path("dev-cluster"), show_default=True)
    @click.option("--demo", is_flag=True,
                  help="Submit a sample topology, kill -9 the leader and show the failover.")
    @click.option("--warm-workers", type=int, default=0, show_default=True,
                  help="supervisor.warm.workers of each supervisor: warm SparkSessions kept "
                       "ready (each a JVM on this one machine).")
    @click.option("--restart", is_flag=True,
                  help="Start a nimbus or supervisor again when it exits (it is always "
                       "reported, and the rest of the cluster goes on either way).")
    @config_option
    @set_option
    @fail_cleanly
    def dev_cluster(nimbuses: int, supervisors: int, base_port: int, work_dir: Path,
                    demo: bool, warm_workers: int, restart: bool, config_path: str | None,
                    overrides: tuple[str, ...]) -> None:
        """ZooKeeper plus N nimbuses (and supervisors) on loopback, for a first look
        (Ctrl-C or SIGTERM stops all).

        A daemon that exits (kill -9 one to watch a failover) is reported with its pid and
        how it ended, and the rest goes on; --restart starts it again. It exits non-zero
        only if ZooKeeper dies.

        --config and --set are validated as for every command and passed to every nimbus
        and supervisor (e.g. --set storm.codedistributor.class=s3 and the plugin's keys),
        except the keys that place the cluster on loopback (ZooKeeper, ports, seeds, local
        dirs).
        """
        from nimbus.dev.cluster import dev_cluster_conf, run_dev_cluster
        from nimbus.redaction import is_secret_key

        chosen, ignored = dev_cluster_conf(conf(config_path, overrides))
        for key in ignored:
            click.echo(f"dev-cluster sets {key} itself: the configured value is ignored",
                       err=True)
        for override in overrides:
            key = override.partition("=")[0].strip()
            if is_secret_key(key) and not key.endswith((".env", ".file")):
                click.echo(f"warning: {key} is a secret and its value is on this command "
                           f"line, which ps shows to every user of the host: pass "
                           f"{key}.env=VARIABLE or {key}.file=PATH instead "
                           "(docs/security.md)", err=True)
        demos = None
        if demo:
            from nimbus.dev.demo import run_demos

            demos = run_demos
        run_dev_cluster(work_dir, nimbuses, base_port, demos, supervisors=supervisors,
                        conf=chosen, warm_workers=warm_workers, restart=restart)

    return dev_cluster
