"""A Spark standalone cluster on this machine: one master and N workers from the pyspark wheel.

    python -m spark.standalone                      master + 2 workers until Ctrl-C
    python -m spark.standalone --workers 3 -- python -m spark.kpi_job --once
                                                    ... run a command against it, then stop

For trying the KPI job on a real cluster manager without one (tests use it too): the
daemons are ``spark-class org.apache.spark.deploy.master.Master`` and ``... Worker``
from the pyspark package's own ``bin/``, on 127.0.0.1 and free ports, with small heaps,
their logs, work and scratch directories under one base directory. Each daemon runs in
its own process group, so stopping (or killing) a worker also ends the executor JVMs it
launched, as losing a machine would. :meth:`StandaloneCluster.job_env` is what a job
needs to run there (``FERRY_KPI_MASTER`` and ``FERRY_KPI_SPARK_CONF``).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devstack.ports import free_ports

#: Where the daemons listen (the job's driver too: executors call it back).
HOST = "127.0.0.1"
#: Heap of the master and of each worker daemon (SPARK_DAEMON_MEMORY).
DAEMON_MEMORY = "256m"
#: Memory each worker offers to executors, and what each executor takes of it (Spark
#: refuses executors under 450 MiB: 300 MiB reserved plus half again).
WORKER_MEMORY = "512m"
EXECUTOR_MEMORY = "512m"
#: Short-lived JVMs on a small machine: C1 only, the serial collector.
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def spark_home() -> Path:
    """SPARK_HOME, else the installed pyspark package (which carries bin/ and jars/)."""
    if os.environ.get("SPARK_HOME"):
        return Path(os.environ["SPARK_HOME"])
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class ClusterError(RuntimeError):
    """A daemon did not start, or the cluster did not come up in time."""


@dataclass
class Daemon:
    """One JVM of the cluster (the leader of its own process group)."""

    name: str
    argv: list[str]
    log: Path
    web_port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self, lines: int = 30) -> str:
        """The end of the daemon's log (for errors)."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@dataclass
