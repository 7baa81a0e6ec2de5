"""A real Spark standalone cluster (one master, one worker) on 127.0.0.1, for tests.

It runs the master and worker classes of the installed pyspark distribution with
``spark-class``, as ``sbin/start-master.sh`` would, but in the foreground of processes this
object owns, so that a test stops them for sure. Every port is bound on loopback; the
master's REST submission server is turned off.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pyspark

from nimbus.dev.zookeeper import free_port


class SparkStandalone:
    """``with SparkStandalone(workdir) as spark: spark.master_url`` (``spark://127.0.0.1:N``)."""

    def __init__(self, workdir: Path, worker_cores: int = 1, worker_memory: str = "1g",
                 start_timeout_s: float = 90.0):
        self.workdir = Path(workdir)
        self.worker_cores = worker_cores
        self.worker_memory = worker_memory
        self.start_timeout_s = start_timeout_s
        self.port = free_port()
        self.ui_port = free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self._procs: list[subprocess.Popen] = []

    @property
    def spark_home(self) -> str:
        return str(Path(pyspark.__file__).parent)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(SPARK_HOME=self.spark_home, SPARK_LOCAL_IP="127.0.0.1",
                   SPARK_DAEMON_MEMORY="256m",
                   SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
                   SPARK_WORKER_OPTS="-Dspark.worker.cleanup.enabled=false")
        return env

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen(
            [str(Path(self.spark_home) / "bin" / "spark-class"), *args],
            stdout=log, stderr=subprocess.STDOUT, env=self._env(), start_new_session=True)
        log.close()
        self._procs.append(proc)
        return proc

    def status(self) -> dict:
        """The master's JSON status page (workers, cores, running applications)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
            return json.load(r)

    def start(self) -> SparkStandalone:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(self.port), "--webui-port", str(self.ui_port)])
        self._spawn("worker", ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                               "--cores", str(self.worker_cores),
                               "--memory", self.worker_memory,
                               "--webui-port", str(free_port()),
                               "--work-dir", str(self.workdir / "work"), self.master_url])
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            for proc in self._procs:
                if proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"spark standalone process exited ({proc.returncode}); "
                                       f"see {self.workdir}")
            try:
                if self.status().get("aliveworkers", 0) >= 1:
                    return self
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"spark standalone cluster did not start in {self.start_timeout_s}s")

    def stop(self) -> None:
        for proc in reversed(self._procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=15)
        self._procs.clear()

    def __enter__(self) -> SparkStandalone:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
