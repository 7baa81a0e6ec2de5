"""The ``nimbus-ha`` command line: run daemons, and talk to the cluster through its leader."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
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


def _new_topology_conf(conf: Config, pairs: tuple[str, ...],
                       settings: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The conf a new topology (submit) or version (upgrade) is sent with: the command's
    ``topology.*`` settings (with ``settings``, the ``--set KEY=VALUE`` options of the
    command, only those it sets) and every ``--conf KEY=VALUE``; a value that looks like
    a relative path existing here draws a warning."""
    from nimbus.config import parse_override
    from nimbus.topology_paths import relative_looking_values

    chosen = None if settings is None else {parse_override(s)[0] for s in settings}
    topo_conf = {k: v for k, v in conf.items()
                 if k.startswith("topology.") and (chosen is None or k in chosen)}
    own = _topology_pairs(pairs)
    for key, value, absolute in relative_looking_values(own.items()):
        click.echo(f"warning: --conf {key}={value} looks like a relative path (it exists "
                   f"here); the pipeline runs in its own directory on a supervisor host, "
                   f"where it names another place. Did you mean {key}={absolute}?",
                   err=True)
    topo_conf.update(own)
    return topo_conf


#: The directory in which Spark's file sink logs the batches it wrote (its "metadata log").
SPARK_SINK_LOG = "_spark_metadata"


def _conf_strings(conf: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """(dotted key, value) of every string in ``conf``, nested maps and lists included
    (``topology.spark.conf.spark.x`` for a key inside the Spark conf)."""
    for key, value in conf.items():
        name = f"{prefix}{key}"
        if isinstance(value, str):
            yield name, value
        elif isinstance(value, dict):
            yield from _conf_strings(value, name + ".")
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, str):
                    yield name, item


def _local_path(value: str) -> Path | None:
    """The absolute local path ``value`` names (``/data/out``, ``file:/data/out``,
    ``file:///data/out``), or None (relative, another scheme, not a path at all)."""
    import os
    from urllib.parse import unquote, urlsplit

    if "\n" in value or "\0" in value or len(value) > 4096:
        return None
    if value.startswith("file:"):
        parts = urlsplit(value)
        if parts.netloc not in ("", "localhost"):
            return None
        value = unquote(parts.path)
    return Path(value) if os.path.isabs(value) else None


def spark_sink_logs(topo_conf: dict[str, Any]) -> list[tuple[str, str, Path]]:
    """(key, value, directory) for each conf value naming an existing local directory
    that holds a Spark file-sink log (``_spark_metadata``), as this host sees it."""
    found = []
    for key, value in _conf_strings(topo_conf):
        path = _local_path(value)
        if path is None:
            continue
        try:
            holds_log = path.is_dir() and (path / SPARK_SINK_LOG).exists()
        except (OSError, ValueError):
            holds_log = False
        if holds_log:
            found.append((key, value, path))
    return found


