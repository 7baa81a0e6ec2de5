"""Seeded fuzz campaign against nimbus-ha's inputs (issue 9, "Bad input and fuzzing").

    .venv/bin/python benchmarks/fuzz.py --cases 10000 --seed 1 [--targets records,config]
    .venv/bin/python benchmarks/fuzz.py --replay nodes:17 --seed 1

Targets (``fuzzing`` documents what counts as a failure for each):

* ``records``: random bytes, truncated and flipped JSON, wrong and missing fields, bad
  and newer format versions, extra fields, deep nesting, non-UTF-8, lone surrogates,
  for every record type of ``nimbus.state.records``;
* ``config``: random YAML and bytes, a wrong type for every key of defaults.yaml, huge
  values, alias bombs and recursive aliases, non-UTF-8, truncated files, ``--set``;
* ``archives``: tar, tar.gz, tar.bz2, tar.xz and zip bundles with absolute and ``..``
  names, links, devices, fifos, corrupted bytes, size, entry-count and header bombs;
  every accepted one is unpacked by the supervisor's code and checked for writes
  outside its directory. Once per run, also the real scale: a tar.gz and a zip of a
  million entries, refused at the default entry limit;
* ``thrift``: random bytes, random and oversized frames, truncated requests, random and
  randomly-typed arguments of every Nimbus method, against the real Thrift server and
  NimbusHandler of a nimbus that leads a real ZooKeeper; after each case the server
  must still list its healthy topology;
* ``nodes``: garbage in every /storm node type (a junk topology's storms, assignments
  and code nodes, a supervisor, a worker beat, an error, the healthy topology's own
  metafile, a nimbus, leader-lock nodes, the root's cluster id) of that same nimbus,
  which must keep serving (and leading, once a garbled root id is restored), log an
  error naming the node, leave the garbage where it is and leave the healthy
  topology's nodes and code alone.

``--cases`` is per target; ``nodes`` cases take about half a second each, so that target
runs ``--cases / 20`` of them (at least 10) unless ``--node-cases`` says otherwise.
``--cases 10000`` takes about 35 minutes on a loaded 2-core machine (most of it the
configuration target: PyYAML parses about 1 MB/s). Prints,
per target, the cases tried, by kind, and the failures (each names its case number:
``--replay TARGET:NUMBER`` runs that one case again). Exits 1 if any case failed.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
import uuid
from pathlib import Path

import _paths  # noqa: F401 - testsupport/ on sys.path
import fuzzing as fuzz


def million_entries(work: Path) -> fuzz.Tally:
    """A tar.gz and a zip of a million and one empty entries each, written directly (the
    archive modules would take minutes): both refused at MAX_BUNDLE_ENTRIES, quickly."""
    import struct
    import tarfile
    import zlib

    from nimbus.distribution.archive import MAX_BUNDLE_ENTRIES, BundleError, check_bundle

    tally = fuzz.Tally("archives-million")
    count = 1_000_001
    tgz = work / "million.tgz"
    template = bytes(tarfile.TarInfo("f0000000").tobuf(format=tarfile.USTAR_FORMAT))
    compressor = zlib.compressobj(1, zlib.DEFLATED, 31)  # gzip framing
    with open(tgz, "wb") as out:
        block = bytearray()
        for i in range(count):
            header = bytearray(template)
            header[0:8] = b"f%07d" % i
            header[148:156] = b"        "
            header[148:156] = b"%06o\0 " % sum(header)
            block += header
            if len(block) >= 1 << 20:
                out.write(compressor.compress(bytes(block)))
                block.clear()
        out.write(compressor.compress(bytes(block) + bytes(1024)) + compressor.flush())
    jar = work / "million.zip"
    local, central = bytearray(), bytearray()
    for i in range(count):
        name = b"f%07d" % i
        central += struct.pack("<4s4B4HL2L5H2L", b"PK\x01\x02", 20, 3, 20, 0, 0, 0, 0, 33,
                               0, 0, 0, len(name), 0, 0, 0, 0, 0o100644 << 16, len(local))
        central += name
        local += struct.pack("<4s2B4HL2L2H", b"PK\x03\x04", 20, 0, 0, 0, 0, 33, 0, 0, 0,
                             len(name), 0) + name
    zip64_at = len(local) + len(central)
    jar.write_bytes(
        bytes(local) + bytes(central)
        + struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, count, count,
                      len(central), len(local))
        + struct.pack("<4sLQL", b"PK\x06\x07", 0, zip64_at, 1)
        + struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF,
                      0xFFFFFFFF, 0))
    for path in (tgz, jar):
        started = time.monotonic()
        try:
            check_bundle(path, 1 << 40)
            problem = "accepted"
        except BundleError as exc:
            problem = None if f"more than {MAX_BUNDLE_ENTRIES} entries" in str(exc) \
                else f"refused for another reason: {exc}"
        tally.add(f"{path.name} ({path.stat().st_size} bytes, "
                  f"{time.monotonic() - started:.1f}s)", path.name, problem)
        print(f"  {path.name}: {path.stat().st_size} bytes, {count} entries, checked in "
              f"{time.monotonic() - started:.1f}s: {problem or 'refused'}", flush=True)
    return tally


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=1000, help="cases per target")
    parser.add_argument("--node-cases", type=int, default=None,
                        help="cases of the nodes target (default: --cases / 20, >= 10)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--targets", default="records,config,archives,thrift,nodes")
    parser.add_argument("--replay", metavar="TARGET:NUMBER",
                        help="run one case again (with --seed) and print its outcome")
    parser.add_argument("--no-million", action="store_true",
                        help="skip the million-entry archives (about a minute)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.CRITICAL)
    for handler in logging.getLogger().handlers:  # the nimbus's logs are checked, not shown
        handler.setLevel(logging.CRITICAL)
    targets = args.targets.split(",")
    first, count = 0, args.cases
    if args.replay:
        target, _, number = args.replay.partition(":")
        targets, first, count = [target], int(number), 1
    node_cases = args.node_cases if args.node_cases is not None else max(10, args.cases // 20)
    tallies: list[fuzz.Tally] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="nimbus-fuzz-") as tmp:
        work = Path(tmp)
        offline = {"records": fuzz.fuzz_records, "config": fuzz.fuzz_config,
                   "archives": fuzz.fuzz_archives}
        for target in targets:
            if target in offline:
                tallies.append(offline[target](args.seed, count, first=first))
                print(tallies[-1].line(), flush=True)
        if "archives" in targets and not args.replay and not args.no_million:
            tallies.append(million_entries(work))
            print(tallies[-1].line(), flush=True)
        if {"thrift", "nodes"} & set(targets):
            from nimbus.dev.zookeeper import ZooKeeperServer

            zk = ZooKeeperServer(work / "zookeeper").start()
            try:
                with fuzz.FuzzNimbus(zk.port, f"/fuzz-{uuid.uuid4().hex[:8]}",
                                     work / "nimbus") as fz:
                    if "thrift" in targets:
                        tallies.append(fuzz.fuzz_thrift(
                            args.seed, count, fz.port, fz.conf["nimbus.thrift.max_buffer_size"],
                            fz.serves, fz.idle, first=first, logs=fz.logs))
                        print(tallies[-1].line(), flush=True)
                    if "nodes" in targets:
                        tallies.append(fuzz.fuzz_nodes(
                            args.seed, 1 if args.replay else node_cases, fz, first=first))
                        print(tallies[-1].line(), flush=True)
            finally:
                zk.stop()
    failures = [f for t in tallies for f in t.failures]
    print(f"\nseed {args.seed}: {sum(t.tried for t in tallies)} cases in "
          f"{time.monotonic() - started:.0f}s, {len(failures)} failed")
    for target in tallies:
        print(f"  {target.target}: {target.tried} tried, {len(target.failures)} failed")
    for failure in failures[:50]:
        print(f"FAILED {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
