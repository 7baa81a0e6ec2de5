"""Seeded fuzzing of what nimbus-ha reads from outside: ZooKeeper records, configuration,
topology bundles, Thrift frames, and garbage in the /storm nodes of a running nimbus.

Used by ``tests/test_fuzz.py`` (a few hundred cases) and ``benchmarks/fuzz.py`` (as many
as asked). Each target is a function ``fuzz_<target>(rng, cases, ...) -> Tally`` that
draws its cases from ``rng`` (a ``random.Random``), so the same seed gives the same
cases; a failure names its case number, and ``case_rng(seed, target, number)`` rebuilds
exactly that case.

What counts as a failure, per target:

* records: ``Record.decode`` raising anything but RecordError, a RecordError that does
  not name the record type and node, a refusal of a valid record with unknown extra
  fields (those are ignored), an acceptance of a newer format, of a missing required
  field or of a wrongly typed field (each must be refused *naming* that field), or an
  accepted record that does not survive an encode/decode round trip or that crashes
  the code that consumes it (``runtime_view``, ``desired_workers``);
* config: ``load_config`` raising anything but ConfigError, a wrong type accepted, a
  refusal that does not name the key (or, for unreadable files, the file), or a case
  slower than ``SLOW_CASE_S``;
* archives: ``check_bundle`` raising anything but BundleError, an unsafe entry accepted
  or refused with the wrong reason, a bomb accepted, or an accepted archive whose
  extraction (the supervisor's own code) writes anything outside its directory or
  fails with anything but CodeVerificationError;
* thrift: the server no longer answering getClusterInfo after a case, a well-formed
  call not answered (a reply or an exception, never a dropped connection), a traceback
  in the server's log, or a connection that outlives its case;
* nodes (:class:`FuzzNimbus`, :func:`check_node_case`): after garbage is written into a
  /storm node and every reader of the nimbus has run twice, the nimbus no longer
  serving or listing its healthy topology, no error naming an unreadable node, the
  garbage deleted or overwritten, the healthy topology's nodes or code changed, or a
  traceback in its log.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import random
import socket
import string
import struct
import tarfile
import tempfile
import time
import typing
import zipfile
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from nimbus.config import ConfigError, builtin_defaults, load_config
from nimbus.distribution.archive import BundleError, check_bundle
from nimbus.state.records import (
    FORMAT_VERSION,
    Assignment,
    CodeMeta,
    ErrorInfo,
    NimbusInfo,
    Record,
    RecordError,
    StormBase,
    SupervisorInfo,
    WorkerBeat,
)

log = logging.getLogger(__name__)

RECORD_TYPES: tuple[type[Record], ...] = (StormBase, Assignment, SupervisorInfo, WorkerBeat,
                                          NimbusInfo, ErrorInfo, CodeMeta)
# A config case slower than this is a failure (the machine may be loaded: generous).
SLOW_CASE_S = 10.0


@dataclass
class Tally:
    """Cases tried for one target, and the failures (``"<case>: <problem>"``)."""

    target: str
    tried: int = 0
    failures: list[str] = field(default_factory=list)
    kinds: dict[str, int] = field(default_factory=dict)

    def add(self, case: str, kind: str, problem: str | None) -> None:
        self.tried += 1
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        if problem:
            self.failures.append(f"{case} ({kind}): {problem}")

    def line(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.kinds.items()))
        return f"{self.target}: {self.tried} cases, {len(self.failures)} failed ({kinds})"


def case_rng(seed: int, target: str, number: int) -> random.Random:
    """The generator of case ``number`` of ``target`` under ``seed``: each case draws from
    its own, so one case can be replayed alone."""
    return random.Random(f"{seed}/{target}/{number}")


# -- random values ---------------------------------------------------------------------------
_TEXT = string.ascii_letters + string.digits + " _-./:\\\"'{}[]\n\t\u00e9\u4e2d\U0001f600"


def random_text(rng: random.Random, longest: int = 20) -> str:
    return "".join(rng.choice(_TEXT) for _ in range(rng.randint(0, longest)))


def random_json(rng: random.Random, depth: int = 3) -> Any:
    """A random JSON value (nested at most ``depth``)."""
    kinds = ["null", "bool", "int", "bigint", "float", "str"]
    if depth > 0:
        kinds += ["list", "dict"]
    kind = rng.choice(kinds)
    if kind == "null":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "int":
        return rng.randint(-1000, 100000)
    if kind == "bigint":
        return rng.choice([2**31, 2**63, -(2**63) - 1, 10**30])
    if kind == "float":
        return rng.choice([0.5, -1.25, 1e300, 3.0])
    if kind == "str":
        return random_text(rng)
    if kind == "list":
        return [random_json(rng, depth - 1) for _ in range(rng.randint(0, 4))]
    return {random_text(rng, 8): random_json(rng, depth - 1) for _ in range(rng.randint(0, 4))}


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    return {float: "float", str: "str", list: "list", dict: "dict"}[type(value)]


def _hint_kind(hint: Any) -> str | None:
    """The JSON kind a field annotation requires (None: anything)."""
    if hint is Any:
        return None
    origin = typing.get_origin(hint) or hint
    return {str: "str", int: "int", bool: "bool", list: "list", dict: "dict"}[origin]


def _value_for(rng: random.Random, hint: Any, name: str) -> Any:
    """A random value that fits annotation ``hint`` (field ``name``)."""
    if name == "metafile_b64":
        return base64.b64encode(rng.randbytes(rng.randint(0, 40))).decode()
    if name == "executor_node_port":
        return {f"worker-{i}": [random_text(rng, 8), rng.randint(1, 65535)]
                for i in range(rng.randint(0, 3))}
    if name == "code_version":
        return rng.randint(1, 9)
    if name in ("worker_versions", "switch", "versions"):
        # Their entries follow rules of their own (Assignment's, CodeVersions'): the
        # fuzzer's random ones would not; the other fields vary.
        return [] if name == "versions" else {}
    if name == "running":
        return 1
    if hint is Any:
        return random_json(rng, 2)
    origin = typing.get_origin(hint)
    if origin is list:
        (item,) = typing.get_args(hint)
        return [_value_for(rng, item, "") for _ in range(rng.randint(0, 3))]
    if origin is dict:
        _key, item = typing.get_args(hint)
        return {random_text(rng, 8): _value_for(rng, item, "") for _ in range(rng.randint(0, 3))}
    if hint is int:
        return rng.choice([0, 1, rng.randint(-(2**40), 2**40)])
    if hint is bool:
        return rng.choice([False, True])
    return random_text(rng)


def sample_record(rng: random.Random, cls: type[Record]) -> Record:
    """A valid record of type ``cls`` with random field values."""
    hints = typing.get_type_hints(cls)
    return cls(**{f.name: _value_for(rng, hints[f.name], f.name)
                  for f in fields(cls)})  # type: ignore[arg-type]


def _wrong_value(rng: random.Random, hint: Any) -> Any:
    """A random JSON value whose kind is not what ``hint`` requires."""
    wanted = _hint_kind(hint)
    while True:
        value = random_json(rng, 2)
        if _json_kind(value) != wanted:
            return value


# -- records -----------------------------------------------------------------------------------
RECORD_KINDS = ("bytes", "truncated", "flipped", "wrong_type", "bad_item", "missing",
                "newer", "bad_format", "extra_fields", "random_json", "deep", "not_utf8",
                "surrogate")


def record_case(rng: random.Random, cls: type[Record]) -> tuple[str, bytes, Callable[
        [Record | None, RecordError | None], str | None]]:
    """(kind, node data, expectation) of one record case; the expectation returns a
    problem (or None) from the decoded record or the RecordError."""
    good = sample_record(rng, cls)
    obj = json.loads(good.encode())
    hints = typing.get_type_hints(cls)
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    required = [f.name for f in fields(cls)  # type: ignore[arg-type]
                if f.default is MISSING and f.default_factory is MISSING]
    kind = rng.choice(RECORD_KINDS)

    def anything(record: Record | None, error: RecordError | None) -> str | None:
        return None

    def refused(*needles: str) -> Callable[[Record | None, RecordError | None], str | None]:
        def check(record: Record | None, error: RecordError | None) -> str | None:
            if error is None:
                return f"accepted {record!r:.120}"
            missing = [n for n in needles if n not in str(error)]
            return f"refused without naming {missing}: {error}" if missing else None
        return check

    def equals(expected: Record) -> Callable[[Record | None, RecordError | None], str | None]:
        def check(record: Record | None, error: RecordError | None) -> str | None:
            if error is not None:
                return f"refused a readable record: {error}"
            return None if record == expected else f"decoded {record!r:.120}, not {expected!r:.120}"
        return check

    if kind == "bytes":
        return kind, rng.randbytes(rng.randint(0, 200)), anything
    if kind == "truncated":
        data = good.encode()
        return kind, data[:rng.randint(0, len(data) - 1)], refused(cls.__name__)
    if kind == "flipped":
        data = bytearray(good.encode())
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return kind, bytes(data), anything
    if kind == "wrong_type":
        name = rng.choice(names)
        obj[name] = _wrong_value(rng, hints[name])
        return kind, json.dumps(obj).encode(), refused(f"field {name!r}")
    if kind == "bad_item":
        containers = [n for n in names if typing.get_origin(hints[n]) in (list, dict)
                      and typing.get_args(hints[n])[-1] is not Any]
        if not containers:
            return kind, good.encode(), equals(good)
        name = rng.choice(containers)
        item = typing.get_args(hints[name])[-1]
        bad = _wrong_value(rng, item)
        obj[name] = [bad] if typing.get_origin(hints[name]) is list else {"worker-0": bad}
        return kind, json.dumps(obj).encode(), refused(f"field {name!r}")
    if kind == "missing":
        if not required or rng.random() < 0.3:
            optional = [f for f in fields(cls) if f.name not in required]  # type: ignore[arg-type]
            expected = good
            if optional:
                dropped = rng.choice(optional)
                del obj[dropped.name]
                default = dropped.default if dropped.default is not MISSING \
                    else dropped.default_factory()  # type: ignore[misc]
                expected = replace(good, **{dropped.name: default})  # type: ignore[type-var]
            return kind, json.dumps(obj).encode(), equals(expected)
        name = rng.choice(required)
        del obj[name]
        return kind, json.dumps(obj).encode(), refused(f"field {name!r} is missing")
    if kind == "newer":
        obj["format"] = rng.choice([FORMAT_VERSION + 1, FORMAT_VERSION + 7, 10**6])
        obj[f"added_{random_text(rng, 5)}"] = random_json(rng)
        return kind, json.dumps(obj).encode(), refused("newer than this release reads")
    if kind == "bad_format":
        if rng.random() < 0.2:
            del obj["format"]
            return kind, json.dumps(obj).encode(), refused("no format version")
        obj["format"] = rng.choice([0, -1, "1", 1.0, None, True, [1], {"v": 1}])
        return kind, json.dumps(obj).encode(), refused("is not a version number")
    if kind == "extra_fields":
        for _ in range(rng.randint(1, 4)):
            name = f"x_{random_text(rng, 6)}"
            if name not in names:
                obj[name] = random_json(rng)
        return kind, json.dumps(obj).encode(), equals(good)
    if kind == "surrogate":  # valid JSON, but no UTF-8 can carry it (a Thrift reply)
        texts = [n for n in names if hints[n] is str]
        if not texts:
            return kind, good.encode(), equals(good)
        name = rng.choice(texts)
        obj[name] = f"a{chr(rng.randint(0xD800, 0xDFFF))}b"
        return kind, json.dumps(obj).encode(), refused(f"field {name!r}", "lone surrogate")
    if kind == "random_json":
        return kind, json.dumps(random_json(rng, 4)).encode(), anything
    if kind == "deep":
        depth = rng.choice([100, 5000, 100000])
        inner = "[" * depth + "]" * depth
        return kind, ('{"format": 1, "x": ' + inner + "}").encode(), anything
    # not_utf8
    data = bytearray(good.encode())
    data.insert(rng.randrange(len(data) + 1), rng.choice([0xff, 0xc0, 0x80, 0xfe]))
    return kind, bytes(data), refused("not UTF-8")


def _consume(record: Record) -> None:
    """Run the pure code that reads a decoded record of this type (it must not crash)."""
    from nimbus.state import runtime_view
    from nimbus.state.cluster_snapshot import ClusterSnapshot
    from nimbus.supervisor.policy import desired_workers

    if isinstance(record, Assignment):
        ClusterSnapshot(assignments={"t-1-1": record}).used_ports()
        desired_workers({"t-1-1": record}, "sup", [6700, 6701])
    elif isinstance(record, CodeMeta):
        _ = record.metafile
    elif isinstance(record, WorkerBeat):
        for stats in record.components.values():
            runtime_view._component_stats(stats)


def check_record(cls: type[Record], data: bytes,
                 expect: Callable[[Record | None, RecordError | None], str | None]) -> str | None:
    source = f"/fuzz/{cls.__name__.lower()}s/t-1-1"
    try:
        record: Record | None = cls.decode(data, source=source)
        error = None
    except RecordError as exc:
        record, error = None, exc
    except Exception as exc:
        return f"{type(exc).__name__} escaped: {exc!s:.200}"
    if error is not None and not str(error).startswith(f"{cls.__name__} at {source}: "):
        return f"error does not name the record and node: {error}"
    problem = expect(record, error)
    if problem or record is None:
        return problem
    try:
        if cls.decode(record.encode()) != record:
            return "does not survive an encode/decode round trip"
        _consume(record)
    except Exception as exc:
        return f"accepted, then {type(exc).__name__}: {exc!s:.200}"
    return None


def fuzz_records(seed: int, cases: int, first: int = 0) -> Tally:
    tally = Tally("records")
    for number in range(first, first + cases):
        rng = case_rng(seed, "records", number)
        cls = RECORD_TYPES[number % len(RECORD_TYPES)]
        kind, data, expect = record_case(rng, cls)
        tally.add(f"records #{number} seed {seed} {cls.__name__}", kind,
                  check_record(cls, data, expect))
    return tally


# -- configuration -------------------------------------------------------------------------------
CONFIG_KINDS = ("bytes", "yaml_random", "wrong_type", "huge", "alias_bomb", "recursive",
                "not_utf8", "truncated", "override", "deep")


def _wrong_config_value(rng: random.Random, default: Any) -> Any | None:
    """A value of another type than ``default`` (None if every value fits it)."""
    candidates: list[Any] = [True, 7, 2.5, "text", ["a"], {"a": 1}, None, [1, 2], {}, []]
    if default is None:
        candidates = [7, True, ["a"], {"a": 1}, 2.5]  # built-in nulls take strings
    from nimbus.config import _value_problem

    wrong = [c for c in candidates
             if _value_problem("", default, c, nullable_strings=True) is not None]
    return rng.choice(wrong) if wrong else None


def _alias_bomb(key: str, width: int, levels: int) -> str:
    lines = [f"{key}: [&a0 [" + ",".join(["lol"] * width) + "]"]
    for level in range(1, levels):
        lines.append(f"  , &a{level} [" + ",".join([f"*a{level - 1}"] * width) + "]")
    return "\n".join(lines) + "]\n"


def config_case(rng: random.Random, heavy: bool = True) -> tuple[
        str, bytes | None, list[str], Callable[[Any, ConfigError | None, str], str | None]]:
    """(kind, file content or None, --set overrides, expectation(conf, error, path)).
    ``heavy=False`` makes the huge and deep cases ten times smaller (PyYAML parses
    about 1 MB/s here), for the quick test."""
    scale = 1 if heavy else 10
    defaults = builtin_defaults()
    keys = sorted(defaults)
    kind = rng.choice(CONFIG_KINDS)

    def anything(conf: Any, error: ConfigError | None, path: str) -> str | None:
        return None

    def refused(*needles: str) -> Callable[[Any, ConfigError | None, str], str | None]:
        def check(conf: Any, error: ConfigError | None, path: str) -> str | None:
            if error is None:
                return "accepted"
            wanted = [n.replace("{path}", path) for n in needles]
            missing = [n for n in wanted if n not in str(error)]
            return f"refused without naming {missing}: {error!s:.200}" if missing else None
        return check

    if kind == "bytes":
        return kind, rng.randbytes(rng.randint(0, 400)), [], anything
    if kind == "yaml_random":
        doc = {}
        for _ in range(rng.randint(1, 6)):
            key = rng.choice(keys) if rng.random() < 0.8 else random_text(rng, 12)
            doc[key] = random_json(rng, 2)
        expect = anything
        unknown = [k for k in doc if k not in defaults]
        if unknown:
            expect = refused("{path}")  # an unknown key, or an earlier bad value
        return kind, yaml.safe_dump(doc, allow_unicode=rng.random() < 0.5).encode(), [], expect
    if kind == "wrong_type":
        key = rng.choice(keys)
        value = _wrong_config_value(rng, defaults[key])
        if value is None:
            return kind, yaml.safe_dump({key: defaults[key]}).encode(), [], anything
        return (kind, yaml.safe_dump({key: value}).encode(), [],
                refused("{path}", f"key {key!r}"))
    if kind == "huge":
        key = rng.choice(keys)
        value = rng.choice(["x" * (200_000 // scale), list(range(50_000 // scale)),
                            10**4000, 1e308, {f"k{i}": i for i in range(20_000 // scale)}])
        text = f"{key}: {value}\n" if isinstance(value, int) else yaml.safe_dump({key: value})
        return kind, text.encode(), [], anything
    if kind == "alias_bomb":
        key = rng.choice(keys) if rng.random() < 0.8 else "unknown.key"
        width, levels = rng.choice([(10, 6), (9, 9), (4, 12), (30, 4)])
        return (kind, _alias_bomb(key, width, levels).encode(), [],
                refused("{path}", f"key {key!r}"))
    if kind == "recursive":
        key = rng.choice(keys)
        text = rng.choice([f"{key}: &a [*a]\n", f"{key}: &a {{x: *a}}\n",
                           f"{key}: &a [1, [2, *a]]\n"])
        return kind, text.encode(), [], refused("{path}", f"key {key!r}", "contains itself")
    if kind == "not_utf8":
        good = yaml.safe_dump({k: defaults[k] for k in rng.sample(keys, 3)}).encode()
        at = rng.randrange(len(good) + 1)
        data = good[:at] + bytes([rng.choice([0xff, 0xfe, 0xc0, 0x80])]) + good[at:]
        return kind, data, [], refused("{path}", "not UTF-8")
    if kind == "truncated":
        good = yaml.safe_dump({k: defaults[k] for k in rng.sample(keys, 8)}).encode()
        return kind, good[:rng.randrange(len(good) + 1)], [], anything
    if kind == "override":
        key = rng.choice(keys) if rng.random() < 0.8 else random_text(rng, 10)
        raw = rng.choice([random_text(rng, 30), json.dumps(random_json(rng, 3)),
                          "[" * (3000 // scale), "9" * 5000, "&a [*a]", "!!binary aGk=",
                          "{a: [1, 2", "- a\n- b"])
        return kind, None, [f"{key}={raw}"], anything
    depth = rng.choice([65, 500, 20000 // scale // 2])
    key = rng.choice(keys)
    return (kind, f"{key}: {'[' * depth}{']' * depth}\n".encode(), [],
            refused("{path}"))


def check_config(data: bytes | None, overrides: list[str], expect: Callable[
        [Any, ConfigError | None, str], str | None], workdir: Path) -> str | None:
    path = None
    if data is not None:
        path = workdir / "storm.yaml"
        path.write_bytes(data)
    started = time.monotonic()
    try:
        conf = load_config(path, overrides, extra_defaults={}, unchecked_prefixes={})
        error = None
    except ConfigError as exc:
        conf, error = None, exc
    except Exception as exc:
        return f"{type(exc).__name__} escaped: {exc!s:.200}"
    elapsed = time.monotonic() - started
    if elapsed > SLOW_CASE_S:
        return f"took {elapsed:.1f}s"
    if error is not None and path is None:
        key = overrides[0].partition("=")[0].strip()
        if key not in str(error) and repr(key) not in str(error):
            return f"an override's error does not name its key {key!r}: {error!s:.200}"
    return expect(conf, error, str(path))


def fuzz_config(seed: int, cases: int, heavy: bool = True, first: int = 0) -> Tally:
    tally = Tally("config")
    with tempfile.TemporaryDirectory(prefix="fuzz-config-") as tmp:
        for number in range(first, first + cases):
            kind, data, overrides, expect = config_case(case_rng(seed, "config", number),
                                                        heavy)
            tally.add(f"config #{number} seed {seed}", kind,
                      check_config(data, overrides, expect, Path(tmp)))
    return tally


# -- archives -------------------------------------------------------------------------------
ARCHIVE_FORMATS = ("tar", "tar.gz", "tar.bz2", "tar.xz", "zip")
# (name, the reason it is refused) of entries that must never be accepted.
HOSTILE_NAMES = (
    ("../escape-marker", "leaves its directory"),
    ("a/../../escape-marker", "leaves its directory"),
    ("ok/../../../escape-marker", "leaves its directory"),
    ("/tmp/escape-marker", "has an absolute path"),
    ("\\escape-marker", "has an absolute path"),
    ("C:escape-marker", "has an absolute path"),
    ("..\\escape-marker", "leaves its directory"),
    ("x" * 300, "longer than a file system takes"),
)
TAR_TYPES = {"symlink": (tarfile.SYMTYPE, "is a link"), "hardlink": (tarfile.LNKTYPE, "is a link"),
             "chardev": (tarfile.CHRTYPE, "is not a file"),
             "blockdev": (tarfile.BLKTYPE, "is not a file"),
             "fifo": (tarfile.FIFOTYPE, "is not a file")}
ZIP_MODES = {"symlink": (0o120777, "is a symlink"), "chardev": (0o020644, "is not a file"),
             "blockdev": (0o060644, "is not a file"), "fifo": (0o010644, "is not a file"),
             "socket": (0o140644, "is not a file")}
ARCHIVE_KINDS = ("safe", "hostile_name", "special_entry", "corrupted", "random_bytes",
                 "size_bomb", "count_bomb", "header_bomb")
FUZZ_MAX_BYTES = 1 << 20
FUZZ_MAX_ENTRIES = 64


@dataclass
class Entry:
    name: str
    data: bytes = b""
    special: str = ""       # "", "dir", or a key of TAR_TYPES / ZIP_MODES


def write_archive(path: Path, fmt: str, entries: list[Entry]) -> None:
    if fmt == "zip":
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
            for e in entries:
                info = zipfile.ZipInfo(e.name + ("/" if e.special == "dir" else ""))
                if e.special == "dir":
                    info.external_attr = (0o040755 << 16) | 0x10
                elif e.special:
                    info.external_attr = ZIP_MODES[e.special][0] << 16
                else:
                    info.external_attr = 0o100644 << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, e.data)
        return
    mode = {"tar": "w", "tar.gz": "w:gz", "tar.bz2": "w:bz2", "tar.xz": "w:xz"}[fmt]
    with tarfile.open(path, mode, format=tarfile.PAX_FORMAT) as tf:
        for e in entries:
            info = tarfile.TarInfo(e.name)
            if e.special == "dir":
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
            elif e.special:
                info.type = TAR_TYPES[e.special][0]
                info.linkname = "../../escape-marker" if e.special in ("symlink", "hardlink") \
                    else ""
                tf.addfile(info)
            else:
                info.size = len(e.data)
                tf.addfile(info, io.BytesIO(e.data))


def _safe_entries(rng: random.Random) -> list[Entry]:
    entries = [Entry("topology.yaml", b"command: [true]\n")]
    for _ in range(rng.randint(0, 6)):
        depth = rng.randint(1, 3)
        name = "/".join(rng.choice(["pkg", "data", "lib", "a.b", "x-y", "\u00e9t\u00e9"])
                        for _ in range(depth)) + f"/f{rng.randint(0, 999)}.txt"
        entries.append(Entry(name, rng.randbytes(rng.randint(0, 2000))))
    if rng.random() < 0.3:
        entries.append(Entry("emptydir", special="dir"))
    return entries


def archive_case(rng: random.Random, workdir: Path) -> tuple[str, Path, str | None]:
    """(kind, archive path, the reason it must be refused, or None if it may pass)."""
    fmt = rng.choice(ARCHIVE_FORMATS)
    path = workdir / f"bundle.{fmt}"
    kind = rng.choice(ARCHIVE_KINDS)
    entries = _safe_entries(rng)
    if kind == "safe":
        write_archive(path, fmt, entries)
        return kind, path, None
    if kind == "hostile_name":
        name, reason = rng.choice(HOSTILE_NAMES)
        entries.insert(rng.randint(0, len(entries)), Entry(name, b"evil"))
        write_archive(path, fmt, entries)
        return kind, path, reason
    if kind == "special_entry":
        table = ZIP_MODES if fmt == "zip" else TAR_TYPES
        special = rng.choice(sorted(table))
        entries.insert(rng.randint(0, len(entries)), Entry(f"special-{special}",
                                                            special=special))
        write_archive(path, fmt, entries)
        return kind, path, table[special][1]
    if kind == "corrupted":
        write_archive(path, fmt, entries)
        data = bytearray(path.read_bytes())
        if rng.random() < 0.5:
            data = data[:rng.randrange(len(data))]
        else:
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        path.write_bytes(bytes(data))
        return kind, path, None  # refused or, if still readable, safe
    if kind == "random_bytes":
        path.write_bytes(rng.randbytes(rng.randint(0, 4096)))
        return kind, path, None
    if kind == "size_bomb":
        # Zeros compress about 1000:1; together they declare more than the limit.
        big = bytes(FUZZ_MAX_BYTES // rng.randint(1, 3) + 1)
        entries += [Entry(f"zeros{i}", big) for i in range(3)]
        write_archive(path, fmt, entries)
        return kind, path, "unpacks to more than"
    if kind == "count_bomb":
        entries += [Entry(f"many/{i}") for i in range(FUZZ_MAX_ENTRIES + 1)]
        write_archive(path, fmt, entries)
        return kind, path, f"more than {FUZZ_MAX_ENTRIES} entries"
    # header_bomb: a GNU long name (tar) or a central directory claiming a million
    # entries (zip), both a few KiB on disk.
    if fmt == "zip":
        write_archive(path, fmt, entries)
        data = bytearray(path.read_bytes())
        at = data.rfind(b"PK\x05\x06")
        struct.pack_into("<HH", data, at + 8, 0xFFFF if rng.random() < 0.5 else 60000,
                         1_000_000 % 65536)
        path.write_bytes(bytes(data))
        return kind, path, None  # refused, or a damaged count that zipfile rejects
    write_tar_header_bomb(path, fmt, 2 * 1024 * 1024)
    return kind, path, "an entry header claims more than"


def write_tar_header_bomb(path: Path, fmt: str, size: int) -> None:
    """A tar whose first header is a GNU long name of ``size`` bytes (of 'a's)."""
    info = tarfile.TarInfo("././@LongLink")
    info.type, info.size = tarfile.GNUTYPE_LONGNAME, size
    header = info.tobuf(format=tarfile.GNU_FORMAT)
    opener: Callable[..., Any] = {"tar": open, "tar.gz": _gz, "tar.bz2": _bz2,
                                  "tar.xz": _xz}[fmt]
    with opener(path, "wb") as f:
        f.write(header)
        chunk = b"a" * 65536
        for _ in range(size // len(chunk)):
            f.write(chunk)
        f.write(bytes(-size % 512))
        f.write(bytes(1024))


def _gz(path: Path, mode: str) -> Any:
    import gzip

    return gzip.open(path, mode, compresslevel=1)


def _bz2(path: Path, mode: str) -> Any:
    import bz2

    return bz2.open(path, mode)


def _xz(path: Path, mode: str) -> Any:
    import lzma

    return lzma.open(path, mode)


def _listing(root: Path, skip: Path) -> list[tuple[str, int]]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        if Path(dirpath) == skip or skip in Path(dirpath).parents:
            continue
        for name in dirnames + filenames:
            full = Path(dirpath) / name
            out.append((str(full.relative_to(root)), full.lstat().st_mode))
    return sorted(out)


def check_archive(path: Path, reason: str | None, sandbox: Path) -> str | None:
    """Check ``path``; if it passes, unpack it as a supervisor does into
    ``sandbox/code/<id>/resources`` and look for anything written elsewhere."""
    from nimbus.supervisor.code_cache import CodeCache, CodeVerificationError

    try:
        check_bundle(path, FUZZ_MAX_BYTES, max_entries=FUZZ_MAX_ENTRIES)
    except BundleError as exc:
        if not str(exc).startswith(path.name) and "bundle" not in str(exc):
            return f"error does not name the archive: {exc}"
        if reason is not None and reason not in str(exc):
            return f"refused for another reason than {reason!r}: {exc}"
        return None
    except Exception as exc:
        return f"{type(exc).__name__} escaped: {exc!s:.200}"
    if reason is not None:
        return f"accepted, but it must be refused ({reason})"
    code_root = sandbox / "code"
    code_root.mkdir(parents=True, exist_ok=True)
    (sandbox / "sentinel").write_text("unchanged")
    before = _listing(sandbox, code_root)
    dest = code_root / "fuzz-1-1" / "resources"
    dest.parent.mkdir(parents=True, exist_ok=True)
    cache = CodeCache(code_root, FUZZ_MAX_BYTES)
    try:
        cache._unpack("fuzz-1-1", path, dest)
    except CodeVerificationError:
        pass  # e.g. a corrupted member that fails its CRC when read: refused, cleanly
    except Exception as exc:
        return f"unpacking {type(exc).__name__}: {exc!s:.200}"
    problems = []
    if _listing(sandbox, code_root) != before or (sandbox / "sentinel").read_text() != \
            "unchanged":
        problems.append("something changed outside the code directory")
    for marker in (sandbox.parent / "escape-marker", Path("/tmp/escape-marker")):
        if marker.exists():
            problems.append(f"{marker} was written")
    for dirpath, dirnames, filenames in os.walk(dest):
        for name in dirnames + filenames:
            full = Path(dirpath) / name
            mode = full.lstat().st_mode
            if not (os.path.isfile(full) or os.path.isdir(full)) or os.path.islink(full):
                problems.append(f"unpacked {full} is not a plain file or directory "
                                f"(mode {mode:o})")
    return "; ".join(problems) or None


def fuzz_archives(seed: int, cases: int, first: int = 0) -> Tally:
    import shutil

    tally = Tally("archives")
    with tempfile.TemporaryDirectory(prefix="fuzz-archives-") as tmp:
        for number in range(first, first + cases):
            case_dir = Path(tmp) / f"case-{number}"
            case_dir.mkdir()
            kind, path, reason = archive_case(case_rng(seed, "archives", number), case_dir)
            tally.add(f"archives #{number} seed {seed} {path.name}", kind,
                      check_archive(path, reason, case_dir / "sandbox"))
            shutil.rmtree(case_dir, ignore_errors=True)
    return tally


# -- thrift ----------------------------------------------------------------------------------
THRIFT_KINDS = ("bytes", "random_frame", "oversized_frame", "truncated", "random_args",
                "typed_args", "wrong_message_type", "unknown_method")
# Names the typed-args cases never use: the campaign must not kill what it checks on.
PROTECTED_NAMES: set[str] = set()


def _random_thrift(rng: random.Random, ttype: int, spec: Any, depth: int = 0) -> Any:
    from thriftpy2.thrift import TType

    if rng.random() < 0.15:
        return None
    if ttype == TType.STRING:
        return rng.choice([random_text(rng, 30), "../../etc/passwd", "/etc/passwd", "",
                           "x" * rng.randint(0, 3000), "{}", '{"topology.workers": -1}',
                           "fuzz-healthy" + random_text(rng, 2)])
    if ttype == TType.BINARY:
        return rng.randbytes(rng.randint(0, 2000))
    if ttype in (TType.I08, TType.I16, TType.I32, TType.I64):
        bits = {TType.I08: 8, TType.I16: 16, TType.I32: 32, TType.I64: 64}[ttype]
        return rng.randint(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    if ttype == TType.DOUBLE:
        return rng.choice([0.0, -1.5, 1e300, float("nan")])
    if ttype == TType.BOOL:
        return rng.random() < 0.5
    if ttype == TType.STRUCT:
        return _random_struct(rng, spec, depth + 1) if depth < 3 else None
    if ttype in (TType.LIST, TType.SET):
        elem_type, elem_spec = (spec, None) if isinstance(spec, int) else spec
        items = [_random_thrift(rng, elem_type, elem_spec, depth + 1)
                 for _ in range(rng.randint(0, 3))]
        items = [i for i in items if i is not None]
        return items if ttype == TType.LIST else set(items) if all(
            isinstance(i, (str, int, bytes, float, bool)) for i in items) else []
    if ttype == TType.MAP:
        (ktype, kspec), (vtype, vspec) = [(s, None) if isinstance(s, int) else s for s in spec]
        out = {}
        for _ in range(rng.randint(0, 3)):
            key = _random_thrift(rng, ktype, kspec, depth + 1)
            value = _random_thrift(rng, vtype, vspec, depth + 1)
            if key is not None and value is not None and isinstance(key, (str, int)):
                out[key] = value
        return out
    return None


def _random_struct(rng: random.Random, cls: Any, depth: int = 0) -> Any:
    obj = cls()
    for spec in cls.thrift_spec.values():
        ttype, name = spec[0], spec[1]
        sub = spec[2] if len(spec) == 4 else None
        setattr(obj, name, _random_thrift(rng, ttype, sub, depth))
    return obj


def thrift_case(rng: random.Random, max_frame: int) -> tuple[str, bytes, bool]:
    """(kind, bytes to send, whether a reply must come back)."""
    from raw_thrift import framed, message
    from thriftpy2.thrift import TMessageType

    from nimbus.thrift import nimbus_ha

    service = nimbus_ha.NimbusHa  # Storm's methods and nimbus-ha's own
    methods = sorted(service.thrift_services)
    kind = rng.choice(THRIFT_KINDS)
    if kind == "bytes":
        return kind, rng.randbytes(rng.randint(1, 8192)), False
    if kind == "random_frame":
        return kind, framed(rng.randbytes(rng.randint(0, 4096))), False
    if kind == "oversized_frame":
        length = rng.choice([max_frame + 1, 2**31 - 1, -1, -(2**31), 0])
        return kind, struct.pack("!i", length) + rng.randbytes(rng.randint(0, 64)), False
    if kind == "truncated":
        method = rng.choice(methods)
        body = message(method, _random_struct(rng, getattr(service, f"{method}_args")))
        request = framed(body)
        return kind, request[:rng.randrange(len(request))], False
    if kind == "random_args":
        method = rng.choice(methods)
        head = message(method, service.getClusterInfo_args())[:-1]  # no stop byte
        return kind, framed(head + rng.randbytes(rng.randint(0, 512))), False
    if kind == "typed_args":
        method = rng.choice(methods)
        args = _random_struct(rng, getattr(service, f"{method}_args"))
        for name in ("name",):
            if getattr(args, name, None) in PROTECTED_NAMES:
                setattr(args, name, "not-" + getattr(args, name))
        try:
            body = message(method, args)
        except Exception:  # a value thriftpy2 cannot write: send the empty struct
            body = message(method, getattr(service, f"{method}_args")())
        return kind, framed(body), True
    if kind == "wrong_message_type":
        body = bytearray(message(rng.choice(methods), service.getClusterInfo_args()))
        body[3] = rng.choice([TMessageType.REPLY, TMessageType.EXCEPTION, 7, 0])
        return kind, framed(bytes(body)), False
    name = random_text(rng, 20) or "x"
    return kind, framed(message(name, service.getClusterInfo_args())), False


def _exchange(port: int, data: bytes, timeout_s: float) -> str:
    """Send ``data``, end the stream, and read until the server closes: "reply",
    "dropped" or "timeout"."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            return "dropped"
        got = b""
        try:
            while True:
                more = sock.recv(65536)
                if not more:
                    break
                got += more
        except (ConnectionResetError, BrokenPipeError):
            pass
        except TimeoutError:
            return "timeout"
    return "reply" if len(got) >= 4 else "dropped"