def _warn_sink_log(key: str, value: str, directory: Path) -> None:
    click.echo(
        f"warning: {key}={value} holds a Spark file-sink log ({directory / SPARK_SINK_LOG})"
        f", written by another query's checkpoint (typically a topology killed and "
        f"submitted again). A new topology starts a new checkpoint, so Spark's file sink "
        f"will skip the batch ids already in that log (their records silently lost) or "
        f"the query will read its input again (records repeated). `nimbus-ha upgrade "
        f"NAME PATH` changes a running topology's code keeping its checkpoint; a new "
        f"topology needs an output directory of its own. (This check looks at paths as "
        f"this host sees them: a supervisor may see another directory there.)", err=True)


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
    sent; a --conf value that is a relative path existing here draws a warning, and so
    does one naming a directory that holds a Spark file-sink log (_spark_metadata) of
    another query. To change the code of a running topology use `nimbus-ha upgrade`.
    """
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    from nimbus.master.lifecycle import check_topology_name
    from nimbus.thrift.client import NimbusClient
    from nimbus.topology_paths import resolve_path_keys

    check_topology_name(name)
    conf = _conf(config_path, overrides)
    topo_conf = _new_topology_conf(conf, topology_conf)
    for key, value, log_dir in spark_sink_logs(resolve_path_keys(topo_conf)):
        _warn_sink_log(key, value, log_dir)
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


# -- code versions (nimbus/state/code_versions.py, docs/runtime.md) ---------------------------
#: Seconds between two looks at a switch under way.
SWITCH_POLL_S = 1.0
#: How long past a switch's deadline (the leader's clock) a command waits by default: the
#: leader rolls a late switch back, and a failover may come in between.
SWITCH_GRACE_S = 60.0
#: How long a switch just asked for may go unseen (a nimbus answering from a view a moment
#: behind) before what the history says counts as its end.
SWITCH_UNSEEN_S = 10.0
EXIT_FAILED, EXIT_TIMEOUT = 1, 2


def _plain(text: Any) -> str:
    """Tenant-supplied text (an error, a submitter) for a terminal: one line, no control
    characters (an escape sequence is shown, not obeyed)."""
    return "".join(c if c.isprintable() else "?" for c in str(text))


def _wait_options(func: Any) -> Any:
    func = click.option(
        "--timeout", "timeout_s", type=click.FloatRange(min=0), default=None, metavar="S",
        help="Stop waiting after S seconds (exit 2; the switch goes on). Default: until "
             "the switch ends, at most a minute past its deadline "
             "(topology.upgrade.timeout.secs after it started).")(func)
    return click.option(
        "--no-wait", is_flag=True,
        help="Return once the leader has taken the switch; follow it with "
             "`nimbus-ha history NAME`.")(func)


class _SwitchWatch:
    """What :func:`_follow_switch` has seen of the switch of ``name`` to ``target``."""

    def __init__(self, name: str, target: int, workers: int | None, new_version: bool):
        self.name, self.target, self.workers = name, target, workers
        # An upgrade's target is a new version: once listed, what it says is current.
        self.new_version = new_version
        self.seen = False               # a switch to or away from the target was seen
        self.deadline_secs: int | None = None
        self._switch: tuple[Any, ...] | None = None
        self._switched: set[str] = set()
        self._told_failure = False

    def look(self, history: dict[str, Any], elapsed_s: float) -> int | None:
        """The exit status once the switch has ended, None while it goes on."""
        switch = history.get("switch") or None
        entry = next((e for e in history.get("versions") or []
                      if e.get("version") == self.target), None)
        if switch and self.target in (switch.get("to"), switch.get("from")):
            self.seen = True
            self.deadline_secs = switch.get("deadline_secs")
            self._started(switch)
            switched = [str(e) for e in switch.get("switched") or []]
            if switch.get("to") == self.target:
                self.progress(switched, f"runs version {self.target}")
            else:  # switching away from the target: it failed, or a rollback by hand
                self._failed(entry, switch)
                self.progress(switched, f"is back on version {switch.get('to')}")
            return None
        running = history.get("running")
        state = entry.get("state") if entry else None
        if running == self.target and state == "running":
            return 0
        unseen = not self.seen and not (self.new_version and entry is not None)
        if (unseen and elapsed_s < SWITCH_UNSEEN_S) or state == "switching":
            return None   # not visible yet, or a view between two writes
        if entry is None:
            click.echo(f"version {self.target} of {self.name} is no longer kept", err=True)
        elif not self._told_failure:
            error = _plain(entry.get("error") or "")
            click.echo(f"version {self.target} of {self.name} is {state}"
                       + (f": {error}" if error else ""), err=True)
        click.echo(f"{self.name} runs version {running}", err=True)
        return EXIT_FAILED

    def _started(self, switch: dict[str, Any]) -> None:
        key = (switch.get("kind"), switch.get("from"), switch.get("to"),
               switch.get("started_secs"))
        if key == self._switch:
            return
        self._switch, self._switched = key, set()
        how = "one worker at a time" if switch.get("strategy") == "rolling" else \
            "all workers at once"
        deadline = switch.get("deadline_secs")
        click.echo(f"{switch.get('kind')} of {self.name} from version {switch.get('from')} "
                   f"to {switch.get('to')}: {how}"
                   + (f", rolled back if not done by {_when(deadline)}"
                      if isinstance(deadline, int) and switch.get("kind") == "upgrade"
                      else ""))

    def progress(self, switched: list[str], what: str) -> None:
        """One line per worker of ``switched`` not told yet."""
        for executor in sorted(set(switched) - self._switched,
                               key=lambda e: (len(e), e)):
            self._switched.add(executor)
            count = f"{len(self._switched)}/{self.workers}" if self.workers else \
                f"{len(self._switched)} so far"
            click.echo(f"  {_plain(executor)} {what} ({count})")

    def _failed(self, entry: dict[str, Any] | None, switch: dict[str, Any]) -> None:
        if self._told_failure:
            return
        self._told_failure = True
        error = _plain((entry or {}).get("error") or "")
        if (entry or {}).get("state") == "failed" or error:
            click.echo(f"version {self.target} of {self.name} failed"
                       + (f": {error}" if error else ""), err=True)
        click.echo(f"rolling {self.name} back to version {switch.get('to')}", err=True)

    def timed_out(self, started: float, hard_deadline: float | None) -> bool:
        if hard_deadline is not None:
            return time.monotonic() >= hard_deadline
        if isinstance(self.deadline_secs, int):
            return time.time() > self.deadline_secs + SWITCH_GRACE_S
        return time.monotonic() - started > SWITCH_UNSEEN_S + SWITCH_GRACE_S


def _worker_count(client: Any, name: str) -> int | None:
    """How many workers topology ``name`` has placed (for "2/3 switched"); None if the
    nimbus does not say (the count is only shown)."""
    try:
        return len(client.topology_view(name)["workers"]) or None
    except Exception:  # noqa: BLE001 - a nicety: the switch is followed without it
        return None


def _last_switched(client: Any, watch: _SwitchWatch) -> None:
    """Once the switch to ``watch.target`` completed (and its record with it): the
    workers that switched since the last look, as topology-info sees them."""
    try:
        workers = client.topology_view(watch.name)["workers"]
    except Exception:  # noqa: BLE001 - a nicety, as _worker_count
        return
    watch.workers = len(workers) or watch.workers
    now = [str(w["worker"]) for w in workers if w.get("version") == watch.target]
    watch.progress(now, f"runs version {watch.target}")


def _follow_switch(client: Any, name: str, target: int, timeout_s: float | None,
                   new_version: bool = False) -> int:
    """Wait for the switch of ``name`` to version ``target`` (``new_version``: one just
    uploaded) to end, saying which workers switched; 0: it runs ``target``, 1: it failed
    or was rolled back, 2: timed out."""
    from thriftpy2.thrift import TApplicationException

    from nimbus.thrift.client import NimbusUnavailableError

    started = time.monotonic()
    hard_deadline = None if timeout_s is None else started + timeout_s
    watch = _SwitchWatch(name, target, _worker_count(client, name), new_version)
    told_unavailable = False
    while True:
        try:
            history = client.history(name)
        except (NimbusUnavailableError, TApplicationException) as exc:
            # A failover (the next leader goes on with the switch), or a nimbus that
            # cannot read the cluster state for a moment.
            if not told_unavailable:
                text = getattr(exc, "message", None) or str(exc)
                click.echo(f"{mask(text)}: still waiting", err=True)
                told_unavailable = True
        else:
            outcome = watch.look(history, time.monotonic() - started)
            if outcome == 0:
                _last_switched(client, watch)
                click.echo(f"{name} runs version {target}")
            if outcome is not None:
                return outcome
        if watch.timed_out(started, hard_deadline):
            click.echo(f"stopped waiting for {name}'s switch to version {target} after "
                       f"{time.monotonic() - started:.0f}s: the switch goes on (see "
                       f"`nimbus-ha history {name}`)", err=True)
            return EXIT_TIMEOUT
        time.sleep(SWITCH_POLL_S)


@main.command()
@click.argument("name")
@click.argument("path", type=click.Path(exists=False, path_type=Path))
@click.option("--conf", "topology_conf", multiple=True, metavar="KEY=VALUE",
              help="A key of the new version's own configuration, as submit's --conf. "
                   "Repeatable.")
@click.option("--strategy", type=click.Choice(["all", "rolling"]), default="all",
              show_default=True,
              help="all: every worker switches at once; rolling: one at a time, each "
                   "after the previous one's first commit on the new version.")
@_wait_options
@config_option
@set_option
@_fail_cleanly
def upgrade(name: str, path: Path, topology_conf: tuple[str, ...], strategy: str,
            no_wait: bool, timeout_s: float | None, config_path: str | None,
            overrides: tuple[str, ...]) -> None:
    """Run PATH as the next code version of running topology NAME: the same id, the same
    checkpoints. PATH is packed as submit packs it. The new version runs with the running
    version's conf, overlaid with this command's --conf KEY=VALUE and --set topology.*
    options (topology.workers and topology.spark.checkpoint.dir cannot change).

    Each worker stops at a batch boundary and starts the new version from the same
    checkpoint; a version that fails before its first commit is rolled back. Waits for
    the switch to end and says which workers switched: exit 0 when the new version runs,
    1 when it failed or was rolled back (its error is printed), 2 on --timeout (the
    switch goes on). `nimbus-ha history NAME` lists the versions.
    """
    from nimbus.master.lifecycle import check_topology_name
    from nimbus.thrift.client import NimbusClient

    check_topology_name(name)
    conf = _conf(config_path, overrides)
    # Laid over the running version's conf: only what this command sets.
    topo_conf = _new_topology_conf(conf, topology_conf, settings=overrides)
    client = NimbusClient(conf)
    with _bundle(path) as (bundle, _size):
        answer = client.upgrade(name, bundle, topo_conf, strategy)
    version = int(answer["version"])
    click.echo(f"uploaded version {version} of {name} ({answer['topology_id']})")
    if no_wait:
        click.echo(f"switching its workers ({strategy}); follow it with "
                   f"`nimbus-ha history {name}`")
        return
    sys.exit(_follow_switch(client, name, version, timeout_s, new_version=True))


@main.command()
@click.argument("name")
@click.option("--to", "to_version", type=click.IntRange(min=1), default=None,
              metavar="N",
              help="The kept version to run (default: the previous one; during a switch, "
                   "the version it switches from).")
@_wait_options
@config_option
@set_option
@_fail_cleanly
def rollback(name: str, to_version: int | None, no_wait: bool, timeout_s: float | None,
             config_path: str | None, overrides: tuple[str, ...]) -> None:
    """Switch topology NAME back to a kept code version, as an upgrade switches (every
    worker at a batch boundary, the same checkpoints). Waits as upgrade does: exit 0 when
    that version runs, 1 when the switch failed, 2 on --timeout."""
    from nimbus.thrift.client import NimbusClient

    client = NimbusClient(_conf(config_path, overrides))
    answer = client.rollback(name, to_version)
    version = int(answer["version"])
    click.echo(f"switching {name} ({answer['topology_id']}) to version {version}")
    if no_wait:
        click.echo(f"follow it with `nimbus-ha history {name}`")
        return
    sys.exit(_follow_switch(client, name, version, timeout_s))


def history_lines(history: dict[str, Any]) -> list[str]:
    """``nimbus-ha history``'s text: the versions (newest first) and a switch under way."""
    versions = history.get("versions") or []
    by_width = min(24, max([len("BY"), *(len(_plain(v.get("submitter") or "-"))
                                         for v in versions)]))
    lines = [f"{history.get('name')} ({history.get('topology_id')}): version "
             f"{history.get('running')} runs",
             f"{'VERSION':>7}  {'STATE':<11}  {'SUBMITTED (UTC)':<20}  "
             f"{'BY':<{by_width}}  {'SHA256':<12}  ERROR"]
    for v in versions:
        created = v.get("created_secs")
        lines.append(
            f"{v.get('version'):>7}  {_plain(v.get('state')):<11}  "
            f"{_when(created) if created else '-':<20}  "
            f"{_plain(v.get('submitter') or '-')[:by_width]:<{by_width}}  "
            f"{_plain(v.get('sha256') or '-')[:12]:<12}  "
            f"{_plain(_first_line(str(v.get('error') or ''), 80)) or '-'}")
    switch = history.get("switch")
    if switch:
        switched = [_plain(e) for e in switch.get("switched") or []]
        lines.append(
            f"switch under way: {switch.get('kind')} from version {switch.get('from')} to "
            f"{switch.get('to')} ({switch.get('strategy')}), started "
            f"{_when(switch['started_secs']) if switch.get('started_secs') else '-'} by "
            f"{_plain(switch.get('by') or '-')}, deadline "
            f"{_when(switch['deadline_secs']) if switch.get('deadline_secs') else '-'}; "
            f"switched: {', '.join(switched) or 'none yet'}")
    return lines


