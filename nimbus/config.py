"""Configuration: Storm's key names in YAML, layered defaults < file < ``--set``.

Every key must be known (listed in ``defaults.yaml`` or declared by an installed code
distributor plugin) and every value must have the type of its default (a list's items
too; a built-in key whose default is null takes a string or null); anything else is a
:class:`ConfigError` that names the key and where it came from.

Whatever the input (a file that is not UTF-8, YAML that does not parse, an alias bomb or
an alias that contains itself, a document nested thousands deep, a 5000-digit number),
loading ends quickly with a ConfigError and never another exception: a file is read only
up to ``MAX_CONFIG_BYTES``, and a document is walked once, counting each value as often
as aliases repeat it, and refused beyond ``MAX_YAML_VALUES`` values or ``MAX_YAML_DEPTH``
levels before anything else looks at it.
"""

from __future__ import annotations

import logging
import os
import stat
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from nimbus.redaction import is_secret_key, redact, redact_value

log = logging.getLogger(__name__)

DEFAULTS_SOURCE = "defaults.yaml (built in)"
# The chunk size of nimbus-ha's own uploads, and the Thrift framing around one: every
# nimbus must accept a frame of this size (nimbus.thrift.max_buffer_size).
UPLOAD_CHUNK_BYTES = 512 * 1024
UPLOAD_FRAME_OVERHEAD_BYTES = 4096
# A client's token for one submission (nimbus-ha's key in the topology conf): a retry of
# that submission, e.g. after the client's call timed out, is answered with the topology
# it created instead of "already alive". Here, not in the master, so that a client does
# not load the master to name it.
SUBMISSION_TOKEN_KEY = "topology.submission.token"
# The code stream (nimbus/distribution/code_stream.py) shares the Thrift port: a
# connection whose first four bytes are its magic, read as a frame length, is the stream.
# So Thrift frames stay below that length, and nimbus.thrift.max_buffer_size with them.
CODE_STREAM_MAGIC = b"NHS1"
MAX_FRAME_BYTES = struct.unpack("!i", CODE_STREAM_MAGIC)[0] - 1
# Bounds on configuration input (see the module docstring). A storm.yaml is a few KiB.
MAX_CONFIG_BYTES = 1024 * 1024
MAX_YAML_VALUES = 100_000
MAX_YAML_DEPTH = 64
# The item types of list keys whose (empty) default cannot show them, and the value types
# of mapping keys.
LIST_ITEM_TYPES: dict[str, type] = {"nimbus.admins": str, "topology.users": str,
                                    "drpc.servers": str}
MAPPING_VALUE_TYPES: dict[str, tuple[type, ...]] = {
    "topology.spark.conf": (str, int, float, bool)}
# Keys whose value is a port number.
PORT_KEYS = ("storm.zookeeper.port", "nimbus.thrift.port", "ui.port")


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


