"""The supervisor's Spark class archive: built once per host, Spark and JDK, in the
background, then named in every worker's spec (``supervisor.spark.class.archive``).

What the archive is and why: :mod:`nimbus.worker.class_archive`, the program that builds
it. Here: which file fits this host's Spark and JDK (:func:`archive_path`), where it lives
(``<storm.local.dir>/supervisor/class-archive/``, the supervisor's), building it on the
``supervisor-class-archive`` thread once a Spark session is first wanted here (a warm
worker, a pipeline; a JVM start, about 30 s of CPU, at low priority; the workers started
meanwhile simply go without it), and removing archives of an earlier
Spark or JDK. A build that fails is logged with its log file and not tried again until
the supervisor restarts: workers then start as they would without one.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

log = logging.getLogger(__name__)

ARCHIVE_KEY = "supervisor.spark.class.archive"
BUILD_LOG = "build.log"
#: The most one build may take before it is given up (killed).
BUILD_TIMEOUT_S = 600.0
#: The program that builds an archive into the file it is given (a JVM's start).
BUILDER = "nimbus.worker.class_archive"
#: The archive of this host's Spark and JDK is ``<dir>/<ARCHIVE_PREFIX><key>.jsa``.
ARCHIVE_PREFIX = "spark-classes-"
SUFFIX = ".jsa"


def archive_key() -> str | None:
    """What the archive depends on, hashed: the pyspark release, the Spark jars it ships
    and the ``java`` that runs them; a change to any of them makes a new file. None when
    pyspark is not installed. Cheap: imports nothing of pyspark."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    package = Path(spec.origin).parent
    parts = [str(package)]
    with contextlib.suppress(OSError):
        parts.append((package / "version.py").read_text(encoding="utf-8"))
    jars = package / "jars"
    if jars.is_dir():
        parts += sorted(f"{p.name}:{p.stat().st_size}" for p in jars.iterdir())
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if java is not None and Path(java).exists():
        real = Path(java).resolve()
        parts += [str(real), str(real.stat().st_mtime_ns)]
        for libjvm in real.parent.parent.glob("lib/server/libjvm.so"):
            parts.append(f"{libjvm.stat().st_size}:{libjvm.stat().st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def archive_path(directory: Path) -> Path | None:
    """Where the archive of this host's Spark and JDK goes in ``directory`` (None:
    pyspark is not installed)."""
    key = archive_key()
    return None if key is None else directory / f"{ARCHIVE_PREFIX}{key}{SUFFIX}"


class ClassArchive:
    """The archive of one supervisor (see the module docstring)."""

    def __init__(self, directory: Path, python: str = sys.executable):
        self.directory = directory
        self._python = python
        self._target: Path | None = None
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._proc_lock = threading.Lock()   # _proc against stop()
        self._started_build = False
        self._thread = threading.Thread(target=self._build, name="supervisor-class-archive",
                                        daemon=True)

    @property
    def path(self) -> str:
        """The archive for workers to use, or "" while there is none (yet)."""
        return str(self._target) if self._target is not None and self._ready.is_set() else ""

    def start(self) -> None:
        """Use the archive already built, if there is one (logged). Never raises: the
        archive only makes starts faster. Nothing is built before :meth:`needed`."""
        try:
            target = archive_path(self.directory)
            if target is None:
                log.warning("%s: pyspark is not installed; no class archive", ARCHIVE_KEY)
                return
            self.directory.mkdir(parents=True, exist_ok=True)
            self._remove_others(target)
        except OSError as exc:
            log.warning("no Spark class archive (%s): %s", ARCHIVE_KEY, exc)
            return
        self._target = target
        if target.is_file():
            self._ready.set()
            log.info("Spark class archive %s in use (%s)", target, ARCHIVE_KEY)

    def needed(self) -> None:
        """A Spark session is about to start here (a warm worker, a pipeline): build
        the archive unless it is there or under way. A host that runs only process
        topologies never builds one. Called from one thread (the monitor's)."""
        if self._target is None or self._ready.is_set() or self._started_build \
                or self._stop.is_set():
            return
        self._started_build = True
        self._thread.start()

    def wait_ready(self, timeout_s: float) -> bool:
        """Whether the archive is there, waiting up to ``timeout_s`` (tests, benchmarks)."""
        return self._ready.wait(timeout_s)

    def stop(self) -> None:
        """Kill a build under way and join its thread."""
        with self._proc_lock:
            self._stop.set()
            proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the builder and its JVM
            except ProcessLookupError:
                pass
        if self._thread.is_alive():
            self._thread.join(10)

    def _remove_others(self, keep: Path) -> None:
        # Archives of another Spark or JDK can never be used again; partial ones are an
        # interrupted build's.
        for child in self.directory.iterdir():
            if child != keep and (child.name.startswith((ARCHIVE_PREFIX, f".{ARCHIVE_PREFIX}"))
                                  and SUFFIX in child.name):
                child.unlink(missing_ok=True)

    def _build(self) -> None:
        assert self._target is not None
        build_log = self.directory / BUILD_LOG
        log.info("building the Spark class archive %s (see %s); workers start without it "
                 "until it is done", self._target, build_log)
        try:
            with open(build_log, "wb") as out, self._proc_lock:
                if self._stop.is_set():
                    return
                # Low priority: it must not slow the workers that start meanwhile.
                proc = self._proc = subprocess.Popen(
                    ["nice", "-n", "10", self._python, "-m", BUILDER, str(self._target)],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True)
            try:
                code = proc.wait(timeout=BUILD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                log.warning("the Spark class archive was not built within %.0f s; "
                            "workers start without it", BUILD_TIMEOUT_S)
                return
        except OSError as exc:
            log.warning("cannot build the Spark class archive: %s; workers start without it",
                        exc)
            return
        if self._stop.is_set():
            return
        if code == 0 and self._target.is_file():
            self._ready.set()
            log.info("Spark class archive %s built and in use", self._target)
        else:
            log.warning("the Spark class archive build failed (exit code %s, see %s); "
                        "workers start without it", code, build_log)
