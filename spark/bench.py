"""How long the KPI job takes on N events: ``python -m spark.bench --events 1000000``.

Starts a throwaway PostgreSQL (the embedded one, fsync off: the data is disposable),
migrates the sea-vibespro databases, generates N SEA events over H hourly windows with
SQL (outbox rows as the producer writes them, published; for each, the inbox row
vibespro's consumer writes: processed with a spread of latencies, a few retried, a few
dead-lettered with their dead_letters row, a few never received), then runs the job as
an operator does (``python -m spark.kpi_job``, a fresh JVM) and prints the wall time, the
job's own phase timings and its verdict. Run by hand, not in CI.
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
from datetime import UTC, datetime, timedelta
from pathlib import Path

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


def main(argv: list[str] | None = None) -> int:
    """Generate, run, print."""
    parser = argparse.ArgumentParser(prog="python -m spark.bench")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--hours", type=int, default=24)
    parser.add_argument("--partitions", type=int, default=8, help="FERRY_KPI_READ_PARTITIONS")
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
        FERRY_KPI_REPORT_DIR=str(base_dir / "reports"),
        FERRY_KPI_READ_PARTITIONS=str(args.partitions),
        PYTHONPATH=str(ROOT),
    )
    clock = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "spark.kpi_job"], env=env, cwd=ROOT,
                            capture_output=True, text=True, check=False)  # fmt: skip
    wall = time.monotonic() - clock
    print(result.stdout)
    report = json.loads(
        (base_dir / "reports" / "sea-vibespro" / "latest" / "report.json").read_text()
    )
    print(f"job wall time (JVM start included): {wall:.1f}s, exit {result.returncode}")
    print(f"job run (after Spark started): {report['duration_seconds']:.1f}s, phases "
          f"{report['timings']}, {report['events']:,} events → "
          f"{report['events'] / max(report['duration_seconds'], 1e-9):,.0f} events/s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
