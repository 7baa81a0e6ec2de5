"""Our storm.thrift against an independent copy of Apache Storm's own IDL.

The integration wire test generates its Apache Thrift client from *our* storm.thrift, so a
transcription error there (a wrong field id, type or requiredness) would be shared by both
ends and go unnoticed.  This module compares our IDL with the ``storm.thrift`` text that the
``streamparse`` distribution on PyPI embeds (``streamparse/thrift.py``, ``_THRIFT_STR``;
streamparse 5.0.1 carries Storm 1.1.1's IDL), installed by the ``test`` extra.

For every struct, union and exception in our IDL: each field's id, name, wire type (element
types recursively, structs and enums by name), requiredness and default must match Storm's.
A field that only Storm has is fine when optional (reported, not failed); a field that only
we have fails.  For every method of our ``Nimbus`` service: Storm's ``Nimbus`` must have it,
with the same argument ids/types, exception ids/types and return type.  Enums must agree.
thriftpy2 folds ``optional`` and default requiredness together, so Apache Thrift's compiler
(``thrift --gen json``, installed by scripts/setup.sh) checks that three-way distinction.

The Storm text is read from streamparse's source file without importing it: importing
``streamparse.thrift`` parses the text under thriftpy2's module name ``storm_thrift``, which is
the name ``nimbus.thrift`` uses too, and thriftpy2's parse cache then hands back *our* module.
"""

from __future__ import annotations

import ast
import importlib.util
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import thriftpy2.parser
from thriftpy2.thrift import TType

from nimbus.thrift import storm as ours

OUR_IDL = Path(__file__).resolve().parents[1] / "nimbus" / "thrift" / "storm.thrift"
TYPE_NAMES = TType._VALUES_TO_NAMES  # 11 -> STRING (not its alias UTF7), 18 -> BINARY

# Fields ("Struct.field") that nimbus-ha adds on top of Storm's IDL: none.  Each would need
# a reason documented here and in storm.thrift.
EXTENSIONS: set[str] = set()


# --------------------------------------------------------------------------- loading


def storm_idl_text() -> str:
    """Storm's storm.thrift as embedded in the installed streamparse distribution."""
    spec = importlib.util.find_spec("streamparse")  # finds the package, does not import it
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("streamparse is not installed: pip install -e '.[test]'")
    source = Path(list(spec.submodule_search_locations)[0]) / "thrift.py"
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "_THRIFT_STR"):
            return ast.literal_eval(node.value)
    pytest.fail(f"no _THRIFT_STR assignment in {source}")


def parse_idl_text(text: str, module_name: str):
    # A private module name and no cache: never confused with nimbus.thrift's module.
    return thriftpy2.parser.parse_fp(io.StringIO(text), module_name, enable_cache=False)


@pytest.fixture(scope="module")
def storm_text() -> str:
    return storm_idl_text()


@pytest.fixture(scope="module")
def upstream(storm_text):
    module = parse_idl_text(storm_text, "storm_upstream_thrift")
    assert module is not ours and hasattr(module, "Nimbus")
    return module


# --------------------------------------------------------------------------- comparator


def type_desc(ttype: int, extra=None):
    """A comparable description of a thriftpy2 field type."""
    if ttype == TType.STRUCT:
        return f"struct {extra.__name__}"
    if ttype == TType.I32 and extra is not None:
        return f"enum {extra.__name__}"
    if ttype in (TType.LIST, TType.SET):
        return f"{TYPE_NAMES[ttype].lower()}<{element_desc(extra)}>"
    if ttype == TType.MAP:
        return f"map<{element_desc(extra[0])}, {element_desc(extra[1])}>"
    return TYPE_NAMES[ttype].lower()


def element_desc(spec):
    return type_desc(*spec) if isinstance(spec, tuple) else type_desc(spec)


def field_table(cls) -> dict[int, tuple[str, str, bool]]:
    """{field id: (name, type, required)} from a thriftpy2 struct's thrift_spec."""
    table = {}
    for fid, spec in cls.thrift_spec.items():
        ttype, name, *extra, required = spec
        table[fid] = (name, type_desc(ttype, *extra), required)
    return table


def kind_of(module, cls) -> str:
    meta = module.__thrift_meta__
    for kind in ("structs", "unions", "exceptions"):
        if any(c.__name__ == cls.__name__ for c in meta[kind]):
            return kind[:-1]
    return "?"


