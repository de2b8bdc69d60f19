"""The driver's own round trips to PostgreSQL (asyncpg): checks, read bounds, results.

Spark reads the records (:mod:`spark.sources`); everything small goes through here:
whether each database answers and has its tables, the seq bounds that split a JDBC read
into partitions, the watermark and the KPI rows. Results are written per run in ONE
transaction: delete the run's windows, insert their rows, record the run, move the
watermark. A re-run of the same windows therefore replaces them with identical rows,
and a run that dies half-way leaves the previous results and watermark untouched.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from shared.adapters.postgres import redact
from spark.errors import AccessDenied, DatabaseUnreachable, RunLocked, SchemaMissing
from spark.kpis import REASON_COLUMNS, WINDOW_COLUMNS, Row
from spark.verdicts import HistoryPoint

#: Tables the job reads in every database it reads, and writes in the KPI database.
SOURCE_TABLES = ("outbox_events", "inbox_messages", "dead_letters", "parked_messages")
KPI_TABLES = ("kpi_windows", "kpi_reasons", "kpi_watermarks", "kpi_runs")
#: Columns later migrations added to those tables (a database migrated before them would
#: fail the reads or the writes half-way): table → columns.
#: 0015_waited_for_operator.sql and 0016_kpi_places.sql.
SOURCE_COLUMNS: dict[str, tuple[str, ...]] = {"inbox_messages": ("held_by",)}
KPI_COLUMNS: dict[str, tuple[str, ...]] = {
    "kpi_windows": (
        "parked", "retrying", "in_flight", "waited", "waited_latency_p99_ms",
        "waited_latency_max_ms",
    ),
}  # fmt: skip
#: First key of the run lock (pg_advisory_lock(int, int)); the second hashes the topology.
LOCK_CLASS = 0x4B5049  # "KPI"


async def connect(dsn: str, database: str, *, timeout: float) -> asyncpg.Connection:
    """A connection, with every way of failing named for the operator."""
    where = f"database {database!r} ({redact(dsn)})"
    try:
        return await asyncpg.connect(dsn, timeout=timeout)
    except asyncpg.exceptions.InvalidCatalogNameError:
        raise SchemaMissing(f"{where} does not exist: run `ferry migrate`") from None
    except (asyncpg.exceptions.InvalidPasswordError,
            asyncpg.exceptions.InvalidAuthorizationSpecificationError) as exc:  # fmt: skip
        raise DatabaseUnreachable(f"{where} refused the login: {exc}") from exc
    except (OSError, TimeoutError, asyncpg.exceptions.PostgresConnectionError,
            asyncpg.exceptions.CannotConnectNowError,
            asyncpg.exceptions.TooManyConnectionsError) as exc:  # fmt: skip
        raise DatabaseUnreachable(f"{where} is unreachable: {exc or type(exc).__name__}") from exc


async def require_tables(conn: asyncpg.Connection, database: str, tables: tuple[str, ...]) -> None:
    """Raise :class:`SchemaMissing` naming every table of ``tables`` that is absent."""
    missing = [t for t in tables if await conn.fetchval("SELECT to_regclass($1)", t) is None]
    if missing:
        raise SchemaMissing(
            f"database {database!r} lacks {', '.join(missing)}: run `ferry migrate`"
        )


_HAS_COLUMN = """
SELECT EXISTS (SELECT 1 FROM pg_attribute
               WHERE attrelid = to_regclass($1) AND attname = $2 AND NOT attisdropped)
"""


async def require_columns(
    conn: asyncpg.Connection, database: str, columns: dict[str, tuple[str, ...]]
) -> None:
    """Raise :class:`SchemaMissing` naming every ``table.column`` of ``columns`` that is absent."""
    missing = [
        f"{table}.{column}"
        for table, names in columns.items()
        for column in names
        if not await conn.fetchval(_HAS_COLUMN, table, column)
    ]
    if missing:
        raise SchemaMissing(
            f"database {database!r} lacks {', '.join(missing)}: run `ferry migrate`"
        )


@dataclass(frozen=True, slots=True)
class Span:
    """Bounds of a numeric column over the rows one read will fetch."""

    low: int | None
    high: int | None
    rows: int


_OUTBOX_SPAN = """
SELECT min(seq), max(seq), count(*) FROM outbox_events
WHERE occurred_at >= $1 AND occurred_at < $2
"""
_INBOX_SPAN = """
SELECT min(stream_seq), max(stream_seq), count(*) FROM inbox_messages
WHERE durable = ANY($3::text[]) AND (
  (occurred_at >= $1 AND occurred_at < $2) OR (occurred_at IS NULL AND received_at >= $1))
