"""The handler's own bookkeeping tables, in the target context's database.

``handler_applied``
    One row per (handler, message_id) whose effect committed. It is inserted in the
    same transaction as the effect, so "applied" and "effect exists" cannot disagree;
    a conflicting insert means the event was already processed (409).
``handler_calls``
    The effects ledger: one row per call, whatever its outcome, never deduplicated.
    The row is committed *before* the call is decided (autocommit, outside the main
    transaction) and its status filled in afterwards, so a call whose transaction
    rolls back, or whose connection dies after the commit, is still counted. Tests and
    the chaos suite count it to prove that no call reached an already-processed id.

Only tables prefixed ``handler_`` are created here; ``outbox_events`` and
``inbox_messages`` belong to migrations/.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from shared.adapters.postgres import Conn

#: Serialises concurrent ``CREATE TABLE IF NOT EXISTS`` of replicas starting together
#: (two such statements racing can fail on the catalog's unique index).
INSTALL_LOCK_KEY = 0x46455248  # "FERH"

BOOKKEEPING_DDL = (
    """
    CREATE TABLE IF NOT EXISTS handler_applied (
      message_id UUID NOT NULL,
      handler TEXT NOT NULL,
      applied_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
      PRIMARY KEY (handler, message_id)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS handler_calls (
      id BIGSERIAL PRIMARY KEY,
      message_id UUID,
      handler TEXT NOT NULL,
      attempt INT,
      status INT,
      called_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
    )
    """,
    "CREATE INDEX IF NOT EXISTS idx_handler_calls_message ON handler_calls (message_id)",
)


async def install(conn: Conn, ddl: Sequence[str]) -> None:
    """Create the bookkeeping tables and ``ddl`` (a service's own tables), idempotently."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", INSTALL_LOCK_KEY)
        for statement in (*BOOKKEEPING_DDL, *ddl):
            await conn.execute(statement)


async def open_call(
    conn: Conn, *, handler: str, message_id: uuid.UUID | None, attempt: int | None
) -> int:
    """Record a call (status unknown yet) and return its ledger id; ``conn`` must autocommit."""
    call_id: int = await conn.fetchval(
        "INSERT INTO handler_calls (message_id, handler, attempt) VALUES ($1, $2, $3) RETURNING id",
        message_id,
        handler,
        attempt,
    )
    return call_id


async def close_call(conn: Conn, call_id: int, status: int) -> None:
    """Fill in the status a call answered."""
    await conn.execute("UPDATE handler_calls SET status = $2 WHERE id = $1", call_id, status)


async def claim(conn: Conn, *, handler: str, message_id: str) -> bool:
    """Mark ``message_id`` applied inside the caller's transaction; False if it already was.

    A concurrent claimer of the same id blocks on the row until this transaction ends,
    then sees the conflict (commit) or claims it itself (rollback).
    """
    result: str = await conn.execute(
        "INSERT INTO handler_applied (message_id, handler, applied_at)"
        " VALUES ($1, $2, clock_timestamp()) ON CONFLICT (handler, message_id) DO NOTHING",
        uuid.UUID(message_id),
        handler,
    )
    return result == "INSERT 0 1"


async def applied_at(conn: Conn, *, handler: str, message_id: str) -> datetime | None:
    """When ``message_id`` was applied by ``handler``, if it was."""
    moment: datetime | None = await conn.fetchval(
        "SELECT applied_at FROM handler_applied WHERE handler = $1 AND message_id = $2",
        handler,
        uuid.UUID(message_id),
    )
    return moment