def fuzz_thrift(seed: int, cases: int, port: int, max_frame: int,
                serves: Callable[[], bool], idle: Callable[[], bool],
                timeout_s: float = 15.0, first: int = 0,
                logs: LogWatch | None = None) -> Tally:
    """Send ``cases`` frames to the Thrift server on ``port``, one connection each.
    ``serves()`` must be true after every case (say, getClusterInfo answers) and
    ``idle()`` (no connection open) soon after the last. With ``logs`` (the server's),
    a case after which a traceback was logged (an exception nobody expected) fails."""
    from waiting import wait_for

    tally = Tally("thrift")
    for number in range(first, first + cases):
        kind, data, must_reply = thrift_case(case_rng(seed, "thrift", number), max_frame)
        problem = None
        mark = logs.mark() if logs is not None else 0
        try:
            outcome = _exchange(port, data, timeout_s)
        except OSError as exc:
            outcome = f"connect failed: {exc}"
        if outcome == "timeout":
            problem = f"no reply and no drop within {timeout_s}s"
        elif must_reply and outcome != "reply":
            problem = f"a well-formed call got no reply ({outcome})"
        elif outcome.startswith("connect failed"):
            problem = outcome
        try:
            if not serves():
                problem = (problem + "; " if problem else "") + "the server stopped answering"
        except Exception as exc:
            problem = (problem + "; " if problem else "") + f"getClusterInfo failed: {exc}"
        if logs is not None:
            for text in logs.tracebacks_since(mark):
                problem = (problem + "; " if problem else "") + \
                    f"unexpected exception logged: {text[:200]}"
        tally.add(f"thrift #{number} seed {seed}", kind, problem)
    try:
        wait_for(idle, timeout_s, "every fuzz connection to close")
    except TimeoutError as exc:
        tally.failures.append(f"thrift seed {seed}: {exc}")
    return tally



