"""Finding and loading code distributors by name, and calling them through the hooks.

``storm.codedistributor.class`` may be an entry-point name (``localfs``), a dotted path
(``package.module:Class`` or ``package.module.Class``) or Storm's Java class name. An
unknown name fails with an error that lists the installed distributors; a known backend
that is not installed names the distribution to ``pip install``. A plugin that fails to
import is reported and skipped, never fatal to the others; selecting it (by entry-point
name or dotted path) fails with its import error, and a dotted path whose module lacks
the attribute names both.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import logging
import threading
from collections.abc import Iterable, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pluggy

from nimbus.config import Config, load_config
from nimbus.distribution import hookspecs
from nimbus.log_policy import treat_as_own
from nimbus.redaction import Secret, mark_secret

log = logging.getLogger(__name__)

# Storm's Java class names, so that an existing storm.yaml keeps working.
STORM_CLASS_ALIASES = {
    "org.apache.storm.codedistributor.LocalFileSystemCodeDistributor": "localfs",
    "backtype.storm.codedistributor.LocalFileSystemCodeDistributor": "localfs",
    "org.apache.storm.hdfs.ha.codedistributor.HDFSCodeDistributor": "hdfs",
}

# The distributions that provide the backends this project knows of.
KNOWN_DISTRIBUTIONS = {
    "localfs": "nimbus-ha-localfs",
    "hdfs": "nimbus-ha-hdfs",
    "s3": "nimbus-ha-s3",
    "torrent": "nimbus-ha-torrent",
    "shareddir": "nimbus-ha-shareddir",
}


class DistributorError(RuntimeError):
    """A code distributor cannot be found, loaded or has failed an operation.

    Every hook failure that a user or the environment can cause (a bad metafile, tampered
    or corrupt data, an unreachable store or peer) is this or one of its subclasses, with
    a message that names the topology and the cause; see docs/hooks.md.
    """


class MetafileError(DistributorError):
    """A metafile is not one this distributor wrote for that topology (empty, truncated,
    garbage, or written for another topology or store)."""


class CodeVerificationError(DistributorError):
    """Fetched code does not match its metafile (size or hash): a tampered or corrupt
    copy, refused. The message names the topology and the file (or piece) that failed."""


class PluginImportError(DistributorError):
    """An installed distributor's entry point failed to import. ``name`` is the entry-point
    name, ``origin`` says where it comes from (entry point and distribution)."""

    def __init__(self, name: str, origin: str, cause: BaseException):
        self.name, self.origin, self.cause = name, origin, cause
        super().__init__(f"code distributor {name!r} is installed but cannot be imported: "
                         f"{_one_line(cause)} ({origin})")


def _one_line(exc: BaseException) -> str:
    """``Type: first line of the message``: an error line must stay one line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _origin(ep: Any) -> str:
    """``entry point NAME = VALUE of DIST VERSION`` (the distribution when known)."""
    dist = getattr(ep, "dist", None)
    where = f" of {dist.metadata['Name']} {dist.version}" if dist is not None else ""
    return f"entry point {ep.name} = {ep.value}{where}"


