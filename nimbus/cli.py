"""The ``nimbus-ha`` command line: run daemons, and talk to the cluster through its leader."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from nimbus import __version__, log_policy
from nimbus.config import Config, ConfigError
from nimbus.daemon_base import run_in_foreground
from nimbus.dev import commands as dev_commands
from nimbus.distribution.distributors import load_cluster_config
from nimbus.redaction import install_log_redaction, mask

log = logging.getLogger("nimbus.cli")

config_option = click.option("--config", "-c", "config_path", type=click.Path(dir_okay=False),
                             help="storm.yaml-style configuration file.")
set_option = click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                          help="Override one configuration key (repeatable).")


def _conf(config_path: str | None, overrides: tuple[str, ...]) -> Config:
    from nimbus.cluster_security import ClusterSecurity

    try:
        conf = load_cluster_config(config_path, overrides)
        # The command's security, checked now: its clients (NimbusClient(conf)) get it,
        # and a daemon's own (ClusterSecurity.for_daemon) shares its client context.
        ClusterSecurity.for_client(conf)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    except (OSError, ValueError) as exc:  # unreadable PEM files
        raise click.ClickException(f"storm.thrift.tls: {exc}") from None
    try:
        log_policy.apply(conf["nimbus.log.levels"], conf["nimbus.log.format"])
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    install_log_redaction(conf)
    return conf


def _fail_cleanly(func: Any) -> Any:
    """Turn expected errors into a one-line message and exit status 1."""
    import functools

    from thriftpy2.thrift import TApplicationException, TException

    from nimbus.distribution.distributors import DistributorError
    from nimbus.state.cluster_state import LayoutMissingError
    from nimbus.thrift.client import NimbusUnavailableError

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (NimbusUnavailableError, DistributorError, ConfigError, OSError,
                LayoutMissingError) as exc:
            raise click.ClickException(mask(str(exc))) from None
        except TApplicationException as exc:
            raise click.ClickException(mask(exc.message or str(exc))) from None
        except TException as exc:
            raise click.ClickException(mask(getattr(exc, "msg", None) or repr(exc))) from None
        except ValueError as exc:
            raise click.ClickException(mask(str(exc))) from None

    return wrapper


@click.group()
@click.version_option(__version__, prog_name="nimbus-ha")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]))
def main(log_level: str) -> None:
    """Highly-available nimbus: run daemons and manage topologies."""
    log_policy.install(log_level)


@main.command()
@config_option
@set_option
@_fail_cleanly
def nimbus(config_path: str | None, overrides: tuple[str, ...]) -> None:
    """Run one nimbus in the foreground (SIGTERM or Ctrl-C to stop)."""
    from nimbus.daemons.nimbus import NimbusDaemon

    conf = _conf(config_path, overrides)
    daemon = NimbusDaemon(conf)
    # A failed start has already released what it took (NimbusDaemon._release).
    run_in_foreground(daemon, "nimbus-shutdown", stop_if_start_fails=False,
                      started=lambda: click.echo(f"nimbus {daemon.address} running",
                                                 err=True))


@main.command()
@config_option
@set_option
@_fail_cleanly
def supervisor(config_path: str | None, overrides: tuple[str, ...]) -> None:
    """Run one supervisor in the foreground: it runs the workers the leader assigns to
    this host's slots (supervisor.slots.ports). SIGTERM or Ctrl-C stops it and them."""
    from nimbus.daemons.supervisor import build_supervisor

    conf = _conf(config_path, overrides)
    daemon = build_supervisor(conf)  # exits 1 here if a slot port is taken
    run_in_foreground(daemon, "supervisor-shutdown", started=lambda: click.echo(
        f"supervisor {daemon.id} running on {daemon.host} with slots "
        + ",".join(map(str, daemon.ports)), err=True))


@contextlib.contextmanager
def _bundle(path: Path) -> Iterator[tuple[Path, int]]:
    """(what to upload for PATH, its size in bytes). A directory is uploaded as it is
    packed (a stored tar, nothing written to disk first; see
    nimbus.distribution.archive): its files are listed here, so a symlink is refused
    before anything is sent. An archive (jar, zip, tar) is checked here, for an early and
    clear error, and sent as it is; the leader checks every bundle again."""
    from nimbus.distribution.archive import BundleError, check_bundle, packed_size

    if path.is_dir():
        yield path, packed_size(path)
        return
    if not path.is_file():
        raise click.ClickException(f"{path}: no such file or directory")
    try:
        check_bundle(path, 1 << 62)
    except BundleError as exc:
        raise click.ClickException(str(exc)) from None
    yield path, path.stat().st_size