class StandaloneCluster:
    """A master and ``workers`` workers; :meth:`start`, then :meth:`stop` (always)."""

    base: Path
    workers: int = 2
    cores: int = 1
    worker_memory: str = WORKER_MEMORY
    executor_memory: str = EXECUTOR_MEMORY
    java_home: Path | None = None
    master_port: int = 0
    daemons: list[Daemon] = field(default_factory=list)

    # ---- lifecycle

    def start(self, timeout: float = 180.0) -> None:
        """Start the master, then the workers; return once all workers are registered."""
        self.base.mkdir(parents=True, exist_ok=True)
        (self.base / "conf").mkdir(exist_ok=True)
        ports = free_ports(2 + 2 * self.workers, HOST)
        self.master_port = ports[0]
        master = Daemon(
            "master",
            [MASTER_CLASS, "--host", HOST, "--port", str(ports[0]), "--webui-port",
             str(ports[1])],
            self.base / "master.log",
            ports[1],
        )  # fmt: skip
        self.daemons = [master]
        for index in range(self.workers):
            port, web = ports[2 + 2 * index], ports[3 + 2 * index]
            self.daemons.append(self._worker(index, port, web))
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout
        try:
            self._launch(master)
            self._wait(lambda: self.master_state().get("status") == "ALIVE", deadline, master)
            for worker in self.daemons[1:]:
                self._launch(worker)
            self.wait_for_workers(self.workers, deadline - time.monotonic())
        except BaseException:
            self.stop()
            raise

    def _worker(self, index: int, port: int, web: int) -> Daemon:
        work = self.base / f"worker-{index}"
        return Daemon(
            f"worker-{index}",
            [WORKER_CLASS, self.master_url, "--host", HOST, "--port", str(port),
             "--webui-port", str(web), "--cores", str(self.cores), "--memory",
             self.worker_memory, "--work-dir", str(work / "work")],
            self.base / f"worker-{index}.log",
            web,
        )  # fmt: skip

    def _env(self, daemon: Daemon) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
        env.update(
            SPARK_HOME=str(spark_home()),
            # An empty configuration directory: no spark-defaults.conf or spark-env.sh of
            # the machine's leaks in.
            SPARK_CONF_DIR=str(self.base / "conf"),
            SPARK_DAEMON_MEMORY=DAEMON_MEMORY,
            SPARK_DAEMON_JAVA_OPTS=QUICK_JVM,
            SPARK_LOCAL_IP=HOST,
            SPARK_LOG_DIR=str(self.base),
            SPARK_PID_DIR=str(self.base),
            # Executors' shuffle and spill files, per worker, removed with the cluster.
            SPARK_LOCAL_DIRS=str(self.base / f"{daemon.name}-scratch"),
        )
        if self.java_home is not None:
            env["JAVA_HOME"] = str(self.java_home)
        return env

    def _launch(self, daemon: Daemon) -> None:
        spark_class = spark_home() / "bin" / "spark-class"
        with daemon.log.open("ab") as log:
            daemon.process = subprocess.Popen(
                [str(spark_class), *daemon.argv],
                env=self._env(daemon),
                cwd=self.base,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: it and its executors
            )

    def _wait(self, ready: Any, deadline: float, daemon: Daemon) -> None:
        while time.monotonic() < deadline:
            if not daemon.alive:
                raise ClusterError(f"Spark {daemon.name} exited at start:\n{daemon.tail()}")
            with contextlib.suppress(OSError, ValueError):
                if ready():
                    return
            time.sleep(0.3)
        raise ClusterError(f"Spark {daemon.name} not ready in time:\n{daemon.tail()}")

    def wait_for_workers(self, count: int, timeout: float = 120.0) -> None:
        """Wait until exactly ``count`` workers are registered and alive."""
        deadline = time.monotonic() + timeout
        self._wait(lambda: self.alive_workers() == count, deadline, self.daemons[0])

    def stop(self) -> None:
        """End every daemon and its executors (SIGTERM, then SIGKILL), remove nothing."""
        for daemon in reversed(self.daemons):
            _end_group(daemon, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for daemon in self.daemons:
            if daemon.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    daemon.process.wait(max(0.1, deadline - time.monotonic()))
            # The group may outlive its leader (an executor): always kill what is left.
            _end_group(daemon, signal.SIGKILL)
            if daemon.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    daemon.process.wait(5)
        with contextlib.suppress(ValueError):
            atexit.unregister(self.stop)

    def kill_worker(self, index: int) -> None:
        """SIGKILL worker ``index`` and its executors (its whole process group), as a lost node."""
        daemon = self.daemons[1 + index]
        _end_group(daemon, signal.SIGKILL)
        if daemon.process is not None:
            daemon.process.wait(10)

    def restart_worker(self, index: int, timeout: float = 120.0) -> None:
        """Start worker ``index`` again (after :meth:`kill_worker`) and wait for it."""
        daemon = self.daemons[1 + index]
        if daemon.alive:
            return
        self._launch(daemon)
        self.wait_for_workers(self.workers, timeout)

    # ---- what it is and how to use it

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.master_port}"

    @property
    def master_web(self) -> str:
        return f"http://{HOST}:{self.daemons[0].web_port}"

    def job_conf(self) -> dict[str, str]:
        """Spark configuration of a driver on this machine using the cluster."""
        return {
            "spark.driver.host": HOST,
            "spark.driver.bindAddress": HOST,
            "spark.executor.memory": self.executor_memory,
            "spark.executor.cores": str(self.cores),
            "spark.cores.max": str(self.cores * self.workers),
            "spark.executor.extraJavaOptions": f"-Duser.timezone=UTC {QUICK_JVM}",
        }

    def job_env(self, extra_conf: dict[str, str] | None = None) -> dict[str, str]:
        """FERRY_KPI_MASTER and FERRY_KPI_SPARK_CONF for the KPI job (plus SPARK_LOCAL_IP)."""
        return {
            "FERRY_KPI_MASTER": self.master_url,
            "FERRY_KPI_SPARK_CONF": json.dumps({**self.job_conf(), **(extra_conf or {})}),
            "SPARK_LOCAL_IP": HOST,
        }

    def master_state(self) -> dict[str, Any]:
        """The master's status page as JSON (workers, applications)."""
        return _get_json(f"{self.master_web}/json/")

    def worker_state(self, index: int) -> dict[str, Any]:
        """Worker ``index``'s status page as JSON (its executors)."""
        return _get_json(f"http://{HOST}:{self.daemons[1 + index].web_port}/json/")

    def alive_workers(self) -> int:
        """Workers the master currently counts as alive."""
        workers = self.master_state().get("workers", [])
        return sum(1 for w in workers if w.get("state") == "ALIVE")

    def worker_of_executor(self, app_id: str, executor_id: str) -> int | None:
        """Which worker runs executor ``executor_id`` of application ``app_id``."""
        for index in range(self.workers):
            if not self.daemons[1 + index].alive:
                continue
            with contextlib.suppress(OSError, ValueError):
                for executor in self.worker_state(index).get("executors", []):
                    if executor.get("appid") == app_id and str(executor.get("id")) == executor_id:
                        return index
        return None

    def executor_dirs(self) -> list[Path]:
        """Every executor's work directory (``app-*/<id>``: its log and fetched jars)."""
        found = []
        for index in range(self.workers):
            work = self.base / f"worker-{index}" / "work"
            found += sorted(p for p in work.glob("app-*/*") if p.is_dir())
        return found


@dataclass
class WorkerKill:
    """A worker SIGKILLed while the job ran, and what the driver then reported."""

    worker: int
    executor: str
    #: Tasks the executor was running when its worker was killed (by the driver's last look).
    active_tasks: int
    #: Seconds after the job started.
    at: float
    #: Tasks the driver counted as failed since (lost with the executor, run again).
    failed_tasks: int = 0
    #: Stage attempts after the first (a stage resubmitted for lost shuffle output).
    stage_retries: int = 0


