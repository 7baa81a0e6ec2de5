"""Benchmark: the s3 code distributor against plain s3fs and sha256sum, in the same run.

Starts a real SeaweedFS S3 gateway and a real ZooKeeper on 127.0.0.1, writes a bundle of
``--megabytes`` MiB of random bytes and measures, best of ``--trials`` (interleaved, so
drift on a shared machine hits every figure alike):

* baseline (b): the same bytes moved by a plain ``s3fs`` ``put_file`` / ``get_file`` with
  its defaults (50 MiB parts, 10 at a time), against the same SeaweedFS;
* baseline (c): coreutils ``sha256sum`` of the file (the least an upload that hashes
  its bytes must do);
* the s3 distributor's upload and download between two simulated nimbus hosts
  (:class:`nimbus.testing.hosts.SimulatedHosts`), verified by sha256 as always.

It prints seconds, MB/s and the ratios (baseline time / distributor time; > 1 is faster
than the baseline). ``--profile`` adds a cProfile of one upload and one download, of the
calling thread and of fsspec's event-loop thread. ``--rss-megabytes N`` adds the peak RSS
growth of this process during an upload and a download of an N MiB bundle (and of the
s3fs baseline's ``put_file`` / ``get_file``, for comparison). ``--set key=value`` sets
``nimbus.codedistributor.s3.<key>`` (repeatable), e.g. ``--set transfer.concurrency=2``.

    .venv/bin/python benchmarks/bench_s3.py [--megabytes 256] [--trials 3] [--profile] \
        [--rss-megabytes 2048] [--set multipart.chunk.mb=8]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import _paths  # noqa: F401 - testsupport/ on sys.path
from nimbus_ha_s3.distributor import PREFIX
from nimbus_ha_s3.seaweed import SeaweedS3Server
from transfer_baselines import sha256sum, write_random_file

from nimbus.dev.zookeeper import ZooKeeperServer
from nimbus.testing.hosts import SimulatedHosts

TOPOLOGY = "bench-1-1"
BUCKET = "bench"
JAR = "stormjar.jar"
PROFILE_LINES = 25


def timed(action: Callable[[], Any]) -> float:
    """Seconds ``action`` takes."""
    started = time.monotonic()
    action()
    return time.monotonic() - started


def parse_settings(pairs: list[str]) -> dict[str, Any]:
    """``["transfer.concurrency=4"]`` -> ``{PREFIX + "transfer.concurrency": 4}``."""
    conf: dict[str, Any] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        conf[PREFIX + key] = int(value) if value.lstrip("-").isdigit() else value
    return conf


class RssPeak:
    """Peak RSS growth of this process over a block (Linux: clear_refs resets VmHWM)."""

    def __init__(self) -> None:
        self.growth_mb = 0.0

    @staticmethod
    def _status_kb(field: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise RuntimeError(f"{field} not in /proc/self/status")

    @contextlib.contextmanager
    def measure(self) -> Iterator[RssPeak]:
        """Reset the high-water mark, run the block, record peak minus starting RSS."""
        Path("/proc/self/clear_refs").write_text("5")
        before = self._status_kb("VmRSS")
        yield self
        self.growth_mb = (self._status_kb("VmHWM") - before) / 1024


class Bench:
    """One SeaweedFS + ZooKeeper, the baselines and the distributor on them."""

    def __init__(self, work: Path, server: SeaweedS3Server, zk: ZooKeeperServer,
                 settings: dict[str, Any]) -> None:
        self.work = work
        self.server = server
        self.zk = zk
        self.conf = {PREFIX + "endpoint": server.endpoint_url, PREFIX + "bucket": BUCKET,
                     PREFIX + "access.key": server.access_key,
                     PREFIX + "secret.key": server.secret_key, **settings}
        self.plain = server.filesystem()  # s3fs with its defaults: baseline (b)
        self._runs = 0

    def baseline_put_get(self, source: Path) -> tuple[float, float]:
        """Baseline (b): s3fs put_file then get_file of ``source``; seconds each."""
        key = f"{BUCKET}/baseline/{source.name}"
        dest = self.work / "baseline-copy"
        put = timed(lambda: self.plain.put_file(str(source), key))
        get = timed(lambda: self.plain.get_file(key, str(dest)))
        if dest.stat().st_size != source.stat().st_size:
            raise RuntimeError("baseline get_file returned the wrong size")
        dest.unlink()
        self.plain.rm(key)
        return put, get

    @contextlib.contextmanager
    def hosts(self) -> Iterator[tuple[Any, Any]]:
        """A fresh uploader and downloader (their own ZK sessions and distributors)."""
        self._runs += 1
        name = f"run-{self._runs}"
        simulated = SimulatedHosts(self.work / name, self.zk.hosts, f"/bench-s3-{name}", "s3",
                                   self.conf, topology_ids=(TOPOLOGY,))
        try:
            yield tuple(simulated.make(2))
        finally:
            simulated.close()
            shutil.rmtree(self.work / name, ignore_errors=True)

    def distributor_up_down(self, source: Path,
                            wrap: Callable[[str], contextlib.AbstractContextManager[Any]]
                            = lambda _: contextlib.nullcontext()) -> tuple[float, float]:
        """The distributor's upload then download of a bundle holding ``source``."""
        with self.hosts() as (uploader, downloader):
            bundle = uploader.code_dir / TOPOLOGY
            bundle.mkdir(parents=True)
            os.link(source, bundle / JAR)  # the same bytes, no copy
            (bundle / "stormconf.json").write_text("{}")
            metafile = self.work / "bench.meta"
            with wrap("upload"):
                up = timed(lambda: metafile.write_bytes(
                    uploader.distributor.upload(bundle, TOPOLOGY).read_bytes()))
            dest = downloader.code_dir / TOPOLOGY
            with wrap("download"):
                down = timed(lambda: downloader.distributor.download(dest, TOPOLOGY, metafile))
            if (dest / JAR).stat().st_size != source.stat().st_size:
                raise RuntimeError("distributor download returned the wrong size")
            uploader.distributor.delete_shared(TOPOLOGY)
            return up, down


