"""The job as an operator runs it: its command, its exit codes, its errors, its schedule."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import zipfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from devstack.ports import free_port
from devstack.postgres import PostgresServer
from spark.errors import (
    EXIT_CONFIG,
    EXIT_CONNECT,
    EXIT_NO_JAVA,
    EXIT_NO_JDBC_DRIVER,
    EXIT_OK,
    EXIT_SCHEMA,
    EXIT_SLO_BREACH,
)
from tests.conftest import ROOT
from tests.spark.conftest import QUICK_JVM, KpiWorld
from tests.spark.dataset import load, standard_events

pytestmark = pytest.mark.integration

HOUR = 3600
JOB = [sys.executable, "-m", "spark.kpi_job"]


def run(
    argv: list[str], env: dict[str, str], timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )


def _base() -> datetime:
    return datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=6)


# ---- the job cannot judge: a clear line on stderr and its own exit code, before Spark starts


def test_missing_java_home(world: KpiWorld) -> None:
    result = run(JOB, world.env(FERRY_KPI_JAVA_HOME="/nonexistent/jdk"))
    assert result.returncode == EXIT_NO_JAVA, result.stderr
    assert "no Java at /nonexistent/jdk/bin/java" in result.stderr


def test_no_java_anywhere(world: KpiWorld, tmp_path: Path) -> None:
    env = world.env(PATH=str(tmp_path))
    env.pop("JAVA_HOME", None)
    result = run(JOB, env)
    assert result.returncode == EXIT_NO_JAVA, result.stderr
    assert "no Java found" in result.stderr and "openjdk-17" in result.stderr


def test_too_old_java(world: KpiWorld, tmp_path: Path) -> None:
    fake = tmp_path / "jdk11" / "bin" / "java"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\necho 'openjdk version \"11.0.22\" 2024-01-16' >&2\n")
    fake.chmod(0o755)
    result = run(JOB, world.env(FERRY_KPI_JAVA_HOME=str(tmp_path / "jdk11")))
    assert result.returncode == EXIT_NO_JAVA, result.stderr
    assert "is Java 11; Spark needs Java 17+" in result.stderr


def test_missing_jdbc_driver(world: KpiWorld, tmp_path: Path) -> None:
    result = run(JOB, world.env(FERRY_KPI_JDBC_DRIVER=str(tmp_path / "postgresql.jar")))
    assert result.returncode == EXIT_NO_JDBC_DRIVER, result.stderr
    assert "not found" in result.stderr and "libpostgresql-jdbc-java" in result.stderr
    other = tmp_path / "other.jar"
    with zipfile.ZipFile(other, "w") as jar:
        jar.writestr("com/example/Thing.class", b"\xca\xfe\xba\xbe")
    result = run(JOB, world.env(FERRY_KPI_JDBC_DRIVER=str(other)))
    assert result.returncode == EXIT_NO_JDBC_DRIVER, result.stderr
    assert "not the PostgreSQL driver" in result.stderr


def test_unreachable_database(world: KpiWorld) -> None:
    port = free_port()  # nothing listens there
    databases = world.databases()
    databases[world.database("vibespro")] = f"postgresql://postgres@127.0.0.1:{port}/nowhere"
    result = run(JOB, world.env(FERRY_DATABASES=json.dumps(databases)))
    assert result.returncode == EXIT_CONNECT, result.stderr
    assert f"database {world.database('vibespro')!r}" in result.stderr
    assert "unreachable" in result.stderr


def test_unmigrated_and_missing_databases(world: KpiWorld, pg_server: PostgresServer) -> None:
    bare = world.database("vibespro") + "_bare"
    pg_server.create_database(bare)
    databases = world.databases()
    databases[world.database("vibespro")] = pg_server.dsn(bare)
    result = run(JOB, world.env(FERRY_DATABASES=json.dumps(databases)))
    assert result.returncode == EXIT_SCHEMA, result.stderr
    assert "lacks outbox_events, inbox_messages, dead_letters, parked_messages" in result.stderr
    assert "ferry migrate" in result.stderr
    databases[world.database("vibespro")] = pg_server.dsn(bare + "_absent")
    result = run(JOB, world.env(FERRY_DATABASES=json.dumps(databases)))
    assert result.returncode == EXIT_SCHEMA, result.stderr
    assert "does not exist" in result.stderr
    # Migrated before 0015 and 0016: the columns the reads and the writes need are named.
    world.execute("vibespro", "ALTER TABLE inbox_messages DROP COLUMN held_by")
    world.execute("sea", "ALTER TABLE kpi_windows DROP COLUMN waited, DROP COLUMN parked")
    result = run(JOB, world.env())
    assert result.returncode == EXIT_SCHEMA, result.stderr
    assert "lacks kpi_windows.parked, kpi_windows.waited: run `ferry migrate`" in result.stderr
    world.execute("sea", "ALTER TABLE kpi_windows ADD COLUMN waited BIGINT NOT NULL DEFAULT 0,"
                  " ADD COLUMN parked BIGINT NOT NULL DEFAULT 0")  # fmt: skip
    result = run(JOB, world.env())
    assert result.returncode == EXIT_SCHEMA, result.stderr
    assert "lacks inbox_messages.held_by: run `ferry migrate`" in result.stderr


def test_bad_settings_and_options(world: KpiWorld) -> None:
    result = run(JOB, world.env(FERRY_KPI_WINDOW="1.5s"))
    assert result.returncode == EXIT_CONFIG and "kpi_window" in result.stderr
    result = run([*JOB, "--since", "yesterday"], world.env())
    assert result.returncode == EXIT_CONFIG and "'yesterday' is not an ISO 8601" in result.stderr


# ---- the job judges: the verdict is the exit code


def test_spark_submit_runs_the_job_and_a_breach_exits_1(world: KpiWorld) -> None:
    # One real run in its own JVM, the way Kubernetes runs it: spark-submit on the job file,
    # without PYTHONPATH (the file finds its package) and with the driver passed by --jars.
    base = _base()
    load(world, standard_events(), base, HOUR)
    env = world.env(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env.pop("PYTHONPATH")
    submit = Path(sys.executable).with_name("spark-submit")
    argv = [str(submit), "--master", "local[2]", "--jars", "/usr/share/java/postgresql.jar",
            "--conf", "spark.ui.enabled=false", "--driver-java-options", QUICK_JVM,
            str(ROOT / "spark" / "kpi_job.py"),
            "--as-of", (base + timedelta(hours=4, minutes=10)).isoformat()]  # fmt: skip
    result = run(argv, env)
    assert result.returncode == EXIT_SLO_BREACH, result.stdout + result.stderr[-3000:]
    assert "verdict: BREACH (exit 1)" in result.stdout
    assert "lost candidates: 1" in result.stdout  # the stuck event is retrying, not lost
    latest = world.report_dir / "sea-vibespro" / "latest"
    doc = json.loads((latest / "report.json").read_text())
    assert doc["exit_code"] == EXIT_SLO_BREACH and doc["range"]["incremental"] is True
    rows = world.fetch("sea", "SELECT count(*) AS n FROM kpi_windows")
    assert rows[0]["n"] > 0


# ---- the schedule


def test_schedule_survives_failing_runs_and_stops_on_sigterm(world: KpiWorld) -> None:
    # Every run fails fast (no Java): the loop logs each one and carries on; SIGTERM ends it.
    # The interval comes from the environment, which each run inherits: runs must not
    # start schedulers of their own.
    env = world.env(
        FERRY_KPI_JAVA_HOME="/nonexistent/jdk", FERRY_KPI_GRACE="0s", FERRY_KPI_EVERY="2s"
    )
    proc = subprocess.Popen(JOB, env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        finished = []
        assert proc.stderr is not None
        while len(finished) < 2 and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if '"KPI run finished"' in line:
                finished.append(json.loads(line))
        assert [f["exit_code"] for f in finished] == [EXIT_NO_JAVA, EXIT_NO_JAVA]
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == EXIT_OK
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def test_schedule_refuses_an_explicit_range(world: KpiWorld) -> None:
    result = run([*JOB, "--every", "1h", "--since", "2026-01-01T00:00Z"], world.env())
    assert result.returncode == EXIT_CONFIG and "--every" in result.stderr
