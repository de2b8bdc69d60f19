"""The inbox repository (PORT-047-002) on PostgreSQL: queries shared by roles and tools."""

from __future__ import annotations

from typing import Any

import asyncpg

_BACKLOG = """
SELECT count(*) AS count, min(received_at) AS oldest_at,
       count(*) FILTER (WHERE status = 'retrying') AS retrying,
       count(*) FILTER (WHERE status = 'failed') AS failed
FROM inbox_messages WHERE durable = $1 AND processed_at IS NULL
"""


async def backlog(conn: asyncpg.Connection, durable: str) -> dict[str, Any]:
    """QRY-051: unprocessed count and oldest received_at for ``durable``.

    Dead-lettered rows (status 'failed') have no processed_at; they are counted and
    also shown apart, so an operator can tell a stuck consumer from parked poison.
    """
    row = await conn.fetchrow(_BACKLOG, durable)
    assert row is not None
    oldest = row["oldest_at"]
    return {
        "count": row["count"],
        "oldest_at": oldest.isoformat() if oldest else None,
        "retrying": row["retrying"],
        "failed": row["failed"],
    }