@contextlib.contextmanager
def profiled(label: str, loop: Any) -> Iterator[None]:
    """cProfile the calling thread and the fsspec event-loop thread; print both."""
    here, there = cProfile.Profile(), cProfile.Profile()
    enabled = threading.Event()

    def enable_there() -> None:
        there.enable()
        enabled.set()

    loop.call_soon_threadsafe(enable_there)
    enabled.wait(5)
    here.enable()
    try:
        yield
    finally:
        here.disable()
        done = threading.Event()

        def disable_there() -> None:
            there.disable()
            done.set()

        loop.call_soon_threadsafe(disable_there)
        done.wait(5)
        for thread, profile in (("calling thread", here), ("fsspec loop thread", there)):
            out = io.StringIO()
            stats = pstats.Stats(profile, stream=out)
            stats.sort_stats("tottime").print_stats(PROFILE_LINES)
            print(f"--- profile of {label}: {thread} (by own time) ---")
            print("\n".join(out.getvalue().splitlines()[:PROFILE_LINES + 12]))


def report(megabytes: int, trials: int, results: dict[str, float]) -> None:
    """Print seconds, MB/s and the ratios of every figure."""
    mb = megabytes * 1024 * 1024 / 1e6

    def line(name: str, seconds: float, ratios: str = "") -> None:
        print(f"{name:30} {seconds:7.3f} s {mb / seconds:8.0f} MB/s  {ratios}")

    print(f"bundle {megabytes} MiB, best of {trials} trials each; ratio = baseline time / "
          "distributor time (> 1: faster than the baseline)")
    line("(b) s3fs put_file, defaults", results["put"])
    line("(b) s3fs get_file, defaults", results["get"])
    line("(c) sha256sum", results["sha"])
    line("s3 distributor upload", results["upload"],
         f"ratio to (b) {results['put'] / results['upload']:.2f}  "
         f"to (c) {results['sha'] / results['upload']:.2f}")
    line("s3 distributor download", results["download"],
         f"ratio to (b) {results['get'] / results['download']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=256)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--profile", action="store_true",
                        help="cProfile one distributor upload and download")
    parser.add_argument("--rss-megabytes", type=int, default=0,
                        help="also measure peak RSS growth for a bundle this large")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help=f"a distributor setting under {PREFIX}")
    args = parser.parse_args()
    settings = parse_settings(args.set)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        work = Path(tmp)
        source = work / "bundle.bin"
        write_random_file(source, args.megabytes)
        with ZooKeeperServer(work / "zookeeper") as zk, \
                SeaweedS3Server(work / "seaweed") as server:
            server.create_bucket(BUCKET)
            bench = Bench(work, server, zk, settings)
            bench.distributor_up_down(source)  # warm up: imports, connections, volumes
            runs: dict[str, list[float]] = {k: [] for k in
                                            ("put", "get", "sha", "upload", "download")}
            for _ in range(args.trials):
                put, get = bench.baseline_put_get(source)
                runs["put"].append(put)
                runs["get"].append(get)
                runs["sha"].append(sha256sum(source))
                up, down = bench.distributor_up_down(source)
                runs["upload"].append(up)
                runs["download"].append(down)
            results = {k: min(v) for k, v in runs.items()}
            if settings:
                print("settings:", ", ".join(f"{k[len(PREFIX):]}={v}"
                                             for k, v in settings.items()))
            report(args.megabytes, args.trials, results)
            if args.profile:
                import fsspec.asyn

                loop = fsspec.asyn.get_loop()
                bench.distributor_up_down(source, lambda label: profiled(label, loop))
            if args.rss_megabytes:
                rss_source = work / "rss-bundle.bin"
                source.unlink()
                write_random_file(rss_source, args.rss_megabytes)
                measure_rss(bench, rss_source, args.rss_megabytes)


def measure_rss(bench: Bench, source: Path, megabytes: int) -> None:
    """Peak RSS growth of the distributor's (and s3fs's) upload and download of ``source``."""
    peaks: dict[str, RssPeak] = {}

    @contextlib.contextmanager
    def measured(label: str) -> Iterator[None]:
        peaks[label] = RssPeak()
        with peaks[label].measure():
            yield

    bench.distributor_up_down(source, measured)
    for label in ("upload", "download"):
        print(f"s3 distributor {label:8} of {megabytes} MiB: peak RSS growth "
              f"{peaks[label].growth_mb:6.1f} MB")
    key = f"{BUCKET}/baseline/{source.name}"
    dest = bench.work / "baseline-copy"
    with measured("put"):
        bench.plain.put_file(str(source), key)
    with measured("get"):
        bench.plain.get_file(key, str(dest))
    dest.unlink()
    bench.plain.rm(key)
    print(f"(b) s3fs put_file of {megabytes} MiB: peak RSS growth {peaks['put'].growth_mb:6.1f}"
          f" MB; get_file {peaks['get'].growth_mb:6.1f} MB")


if __name__ == "__main__":
    main()