def _topology_pairs(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``--conf KEY=VALUE`` options as a dict; values are YAML (``2`` is a number, ``[a]`` a
    list), and text that is not YAML stays text."""
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise click.ClickException(f"--conf expects KEY=VALUE, got {pair!r}")
        try:
            out[key.strip()] = yaml.safe_load(text) if text else ""
        except yaml.YAMLError:
            out[key.strip()] = text
    return out


@main.command()
@click.argument("name")
@click.argument("path", type=click.Path(exists=False, path_type=Path))
@click.option("--inactive", is_flag=True, help="Submit without activating.")
@click.option("--conf", "topology_conf", multiple=True, metavar="KEY=VALUE",
              help="A key of the topology's own configuration, any name (value read as "
                   "YAML), like Storm's `storm jar -c`; reaches the pipeline's build(). "
                   "Repeatable.")
@config_option
@set_option
@_fail_cleanly
def submit(name: str, path: Path, inactive: bool, topology_conf: tuple[str, ...],
           config_path: str | None, overrides: tuple[str, ...]) -> None:
    """Submit topology NAME from PATH (a directory or an archive); prints its id.

    A directory is packed as it is sent (an uncompressed tar: files go from the page cache
    to the socket); an archive is sent as it is. Either way the leader checks the bundle
    as it arrives, and a bundle of any size needs little memory.

    --set keys starting with "topology." are sent as the topology's configuration
    (e.g. --set topology.min.replication.count=2), and so is every --conf KEY=VALUE, whatever
    its name (e.g. --conf wordcount.input.dir=/data/in).

    topology.spark.checkpoint.dir (and Spark's checkpointLocation and warehouse dir in
    topology.spark.conf) are made absolute against the current directory before they are
    sent; a --conf value that is a relative path existing here draws a warning.
    """
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    from nimbus.master.lifecycle import check_topology_name
    from nimbus.thrift.client import NimbusClient
    from nimbus.topology_paths import relative_looking_values

    check_topology_name(name)
    conf = _conf(config_path, overrides)
    topo_conf = {k: v for k, v in conf.items() if k.startswith("topology.")}
    own = _topology_pairs(topology_conf)
    for key, value, absolute in relative_looking_values(own.items()):
        click.echo(f"warning: --conf {key}={value} looks like a relative path (it exists "
                   f"here); the pipeline runs in its own directory on a supervisor host, "
                   f"where it names another place. Did you mean {key}={absolute}?",
                   err=True)
    topo_conf.update(own)
    client = NimbusClient(conf)
    with _bundle(path) as (bundle, size), Progress(
            "[progress.description]{task.description}", BarColumn(), DownloadColumn(),
            TransferSpeedColumn(), transient=True, disable=not sys.stderr.isatty(),
            console=None) as progress:
        task = progress.add_task(f"uploading {name}", total=size)

        def advance(n: int) -> None:
            progress.update(task, advance=n)

        topology_id = client.submit(name, bundle, topo_conf, advance, active=not inactive)
    click.echo(topology_id)


def _simple(action: str):  # type: ignore[no-untyped-def]
    @click.argument("name")
    @config_option
    @set_option
    @_fail_cleanly
    def command(name: str, config_path: str | None, overrides: tuple[str, ...]) -> None:
        from nimbus.thrift.client import NimbusClient

        getattr(NimbusClient(_conf(config_path, overrides)), action)(name)
        click.echo(f"{action}d {name}" if action.endswith("e") else f"{action}ed {name}")

    command.__doc__ = f"{action.capitalize()} topology NAME (on the leader)."
    return command


main.command("activate")(_simple("activate"))
main.command("deactivate")(_simple("deactivate"))


@main.command()
@click.argument("name")
@click.option("--wait", "-w", "wait_secs", type=int, default=None,
              help="Seconds it stays KILLED before removal "
                   "(default: topology.message.timeout.secs).")
@config_option
@set_option
@_fail_cleanly
def kill(name: str, wait_secs: int | None, config_path: str | None,
         overrides: tuple[str, ...]) -> None:
    """Kill topology NAME."""
    from nimbus.thrift.client import NimbusClient

    NimbusClient(_conf(config_path, overrides)).kill(name, wait_secs)
    click.echo(f"killed {name}")


@main.command()
@click.argument("name")
@click.option("--workers", "-n", "num_workers", type=int, required=True,
              help="The number of workers the topology gets (>= 1).")
@click.option("--wait", "-w", "wait_secs", type=int, default=None,
              help="Seconds the topology stays REBALANCING (deactivated: its workers "
                   "stop) before the new count applies and it returns to its previous "
                   "status (Storm's -w). Default 0: the count changes at once.")
@config_option
@set_option
@_fail_cleanly
def rebalance(name: str, num_workers: int, wait_secs: int | None, config_path: str | None,
              overrides: tuple[str, ...]) -> None:
    """Give topology NAME a new number of workers (Storm's `storm rebalance -n -w`)."""
    from nimbus.thrift.client import NimbusClient

    NimbusClient(_conf(config_path, overrides)).rebalance(name, num_workers, wait_secs)
    workers = f"{num_workers} worker{'s' if num_workers != 1 else ''}"
    if wait_secs:
        click.echo(f"rebalancing {name} to {workers} in {wait_secs}s (REBALANCING, "
                   "deactivated, until then)")
    else:
        click.echo(f"rebalanced {name} to {workers}")


@main.command()
@config_option
@set_option
@_fail_cleanly
def leader(config_path: str | None, overrides: tuple[str, ...]) -> None:
    """Print host:port of the current leader."""
    from nimbus.thrift.client import NimbusClient

    click.echo(str(NimbusClient(_conf(config_path, overrides)).leader()))


def summary_to_json(info: Any) -> dict[str, Any]:
    """ClusterSummary as JSON with storm.thrift's field names."""
    return {
        "nimbuses": [{"host": n.host, "port": n.port, "uptime_secs": n.uptime_secs,
                      "isLeader": n.isLeader, "version": n.version} for n in info.nimbuses],
        "topologies": [{"id": t.id, "name": t.name, "status": t.status,
                        "num_workers": t.num_workers, "uptime_secs": t.uptime_secs,
                        "replication_count": t.replication_count} for t in info.topologies],
        "supervisors": [{"supervisor_id": s.supervisor_id, "host": s.host,
                         "uptime_secs": s.uptime_secs, "num_workers": s.num_workers,
                         "num_used_workers": s.num_used_workers} for s in info.supervisors],
    }


@main.command("list")
@config_option
@set_option
@_fail_cleanly
def list_(config_path: str | None, overrides: tuple[str, ...]) -> None:
    """List topologies: name, status, replication count, id."""
    from nimbus.thrift.client import NimbusClient

    info = NimbusClient(_conf(config_path, overrides)).cluster_info()
    if not info.topologies:
        click.echo("No topologies running.")
        return
    click.echo(f"{'Topology_name':<24} {'Status':<11} {'Replicas':>8}  Id")  # REBALANCING
    for t in sorted(info.topologies, key=lambda t: t.name):
        click.echo(f"{t.name:<24} {t.status:<11} {t.replication_count or 0:>8}  {t.id}")


@main.command("cluster-info")
@click.option("--json", "as_json", is_flag=True, help="Print storm.thrift field names as JSON.")
@config_option
@set_option
@_fail_cleanly
def cluster_info(as_json: bool, config_path: str | None, overrides: tuple[str, ...]) -> None:
    """Print the ClusterSummary (nimbuses, topologies, supervisors)."""
    from nimbus.thrift.client import NimbusClient

    data = summary_to_json(NimbusClient(_conf(config_path, overrides)).cluster_info())
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    click.echo("Nimbuses:")
    for n in data["nimbuses"]:
        click.echo(f"  {n['host']}:{n['port']:<6} {'LEADER' if n['isLeader'] else 'follower':<8}"
                   f" up {n['uptime_secs']}s  v{n['version']}")
    click.echo("Topologies:")
    for t in data["topologies"]:
        click.echo(f"  {t['name']:<24} {t['status']:<9} replicas={t['replication_count']}"
                   f"  {t['id']}")
    click.echo(f"Supervisors: {len(data['supervisors'])}")
    for s in data["supervisors"]:
        click.echo(f"  {s['supervisor_id']:<24} {s['host']:<20} slots {s['num_used_workers']}"
                   f"/{s['num_workers']} used  up {s['uptime_secs']}s")


def _nimbus_reader(conf: Config) -> Any:
    """A client for nimbus-ha's reads: it needs ``nimbus.seeds`` only (no ZooKeeper
    access, no ZooKeeper credentials); any nimbus answers, the leader first."""
    from nimbus.thrift.client import NimbusClient

    return NimbusClient(conf)


def _when(time_secs: int) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(time_secs, datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%SZ")


def _where(error: dict[str, Any]) -> str:
    """host:port of an error's worker, or "-" when the reporter gave none."""
    return f"{error['host']}:{error['port']}" if error["host"] else "-"


def _mib(count: int) -> str:
    return f"{count / 2**20:.0f} MiB" if count else "-"


def _first_line(text: str, width: int = 100) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[:width - 3] + "..."


def _console() -> Any:
    """A rich console; piped into a file or a pager it is wide enough that no host:port
    or id is cut short (rich assumes 80 columns when it cannot ask a terminal)."""
    from rich.console import Console

    return Console(soft_wrap=True, width=None if sys.stdout.isatty() else 240)


@main.command("topology-info")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True,
              help="Print the view as JSON (see nimbus/state/runtime_view.py).")
@config_option
@set_option
@_fail_cleanly
def topology_info(name: str, as_json: bool, config_path: str | None,
                  overrides: tuple[str, ...]) -> None:
    """Show topology NAME's workers, components and newest errors (asked of a nimbus)."""
    from rich.table import Table

    from nimbus.state import worker_state

    info = _nimbus_reader(_conf(config_path, overrides)).topology_view(name)
    if as_json:
        click.echo(json.dumps(info, indent=2, sort_keys=True))
        return
    console = _console()
    running = sum(1 for w in info["workers"] if w["alive"])
    console.print(f"[bold]{info['name']}[/bold] {info['id']}  {info['status']}  "
                  f"up {info['uptime_secs']}s  workers {len(info['workers'])}/"
                  f"{info['num_workers']} ({running} running)", highlight=False)
    workers = Table("worker", "host:port", "supervisor", "state", "uptime", "restarts",
                    "start", "memory", "components", "last error", title="Workers",
                    title_justify="left")
    for w in info["workers"]:
        workers.add_row(w["worker"], f"{w['host']}:{w['port']}", w["supervisor_id"],
                        worker_state.describe(w["state"], w["backoff_secs"]),
                        f"{w['uptime_secs']}s", str(w["restarts"]),
                        "warm" if w["warm_start"] else "cold", _mib(w["memory_bytes"]),
                        ", ".join(w["components"]) or "-",
                        _first_line(w["last_error"], 80) or "-")
    console.print(workers)
    if any(w["ready"] or w["starting"] for w in info["warm_workers"].values()):
        warm = Table("supervisor", "host", "ready", "starting", "memory",
                     title="Warm workers on its supervisors", title_justify="left")
        for supervisor_id, w in info["warm_workers"].items():
            warm.add_row(supervisor_id, w["host"], str(w["ready"]), str(w["starting"]),
                         _mib(w["memory_bytes"]))
        console.print(warm)
    components = Table("component", "workers", "last batch", "input rows/s",
                       "processed rows/s", "input rows", title="Components",
                       title_justify="left")
    for cname, c in info["components"].items():
        components.add_row(cname, " ".join(c["host_ports"]),
                           "-" if c["batch_id"] is None else str(c["batch_id"]),
                           f"{c['input_rows_per_second']:.1f}",
                           f"{c['processed_rows_per_second']:.1f}", str(c["num_input_rows"]))
    console.print(components)
    if not info["errors"]:
        console.print("No errors reported.")
        return
    errors = Table("component", "time (UTC)", "host:port", "error",
                   title="Errors (10 newest per component)", title_justify="left")
    for cname, kept in info["errors"].items():
        for e in kept:
            errors.add_row(cname, _when(e["time_secs"]), _where(e), _first_line(e["error"]))
    console.print(errors)


@main.command("errors")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the errors as JSON.")
@config_option
@set_option
@_fail_cleanly
def errors_(name: str, as_json: bool, config_path: str | None,
            overrides: tuple[str, ...]) -> None:
    """Print the errors topology NAME's components reported, newest first per component."""
    errors = _nimbus_reader(_conf(config_path, overrides)).topology_view(name)["errors"]
    if as_json:
        click.echo(json.dumps(errors, indent=2, sort_keys=True))
        return
    if not errors:
        click.echo(f"No errors reported by {name}.")
        return
    for component, kept in errors.items():
        click.echo(f"{component}:")
        for e in kept:
            lines = e["error"].rstrip().splitlines() or [""]
            click.echo(f"  {_when(e['time_secs'])}  {_where(e)}  {lines[0]}")
            for line in lines[1:]:
                click.echo(f"      {line}")


@main.command()
@click.option("--interval", "interval_s", type=click.FloatRange(min=0.1), default=2.0,
              show_default=True, help="Seconds between two refreshes.")
@click.option("--once", is_flag=True, help="Print the table once and exit.")
@config_option
@set_option
@_fail_cleanly
def top(interval_s: float, once: bool, config_path: str | None,
        overrides: tuple[str, ...]) -> None:
    """A refreshing table of topologies: status, workers, restarts, rows/s, last batch and
    newest error, of every topology you may read (asked of a nimbus; Ctrl-C exits)."""
    from nimbus import top as top_view

    reader = _nimbus_reader(_conf(config_path, overrides))
    top_view.run(reader.topology_rows, _console(), interval_s, once)


@main.command()
@config_option
@set_option
@_fail_cleanly
def ui(config_path: str | None, overrides: tuple[str, ...]) -> None:
    """Serve the Storm UI REST API and the dashboard on ui.host:ui.port (Storm's
    `storm ui`). Any host may run it: it reads ZooKeeper and sends actions to the
    leader. With storm.thrift.transport: tls it serves HTTPS, requires a client
    certificate of the cluster's CA and applies nimbus.authorizer's rules to it
    (docs/security.md). SIGTERM or Ctrl-C stops it."""
    from nimbus.ui.server import UIServer

    server = UIServer(_conf(config_path, overrides))
    run_in_foreground(server, "ui-shutdown",
                      started=lambda: click.echo(f"UI serving on {server.url}", err=True))


@main.command("secure-zookeeper")
@config_option
@set_option
@_fail_cleanly
def secure_zookeeper(config_path: str | None, overrides: tuple[str, ...]) -> None:
    """Set the cluster's ACL on every node under storm.zookeeper.root.

    For turning ZooKeeper auth on in a cluster that ran without it: nodes created before
    keep the open ACL they were made with until this runs (see README, "ZooKeeper
    authentication")."""
    from nimbus.state.zk_auth import secure_tree, zk_security
    from nimbus.state.zk_client import make_zk_client

    conf = _conf(config_path, overrides)
    security = zk_security(conf)
    if security is None:
        raise click.ClickException("storm.zookeeper.auth.scheme is not set: there is no "
                                   "ACL to set")
    zk = make_zk_client(conf)
    try:
        count = secure_tree(zk, conf.zk_root, security.acl)
    finally:
        zk.stop()
        zk.close()
    click.echo(f"set the cluster's ACL on {count} nodes under {conf.zk_root}")


dev_commands.register(main, conf=_conf, config_option=config_option, set_option=set_option,
                      fail_cleanly=_fail_cleanly)  # zookeeper, dev-cluster


@main.command("new-plugin")
@click.argument("name")
@click.option("--dir", "target", type=click.Path(file_okay=False, path_type=Path),
              default=None, help="Where to write it (default: ./nimbus-ha-NAME).")
def new_plugin(name: str, target: Path | None) -> None:
    """Write a code-distributor distribution NAME that passes the kit as it is: pyproject
    with the entry point, the distributor, its test module and a README (docs/plugins.md)."""
    from nimbus.scaffold import ScaffoldError
    from nimbus.scaffold import new_plugin as write

    target = target if target is not None else Path(f"nimbus-ha-{name}")
    try:
        files = write(name, target)
    except (ScaffoldError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    for path in files:
        click.echo(f"wrote {path}")
    click.echo(f"next: pip install -e '{target}[test]' && pytest {target / 'tests'}")



@main.command("logs")
@click.argument("name")
@click.option("--worker", type=click.IntRange(min=0), default=None,
              help="Only worker-N's logs: the slots it runs in now or wrote in before.")
@click.option("--follow", "-f", is_flag=True,
              help="Then print what the workers write, until interrupted.")
@click.option("--since", default=None, metavar="DURATION",
              help="What was written in the last DURATION (30s, 10m, 2h, 1d), rotated "
                   "files included; without it, each slot's current file.")
@click.option("--grep", default=None, metavar="RE",
              help="Only the lines this Python regular expression finds.")
@config_option
@set_option
@_fail_cleanly
def logs(name: str, worker: int | None, follow: bool, since: str | None, grep: str | None,
         config_path: str | None, overrides: tuple[str, ...]) -> None:
    """Print topology NAME's worker logs, read from the supervisors' logviewers through
    the leader: no ZooKeeper access, no shell on a supervisor host (docs/logs.md)."""
    from nimbus.logs import LogsError, LogsOptions, compile_grep, parse_since, run_logs

    options = LogsOptions(worker=worker, follow=follow,
                          since_s=parse_since(since) if since is not None else None,
                          grep=compile_grep(grep))
    conf = _conf(config_path, overrides)
    try:
        run_logs(conf, name, options)
    except LogsError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:  # the end of --follow
        pass

if __name__ == "__main__":  # pragma: no cover
    main()
