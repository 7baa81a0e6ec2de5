"""A seeded fuzz campaign (fuzzing) over every input nimbus-ha reads from
outside, plus the named cases each target must refuse with a clear error.

1,270 seeded cases (700 records, 120 configurations, 300 archives, 150 Thrift requests)
and about 360 named ones; ``benchmarks/fuzz.py --cases N --seed S`` runs as many as
asked. A failure names its case (``records #12 seed 1 ...``);
``benchmarks/fuzz.py --replay records:12 --seed 1`` runs that one again.
"""

from __future__ import annotations

import json

import fuzzing as fuzz
import pytest

from nimbus.config import (
    MAX_CONFIG_BYTES,
    MAX_YAML_DEPTH,
    MAX_YAML_VALUES,
    ConfigError,
    _value_problem,
    builtin_defaults,
    load_config,
)
from nimbus.state.records import (
    Assignment,
    CodeMeta,
    ErrorInfo,
    NimbusInfo,
    RecordError,
    StormBase,
    SupervisorInfo,
    WorkerBeat,
)

SEED = 20240917


# -- records -------------------------------------------------------------------------------------
def test_record_fuzz():
    tally = fuzz.fuzz_records(SEED, 700)
    assert tally.failures == []
    assert tally.tried == 700
    assert set(tally.kinds) == set(fuzz.RECORD_KINDS)


NODE = "/storm/storms/t-1-1"


@pytest.mark.parametrize("data, problem", [
    (b"", "empty (a node created but never written?)"),
    (b"\xff\xfe{}", "not UTF-8 text (byte 0 of 4)"),
    (b'{"format": 1, "storm_name": "a"', "not JSON: Expecting ',' delimiter: line 1 column "
                                         "32 (char 31)"),
    (b"[1, 2]", "not a JSON object but an array"),
    (b'{"storm_name": "a"}', "no format version"),
    (b'{"format": "1"}', 'format "1" is not a version number'),
    (b'{"format": 2, "storm_name": "a", "launch_time_secs": 1, "status": "ACTIVE", '
     b'"placement": "rack-aware"}',
     "format 2 is newer than this release reads (1): written by a newer nimbus-ha; upgrade "
     "this host"),
    (b'{"format": 1, "launch_time_secs": 1, "status": "ACTIVE"}',
     "field 'storm_name' is missing"),
    (b'{"format": 1, "storm_name": "a", "launch_time_secs": "1", "status": "ACTIVE"}',
     "field 'launch_time_secs' must be an integer, got a string \"1\""),
    (b'{"format": 1, "storm_name": "a", "launch_time_secs": true, "status": "ACTIVE"}',
     "field 'launch_time_secs' must be an integer, got a boolean true"),
    (b'{"format": 1, "storm_name": "a", "launch_time_secs": 1, "status": "ACTIVE", '
     b'"component_executors": {"spout": 1.5}}',
     "field 'component_executors'['spout'] must be an integer, got a number 1.5"),
    (b'{"format": 1, "storm_name": "a\\ud800", "launch_time_secs": 1, "status": "ACTIVE"}',
     "field 'storm_name' must be text, got a string with a lone surrogate (\\ud800-\\udfff)"),
    (b'{"format": 1, "x": ' + b"[" * 100000 + b"]" * 100000 + b"}", "JSON nested too deeply"),
])
def test_unreadable_storm_base_is_a_record_error_naming_node_and_problem(data, problem):
    with pytest.raises(RecordError) as err:
        StormBase.decode(data, source=NODE)
    assert str(err.value) == f"StormBase at {NODE}: {problem}"


def test_unknown_fields_of_the_same_format_are_ignored():
    """Storm's rule for Thrift records: a newer release may add fields; an older one
    reads on. Only a new format number says the meaning changed."""
    base = StormBase("a", 1, "ACTIVE", num_workers=3)
    newer = {**json.loads(base.encode()), "placement": "rack-aware", "weights": [1, 2]}
    assert StormBase.decode(json.dumps(newer).encode()) == base
    # Fields an older release did not write take their defaults.
    assert StormBase.decode(b'{"format": 1, "storm_name": "a", "launch_time_secs": 1, '
                            b'"status": "ACTIVE"}') == StormBase("a", 1, "ACTIVE")


