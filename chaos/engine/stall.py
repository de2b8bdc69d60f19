"""The stall instrumentation that holds a role inside its crash window.

A trigger on the role's UPDATE sleeps inside PostgreSQL, so the process is provably
between two steps when the run SIGKILLs it (see :mod:`chaos.engine.faults`):

* on ``outbox_events``: the publisher's mark-published, which runs only after every
  PubAck of its batch arrived;
* on ``inbox_messages`` (rows turning ``processed``): the consumer's inbox update, which
  runs only after the handler answered 200.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg

from shared.adapters.postgres import DATABASE_ERRORS

#: Stall instrumentation, installed in each context database before the roles start.
#: A trigger fires on the role's UPDATE but sleeps only when the run has *armed* it (one
#: row in chaos_stall_armed, taken by the first statement that fires), so no DDL — and
#: no table lock — is needed while the run is under way.
STALL_SECONDS = 120
STALL_DDL = (
    "CREATE TABLE IF NOT EXISTS chaos_stall_armed (tbl TEXT NOT NULL)",
    f"""
    CREATE OR REPLACE FUNCTION chaos_stall() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
      armed INT;
    BEGIN
      DELETE FROM chaos_stall_armed
      WHERE ctid = (SELECT ctid FROM chaos_stall_armed WHERE tbl = TG_TABLE_NAME
                    LIMIT 1 FOR UPDATE SKIP LOCKED)
      RETURNING 1 INTO armed;
      IF armed IS NOT NULL THEN
        PERFORM pg_sleep({STALL_SECONDS});
      END IF;
      IF TG_LEVEL = 'ROW' THEN RETURN NEW; END IF;
      RETURN NULL;
    END $$
    """,
    "DROP TRIGGER IF EXISTS chaos_stall ON outbox_events",
    "CREATE TRIGGER chaos_stall BEFORE UPDATE ON outbox_events"
    " FOR EACH STATEMENT EXECUTE FUNCTION chaos_stall()",
    "DROP TRIGGER IF EXISTS chaos_stall ON inbox_messages",
    "CREATE TRIGGER chaos_stall BEFORE UPDATE ON inbox_messages FOR EACH ROW"
    " WHEN (NEW.status = 'processed' AND OLD.status <> 'processed')"
    " EXECUTE FUNCTION chaos_stall()",
)
#: The stalled statement of each window, as pg_stat_activity shows it.
WINDOWS = {
    "kill_publisher_in_window": ("outbox_events", "%UPDATE outbox_events%"),
    "kill_consumer_in_window": ("inbox_messages", "%status = 'processed'%"),
}
_STALLED = """
SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND wait_event = 'PgSleep' AND query ILIKE $1
"""


async def install_stall(conn: asyncpg.Connection) -> None:
    """Install the (disarmed) stall instrumentation in one context database."""
    for statement in STALL_DDL:
        await conn.execute(statement)


async def disarm(conn: asyncpg.Connection, table: str) -> bool:
    """Take the armed row back; False if a stalling statement holds it right now."""
    taken = await conn.fetchval(
        "DELETE FROM chaos_stall_armed WHERE ctid = (SELECT ctid FROM chaos_stall_armed"
        " WHERE tbl = $1 LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING 1",
        table,
    )
    return taken is not None


async def terminate_stalled(conn: asyncpg.Connection, where: str) -> None:
    """End the backends sleeping in the stall (their transactions roll back)."""
    await conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " AND wait_event = 'PgSleep' AND query ILIKE $1",
        where,
    )


async def disarm_fully(conn: asyncpg.Connection, table: str, where: str) -> None:
    """Make sure nothing stays armed (a terminated stall's rollback brings its row back)."""
    for _ in range(100):
        await terminate_stalled(conn, where)
        await conn.execute("DELETE FROM chaos_stall_armed WHERE tbl = $1", table)
        if not await conn.fetchval("SELECT count(*) FROM chaos_stall_armed WHERE tbl = $1", table):
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"could not disarm the stall on {table}")


async def wait_for_stall(conn: asyncpg.Connection, where: str, timeout: float) -> bool:
    """Whether a statement matching ``where`` sleeps in the stall within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if await conn.fetch(_STALLED, where):
                return True
        except DATABASE_ERRORS:
            return False
        await asyncio.sleep(0.05)
    return False


async def arm_and_wait(conn: asyncpg.Connection, table: str, where: str, wait: float) -> bool:
    """Arm the stall on ``table`` and wait up to ``wait`` seconds for a transaction to be
    stalled ``where``; whether one is (one that took the stall just as it was disarmed
    counts: it gets 5 s more)."""
    await conn.execute("INSERT INTO chaos_stall_armed (tbl) VALUES ($1)", table)
    stalled = await wait_for_stall(conn, where, wait)
    if not stalled and not await disarm(conn, table):
        stalled = await wait_for_stall(conn, where, 5.0)  # taken just now
    return stalled
