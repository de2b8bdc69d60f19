"""How long the KPI job takes on N events: ``python -m spark.bench --events 1000000``.

Starts a throwaway PostgreSQL (the embedded one, fsync off: the data is disposable),
migrates the sea-vibespro databases, generates N SEA events over H hourly windows with
SQL (outbox rows as the producer writes them, published; for each, the inbox row
vibespro's consumer writes: processed with a spread of latencies, a few retried, a few
dead-lettered with their dead_letters row, a few never received), then runs the job as
an operator does (``python -m spark.kpi_job``, a fresh JVM) and prints the wall time, the
job's own phase timings and its verdict. ``--cluster`` runs it again on a Spark standalone
cluster (:mod:`spark.standalone`: a master and ``--workers`` workers on this machine) and
``--kill-worker`` once more there, SIGKILLing a worker mid-job; each run must write the
same KPI rows and report as ``local[*]`` (exit 1 otherwise). Run by hand, not in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from devstack.postgres import PostgresServer
from shared.adapters.postgres import migrate_database

ROOT = Path(__file__).resolve().parents[1]
TOPOLOGY = ROOT / "topologies" / "sea-vibespro.yaml"

_OUTBOX = """
INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, event_version, payload,
                           occurred_at, published_at, publish_attempts)
SELECT md5('ev' || i)::uuid, 'model', 'm' || (i % 1000), 'model_published', 1,
       jsonb_build_object('model_id', 'm' || (i % 1000), 'name', 'n' || i),
       $1::timestamptz + (i * $3::float8) * interval '1 second',
       $1::timestamptz + (i * $3::float8) * interval '1 second' + interval '2 ms', 1
FROM generate_series($2::bigint, $4::bigint) AS i
"""
# Latency: 3-40 ms for most, a tail to ~400 ms for 1 in 100; 1 in 2,000 dead-lettered,
# 1 in 200,000 never received (lost), 1 in 50 retried once before succeeding.
_INBOX = """
INSERT INTO inbox_messages (message_id, durable, subject, received_at, processed_at, attempts,
  status, event_type, event_version, occurred_at, stream_seq, handler_status, reason_code,
  duplicates, retry_history)
SELECT md5('ev' || i)::uuid, 'vibespro__from_sea', 'sea.event.model_published.v1',
       at + interval '3 ms',
       CASE WHEN i % 2000 = 7 THEN NULL
            ELSE at + ((3 + (i * 7919 % 37) + CASE WHEN i % 100 = 3 THEN (i % 400) ELSE 0 END)
                       * interval '1 ms') END,
       CASE WHEN i % 50 = 1 THEN 2 ELSE 1 END,
       CASE WHEN i % 2000 = 7 THEN 'failed' ELSE 'processed' END,
       'model_published', 1, at, i, CASE WHEN i % 2000 = 7 THEN 422 ELSE 200 END,
       CASE WHEN i % 2000 = 7 THEN 'HANDLER_REJECTED' WHEN i % 50 = 1 THEN 'HTTP_503' END,
       0,
       CASE WHEN i % 2000 = 7 THEN '[{"attempt":1,"reason":"HANDLER_REJECTED","status":422}]'
            WHEN i % 50 = 1 THEN '[{"attempt":1,"reason":"HTTP_503","status":503}]'
            ELSE '[]' END::jsonb
FROM (SELECT i, $1::timestamptz + (i * $3::float8) * interval '1 second' AS at
      FROM generate_series($2::bigint, $4::bigint) AS i) AS g
WHERE i % 200000 <> 11
"""
_DEAD = """
INSERT INTO dead_letters (durable, message_id, stream, stream_seq, original_subject, event_type,
  event_version, reason_code, last_error, attempts, record, dlq_subject, source, status)
SELECT durable, message_id, 'SEA_EVENTS', stream_seq, subject, event_type, event_version,
       reason_code, 'handler answered 422', attempts, '{}'::jsonb,
       'vibespro.dlq.vibespro__from_sea', 'consumer', 'held'