def driver_executors(ui_port: int) -> tuple[str, list[dict[str, Any]]] | None:
    """(application id, every executor incl. lost ones) from a driver's REST API, if it answers."""
    base = f"http://{HOST}:{ui_port}/api/v1/applications"
    with contextlib.suppress(OSError, ValueError, KeyError, IndexError, TypeError):
        app = str(_get_json(base)["items"][0]["id"])
        executors = _get_json(f"{base}/{app}/allexecutors")["items"]
        return app, [e for e in executors if e.get("id") != "driver"]
    return None


def kill_worker_mid_job(
    cluster: StandaloneCluster,
    ui_port: int,
    job: subprocess.Popen[Any],
    *,
    timeout: float = 300.0,
) -> WorkerKill | None:
    """SIGKILL the worker of an executor the moment it runs a task; follow the job to its end.

    ``job`` is the driver process, with its UI on ``ui_port`` (``spark.ui.enabled``). The
    victim is chosen once both executors are known (which worker runs which is read from
    the workers' pages beforehand), so the kill follows the sighting by one signal.
    """
    started, deadline = time.monotonic(), time.monotonic() + timeout
    victim: tuple[int, str] | None = None
    kill: WorkerKill | None = None
    while job.poll() is None and time.monotonic() < deadline:
        state = driver_executors(ui_port)
        if state is not None:
            app, executors = state
            by_id = {str(e["id"]): e for e in executors}
            if victim is None and len(by_id) >= cluster.workers:
                found = cluster.worker_of_executor(app, min(by_id))
                victim = None if found is None else (found, min(by_id))
            elif victim is not None and kill is None:
                seen = by_id.get(victim[1], {})
                if seen.get("activeTasks", 0) > 0:
                    cluster.kill_worker(victim[0])
                    kill = WorkerKill(victim[0], victim[1], int(seen["activeTasks"]),
                                      round(time.monotonic() - started, 1))  # fmt: skip
            elif kill is not None:
                _follow(kill, ui_port, app)
        time.sleep(0.05 if kill is None else 0.5)
    return kill


def _follow(kill: WorkerKill, ui_port: int, app: str) -> None:
    """Count failed tasks and stage re-attempts (the lost executor's own counters freeze)."""
    url = f"http://{HOST}:{ui_port}/api/v1/applications/{app}/stages"
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        stages = _get_json(url)["items"]
        kill.failed_tasks = max(kill.failed_tasks, sum(int(s["numFailedTasks"]) for s in stages))
        kill.stage_retries = max(kill.stage_retries, sum(s["attemptId"] > 0 for s in stages))


def _end_group(daemon: Daemon, sig: signal.Signals) -> None:
    if daemon.process is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(daemon.process.pid, sig)


def _get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as response:
        doc = json.loads(response.read())
    return doc if isinstance(doc, dict) else {"items": doc}


@contextlib.contextmanager
def standalone_cluster(base: Path | None = None, **options: Any) -> Iterator[StandaloneCluster]:
    """A started cluster, stopped on exit whatever happened; its directory removed if ours."""
    own = base is None
    directory = Path(tempfile.mkdtemp(prefix="ferry-spark-")) if base is None else base
    cluster = StandaloneCluster(directory, **options)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        if own:
            shutil.rmtree(directory, ignore_errors=True)


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m spark.standalone``."""
    p = argparse.ArgumentParser(
        prog="python -m spark.standalone",
        description="A Spark standalone master and workers on 127.0.0.1 (development, tests)",
    )
    p.add_argument("--workers", type=int, default=2, help="number of workers")
    p.add_argument("--cores", type=int, default=1, help="cores each worker offers")
    p.add_argument("--worker-memory", default=WORKER_MEMORY,
                   help="memory each worker offers")  # fmt: skip
    p.add_argument("--executor-memory", default=EXECUTOR_MEMORY,
                   help="memory of each executor")  # fmt: skip
    p.add_argument("--dir", type=Path,
                   help="directory of logs and work (default: a temporary one)")  # fmt: skip
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="after --: run this with the cluster's FERRY_KPI_MASTER and "
                   "FERRY_KPI_SPARK_CONF, then stop (its exit code is ours)")  # fmt: skip
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Start the cluster; run the command or wait for Ctrl-C/SIGTERM; stop it."""
    args = parser().parse_args(argv)
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    options = {
        "workers": args.workers,
        "cores": args.cores,
        "worker_memory": args.worker_memory,
        "executor_memory": args.executor_memory,
    }
    with standalone_cluster(args.dir, **options) as cluster:
        env = cluster.job_env()
        print(f"Spark master {cluster.master_url} (web UI {cluster.master_web}), "
              f"{cluster.workers} workers, logs in {cluster.base}", flush=True)  # fmt: skip
        if command:
            return subprocess.run(command, env={**os.environ, **env}, check=False).returncode
        print("Run the KPI job against it with:", flush=True)
        for key, value in env.items():
            print(f"  export {key}='{value}'", flush=True)
        print("Ctrl-C stops the cluster.", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
