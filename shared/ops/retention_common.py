"""What ``ferry purge``'s parts share: one table's report, a connection per database,
the cut-off and the batch loop (:mod:`shared.ops.purge`, :mod:`shared.ops.retention_run`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from shared.adapters.postgres import DATABASE_ERRORS, NOT_PERMITTED_ERRORS, connect, redact
from shared.domain.errors import ConfigurationError, TransientError
from shared.runtime.settings import CommonSettings


@dataclass
class Purged:
    """What one table's purge found and did (and, when measured, the table's size)."""

    table: str
    scope: str
    database: str
    retention_seconds: float
    before: datetime
    purged: int
    #: The table's rows as the statistics estimate them (pg_class.reltuples), its bytes
    #: (pg_total_relation_size) and its oldest row's age after the purge: None when not
    #: measured or the table is empty. For the outbox and the inbox, the oldest row the
    #: purge should already have deleted (published or processed before the cut-off):
    #: None while the purge keeps up (their unfinished rows are never purged, and have
    #: metrics of their own: the outbox backlog, dead letters, retries).
    rows_estimate: int | None = None
    bytes: int | None = None
    oldest_age_seconds: float | None = None
    #: Why nothing was done ("" when it was): a handler's table absent or not granted.
    skipped: str = ""

    def line(self, dry_run: bool) -> str:
        if self.skipped:
            return f"{self.table} {self.scope} ({self.database}): skipped: {self.skipped}"
        verb = "would purge" if dry_run else "purged"
        return (
            f"{self.table} {self.scope} ({self.database}): {verb} {self.purged:,} rows "
            f"older than {self.before.isoformat()} (retention {_days(self.retention_seconds)})"
        )


def _days(seconds: float) -> str:
    return f"{seconds / 86400:g}d" if seconds >= 86400 else f"{seconds:g}s"


@asynccontextmanager
async def database(settings: CommonSettings, name: str) -> AsyncIterator[Any]:
    """A connection to database ``name``; a refused statement or a lost server named with it.

    A permission error is a configuration error (the login lacks the grants ``ferry
    db-roles`` gives ``retention-{topology}``); anything else from the server is transient:
    what was deleted stays deleted, the rest waits for the next run.
    """
    dsn = settings.dsn(name)
    conn = await connect(dsn)
    try:
        # Every statement's cut-off is a parameter; a generic plan would estimate a third of
        # the table behind it and could scan it whole. The actual cut-off finds a few pages.
        await conn.execute("SET plan_cache_mode = force_custom_plan")
        yield conn
    except NOT_PERMITTED_ERRORS as exc:
        raise ConfigurationError(
            f"{redact(dsn)}: {exc}; the purge needs the grants `ferry db-roles` gives the "
            "topology's retention login"
        ) from exc
    except DATABASE_ERRORS as exc:
        raise TransientError(f"{redact(dsn)}: purge interrupted: {exc}") from exc
    finally:
        await conn.close()


async def cutoff(conn: Any, retention: float) -> datetime:
    """The database's now minus ``retention`` seconds."""
    now: datetime = await conn.fetchval("SELECT now()")
    return now - timedelta(seconds=retention)


async def age(conn: Any, at: datetime | None) -> float | None:
    """Seconds from ``at`` to the database's now (None for None)."""
    if at is None:
        return None
    return float(await conn.fetchval("SELECT extract(epoch FROM now() - $1::timestamptz)", at))


async def drain(step: Callable[[], Awaitable[int]]) -> int:
    """Run ``step`` (one batch) until it deletes nothing; the rows deleted in all."""
    total = 0
    while True:
        deleted = await step()
        total += deleted
        if deleted == 0:
            return total


def deleted(status: str) -> int:
    """The row count of a ``DELETE n`` command status."""
    return int(status.split()[-1])
