"""Configuration: Storm's key names in YAML, layered defaults < file < ``--set``.

Every key must be known (listed in ``defaults.yaml`` or declared by an installed code
distributor plugin) and every value must have the type of its default; anything else is a
:class:`ConfigError` that names the key and where it came from.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from nimbus.distribution.code_stream import MAX_FRAME_BYTES
from nimbus.redaction import redact, redact_value

log = logging.getLogger(__name__)

DEFAULTS_SOURCE = "defaults.yaml (built in)"
# The chunk size of nimbus-ha's own uploads, and the Thrift framing around one: every
# nimbus must accept a frame of this size (nimbus.thrift.max_buffer_size).
UPLOAD_CHUNK_BYTES = 512 * 1024
UPLOAD_FRAME_OVERHEAD_BYTES = 4096


class ConfigError(ValueError):
    """A configuration file or override is malformed, unknown or of the wrong type."""


@dataclass(frozen=True)
class HostPort:
    """A ``host:port`` address; ``str()`` gives that form back."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, text: str, default_port: int) -> HostPort:
        """Parse ``host`` or ``host:port``; raises ValueError on a bad port."""
        host, sep, port = str(text).strip().rpartition(":")
        if not sep:
            return cls(str(text).strip(), default_port)
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{text!r} is not 'host' or 'host:port'")
        return cls(host, int(port))


def _load_yaml(text: str, source: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: malformed YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of Storm keys, got {type(data).__name__}")
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(f"{source}: key {key!r} is not a string")
    return data


def builtin_defaults() -> dict[str, Any]:
    """The defaults shipped inside the package (conf/defaults.yaml is the same file)."""
    text = resources.files("nimbus").joinpath("defaults.yaml").read_text(encoding="utf-8")
    return _load_yaml(text, DEFAULTS_SOURCE)


def _type_ok(default: Any, value: Any) -> bool:
    if default is None:
        return True
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, type(default))


def _type_name(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "a mapping"}.get(type(value), type(value).__name__)