def compare_fields(what: str, mine, theirs, *, storm_only_ok_if_optional: bool):
    """(problems, infos) for the fields of two thriftpy2 structs."""
    problems, infos = [], []
    a, b = field_table(mine), field_table(theirs)
    a_defaults, b_defaults = dict(mine.default_spec), dict(theirs.default_spec)
    for fid in sorted(set(a) | set(b)):
        if fid not in b:
            if f"{what}.{a[fid][0]}" not in EXTENSIONS:
                problems.append(f"{what}: field {fid} ({a[fid][0]}) is not in Storm's IDL")
            continue
        if fid not in a:
            name, typ, required = b[fid]
            if storm_only_ok_if_optional and not required:
                infos.append(f"{what}: Storm-only optional field {fid}: {typ} {name}")
            else:
                problems.append(f"{what}: Storm's field {fid} ({typ} {name}"
                                f"{', required' if required else ''}) is missing from ours")
            continue
        (n1, t1, r1), (n2, t2, r2) = a[fid], b[fid]
        if n1 != n2:
            problems.append(f"{what}: field {fid} is named {n1!r}, Storm's is {n2!r}")
        if t1 != t2:
            problems.append(f"{what}: field {fid} ({n1}) is {t1}, Storm's is {t2}")
        if r1 != r2:
            problems.append(f"{what}: field {fid} ({n1}) is "
                            f"{'required' if r1 else 'not required'}, Storm's is "
                            f"{'required' if r2 else 'not required'}")
        if a_defaults.get(n1) != b_defaults.get(n2):
            problems.append(f"{what}: field {fid} ({n1}) defaults to {a_defaults.get(n1)!r}, "
                            f"Storm's to {b_defaults.get(n2)!r}")
    return problems, infos


def compare_struct(name: str, mine_module, storm_module):
    mine = getattr(mine_module, name)
    theirs = getattr(storm_module, name, None)
    if theirs is None:
        return [f"{name} is not in Storm's IDL"], []
    problems, infos = compare_fields(name, mine, theirs, storm_only_ok_if_optional=True)
    k1, k2 = kind_of(mine_module, mine), kind_of(storm_module, theirs)
    if k1 != k2:
        problems.insert(0, f"{name} is a {k1}, Storm's is a {k2}")
    return problems, infos


def compare_method(name: str, mine_module, storm_module):
    """Arguments, return type and exceptions of one Nimbus method; all must match exactly."""
    if name not in storm_module.Nimbus.thrift_services:
        return [f"Nimbus.{name} is not in Storm's Nimbus service"]
    problems = []
    for suffix in ("_args", "_result"):  # the result struct: 0 = return value, 1.. = throws
        label = f"Nimbus.{name}{suffix}"
        found, _ = compare_fields(label, getattr(mine_module.Nimbus, name + suffix),
                                  getattr(storm_module.Nimbus, name + suffix),
                                  storm_only_ok_if_optional=False)
        problems += found
    return problems


def compare_enum(name: str, mine_module, storm_module):
    theirs = getattr(storm_module, name, None)
    if theirs is None:
        return [f"enum {name} is not in Storm's IDL"]
    a = getattr(mine_module, name)._NAMES_TO_VALUES
    b = theirs._NAMES_TO_VALUES
    return [] if a == b else [f"enum {name} is {a}, Storm's is {b}"]


def compiler_requiredness(idl: Path, out: Path) -> dict[tuple[str, int], str]:
    """{(struct, field id): 'required' | 'optional' | 'req_out'} from `thrift --gen json`."""
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(["thrift", "--gen", "json", "-out", str(out), str(idl)], check=True)
    doc = json.loads((out / f"{idl.stem}.json").read_text())
    return {(s["name"], f["key"]): f["required"] for s in doc["structs"] for f in s["fields"]}


def requiredness_diffs(name: str, mine: dict, theirs: dict) -> dict:
    """{(struct, field id): (ours, Storm's)} where both have the field and disagree."""
    return {key: (req, theirs[key]) for key, req in mine.items()
            if key[0] == name and key in theirs and theirs[key] != req}


# --------------------------------------------------------------------------- the checks

STRUCTS = sorted(c.__name__ for kind in ("structs", "unions", "exceptions")
                 for c in ours.__thrift_meta__[kind])
METHODS = list(ours.Nimbus.thrift_services)
ENUMS = sorted(c.__name__ for c in ours.__thrift_meta__["enums"])


def test_streamparse_carries_storms_idl(storm_text, upstream):
    assert "namespace java org.apache.storm.generated" in storm_text
    assert {"submitTopology", "getClusterInfo", "getLeader"} <= set(upstream.Nimbus.thrift_services)