def _safe_load(text: str, source: str) -> Any:
    """``yaml.safe_load``, with every failure a ConfigError naming ``source``."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: malformed YAML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{source}: malformed YAML: nested too deeply") from None
    except (ValueError, OverflowError) as exc:  # e.g. an integer of 5000 digits
        raise ConfigError(f"{source}: malformed YAML: {exc}") from None


def _check_bounded(document: Any, source: str) -> None:
    """Raise ConfigError if ``document`` holds more than MAX_YAML_VALUES values (counting
    each as often as aliases repeat it), nests deeper than MAX_YAML_DEPTH, or contains
    itself; the error names the top-level key where that happens. Nothing else may walk
    a loaded document before this passed."""
    seen = 0
    inside: set[int] = set()

    def walk(item: Any, depth: int, where: str) -> None:
        nonlocal seen
        seen += 1
        if seen > MAX_YAML_VALUES:
            raise ConfigError(f"{where}: the document expands to more than "
                              f"{MAX_YAML_VALUES} values (aliases of aliases?)")
        if not isinstance(item, (list, dict, set, tuple)):
            return
        if id(item) in inside:
            raise ConfigError(f"{where}: a value contains itself (a recursive alias)")
        if depth >= MAX_YAML_DEPTH:
            raise ConfigError(f"{where}: nested more than {MAX_YAML_DEPTH} levels deep")
        inside.add(id(item))
        for child in (item.items() if isinstance(item, dict) else item):
            if isinstance(item, dict):
                walk(child[0], depth + 1, where)
                walk(child[1], depth + 1, where)
            else:
                walk(child, depth + 1, where)
        inside.discard(id(item))

    if isinstance(document, dict):
        for key, value in document.items():
            if isinstance(key, str):
                walk(value, 1, f"{source}: key {key[:100]!r}")
    else:
        walk(document, 0, source)


def _load_yaml(text: str, source: str) -> dict[str, Any]:
    data = _safe_load(text, source)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of Storm keys, got {type(data).__name__}")
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(f"{source}: key {key!r:.80} is not a string")
    _check_bounded(data, source)
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


_TYPE_PLURALS = {bool: "booleans", int: "integers", float: "numbers", str: "strings"}


def _value_problem(key: str, default: Any, value: Any, nullable_strings: bool) -> str | None:
    """Why ``value`` does not fit key ``key`` (whose default is ``default``), or None.

    ``nullable_strings``: a null default means "a string or null" (the built-in keys)."""
    if default is None:
        if not nullable_strings or value is None or isinstance(value, str):
            return None
        return f"must be a string or null, got {_type_name(value)}"
    if not _type_ok(default, value):
        return f"must be {_type_name(default)}, got {_type_name(value)}"
    if isinstance(default, list):
        kinds = {type(item) for item in default}
        item_type = LIST_ITEM_TYPES.get(key) or (kinds.pop() if len(kinds) == 1 else None)
        if item_type is not None:
            for i, item in enumerate(value):
                if not _type_ok(item_type(), item):
                    return (f"must be a list of {_TYPE_PLURALS.get(item_type, 'values')}, "
                            f"got {_type_name(item)} at [{i}]")
    if isinstance(default, dict) and key in MAPPING_VALUE_TYPES:
        for name, item in value.items():
            if not isinstance(name, str) or not isinstance(item, MAPPING_VALUE_TYPES[key]):
                return (f"must map strings to strings, numbers or booleans, got "
                        f"{_type_name(name)} -> {_type_name(item)}")
    return None


def parse_override(text: str) -> tuple[str, Any]:
    """Parse one ``--set key=value``; the value is read as a YAML scalar or list."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set {text!r}: expected key=value")
    value = _safe_load(raw, f"--set {key}") if raw.strip() else ""
    _check_bounded(value, f"--set {key}")
    return key, value


