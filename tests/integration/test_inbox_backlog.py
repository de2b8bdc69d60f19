"""QRY-051, the inbox backlog (the console overview, the consumer's metrics, ``ferry
inbox-backlog``): the rows in play and the dead letters still open, each counted once, the
oldest being the oldest row in play (migration 0021: a year of dead letters is never read
for the rows in play; a dead letter settled is no longer counted)."""

from __future__ import annotations

import uuid
from datetime import datetime

import asyncpg
import pytest

from shared.adapters import inbox
from tests.conftest import Env

pytestmark = pytest.mark.integration

DURABLE = "vibespro__from_sea"


async def _row(
    conn: asyncpg.Connection, status: str, days_ago: float, durable: str = DURABLE
) -> None:
    await conn.execute(
        "INSERT INTO inbox_messages (message_id, durable, subject, status, received_at,"
        " processed_at) VALUES ($1, $2, 'sea.event.model_published.v1', $3,"
        " now() - $4 * interval '1 day',"
        " CASE WHEN $3 = 'processed' THEN now() - $4 * interval '1 day' END)",
        uuid.uuid4(), durable, status, days_ago,
    )  # fmt: skip


async def _dead_letter(conn: asyncpg.Connection, status: str, durable: str = DURABLE) -> None:
    """A dead letter as the dlq-router records it; its inbox row 'failed' as the consumer
    left it."""
    message_id = uuid.uuid4()
    await conn.execute(
        "INSERT INTO dead_letters (durable, message_id, stream, original_subject, reason_code,"
        " record, dlq_subject, source, status) VALUES ($1, $2, 'S', 'x.y.v1', 'handler',"
        " '{}', 'ferry.dead_letter', 'consumer', $3)",
        durable, message_id, status,
    )  # fmt: skip
    await conn.execute(
        "INSERT INTO inbox_messages (message_id, durable, subject, status, received_at)"
        " VALUES ($1, $2, 'x.y.v1', 'failed', now() - interval '300 days')",
        message_id, durable,
    )  # fmt: skip


async def test_the_backlog_counts_rows_in_play_and_dead_letters_apart(env: Env) -> None:
    conn = await asyncpg.connect(env.dsn("vibespro"))
    try:
        assert await inbox.backlog(conn, DURABLE) == {
            "count": 0, "oldest_at": None, "retrying": 0, "failed": 0,
        }  # fmt: skip
        for status, days in [("processed", 100), ("retrying", 2), ("received", 1),
                             ("processing", 0.5)]:  # fmt: skip
            await _row(conn, status, days)
        # Open: waiting for the replayer or an operator. Settled: no longer counted.
        for status in ("dead", "held", "replaying", "parked", "discarded", "discarded"):
            await _dead_letter(conn, status)
        await _row(conn, "retrying", 50, durable="sea__from_vibespro")  # another durable's
        await _dead_letter(conn, "dead", durable="sea__from_vibespro")
        doc = await inbox.backlog(conn, DURABLE)
        two_days = await conn.fetchval("SELECT now() - interval '2 days'")
        assert (doc["count"], doc["retrying"], doc["failed"]) == (7, 1, 4)
        # The oldest row in play: the retrying one, not the dead letters of a year ago.
        oldest = datetime.fromisoformat(doc["oldest_at"])
        assert abs((oldest - two_days).total_seconds()) < 60
    finally:
        await conn.close()