def parse_override(text: str) -> tuple[str, Any]:
    """Parse one ``--set key=value``; the value is read as a YAML scalar or list."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set {text!r}: expected key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {key}: value is not valid YAML: {exc}") from None
    return key, value


class Config(Mapping[str, Any]):
    """An immutable, validated configuration with typed accessors for the core keys."""

    def __init__(self, values: Mapping[str, Any]):
        self._values = dict(values)

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    def redacted(self) -> dict[str, Any]:
        """The values with every secret replaced: what may leave the process."""
        return redact(self._values)

    def redacted_changes(self) -> dict[str, Any]:
        """The keys whose value differs from the defaults (built in and of the installed
        plugins), secrets replaced: what a daemon logs of its configuration."""
        from nimbus.distribution.distributors import plugin_config_defaults

        defaults = {**builtin_defaults(), **plugin_config_defaults()}
        missing = object()
        return redact({key: value for key, value in self._values.items()
                       if defaults.get(key, missing) != value})

    # Typed views of the keys the core uses, so callers do not repeat conversions.
    @property
    def zk_hosts(self) -> str:
        """The kazoo connection string. A ``host:port`` entry in storm.zookeeper.servers
        keeps its own port (an ensemble on one host); others get storm.zookeeper.port."""
        port = self["storm.zookeeper.port"]
        return ",".join(str(h) if _has_port(str(h)) else f"{h}:{port}"
                        for h in self["storm.zookeeper.servers"])

    @property
    def zk_root(self) -> str:
        return "/" + self["storm.zookeeper.root"].strip("/")

    @property
    def session_timeout_s(self) -> float:
        return self["storm.zookeeper.session.timeout"] / 1000.0

    @property
    def connection_timeout_s(self) -> float:
        return self["storm.zookeeper.connection.timeout"] / 1000.0

    @property
    def nimbus_address(self) -> HostPort:
        return HostPort(self["nimbus.host"], self["nimbus.thrift.port"])

    @property
    def seeds(self) -> list[HostPort]:
        return [HostPort.parse(s, self["nimbus.thrift.port"]) for s in self["nimbus.seeds"]]

    @property
    def local_dir(self) -> Path:
        return Path(self["storm.local.dir"]).expanduser().absolute()


def _has_port(server: str) -> bool:
    host, sep, port = server.rpartition(":")
    return bool(sep) and port.isdigit() and ":" not in host  # not a bare IPv6 address


def load_config(
    path: str | Path | None = None,
    overrides: Iterable[str] | Mapping[str, Any] = (),
    extra_defaults: Mapping[str, Any] | None = None,
    unchecked_prefixes: Mapping[str, str] | None = None,
) -> Config:
    """Load defaults, then the YAML file at ``path``, then overrides, validating each layer.

    ``overrides`` are ``key=value`` strings (as given to ``--set``) or a mapping.
    ``extra_defaults`` are keys declared by code-distributor plugins; when omitted, the
    installed plugins are asked for them. ``unchecked_prefixes`` maps the key prefix of
    an installed plugin that cannot report its keys (it fails to import) to the reason:
    keys under it are accepted without a type check, with a warning. When
    ``extra_defaults`` is omitted they come from the installed plugins too.
    """
    defaults = builtin_defaults()
    if extra_defaults is None:
        from nimbus.distribution.distributors import plugin_settings

        extra_defaults, found_unchecked = plugin_settings()
        if unchecked_prefixes is None:
            unchecked_prefixes = found_unchecked
    unchecked_prefixes = dict(unchecked_prefixes or {})
    defaults.update(extra_defaults)
    values = dict(defaults)

    layers: list[tuple[str, Mapping[str, Any]]] = []
    if path is not None:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{p}: cannot read configuration file: {exc.strerror}") from None
        layers.append((str(p), _load_yaml(text, str(p))))
    if isinstance(overrides, Mapping):
        layers.append(("overrides", overrides))
    else:
        for item in overrides:
            key, value = parse_override(item)
            layers.append(("--set", {key: value}))

    for source, layer in layers:
        for key, value in layer.items():
            prefix = next((p for p in unchecked_prefixes if key.startswith(p)), None)
            if key not in defaults and prefix is not None:
                log.warning("%s: key %r accepted unchecked: %s", source, key,
                            unchecked_prefixes[prefix])
                values[key] = value
                continue
            if key not in defaults:
                hint = _closest(key, defaults)
                suggestion = f" (did you mean {hint!r}?)" if hint else ""
                raise ConfigError(f"{source}: unknown key {key!r}{suggestion}")
            if not _type_ok(defaults[key], value):
                raise ConfigError(
                    f"{source}: key {key!r} must be {_type_name(defaults[key])}, "
                    f"got {_type_name(value)} {redact_value(key, value)!r}"
                )
            values[key] = value
    _check_semantics(values)
    return Config(values)


def _check_semantics(values: Mapping[str, Any]) -> None:
    """Checks that go beyond types: ranges and formats the daemons rely on."""
    for key in ("storm.zookeeper.session.timeout", "storm.zookeeper.connection.timeout",
                "nimbus.code.sync.freq.secs", "nimbus.monitor.freq.secs"):
        if values[key] <= 0:
            raise ConfigError(f"key {key!r} must be positive, got {values[key]}")
    if values["topology.min.replication.count"] < 1:
        raise ConfigError("key 'topology.min.replication.count' must be at least 1")
    wait = values["topology.max.replication.wait.time.sec"]
    if wait < 0 and wait != -1:
        raise ConfigError("key 'topology.max.replication.wait.time.sec' must be >= 0 or -1")
    if not values["storm.zookeeper.servers"]:
        raise ConfigError("key 'storm.zookeeper.servers' must list at least one server")
    for seed in values["nimbus.seeds"]:
        try:
            HostPort.parse(seed, values["nimbus.thrift.port"])
        except ValueError as exc:
            raise ConfigError(f"key 'nimbus.seeds': {exc}") from None
    smallest_frame = UPLOAD_CHUNK_BYTES + UPLOAD_FRAME_OVERHEAD_BYTES
    if values["nimbus.thrift.max_buffer_size"] < smallest_frame:
        raise ConfigError(
            f"key 'nimbus.thrift.max_buffer_size' must be at least {smallest_frame} (an "
            f"upload chunk of {UPLOAD_CHUNK_BYTES} bytes and its framing), got "
            f"{values['nimbus.thrift.max_buffer_size']}")
    if values["nimbus.thrift.max_buffer_size"] > MAX_FRAME_BYTES:
        raise ConfigError(
            f"key 'nimbus.thrift.max_buffer_size' must be at most {MAX_FRAME_BYTES} (larger "
            "frame lengths are reserved for the code stream), got "
            f"{values['nimbus.thrift.max_buffer_size']}")
    grace = values["nimbus.code.lost.grace.secs"]
    if grace < 0 and grace != -1:
        raise ConfigError("key 'nimbus.code.lost.grace.secs' must be >= 0 or -1 (never)")
    if values["nimbus.thrift.threads"] < 1:
        raise ConfigError("key 'nimbus.thrift.threads' must be at least 1")
    for key in ("nimbus.metrics.port", "supervisor.metrics.port"):
        if not 0 <= values[key] < 65536:
            raise ConfigError(f"key {key!r} must be a port (1-65535), or 0 for no "
                              f"/metrics, got {values[key]}")
    if not str(values["storm.zookeeper.root"]).strip("/"):
        raise ConfigError("key 'storm.zookeeper.root' must name a znode, e.g. /storm")


def _closest(key: str, known: Iterable[str]) -> str | None:
    import difflib

    match = difflib.get_close_matches(key, list(known), n=1, cutoff=0.8)
    return match[0] if match else None
