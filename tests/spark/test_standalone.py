"""The KPI job on a Spark standalone cluster (a master and two workers from the pyspark wheel).

One dataset (every fate of tests/spark/dataset.py plus bulk traffic generated as
``spark.bench`` does, so that the Spark phase lasts a few seconds) is judged three times,
each run as an operator starts it (``python -m spark.kpi_job``, its own JVM) over the same
explicit range and instant: in ``local[*]``, on the cluster, and on the cluster while one
worker is SIGKILLed (with its executor) as soon as that executor runs a task. Every run
must write exactly the same KPI rows and the same report; the JDBC driver jar must have
reached every executor (spark.jars). The run times of local[*] and of the cluster are
printed (``pytest -s``); ``python -m spark.bench --cluster --kill-worker`` does the same at
any size (the long run, by hand). Also: a configuration Spark refuses is exit 13 in one
line, and ``python -m spark.standalone -- CMD`` leaves no JVM behind.

Six JVM starts plus the cluster's: 1.5 minutes measured on two nearly idle cores (load
2.5), 4 to 6 under other test runs (load 10-17). The cluster's daemons have 256 MiB
heaps, its executors 512 MiB.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from devstack.ports import free_port
from devstack.postgres import PostgresServer
from spark.bench import clear_kpi_tables, generate, kpi_outputs
from spark.errors import EXIT_SLO_BREACH, EXIT_SPARK
from spark.standalone import (
    StandaloneCluster,
    WorkerKill,
    kill_worker_mid_job,
    standalone_cluster,
)
from tests.conftest import ROOT
from tests.spark.conftest import QUICK_JVM, KpiWorld, make_world
from tests.spark.dataset import load, standard_events

pytestmark = pytest.mark.integration

HOUR = 3600
#: Bulk events on top of the hand-made ones: enough for tasks that last (CI size).
BULK_EVENTS = 10_000
JOB = [sys.executable, "-m", "spark.kpi_job"]
#: The same reading and shuffling everywhere: many small JDBC partitions.
SHAPE = {"FERRY_KPI_SHUFFLE_PARTITIONS": "2", "FERRY_KPI_READ_PARTITIONS": "4",
         "FERRY_KPI_PARTITION_MIN_ROWS": "500"}  # fmt: skip


@dataclass
class Dataset:
    world: KpiWorld
    base: datetime

    def argv(self) -> list[str]:
        """One explicit range and instant: every run judges exactly the same thing."""
        end = self.base + timedelta(hours=4)
        return [*JOB, "--since", self.base.isoformat(), "--until", end.isoformat(),
                "--as-of", (end + timedelta(minutes=10)).isoformat()]  # fmt: skip


@dataclass
class Run:
    """What one run of the job did and wrote."""

    code: int
    wall: float
    stdout: str
    stderr: str
    outputs: dict[str, Any]
    report: dict[str, Any]

    def times(self) -> str:
        run, spark_phase = self.report["duration_seconds"], self.report["timings"]["spark"]
        return (
            f"{self.wall:.1f}s wall (JVM start included), run {run:.1f}s, Spark {spark_phase:.1f}s"
        )


@pytest.fixture(scope="module")
def dataset(pg_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    world = make_world(tmp_path_factory.mktemp("cluster-data"), pg_server,
                       only_model_published=True)  # fmt: skip
    base = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=6)
    # Bulk first: its dead letters are copied from every failed inbox row there is.
    dsns = {"sea": world.dsn("sea"), "vibespro": world.dsn("vibespro")}
    asyncio.run(generate(dsns, BULK_EVENTS, 4, base))
    load(world, standard_events(), base, HOUR)
    return Dataset(world, base)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """Master and two workers for the module; every JVM ends at teardown, whatever happened."""
    with standalone_cluster(tmp_path_factory.mktemp("spark-standalone")) as started:
        yield started


@pytest.fixture
def whole_cluster(cluster: StandaloneCluster) -> StandaloneCluster:
    """The cluster with both workers alive (a worker an earlier test killed comes back)."""
    for index in range(cluster.workers):
        cluster.restart_worker(index)
    return cluster


@pytest.fixture(scope="module")
def local_run(dataset: Dataset, tmp_path_factory: pytest.TempPathFactory) -> Run:
    conf = json.dumps({"spark.driver.extraJavaOptions": QUICK_JVM})
    extra = {"FERRY_KPI_MASTER": "local[*]", "FERRY_KPI_SPARK_CONF": conf}
    env = _env(dataset, tmp_path_factory.mktemp("local"), extra)
    return _run(dataset, env)


def _env(dataset: Dataset, report_dir: Path, extra: dict[str, str]) -> dict[str, str]:
    env = dataset.world.env(FERRY_KPI_REPORT_DIR=str(report_dir), **SHAPE)
    env.update(extra)
    return env


def _run(dataset: Dataset, env: dict[str, str], *, during: Any = None) -> Run:
    """Run the job to its end (``during(process)`` is polled while it runs)."""
    asyncio.run(clear_kpi_tables(dataset.world.dsn("sea")))
    report_dir = Path(env["FERRY_KPI_REPORT_DIR"])
    clock = time.monotonic()
    process = subprocess.Popen(dataset.argv(), env=env, cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        if during is not None:
            during(process)
        stdout, stderr = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    wall = time.monotonic() - clock
    (report_dir / "driver.log").write_text(stderr)  # the driver's log, beside its report
    summary = f"exit {process.returncode}\n{stdout[-2000:]}\n{stderr[-4000:]}"
    assert process.returncode == EXIT_SLO_BREACH, summary
    assert "BREACH" in stdout, summary
    report = json.loads((report_dir / "sea-vibespro" / "latest" / "report.json").read_text())
    outputs = asyncio.run(kpi_outputs(dataset.world.dsn("sea"), report))
    return Run(process.returncode, wall, stdout, stderr, outputs, report)


def test_the_data_is_judged_in_local_mode(local_run: Run) -> None:
    # The baseline every cluster run is compared with: it saw the whole dataset.
    windows = local_run.outputs["kpi_windows"]
    assert local_run.report["events"] == BULK_EVENTS + len(standard_events())
    assert sum(r["produced"] for r in windows if r["subject"] == "*") == local_run.report["events"]
    assert local_run.report["lost_candidates"]["count"] > 0
    assert local_run.outputs["kpi_reasons"], "retries and dead letters by reason"


def test_same_kpis_on_the_cluster_and_the_driver_reaches_every_executor(
    dataset: Dataset, whole_cluster: StandaloneCluster, local_run: Run,
    tmp_path: Path,
) -> None:  # fmt: skip
    before = set(whole_cluster.executor_dirs())
    env = _env(dataset, tmp_path / "reports", whole_cluster.job_env(
        {"spark.driver.extraJavaOptions": QUICK_JVM}))  # fmt: skip
    on_cluster = _run(dataset, env)
    assert on_cluster.outputs == local_run.outputs
    # Both executors (one per worker) ran the JDBC reads with the jar the driver served.
    executors = sorted(set(whole_cluster.executor_dirs()) - before)
    assert len(executors) == 2, executors
    for directory in executors:
        assert (directory / "postgresql.jar").is_file(), sorted(directory.iterdir())
    print(f"\nKPI job, {on_cluster.report['events']:,} events, {SHAPE}:"
          f"\n  local[*]:                      {local_run.times()}"
          f"\n  standalone, 2 workers x 1 core: {on_cluster.times()}")  # fmt: skip


def test_a_worker_killed_mid_job_changes_nothing(
    dataset: Dataset, whole_cluster: StandaloneCluster, local_run: Run, tmp_path: Path
) -> None:
    ui_port = free_port()
    env = _env(dataset, tmp_path / "reports", whole_cluster.job_env(
        {"spark.driver.extraJavaOptions": QUICK_JVM, "spark.ui.enabled": "true",
         "spark.ui.port": str(ui_port)}))  # fmt: skip
    kills: list[WorkerKill | None] = []
    survived = _run(dataset, env, during=lambda job: kills.append(
        kill_worker_mid_job(whole_cluster, ui_port, job, timeout=240)))  # fmt: skip
    kill = kills[0]
    assert kill is not None, "no executor was ever seen running a task"
    # The driver saw the executor go and went on with the other one; the master, the worker.
    assert f"Lost executor {kill.executor}" in survived.stderr, survived.stderr[-3000:]
    whole_cluster.wait_for_workers(1, timeout=60)
    # Work was lost with it (its running task, or shuffle output a stage had to recompute) ...
    assert kill.failed_tasks + kill.stage_retries >= 1, kill
    # ... and redone elsewhere: not one KPI differs.
    assert survived.outputs == local_run.outputs
    print(
        f"\nworker {kill.worker} SIGKILLed {kill.at}s into the job while its executor "
        f"{kill.executor} ran {kill.active_tasks} task(s); {kill.failed_tasks} task(s) failed, "
        f"{kill.stage_retries} stage(s) re-run; same KPIs; {survived.times()}"
    )


def test_a_configuration_spark_refuses_exits_13_in_one_line(
    dataset: Dataset, tmp_path: Path
) -> None:
    # Below Spark's 450 MiB minimum the driver refuses to start; a traceback would exit 1,
    # which means "a target was missed".
    conf = {"spark.executor.memory": "384m", "spark.driver.extraJavaOptions": QUICK_JVM}
    extra = {"FERRY_KPI_MASTER": "spark://127.0.0.1:7077", "FERRY_KPI_SPARK_CONF": json.dumps(conf)}
    result = subprocess.run(dataset.argv(), env=_env(dataset, tmp_path, extra), cwd=ROOT,
                            capture_output=True, text=True, timeout=240, check=False)  # fmt: skip
    assert result.returncode == EXIT_SPARK, result.stderr[-3000:]
    line = next(x for x in result.stderr.splitlines() if x.startswith("kpi-spark-job: "))
    assert "Spark did not start" in line and "Insufficient executor memory" in line, line
    assert "Traceback" not in result.stderr


def test_the_command_runs_a_job_on_its_cluster_and_leaves_no_jvm(tmp_path: Path) -> None:
    # What an operator or developer runs: the cluster, the command with its master, then
    # nothing left running (the daemons' directory is in every JVM's command line).
    probe = (
        "import json, os, sys; conf = json.loads(os.environ['FERRY_KPI_SPARK_CONF']);"
        " print('MASTER', os.environ['FERRY_KPI_MASTER'], conf['spark.executor.memory']);"
        " sys.exit(7)"
    )
    directory = tmp_path / "cluster"
    argv = [sys.executable, "-m", "spark.standalone", "--workers", "1", "--dir", str(directory),
            "--", sys.executable, "-c", probe]  # fmt: skip
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=180,
                            check=False)  # fmt: skip
    assert result.returncode == 7, result.stderr[-3000:]
    assert "MASTER spark://127.0.0.1:" in result.stdout and " 512m" in result.stdout
    assert "Registering worker 127.0.0.1" in (directory / "master.log").read_text()
    assert _processes_mentioning(str(directory)) == []


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in args:
            found.append(args[:200])
    return found