FROM inbox_messages WHERE status = 'failed'
"""


async def generate(dsns: dict[str, str], events: int, hours: int, base: datetime) -> None:
    """N events spread evenly over ``hours`` hours from ``base``, in batches."""
    step = hours * 3600 / events
    sea, vibespro = await asyncpg.connect(dsns["sea"]), await asyncpg.connect(dsns["vibespro"])
    try:
        batch = 100_000
        for low in range(0, events, batch):
            high = min(events, low + batch) - 1
            await sea.execute(_OUTBOX, base, low, step, high)
            await vibespro.execute(_INBOX, base, low, step, high)
        await vibespro.execute(_DEAD)
        for conn in (sea, vibespro):
            await conn.execute("ANALYZE")
    finally:
        await sea.close()
        await vibespro.close()


STABLE_SKIP = ("run_id", "duration_seconds", "timings")


async def clear_kpi_tables(dsn: str) -> None:
    """Empty the KPI tables of a database (before a run whose rows are to be compared)."""
    conn = await asyncpg.connect(dsn)
    try:
        for table in ("kpi_windows", "kpi_reasons", "kpi_runs", "kpi_watermarks"):
            await conn.execute(f"DELETE FROM {table}")
    finally:
        await conn.close()


async def kpi_outputs(dsn: str, report: dict[str, Any]) -> dict[str, Any]:
    """What a run wrote that does not name the run itself: KPI rows and the report.

    Two runs over the same data, range and instant must give equal values, whatever the
    Spark master (``local[*]`` or a cluster, with or without a worker lost mid-job).
    """
    conn = await asyncpg.connect(dsn)
    try:
        windows = await conn.fetch(
            "SELECT * FROM kpi_windows"
            " ORDER BY topology, window_seconds, window_start, context, durable, subject"
        )
        reasons = await conn.fetch("SELECT * FROM kpi_reasons ORDER BY 1, 2, 3, 4, 5, 6, 7, 8")
        runs = await conn.fetch(
            "SELECT topology, window_seconds, range_start, range_end, as_of, incremental,"
            " windows, events, verdict, exit_code FROM kpi_runs ORDER BY range_start"
        )
    finally:
        await conn.close()
    return {
        "kpi_windows": [dict(r) for r in windows],
        "kpi_reasons": [dict(r) for r in reasons],
        "kpi_runs": [dict(r) for r in runs],
        "report": {k: v for k, v in report.items() if k not in STABLE_SKIP},
    }


@dataclass
class JobRun:
    """One timed run of the job."""

    label: str
    code: int
    wall: float
    report: dict[str, Any]
    outputs: dict[str, Any]
    stdout: str
    note: str = ""

    def line(self) -> str:
        run, spark_phase = self.report["duration_seconds"], self.report["timings"].get("spark")
        return (
            f"{self.label}: {self.wall:.1f}s wall (JVM start included), run {run:.1f}s "
            f"(Spark phase {spark_phase}s), exit {self.code}{self.note}"
        )


def main(argv: list[str] | None = None) -> int:
    """Generate, run, print."""
    parser = argparse.ArgumentParser(
        prog="python -m spark.bench", description="Time the KPI job on generated data"
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--hours", type=int, default=24)
    parser.add_argument("--partitions", type=int, default=8, help="FERRY_KPI_READ_PARTITIONS")
    parser.add_argument("--cluster", action="store_true",
                        help="run again on a Spark standalone cluster (spark.standalone) and "
                        "check it writes the same KPIs as local[*]")  # fmt: skip
    parser.add_argument("--workers", type=int, default=2, help="workers of --cluster")
    parser.add_argument("--kill-worker", action="store_true",
                        help="and once more there, SIGKILLing a worker mid-job")  # fmt: skip
    args = parser.parse_args(argv)
    base_dir = Path(tempfile.mkdtemp(prefix="ferry-kpi-bench-"))
    base_dir.chmod(0o711)
    settings = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
    server = PostgresServer(base_dir / "data", extra_settings=settings)
    server.start()
    try:
        return _bench(server, base_dir, args)
    finally:
        server.stop()
        shutil.rmtree(base_dir, ignore_errors=True)


def _bench(server: PostgresServer, base_dir: Path, args: argparse.Namespace) -> int:
    dsns = {db: server.dsn(db) for db in ("sea", "vibespro")}

    async def prepare() -> None:
        for dsn in dsns.values():
            await migrate_database(dsn)

    asyncio.run(prepare())
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    base = now - timedelta(hours=args.hours + 1)
    clock = time.monotonic()
    asyncio.run(generate(dsns, args.events, args.hours, base))
    print(
        f"generated {args.events:,} events over {args.hours} h in {time.monotonic() - clock:.1f}s"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    env.update(
        FERRY_TOPOLOGY=str(TOPOLOGY),
        FERRY_DATABASES=json.dumps(dsns),
        FERRY_KPI_READ_PARTITIONS=str(args.partitions),
        PYTHONPATH=str(ROOT),
    )
    end = base + timedelta(hours=args.hours)
    # One explicit range and instant: every run judges exactly the same thing.
    as_of = end + timedelta(minutes=10)
    argv = [sys.executable, "-m", "spark.kpi_job", "--since", base.isoformat(),
            "--until", end.isoformat(), "--as-of", as_of.isoformat()]  # fmt: skip
    runs = [_run_job("local[*]", argv, {**env, "FERRY_KPI_MASTER": "local[*]"}, base_dir, dsns)]
    print(runs[0].stdout)
    if args.cluster or args.kill_worker:
        runs += _on_cluster(argv, env, base_dir, dsns, args)
    for run in runs:
        print(run.line())
    report = runs[0].report
    print(f"{report['events']:,} events; local[*] phases {report['timings']}, "
          f"{report['events'] / max(report['duration_seconds'], 1e-9):,.0f} events/s")  # fmt: skip
    differing = [run.label for run in runs[1:] if run.outputs != runs[0].outputs]
    if differing:
        print(f"KPIs DIFFER from local[*]: {', '.join(differing)}")
        return 1
    if len(runs) > 1:
        print("same KPI rows and report in every run")
    return 0


def _on_cluster(
    argv: list[str],
    env: dict[str, str],
    base_dir: Path,
    dsns: dict[str, str],
    args: argparse.Namespace,
) -> list[JobRun]:
    from devstack.ports import free_port
    from spark.standalone import kill_worker_mid_job, standalone_cluster

    runs = []
    with standalone_cluster(base_dir / "spark", workers=args.workers) as cluster:
        label = f"standalone ({args.workers} workers x 1 core)"
        runs.append(_run_job(label, argv, {**env, **cluster.job_env()}, base_dir, dsns))
        if args.kill_worker:
            port = free_port()
            conf = {"spark.ui.enabled": "true", "spark.ui.port": str(port)}
            kills = []

            def kill(job: subprocess.Popen[str]) -> None:
                kills.append(kill_worker_mid_job(cluster, port, job))

            killing = {**env, **cluster.job_env(conf)}
            run = _run_job(f"{label}, a worker killed", argv, killing, base_dir, dsns, during=kill)
            found = kills[0] if kills else None
            run.note = (
                " (no executor was seen running a task: nothing killed)"
                if found is None
                else f" (worker {found.worker} SIGKILLed at {found.at}s with "
                f"{found.active_tasks} task(s) running; {found.failed_tasks} task(s) failed, "
                f"{found.stage_retries} stage(s) re-run)"
            )
            runs.append(run)
    return runs


def _run_job(
    label: str,
    argv: list[str],
    env: dict[str, str],
    base_dir: Path,
    dsns: dict[str, str],
    during: Callable[[subprocess.Popen[str]], None] | None = None,
) -> JobRun:
    reports = base_dir / "reports" / f"run-{len(list(base_dir.glob('reports/run-*')))}"
    env = {**env, "FERRY_KPI_REPORT_DIR": str(reports)}
    asyncio.run(clear_kpi_tables(dsns["sea"]))
    clock = time.monotonic()
    job = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        if during is not None:
            during(job)
        stdout, stderr = job.communicate()
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    wall = time.monotonic() - clock
    report_json = reports / "sea-vibespro" / "latest" / "report.json"
    if not report_json.exists():
        raise SystemExit(f"{label}: the job wrote no report (exit {job.returncode}):\n"
                         f"{stdout[-2000:]}\n{stderr[-4000:]}")  # fmt: skip
    report = json.loads(report_json.read_text())
    outputs = asyncio.run(kpi_outputs(dsns["sea"], report))
    return JobRun(label, job.returncode, wall, report, outputs, stdout)


if __name__ == "__main__":
    sys.exit(main())