"""


async def outbox_span(conn: asyncpg.Connection, start: datetime, end: datetime) -> Span:
    """seq bounds and row count of the outbox rows that occurred in ``[start, end)``."""
    row = await conn.fetchrow(_OUTBOX_SPAN, start, end)
    assert row is not None
    return Span(row[0], row[1], row[2])


async def inbox_span(
    conn: asyncpg.Connection, durables: list[str], start: datetime, end: datetime
) -> Span:
    """stream_seq bounds and row count of the inbox rows of ``durables`` in the range."""
    row = await conn.fetchrow(_INBOX_SPAN, start, end, durables)
    assert row is not None
    return Span(row[0], row[1], row[2])


async def dead_letter_count(conn: asyncpg.Connection, durables: list[str], since: datetime) -> int:
    """Dead letters of ``durables`` recorded since ``since`` (skips an empty Spark read)."""
    value = await conn.fetchval(
        "SELECT count(*) FROM dead_letters WHERE durable = ANY($1::text[])"
        " AND dead_lettered_at >= $2",
        durables,
        since,
    )
    return int(value or 0)


async def parked_count(conn: asyncpg.Connection, database: str, durables: list[str]) -> int:
    """Messages ``durables`` hold parked now (skips an empty Spark read)."""
    try:
        value = await conn.fetchval(
            "SELECT count(*) FROM parked_messages WHERE durable = ANY($1::text[])", durables
        )
    except asyncpg.exceptions.InsufficientPrivilegeError as exc:
        raise AccessDenied(
            f"database {database!r}: the job's login may not read parked_messages ({exc}); "
            "its grants come from `ferry db-roles`"
        ) from None
    return int(value or 0)


async def earliest_event(conn: asyncpg.Connection) -> datetime | None:
    """The oldest occurred_at in the outbox (where a first run starts)."""
    value = await conn.fetchval("SELECT min(occurred_at) FROM outbox_events")
    return value if isinstance(value, datetime) else None


class KpiStore:
    """The KPI database: run lock, watermark, history for baselines, results."""

    def __init__(self, conn: asyncpg.Connection, *, topology: str, window_seconds: int) -> None:
        self.conn, self.topology, self.window_seconds = conn, topology, window_seconds

    async def lock(self) -> None:
        """Hold the run lock for this topology and window length until the connection closes."""
        got = await self.conn.fetchval(
            "SELECT pg_try_advisory_lock($1, hashtext($2))",
            LOCK_CLASS,
            f"{self.topology}:{self.window_seconds}",
        )
        if not got:
            raise RunLocked(
                f"another KPI run for topology {self.topology!r} with {self.window_seconds}s "
                "windows is in progress"
            )

    async def watermark(self) -> datetime | None:
        """End of the last window an incremental run completed, if any."""
        value = await self.conn.fetchval(
            "SELECT watermark FROM kpi_watermarks WHERE topology = $1 AND window_seconds = $2",
            self.topology,
            self.window_seconds,
        )
        return value if isinstance(value, datetime) else None

    async def history(self, start: datetime, end: datetime) -> list[HistoryPoint]:
        """Durable roll-up rows of the windows in ``[start, end)`` (alert baselines)."""
        rows = await self.conn.fetch(
            "SELECT window_start, context, durable, dead_lettered, lag_p50_ms FROM kpi_windows"
            " WHERE topology = $1 AND window_seconds = $2 AND subject = '*'"
            " AND window_start >= $3 AND window_start < $4",
            self.topology,
            self.window_seconds,
            start,
            end,
        )
        return [HistoryPoint(r[0], r[1], r[2], int(r[3]), r[4]) for r in rows]

    async def rows(self, start: datetime, end: datetime) -> list[dict[str, Any]]:
        """The stored window rows of ``[start, end)``, in key order (for tests and tools)."""
        records = await self.conn.fetch(
            "SELECT * FROM kpi_windows WHERE topology = $1 AND window_seconds = $2"
            " AND window_start >= $3 AND window_start < $4"
            " ORDER BY window_start, context, durable, subject",
            self.topology,
            self.window_seconds,
            start,
            end,
        )
        return [dict(r) for r in records]

    async def write(self, result: WriteSet) -> None:
        """Replace the run's windows and record the run, atomically."""
        key = (self.topology, self.window_seconds, result.start, result.end)
        async with self.conn.transaction():
            for table in ("kpi_windows", "kpi_reasons"):
                await self.conn.execute(
                    f"DELETE FROM {table} WHERE topology = $1 AND window_seconds = $2"
                    " AND window_start >= $3 AND window_start < $4",
                    *key,
                )
            await self._copy("kpi_windows", WINDOW_COLUMNS, result.windows)
            await self._copy("kpi_reasons", REASON_COLUMNS, result.reasons)
            await self.conn.execute(
                "INSERT INTO kpi_runs (run_id, topology, window_seconds, range_start, range_end,"
                " as_of, incremental, windows, events, verdict, exit_code, report_dir, started_at)"
                " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
                result.run_id, self.topology, self.window_seconds, result.start, result.end,
                result.as_of, result.incremental, result.window_count, result.events,
                result.verdict, result.exit_code, result.report_dir, result.started_at,
            )  # fmt: skip
            if result.incremental:
                await self.conn.execute(
                    "INSERT INTO kpi_watermarks (topology, window_seconds, watermark, run_id)"
                    " VALUES ($1, $2, $3, $4) ON CONFLICT (topology, window_seconds) DO UPDATE"
                    " SET watermark = greatest(kpi_watermarks.watermark, EXCLUDED.watermark),"
                    " run_id = EXCLUDED.run_id, updated_at = clock_timestamp()",
                    self.topology,
                    self.window_seconds,
                    result.end,
                    result.run_id,
                )

    async def _copy(self, table: str, columns: tuple[str, ...], rows: list[Row]) -> None:
        if rows:
            await self.conn.copy_records_to_table(
                table, columns=list(columns), records=[tuple(r[c] for c in columns) for r in rows]
            )


@dataclass(frozen=True)
class WriteSet:
    """Everything one run writes."""

    run_id: uuid.UUID
    start: datetime
    end: datetime
    as_of: datetime
    started_at: datetime
    incremental: bool
    window_count: int
    events: int
    verdict: str
    exit_code: int
    report_dir: str | None
    windows: list[Row]
    reasons: list[Row]