@main.command("history")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True,
              help="Print the history as JSON (running, switch, versions newest first).")
@config_option
@set_option
@_fail_cleanly
def history(name: str, as_json: bool, config_path: str | None,
            overrides: tuple[str, ...]) -> None:
    """List topology NAME's code versions, newest first: number, state (running,
    switching, previous, old, rolled back, failed), when and by whom it was submitted,
    its sha256 and the recorded error; and the switch under way, if any."""
    data = _nimbus_reader(_conf(config_path, overrides)).history(name)
    if as_json:
        click.echo(json.dumps(data, indent=2, sort_keys=True))
        return
    for line in history_lines(data):
        click.echo(line)


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


def version_lines(info: dict[str, Any]) -> list[str]:
    """topology-info's lines on code versions: the version that runs, a switch under
    way, and a newer version that failed or was rolled back (none from a nimbus of an
    earlier release, which says nothing of versions)."""
    if "code_version" not in info:
        return []
    running = info["code_version"]
    lines = [f"code version {running}"]
    switch = info.get("switch")
    if switch:
        switched = switch.get("switched") or []
        lines.append(f"switch under way: {switch.get('kind')} from version "
                     f"{switch.get('from')} to {switch.get('to')} ({switch.get('strategy')}"
                     f"), {len(switched)} of {len(info['workers'])} workers switched"
                     + (f", deadline {_when(switch['deadline_secs'])}"
                        if switch.get("deadline_secs") else ""))
    for version in info.get("code_versions") or []:
        if version["version"] <= running:
            break   # newest first: only versions newer than the one that runs
        if version["state"] in ("failed", "rolled back"):
            error = _plain(_first_line(version.get("error") or "", 100))
            lines.append(f"version {version['version']} {version['state']}"
                         + (f": {error}" if error else ""))
            break
    return lines


def _worker_version(worker: dict[str, Any]) -> str:
    """A worker's code version, ``2 -> 3`` while it is assigned another one."""
    runs, assigned = worker.get("version"), worker.get("assigned_version")
    if assigned is None:
        return "-" if runs is None else str(runs)
    if runs == assigned:
        return str(runs)
    return f"{'?' if runs is None else runs} -> {assigned}"


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
    from rich.text import Text

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
    for line in version_lines(info):
        console.print(Text(line))
    workers = Table("worker", "host:port", "supervisor", "state", "version", "uptime",
                    "restarts", "start", "memory", "components", "last error",
                    title="Workers", title_justify="left")
    for w in info["workers"]:
        workers.add_row(w["worker"], f"{w['host']}:{w['port']}", w["supervisor_id"],
                        worker_state.describe(w["state"], w["backoff_secs"]),
                        _worker_version(w), f"{w['uptime_secs']}s", str(w["restarts"]),
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