def _suggest(name: str, candidates: Any) -> str:
    """`` (did you mean 'x'?)`` for the closest candidate, or ""."""
    match = difflib.get_close_matches(name, sorted(set(candidates)), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def installed_distributors() -> dict[str, type]:
    """Entry-point name -> plugin class of every distributor that imports cleanly."""
    return _load_entry_points()[0]


def broken_distributors() -> dict[str, Exception]:
    """Entry-point name -> import error of every installed distributor that fails to load."""
    return _load_entry_points()[1]


_Loaded = tuple[dict[str, type], dict[str, Exception]]
# Plugins are imported, and their settings read, once per process for a given set of
# installed entry points (a set that changes, as tests make it, is loaded afresh).
_loaded: dict[tuple[Any, ...], _Loaded] = {}
_settings: dict[tuple[Any, ...], tuple[dict[str, Any], dict[str, str]]] = {}
_cache_lock = threading.RLock()


def _installed_entry_points() -> tuple[Any, ...]:
    return tuple(entry_points(group=hookspecs.ENTRY_POINT_GROUP))


def _load_entry_points() -> _Loaded:
    """(name -> class of each plugin that imports, name -> error of each that does not),
    loaded once per process for the installed set."""
    installed = _installed_entry_points()
    with _cache_lock:
        if installed not in _loaded:
            _loaded[installed] = _load(installed)
        found, broken = _loaded[installed]
        return dict(found), dict(broken)


def _load(installed: tuple[Any, ...]) -> _Loaded:
    found: dict[str, type] = {}
    broken: dict[str, Exception] = {}
    for ep in installed:
        try:
            found[ep.name] = ep.load()
        except Exception as exc:  # a broken plugin must not take the nimbus down
            log.warning("code distributor %r (%s) failed to load and is skipped: %s",
                        ep.name, _origin(ep), _one_line(exc))
            broken[ep.name] = PluginImportError(ep.name, _origin(ep), exc)
            broken[ep.name].__cause__ = exc
    return found, broken


def resolve_distributor_class(name: str) -> type:
    """Return the plugin class for ``name`` (entry point, dotted path or Storm class)."""
    name = name.strip()
    alias = STORM_CLASS_ALIASES.get(name, name)
    installed, failed = _load_entry_points()
    if alias in installed:
        return installed[alias]
    if alias in failed:
        broken = failed[alias]
        if isinstance(broken, PluginImportError):
            raise broken from broken.cause
        raise DistributorError(
            f"code distributor {name!r} is installed but cannot be imported: "
            f"{_one_line(broken)}") from broken
    if alias in KNOWN_DISTRIBUTIONS:
        raise DistributorError(
            f"code distributor {name!r} is not installed: pip install {KNOWN_DISTRIBUTIONS[alias]}"
            f" (installed: {', '.join(sorted(installed)) or 'none'})"
        )
    if "." in alias or ":" in alias:
        found = _import_dotted(name, alias)
        if found is not None:
            return found
    known = [*installed, *failed, *KNOWN_DISTRIBUTIONS, *STORM_CLASS_ALIASES]
    raise DistributorError(
        f"unknown code distributor {name!r} in storm.codedistributor.class"
        f"{_suggest(name, known)}; installed: "
        f"{', '.join(sorted(installed)) or 'none'} (or give a dotted path 'module:Class')"
    )


def _import_dotted(name: str, path: str) -> type | None:
    """The object at ``module:attr`` or ``module.attr``; None if no such module exists.

    A module that exists but fails to import (a missing dependency, an error in its
    code) and a module without the attribute are errors that say so, never "unknown".
    """
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        return None
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, SyntaxError, anything the module raised
        # The dotted path itself names no module (or no package above it): unknown name.
        missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            return None
        raise DistributorError(
            f"code distributor {name!r}: importing module {module_name!r} failed: "
            f"{type(exc).__name__}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise DistributorError(
            f"code distributor {name!r}: module {module_name!r} has no attribute {attr!r}"
        ) from None


def plugin_config_defaults() -> dict[str, Any]:
    """Configuration keys declared by every installed distributor plugin."""
    return plugin_settings()[0]


def plugin_settings() -> tuple[dict[str, Any], dict[str, str]]:
    """(keys declared by every working plugin with their defaults, unchecked prefixes).

    A plugin that is installed but cannot report its keys (its import fails, its hooks
    are invalid, ``config_defaults`` raises) gets its prefix
    ``nimbus.codedistributor.<entry-point name>.`` mapped to the reason: the configuration
    loader accepts keys under it unchecked, with a warning, so that commands which do
    not need the distributor (``list``, ``kill``) still read a YAML that holds its keys.
    """
    key = _installed_entry_points()
    with _cache_lock:
        if key not in _settings:
            _settings[key] = _read_settings()
        merged, unchecked = _settings[key]
        return dict(merged), dict(unchecked)


def _read_settings() -> tuple[dict[str, Any], dict[str, str]]:
    merged: dict[str, Any] = {}
    unchecked: dict[str, str] = {}
    installed, failed = _load_entry_points()
    for name, exc in failed.items():
        unchecked[f"{PLUGIN_KEY_PREFIX}{name}."] = str(exc)
    for name, cls in installed.items():
        try:
            distributor = CodeDistributor(cls)
            merged.update(distributor.config_defaults())
        except Exception as exc:
            log.warning("code distributor %r could not report its settings: %s", name, exc)
            unchecked[f"{PLUGIN_KEY_PREFIX}{name}."] = (
                f"code distributor {name!r} could not report its settings: {exc}")
    return merged, unchecked


def load_cluster_config(path: str | Path | None = None,
                        overrides: Iterable[str] | Mapping[str, Any] = ()) -> Config:
    """:func:`nimbus.config.load_config` with the keys of every installed distributor
    plugin known (and those of a plugin that cannot report them accepted unchecked, with
    a warning): how the commands and the daemons read ``storm.yaml``."""
    extra_defaults, unchecked = plugin_settings()
    return load_config(path, overrides, extra_defaults=extra_defaults,
                       unchecked_prefixes=unchecked)


#: Every plugin's keys start with this and its entry-point name (docs/plugins.md).
PLUGIN_KEY_PREFIX = "nimbus.codedistributor."


def _spec_argnames(hook: str) -> list[str]:
    return list(inspect.signature(getattr(hookspecs, hook)).parameters)


def check_hookimpls(plugin_class: type, name: str) -> None:
    """Raise a one-line DistributorError for a method marked ``@hookimpl`` whose name is
    no hook, or which takes an argument its specification lacks (pluggy matches hook
    arguments by name, so ``dirpath`` for ``dir_path`` can never be passed)."""
    where = f"{plugin_class.__module__}:{plugin_class.__qualname__}"
    for attr in dir(plugin_class):
        method = getattr(plugin_class, attr, None)
        if getattr(method, hookspecs.PROJECT + "_impl", None) is None:
            continue
        if attr not in hookspecs.ALL_HOOKS:
            raise DistributorError(
                f"code distributor {name!r} ({where}): method {attr!r} is marked @hookimpl "
                f"but there is no such hook{_suggest(attr, hookspecs.ALL_HOOKS)}; hooks: "
                f"{', '.join(hookspecs.ALL_HOOKS)}")
        try:
            params = list(inspect.signature(method).parameters)
        except (TypeError, ValueError):
            continue  # not introspectable: pluggy's own check below decides
        spec = _spec_argnames(attr)
        for arg in params[1:] if params and params[0] == "self" else params:
            if arg not in spec:
                raise DistributorError(
                    f"code distributor {name!r} ({where}): hook {attr!r} takes argument "
                    f"{arg!r}, which its specification {attr}({', '.join(spec)}) does not "
                    f"have{_suggest(arg, spec)}; arguments are passed by name")


class CodeDistributor:
    """One selected distributor, registered alone in its own plugin manager.

    Every call goes through ``pm.hook``; this class adds only error wrapping, so the
    elector, the sync thread and the leader never touch the plugin object directly.
    """

    def __init__(self, plugin_class: type):
        self.name = getattr(plugin_class, "name", plugin_class.__name__)
        treat_as_own(plugin_class.__module__)   # its INFO lines are the daemon's news
        #: True when the plugin may be prepared on supervisors (docs/hooks.md).
        self.serves_supervisors = getattr(plugin_class, hookspecs.SERVES_SUPERVISORS,
                                          False) is True
        self._pm = pluggy.PluginManager(hookspecs.PROJECT)
        self._pm.add_hookspecs(hookspecs)
        check_hookimpls(plugin_class, self.name)
        try:
            plugin = plugin_class()
        except Exception as exc:
            raise DistributorError(f"code distributor {self.name!r} cannot be created: "
                                   f"{_one_line(exc)}") from exc
        try:
            self._pm.register(plugin, name=self.name)
        except pluggy.PluginValidationError as exc:
            # Anything check_hookimpls does not catch (a bad hookwrapper, say): still one
            # line naming the plugin, not pluggy's multi-line report.
            raise DistributorError(f"code distributor {self.name!r}: invalid hook: "
                                   f"{' '.join(str(exc).split())}") from exc
        missing = [h for h in hookspecs.DISTRIBUTOR_HOOKS
                   if not getattr(self._pm.hook, h).get_hookimpls()]
        if missing:
            raise DistributorError(
                f"code distributor {self.name!r} does not implement hooks: {', '.join(missing)}"
            )

    @classmethod
    def from_conf(cls, conf: Any) -> CodeDistributor:
        return cls(resolve_distributor_class(conf["storm.codedistributor.class"]))

    def config_defaults(self) -> dict[str, Any]:
        """The plugin's keys and defaults; a default given as a
        :class:`~nimbus.redaction.Secret` marks its key as a credential (redacted
        everywhere) and is unwrapped."""
        merged: dict[str, Any] = {}
        for part in self._pm.hook.config_defaults():
            for key, default in (part or {}).items():
                if isinstance(default, Secret):
                    mark_secret(key)
                    default = default.default
                merged[key] = default
        return merged

    def prepare(self, conf: Any, context: hookspecs.DistributorContext) -> None:
        """Start the distributor; any failure becomes a DistributorError naming it."""
        try:
            self._pm.hook.prepare(conf=dict(conf), context=context)
        except Exception as exc:  # DistributorErrors too: the message must name the plugin
            raise DistributorError(
                f"code distributor {self.name!r} cannot start: {exc}") from exc

    def _call(self, what: str, hook: Any, **kwargs: Any) -> Any:
        """Call ``hook``; a plugin's stray exception becomes a DistributorError naming the
        distributor, the operation and the topology (its own errors pass unchanged)."""
        try:
            return hook(**kwargs)
        except DistributorError:
            raise
        except Exception as exc:
            raise DistributorError(f"{self.name}: {what} of {kwargs['topology_id']} failed: "
                                   f"{type(exc).__name__}: {exc}") from exc

    def upload(self, dir_path: Path, topology_id: str) -> Path:
        metafile = self._call("upload", self._pm.hook.upload,
                              dir_path=Path(dir_path), topology_id=topology_id)
        if metafile is None or not Path(metafile).is_file():
            raise DistributorError(f"{self.name}: upload of {topology_id} returned no metafile")
        return Path(metafile)

    def download(self, dest_dir: Path, topology_id: str, metafile: Path) -> list[Path]:
        files = self._call("download", self._pm.hook.download,
                           dest_dir=Path(dest_dir), topology_id=topology_id,
                           metafile=Path(metafile))
        return [Path(f) for f in files or []]

    def get_replication_count(self, topology_id: str) -> int:
        return int(self._pm.hook.get_replication_count(topology_id=topology_id) or 0)

    def cleanup(self, topology_id: str) -> None:
        """Drop this host's copy and registrations (every nimbus)."""
        self._pm.hook.cleanup(topology_id=topology_id)

    def delete_shared(self, topology_id: str) -> None:
        """Delete shared storage of a removed topology (leader, after a fenced removal)."""
        self._pm.hook.delete_shared(topology_id=topology_id)

    def list_shared(self) -> list[str] | None:
        """Topology ids in shared storage; None when the plugin does not say (it does not
        implement ``list_shared``) or cannot (it raised: logged), so nothing is swept."""
        if not self._pm.hook.list_shared.get_hookimpls():
            return None
        try:
            found = self._pm.hook.list_shared()
        except Exception as exc:
            log.warning("code distributor %s could not list its shared storage: %s",
                        self.name, exc)
            return None
        return [str(t) for t in found or []]

    def close(self, conf: Any) -> None:
        self._pm.hook.close(conf=dict(conf))