@pytest.mark.parametrize("name", STRUCTS)
def test_struct_matches_storm(name, upstream, record_property):
    problems, infos = compare_struct(name, ours, upstream)
    for info in infos:
        print(info)
    record_property("storm_only_optional_fields", "; ".join(infos))
    assert problems == []


@pytest.mark.parametrize("name", METHODS)
def test_method_matches_storm(name, upstream):
    assert compare_method(name, ours, upstream) == []


@pytest.mark.parametrize("name", ENUMS)
def test_enum_matches_storm(name, upstream):
    assert compare_enum(name, ours, upstream) == []


@pytest.fixture(scope="module")
def requiredness(storm_text, tmp_path_factory):
    if shutil.which("thrift") is None:
        pytest.fail("Apache Thrift's compiler is missing: apt-get install thrift-compiler")
    work = tmp_path_factory.mktemp("idl-json")
    storm_idl = work / "storm_upstream.thrift"
    storm_idl.write_text(storm_text, encoding="utf-8")
    return (compiler_requiredness(OUR_IDL, work / "ours"),
            compiler_requiredness(storm_idl, work / "storm"))


@pytest.mark.parametrize("name", STRUCTS)
def test_optional_vs_default_requiredness_matches_storm(name, requiredness):
    assert requiredness_diffs(name, *requiredness) == {}


# --------------------------------------------------------------------------- the comparator
# catches what it is for: a scratch copy of our IDL with known mistakes.


def test_comparator_reports_a_mutated_copy_of_our_idl(upstream, tmp_path):
    text = OUR_IDL.read_text(encoding="utf-8")
    mutations = [
        # TopologySummary comes before TopologyInfo: only its field is renumbered.
        ("  515: optional i32 replication_count;", "  516: optional i32 replication_count;"),
        ("1: required string componentId;", "1: optional string componentId;"),
        ("NimbusSummary getLeader()\n      throws (1: AuthorizationException aze);",
         "NimbusSummary getLeader()\n      throws (2: AuthorizationException aze);"),
    ]
    for old, new in mutations:
        assert old in text
        text = text.replace(old, new, 1)
    scratch = tmp_path / "storm.thrift"
    scratch.write_text(text, encoding="utf-8")
    mutated = thriftpy2.parser.parse(str(scratch), module_name="mutated_storm_thrift",
                                     enable_cache=False)

    assert compare_struct("TopologySummary", mutated, upstream) == (
        ["TopologySummary: field 516 (replication_count) is not in Storm's IDL"],
        ["TopologySummary: Storm-only optional field 515: i32 replication_count"],
    )
    assert compare_struct("TopologyInfo", mutated, upstream)[0] == []
    assert compare_struct("GlobalStreamId", mutated, upstream)[0] == [
        "GlobalStreamId: field 1 (componentId) is not required, Storm's is required",
    ]
    assert compare_method("getLeader", mutated, upstream) == [
        "Nimbus.getLeader_result: Storm's field 1 (struct AuthorizationException aze) "
        "is missing from ours",
        "Nimbus.getLeader_result: field 2 (aze) is not in Storm's IDL",
    ]
    assert compare_method("getClusterInfo", mutated, upstream) == []
    # Unmutated, the same copy compares clean.
    pristine = parse_idl_text(OUR_IDL.read_text(encoding="utf-8"), "pristine_storm_thrift")
    assert compare_struct("TopologySummary", pristine, upstream)[0] == []


def test_compiler_check_reports_optional_for_default_requiredness(storm_text, tmp_path):
    if shutil.which("thrift") is None:
        pytest.fail("Apache Thrift's compiler is missing: apt-get install thrift-compiler")
    text = OUR_IDL.read_text(encoding="utf-8")
    text, n = re.subn(r"1: string execution_command;", "1: optional string execution_command;",
                      text)
    assert n == 1
    scratch = tmp_path / "scratch.thrift"
    scratch.write_text(text, encoding="utf-8")
    storm_idl = tmp_path / "storm_upstream.thrift"
    storm_idl.write_text(storm_text, encoding="utf-8")
    mine = compiler_requiredness(scratch, tmp_path / "ours")
    theirs = compiler_requiredness(storm_idl, tmp_path / "storm")
    assert requiredness_diffs("ShellComponent", mine, theirs) == {
        ("ShellComponent", 1): ("optional", "req_out"),
    }
    assert requiredness_diffs("JavaObject", mine, theirs) == {}