@pytest.mark.parametrize("cls, data, problem", [
    (Assignment, {"master_code_dir": "/x", "executor_node_port": {"worker-0": ["sup", "1"]}},
     "field 'executor_node_port'['worker-0'] must be [supervisor id, port], got "
     '["sup", "1"]'),
    (Assignment, {"master_code_dir": "/x", "executor_node_port": {"spout": ["sup", 1]}},
     "field 'executor_node_port' has key 'spout', not worker-<index>"),
    (Assignment, {"master_code_dir": "/x", "code_sha256": {"stormjar.jar": None}},
     "field 'code_sha256'['stormjar.jar'] must be a string, got null null"),
    (SupervisorInfo, {"time_secs": 1, "hostname": "h", "meta": [6700, "6701"]},
     "field 'meta'[1] must be an integer, got a string \"6701\""),
    (WorkerBeat, {"time_secs": 1, "topology_id": "t-1-1", "supervisor_id": "s", "host": "h",
                  "port": 1, "components": {"count": 7}},
     "field 'components'['count'] must be an object, got an integer 7"),
    (NimbusInfo, {"host": "h", "port": None, "start_time_secs": 1, "version": "1"},
     "field 'port' must be an integer, got null null"),
    (ErrorInfo, {"error": ["boom"], "error_time_secs": 1},
     "field 'error' must be a string, got an array [\"boom\"]"),
    (CodeMeta, {"distributor": "localfs", "metafile_b64": "not base64!",
                "uploaded_by": "n", "created_secs": 1},
     "field 'metafile_b64' is not base64"),
])
def test_every_record_type_refuses_wrong_fields_by_name(cls, data, problem):
    with pytest.raises(RecordError) as err:
        cls.decode(json.dumps({"format": 1, **data}).encode(), source="/storm/x")
    assert str(err.value) == f"{cls.__name__} at /storm/x: {problem}"


# -- configuration -------------------------------------------------------------------------------
def test_config_fuzz():
    tally = fuzz.fuzz_config(SEED, 120, heavy=False)
    assert tally.failures == []
    assert tally.tried == 120


def load(tmp_path, data: bytes):
    path = tmp_path / "storm.yaml"
    path.write_bytes(data)
    with pytest.raises(ConfigError) as err:
        load_config(path, extra_defaults={}, unchecked_prefixes={})
    return str(err.value).replace(str(path), "storm.yaml")


def test_a_wrong_type_for_every_default_key_names_the_key(tmp_path):
    defaults = builtin_defaults()
    tried = dict.fromkeys(defaults, 0)
    for key, default in sorted(defaults.items()):
        for value in (True, 7, "text", ["a"], {"a": 1}, [1.5]):
            if _value_problem(key, default, value, nullable_strings=True) is None:
                continue  # that value fits this key
            message = load(tmp_path, json.dumps({key: value}).encode())
            assert message.startswith(f"storm.yaml: key {key!r} must be "), message
            tried[key] += 1
    # Every key met at least four values of a wrong type (a list of strings fits two).
    assert min(tried.values()) >= 4, sorted(tried.items(), key=lambda kv: kv[1])[:5]


@pytest.mark.parametrize("text, message", [
    ("nimbus.seeds: [nimbus1, 6627]\n",
     "storm.yaml: key 'nimbus.seeds' must be a list of strings, got an integer at [1] "
     "['nimbus1', 6627]"),
    ("supervisor.slots.ports: [6700, '6701']\n",
     "storm.yaml: key 'supervisor.slots.ports' must be a list of integers, got a string at "
     "[1] [6700, '6701']"),
    ("nimbus.admins: [alice, [bob]]\n",
     "storm.yaml: key 'nimbus.admins' must be a list of strings, got a list at [1] "
     "['alice', ['bob']]"),
    ("nimbus.authorizer: [a]\n",
     "storm.yaml: key 'nimbus.authorizer' must be a string or null, got a list ['a']"),
    ("topology.spark.conf: {spark.executor.memory: [1g]}\n",
     "storm.yaml: key 'topology.spark.conf' must map strings to strings, numbers or "
     "booleans, got a string -> a list {'spark.executor.memory': ['1g']}"),
    ("nimbus.thrift.port: 70000\n",
     "key 'nimbus.thrift.port' must be a port (0-65535), got 70000"),
    ("supervisor.slots.ports: [0]\n",
     "key 'supervisor.slots.ports' must list ports (1-65535), got 0"),
    ("nimbus.thrift.port: " + "9" * 5000 + "\n",
     "storm.yaml: malformed YAML: Exceeds the limit (4300 digits) for integer string "
     "conversion: value has 5000 digits; use sys.set_int_max_str_digits() to increase the "
     "limit"),
    ("storm.local.dir: " + "[" * 3000 + "]" * 3000 + "\n",
     "storm.yaml: malformed YAML: nested too deeply"),
    ("nimbus.seeds: &a [*a]\n",
     "storm.yaml: key 'nimbus.seeds': a value contains itself (a recursive alias)"),
    ("storm.local.dir: &a {x: [*a]}\n",
     "storm.yaml: key 'storm.local.dir': a value contains itself (a recursive alias)"),
    ("storm.local.dir: " + "[" * (MAX_YAML_DEPTH + 1) + "]" * (MAX_YAML_DEPTH + 1) + "\n",
     f"storm.yaml: key 'storm.local.dir': nested more than {MAX_YAML_DEPTH} levels deep"),
])
def test_bad_values_are_config_errors_naming_key_and_file(tmp_path, text, message):
    assert load(tmp_path, text.encode()) == message