class Config(Mapping[str, Any]):
    """An immutable, validated configuration with typed accessors for the core keys."""

    def __init__(self, values: Mapping[str, Any],
                 indirect: Mapping[str, tuple[str, str]] | None = None,
                 defaults: Mapping[str, Any] | None = None):
        self._values = dict(values)
        # The defaults it was loaded against (built in, and the plugins' keys it knew).
        self._defaults = dict(defaults) if defaults is not None else builtin_defaults()
        #: secret key -> (``<key>.file`` or ``<key>.env``, its file or variable): where
        #: a secret was read from, so that it is passed on as that, never in clear.
        self.indirect = dict(indirect or {})

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    def check_layer(self, values: Mapping[str, Any], source: str) -> None:
        """Check ``values`` as :func:`load_config` checks each layer, against the keys this
        configuration knows (built in, and the plugins' it was loaded with): a known key
        of the wrong type is a ConfigError naming ``source`` and the key. Unknown keys
        pass, as Storm lets a topology's configuration carry keys of its own."""
        for key, value in values.items():
            if not isinstance(key, str) or key not in self._defaults:
                continue
            default = self._defaults[key]
            problem = _value_problem(key, default, value, default is None)
            if problem:
                raise ConfigError(f"{source}: key {key!r} {problem} "
                                  f"{redact_value(key, value)!r:.200}")

    def redacted(self) -> dict[str, Any]:
        """The values with every secret replaced: what may leave the process."""
        return redact(self._values)

    def redacted_changes(self) -> dict[str, Any]:
        """The keys whose value differs from the defaults it was loaded against (built
        in, and the plugins' keys), secrets replaced: what a daemon logs of its
        configuration."""
        missing = object()
        return redact({key: value for key, value in self._values.items()
                       if self._defaults.get(key, missing) != value})

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
    def client_wait_s(self) -> float:
        """How long a client command waits for the cluster (``nimbus.client.wait.secs``)."""
        return float(self["nimbus.client.wait.secs"])

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
    ``extra_defaults`` are keys declared by code-distributor plugins (none when omitted:
    :func:`nimbus.distribution.distributors.load_cluster_config` asks the installed
    plugins for theirs). ``unchecked_prefixes`` maps the key prefix of an installed
    plugin that cannot report its keys (it fails to import) to the reason: keys under it
    are accepted without a type check, with a warning.
    """
    defaults = builtin_defaults()
    nullable_strings = {key for key, value in defaults.items() if value is None}
    unchecked_prefixes = dict(unchecked_prefixes or {})
    defaults.update(extra_defaults or {})
    values = dict(defaults)

    layers: list[tuple[str, Mapping[str, Any]]] = []
    if path is not None:
        p = Path(path)
        try:
            with open(p, "rb") as f:
                data = f.read(MAX_CONFIG_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"{p}: cannot read configuration file: {exc.strerror}") from None
        if len(data) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{p}: larger than {MAX_CONFIG_BYTES} bytes; not a "
                              "configuration file?")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{p}: not UTF-8 text (byte {exc.start})") from None
        layers.append((str(p), _load_yaml(text, str(p))))
    if isinstance(overrides, Mapping):
        _check_bounded(dict(overrides), "overrides")
        layers.append(("overrides", overrides))
    else:
        for item in overrides:
            key, value = parse_override(item)
            layers.append(("--set", {key: value}))

    indirect: dict[str, tuple[str, str]] = {}
    for source, layer in layers:
        for key, value in layer.items():
            base = _secret_base(key, defaults)
            if base is not None:
                indirect[base] = (key, value)
                key, value = base, _read_secret(source, key, value)
            elif key in indirect:
                del indirect[key]   # given outright in a later layer
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
            problem = _value_problem(key, defaults[key], value, key in nullable_strings)
            if problem:
                raise ConfigError(f"{source}: key {key!r} {problem} "
                                  f"{redact_value(key, value)!r:.200}")
            values[key] = value
    _apply_aliases(values)
    _check_semantics(values)
    return Config(values, indirect={base: ref for base, ref in indirect.items()},
                  defaults=defaults)


#: nimbus-ha's names of settings that Storm names otherwise: (ours, Storm's, ours -> Storm's
#: value). Ours is -1 unless set; set, it decides, and setting both to different values is
#: an error.
ALIASES = (
    ("supervisor.logviewer.port", "logviewer.port", lambda port: port),
    ("supervisor.worker.log.retention.hours", "logviewer.cleanup.age.mins",
     lambda hours: hours * 60.0),
)


def _apply_aliases(values: dict[str, Any]) -> None:
    for ours, storms, convert in ALIASES:
        if values[ours] == -1:
            continue
        if values[ours] < 0:
            raise ConfigError(f"key {ours!r} must be 0 or more (or -1: {storms} decides), "
                              f"got {values[ours]}")
        wanted = convert(values[ours])
        default = builtin_defaults()[storms]
        if values[storms] != default and values[storms] != wanted:
            raise ConfigError(f"keys {ours!r} and {storms!r} name the same setting and "
                              f"disagree ({values[ours]} and {values[storms]}): set one")
        values[storms] = type(default)(wanted)


#: ``<secret key>.file`` and ``<secret key>.env``: a secret read from a file (owner-only)
#: or from an environment variable at start, so that it is in no process listing and no
#: configuration file.
SECRET_SOURCES = (".file", ".env")


def _secret_base(key: str, defaults: Mapping[str, Any]) -> str | None:
    """The secret key that ``key`` gives indirectly (``<it>.file`` or ``<it>.env``)."""
    for suffix in SECRET_SOURCES:
        if key.endswith(suffix):
            base = key[: -len(suffix)]
            if base in defaults and is_secret_key(base):
                return base
    return None


def _read_secret(source: str, key: str, reference: Any) -> str:
    """The secret that ``key`` (``<secret>.file`` or ``<secret>.env``) points to."""
    if not isinstance(reference, str) or not reference:
        raise ConfigError(f"{source}: key {key!r} must name "
                          f"{'a file' if key.endswith('.file') else 'an environment variable'}")
    if key.endswith(".env"):
        if reference not in os.environ:
            raise ConfigError(f"{source}: key {key!r}: environment variable {reference} "
                              "is not set")
        return os.environ[reference]
    path = Path(reference).expanduser()
    try:
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(f"{source}: key {key!r}: {path} is not a file")
        if mode & (stat.S_IRGRP | stat.S_IROTH):
            raise ConfigError(
                f"{source}: key {key!r}: {path} is readable by its group or by everyone "
                f"(mode {stat.S_IMODE(mode):04o}); chmod 600 it")
        with open(path, "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{source}: key {key!r}: cannot read {path}: {exc.strerror}") \
            from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{source}: key {key!r}: {path} is too large for a secret")
    try:
        return data.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        raise ConfigError(f"{source}: key {key!r}: {path} is not UTF-8 text") from None


def _check_semantics(values: Mapping[str, Any]) -> None:
    """Checks that go beyond types: ranges and formats the daemons rely on."""
    for key in ("storm.zookeeper.session.timeout", "storm.zookeeper.connection.timeout",
                "nimbus.code.sync.freq.secs", "nimbus.monitor.freq.secs"):
        if values[key] <= 0:
            raise ConfigError(f"key {key!r} must be positive, got {values[key]}")
    if values["nimbus.client.wait.secs"] < 0:
        raise ConfigError("key 'nimbus.client.wait.secs' must be 0 (try once) or more, got "
                          f"{values['nimbus.client.wait.secs']}")
    for key in ("nimbus.view.audit.nodes.per.sec", "supervisor.view.audit.nodes.per.sec"):
        if values[key] < 0:
            raise ConfigError(f"key {key!r} must be 0 (no audit) or more, got {values[key]}")
    freeze, thaw = values["nimbus.gc.freeze.secs"], values["nimbus.gc.thaw.secs"]
    if freeze < 0:
        raise ConfigError(f"key 'nimbus.gc.freeze.secs' must be 0 (never freeze) or more, "
                          f"got {freeze}")
    if thaw < 0:
        raise ConfigError(f"key 'nimbus.gc.thaw.secs' must be 0 or more, got {thaw}")
    if freeze and thaw < freeze:
        raise ConfigError(f"key 'nimbus.gc.thaw.secs' must be at least nimbus.gc.freeze.secs "
                          f"({freeze}), got {thaw}")
    if values["topology.min.replication.count"] < 1:
        raise ConfigError("key 'topology.min.replication.count' must be at least 1")
    for key in ("topology.code.versions.kept", "topology.upgrade.timeout.secs"):
        if values[key] < 1:
            raise ConfigError(f"key {key!r} must be at least 1, got {values[key]}")
    wait = values["topology.max.replication.wait.time.sec"]
    if wait < 0 and wait != -1:
        raise ConfigError("key 'topology.max.replication.wait.time.sec' must be >= 0 or -1")
    if values["nimbus.max.replication.wait.time.sec"] < 0:
        raise ConfigError("key 'nimbus.max.replication.wait.time.sec' must be 0 or more, "
                          f"got {values['nimbus.max.replication.wait.time.sec']}")
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
    if values["nimbus.thrift.handshake.timeout.secs"] < 1:
        raise ConfigError("key 'nimbus.thrift.handshake.timeout.secs' must be at least 1, "
                          f"got {values['nimbus.thrift.handshake.timeout.secs']}")
    for key in ("nimbus.metrics.port", "supervisor.metrics.port"):
        if not 0 <= values[key] < 65536:
            raise ConfigError(f"key {key!r} must be a port (1-65535), or 0 for no "
                              f"/metrics, got {values[key]}")
    if not 0 <= values["logviewer.port"] < 65536:
        raise ConfigError("key 'logviewer.port' must be a port (1-65535), or 0 for no "
                          f"logviewer, got {values['logviewer.port']}")
    for key in PORT_KEYS:
        if not 0 <= values[key] < 65536:
            raise ConfigError(f"key {key!r} must be a port (0-65535), got {values[key]}")
    for port in values["supervisor.slots.ports"]:
        if not 0 < port < 65536:
            raise ConfigError(f"key 'supervisor.slots.ports' must list ports (1-65535), "
                              f"got {port}")
    if not str(values["storm.zookeeper.root"]).strip("/"):
        raise ConfigError("key 'storm.zookeeper.root' must name a znode, e.g. /storm")


def _closest(key: str, known: Iterable[str]) -> str | None:
    import difflib

    match = difflib.get_close_matches(key, list(known), n=1, cutoff=0.8)
    return match[0] if match else None