# -- a nimbus to fuzz, and garbage in its ZooKeeper nodes -----------------------------------
HEALTHY = "fuzz-healthy"
STAND_IN_SUPERVISOR = "fuzz-supervisor"
STAND_IN_PORT = 6700


class LogWatch(logging.Handler):
    """Every record of the ``nimbus`` loggers: errors, and unexpected exceptions (any
    record with a traceback), counted from a mark."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[tuple[int, str, bool]] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception as exc:  # a bad format string is itself worth reporting
            text = f"unformattable log record {record.msg!r}: {exc}"
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            text += f" ({type(exc).__name__}: {exc!s:.300})"
        self.records.append((record.levelno, f"{record.name}: {text}",
                             record.exc_info is not None))

    def mark(self) -> int:
        return len(self.records)

    def errors_since(self, mark: int) -> list[str]:
        return [text for level, text, _ in self.records[mark:] if level >= logging.ERROR]

    def tracebacks_since(self, mark: int) -> list[str]:
        return [text for _, text, tb in self.records[mark:] if tb]


class FuzzNimbus:
    """A nimbus in this process (real ZooKeeper, real Thrift server, real handler) that
    leads a cluster with one healthy topology, whose only worker is placed on a stand-in
    supervisor (a heartbeat node, no process; the worker timeouts are long, so it stays
    placed). Use as a context manager."""

    def __init__(self, zk_port: int, zk_root: str, work_dir: Path):
        self.zk_port = zk_port
        self.zk_root = zk_root
        self.work_dir = Path(work_dir)
        self.logs = LogWatch()
        self.daemon: Any = None
        self.topology_id = ""

    def __enter__(self) -> FuzzNimbus:
        from kazoo.client import KazooClient
        from waiting import wait_for

        from nimbus.daemons.nimbus import NimbusDaemon
        from nimbus.dev.zookeeper import free_port
        from nimbus.distribution.archive import pack_directory
        from nimbus.state.cluster_state import StormClusterState
        from nimbus.thrift.client import NimbusClient

        nimbus_log = logging.getLogger("nimbus")
        nimbus_log.addHandler(self.logs)
        self._level = nimbus_log.level
        nimbus_log.setLevel(logging.INFO)
        self.port = free_port()
        self.conf = load_config(overrides={
            "storm.zookeeper.servers": ["127.0.0.1"], "storm.zookeeper.port": self.zk_port,
            "storm.zookeeper.root": self.zk_root, "storm.zookeeper.session.timeout": 20000,
            "nimbus.thrift.port": self.port, "nimbus.seeds": [f"127.0.0.1:{self.port}"],
            "storm.local.dir": str(self.work_dir / "nimbus-local"),
            "nimbus.monitor.freq.secs": 1, "nimbus.code.sync.freq.secs": 2,
            "nimbus.task.launch.secs": 10**6, "nimbus.task.timeout.secs": 10**6},
            extra_defaults={}, unchecked_prefixes={})
        self.zk = KazooClient(hosts=f"127.0.0.1:{self.zk_port}", timeout=20.0)
        self.zk.start(timeout=15)
        self.state = StormClusterState(self.zk, self.zk_root)
        self.daemon = NimbusDaemon(self.conf)
        try:
            self.daemon.start()
            wait_for(self.daemon.master.elector.is_leader, 60, "the fuzzed nimbus to lead")
            src = self.work_dir / "healthy"
            src.mkdir(parents=True, exist_ok=True)
            (src / "topology.yaml").write_text('command: ["true"]\n')
            self.topology_id = NimbusClient(self.conf).submit(HEALTHY, pack_directory(src), {})
            self.ensure_stand_in()
            PROTECTED_NAMES.add(HEALTHY)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("nimbus").removeHandler(self.logs)
        logging.getLogger("nimbus").setLevel(self._level)
        if self.daemon is not None:
            self.daemon.stop()
        self.zk.stop()
        self.zk.close()

    def ensure_stand_in(self) -> None:
        """(Re)make the stand-in supervisor's heartbeat (ephemeral: a session lost on a
        loaded machine takes it along) and wait until the healthy worker is on it."""
        from kazoo.exceptions import NodeExistsError
        from waiting import wait_for

        try:
            self.zk.create(self.state.path("supervisors", STAND_IN_SUPERVISOR),
                           SupervisorInfo(time_secs=int(time.time()), hostname="127.0.0.1",
                                          meta=[STAND_IN_PORT]).encode(), ephemeral=True)
        except NodeExistsError:
            return
        self.daemon.master.wake_duties()
        wait_for(lambda: (a := self.state.assignment_info(self.topology_id)) and
                 a.executor_node_port == {"worker-0": [STAND_IN_SUPERVISOR, STAND_IN_PORT]}
                 or self.daemon.master.wake_duties(), 60, "the healthy worker on the stand-in")

    # -- probes ------------------------------------------------------------------------
    def client(self) -> Any:
        from nimbus.thrift.client import connect

        return connect(f"127.0.0.1:{self.port}", timeout_s=15)

    def serves(self) -> bool:
        """getClusterInfo answers and lists the healthy topology, ACTIVE."""
        with self.client() as client:
            info = client.getClusterInfo()
        return [(t.name, t.status) for t in info.topologies if t.name == HEALTHY] == [
            (HEALTHY, "ACTIVE")]

    def idle(self) -> bool:
        return self.daemon.server.active_connections == 0

    def healthy_state(self) -> dict[str, Any]:
        """What nothing may change: the healthy topology's nodes (data and version) and
        its code on this nimbus."""
        from nimbus.distribution.local_code import sha256_file

        out: dict[str, Any] = {}
        for sub in ("storms", "assignments", "code-distributor"):
            data, stat = self.zk.get(self.state.path(sub, self.topology_id))
            out[sub] = (data, stat.version)
        code = self.daemon.master.store.path(self.topology_id)
        out["code"] = sorted((p.name, sha256_file(p)) for p in code.iterdir())
        return out

    def settle(self, timeout_s: float = 30.0) -> None:
        """Wake every reader and wait until each has run twice since: the summary cache,
        the code sync and the duty cycle."""
        from waiting import wait_for

        master = self.daemon.master
        runs, cycles = master.sync.runs, master.cycles
        master.sync.wake()
        master.wake_duties()
        master.cache.refresh_now(timeout_s)
        wait_for(lambda: master.sync.runs >= runs + 2 or master.sync.wake(), timeout_s,
                 "two code-sync passes")
        wait_for(lambda: master.cycles >= cycles + 2 or master.wake_duties(),
                 timeout_s, "two cycles with the leader's duties")
        master.cache.refresh_now(timeout_s)


NODE_KINDS = ("storms", "storms_bad_id", "assignments", "supervisors", "workerbeats",
              "errors", "code_distributor", "code_distributor_healthy", "nimbuses",
              "leader_lock", "leader_lock_bad_name", "root")


@dataclass
class NodeCase:
    kind: str
    path: str
    data: bytes
    must_log: bool      # the data (or the name) is unreadable: an error must name the path
    sequence: bool = False
    # Nodes made first and removed afterwards (say, a StormBase beside a code node, so
    # that the code node is not an unfinished submission's, which the leader removes).
    companions: list[tuple[str, bytes]] = field(default_factory=list)
    created: str = ""   # the node's path once written (a sequence node's has a suffix)


def _garbage(rng: random.Random, cls: type[Record]) -> tuple[bytes, bool]:
    """Node data for a ``cls`` node, and whether this release must refuse it."""
    _kind, data, _expect = record_case(rng, cls)
    try:
        cls.decode(data)
        return data, False
    except RecordError:
        return data, True


def node_case(rng: random.Random, fz: FuzzNimbus, number: int) -> NodeCase:
    state, healthy = fz.state, fz.topology_id
    kind = rng.choice(NODE_KINDS)
    junk = f"junk-{number}-1"
    if kind == "storms":
        return NodeCase(kind, state.path("storms", junk), *_garbage(rng, StormBase))
    if kind == "storms_bad_id":
        name = rng.choice(["junk", "a-b", "-1-1", "x" * 300, "junk-1-x", "\u00e9-1-1"])
        return NodeCase(kind, state.path("storms", name), rng.randbytes(20), True)
    if kind == "assignments":
        return NodeCase(kind, state.path("assignments", junk), *_garbage(rng, Assignment))
    if kind == "supervisors":
        return NodeCase(kind, state.path("supervisors", f"sup-{junk}"),
                        *_garbage(rng, SupervisorInfo))
    if kind == "workerbeats":
        return NodeCase(kind, state.path("workerbeats", healthy,
                                         f"{STAND_IN_SUPERVISOR}-{STAND_IN_PORT}"),
                        *_garbage(rng, WorkerBeat))
    if kind == "errors":
        return NodeCase(kind, state.path("errors", healthy, "spout", "e"),
                        *_garbage(rng, ErrorInfo), sequence=True,
                        companions=[(state.path("errors", healthy, "spout"), b"")])
    if kind == "code_distributor":
        base = StormBase(storm_name=junk, launch_time_secs=1, status="INACTIVE").encode()
        return NodeCase(kind, state.path("code-distributor", junk), *_garbage(rng, CodeMeta),
                        companions=[(state.path("storms", junk), base)])
    if kind == "code_distributor_healthy":
        data, refused = _garbage(rng, CodeMeta)
        return NodeCase(kind, state.code_path(healthy), data, refused)
    if kind == "nimbuses":
        return NodeCase(kind, state.path("nimbuses", f"10.9.{number % 250}.1:6627"),
                        *_garbage(rng, NimbusInfo))
    if kind == "leader_lock":
        data = rng.choice([rng.randbytes(16), b"", b"not an address", b"host:port"])
        return NodeCase(kind, state.path("leader-lock", f"nimbus-junk-{9999999990 + number % 9}"),
                        data, True)
    if kind == "leader_lock_bad_name":
        return NodeCase(kind, state.path("leader-lock", rng.choice(["junk", "nimbus-x-y", "-"])),
                        rng.randbytes(8), True)
    data = rng.choice([rng.randbytes(rng.randint(1, 64)), b"", b"not a cluster id",
                       "\u00e9\u00e9".encode()])
    return NodeCase("root", state.root, data, True)


def check_node_case(fz: FuzzNimbus, case: NodeCase) -> str | None:
    """Write ``case``'s garbage, let the nimbus read it, check it coped, then undo it."""
    from kazoo.exceptions import NodeExistsError, NoNodeError
    from waiting import wait_for

    zk = fz.zk
    problems: list[str] = []
    fz.ensure_stand_in()
    before = fz.healthy_state()
    fz.daemon.master.state.forget_unreadable()  # each case must be reported, as if it were first
    mark = fz.logs.mark()
    restore: tuple[str, bytes] | None = None
    path = case.path
    for companion, data in case.companions:
        zk.create(companion, data)
    if case.kind in ("root", "code_distributor_healthy"):
        restore = (path, zk.get(path)[0])
        zk.set(path, case.data)
    else:
        try:
            path = zk.create(path, case.data, sequence=case.sequence)
        except NodeExistsError:
            zk.set(path, case.data)
    case.created = path
    try:
        fz.settle()
        if not fz.serves():
            problems.append("getClusterInfo no longer lists the healthy topology ACTIVE")
        with fz.client() as client:
            info = client.getTopologyInfo(fz.topology_id)
            if info.name != HEALTHY:
                problems.append(f"getTopologyInfo names {info.name!r}")
        if case.must_log:
            shown = path if case.kind != "root" else f"ZooKeeper root {path}"
            if not any(shown in e for e in fz.logs.errors_since(mark)):
                problems.append(f"no error names {shown}")
        if case.kind not in ("root",) and case.must_log:
            try:
                if zk.get(path)[0] != case.data:
                    problems.append("the garbage node was overwritten")
            except NoNodeError:
                problems.append("the garbage node was deleted")
    finally:
        if restore is not None:
            zk.set(*restore)
        else:
            try:
                zk.delete(path)
            except NoNodeError:
                pass
        for companion, _data in reversed(case.companions):
            try:
                zk.delete(companion)
            except NoNodeError:
                pass
        if case.kind == "root":
            wait_for(fz.daemon.master.elector.is_leader, 60, "leadership back once the root is")
        fz.settle()
    if case.kind == "code_distributor_healthy":  # written twice here: garbage, then back
        data, version = before["code-distributor"]
        before["code-distributor"] = (data, version + 2)
    after = fz.healthy_state()
    changed = sorted(k for k in before if before[k] != after[k])
    if changed:
        problems.append(f"the healthy topology's {', '.join(changed)} changed: "
                        f"{[after[k] for k in changed]!s:.300}")
    problems += [f"unexpected exception logged: {t[:200]}" for t in fz.logs.tracebacks_since(mark)]
    return "; ".join(problems) or None


def fuzz_nodes(seed: int, cases: int, fz: FuzzNimbus, first: int = 0) -> Tally:
    tally = Tally("nodes")
    for number in range(first, first + cases):
        case = node_case(case_rng(seed, "nodes", number), fz, number)
        try:
            problem = check_node_case(fz, case)
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc!s:.200}"
        tally.add(f"nodes #{number} seed {seed} {case.path}", case.kind, problem)
    return tally