def test_billion_laughs_is_refused_before_anything_walks_it(tmp_path):
    # 10**9 values once expanded; loads in a few KiB because aliases share their parts.
    bomb = fuzz._alias_bomb("nimbus.seeds", 10, 9).encode()
    assert len(bomb) < 1000
    assert load(tmp_path, bomb) == (
        f"storm.yaml: key 'nimbus.seeds': the document expands to more than "
        f"{MAX_YAML_VALUES} values (aliases of aliases?)")
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["nimbus.seeds=" + bomb.decode().split(": ", 1)[1]],
                    extra_defaults={}, unchecked_prefixes={})
    assert str(err.value) == (f"--set nimbus.seeds: the document expands to more than "
                              f"{MAX_YAML_VALUES} values (aliases of aliases?)")


def test_unreadable_files_name_the_file(tmp_path):
    assert load(tmp_path, b"storm.local.dir: caf\xe9\n") == "storm.yaml: not UTF-8 text " \
                                                            "(byte 20)"
    assert load(tmp_path, b"x" * (MAX_CONFIG_BYTES + 1)) == (
        f"storm.yaml: larger than {MAX_CONFIG_BYTES} bytes; not a configuration file?")
    assert load(tmp_path, b"\x00\x01\x02").startswith(
        "storm.yaml: malformed YAML: unacceptable character #x0000")


@pytest.mark.parametrize("override, message", [
    ("nimbus.seeds=&a [*a]", "--set nimbus.seeds: a value contains itself (a recursive "
                             "alias)"),
    ("nimbus.thrift.port=" + "9" * 5000, "--set nimbus.thrift.port: malformed YAML: Exceeds "
     "the limit (4300 digits) for integer string conversion: value has 5000 digits; use "
     "sys.set_int_max_str_digits() to increase the limit"),
    ("storm.local.dir=" + "[" * 3000, "--set storm.local.dir: malformed YAML: nested too "
                                      "deeply"),
])
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[override], extra_defaults={}, unchecked_prefixes={})
    assert str(err.value) == message


# -- archives --------------------------------------------------------------------------------------
def test_archive_fuzz():
    tally = fuzz.fuzz_archives(SEED, 300)
    assert tally.failures == []
    assert tally.tried == 300
    assert set(tally.kinds) == set(fuzz.ARCHIVE_KINDS)


# -- thrift, against a real nimbus -------------------------------------------------------------
@pytest.mark.zookeeper
def test_thrift_fuzz_against_a_real_nimbus(zk_server, zk_root, tmp_path):
    """Random bytes, random and oversized frames, truncated requests, random and randomly
    typed arguments of every method, against the Thrift server and NimbusHandler of a
    nimbus leading a real ZooKeeper: every case is answered or dropped, nothing escapes
    as a traceback, and the healthy topology stays listed after each."""
    with fuzz.FuzzNimbus(zk_server.port, zk_root, tmp_path) as fz:
        tally = fuzz.fuzz_thrift(SEED, 150, fz.port, fz.conf["nimbus.thrift.max_buffer_size"],
                                 fz.serves, fz.idle, logs=fz.logs)
        assert tally.failures == []
        assert tally.tried == 150
        assert set(tally.kinds) == set(fuzz.THRIFT_KINDS)
        assert fz.daemon.master.elector.is_leader()
