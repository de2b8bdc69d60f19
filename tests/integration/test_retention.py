"""``ferry purge``: rows past their retention go, everything unfinished or younger stays.

Rows are back-dated in SQL around the shipped retentions (outbox 7 days after
publishing, inbox 35 days after processing); every row is then accounted for by id.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid

import asyncpg
import pytest

from tests.conftest import ROOT, Env

pytestmark = pytest.mark.integration

VIBESPRO_DURABLE = "vibespro__from_sea"
SEA_DURABLE = "sea__from_vibespro"


async def ferry(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "shared.cli", *args],
        cwd=ROOT, env=env.settings_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


async def outbox_row(conn: asyncpg.Connection, published_days_ago: float | None) -> uuid.UUID:
    """An outbox row published that many days ago (None: never published)."""
    event_id = uuid.uuid4()
    await conn.execute(
        "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, payload,"
        " occurred_at, published_at) VALUES ($1, 'model', 'm1', 'model_published', '{}',"
        " now() - interval '60 days',"
        " CASE WHEN $2::float8 IS NULL THEN NULL ELSE now() - $2 * interval '1 day' END)",
        event_id, published_days_ago,
    )  # fmt: skip
    return event_id


async def inbox_row(
    conn: asyncpg.Connection, durable: str, status: str, days_ago: float
) -> uuid.UUID:
    """An inbox row received ``days_ago`` days ago; processed then if status says so."""
    message_id = uuid.uuid4()
    await conn.execute(
        "INSERT INTO inbox_messages (message_id, durable, subject, status, received_at,"
        " processed_at) VALUES ($1, $2, 'sea.event.model_published.v1', $3,"
        " now() - $4 * interval '1 day',"
        " CASE WHEN $3 = 'processed' THEN now() - $4 * interval '1 day' END)",
        message_id, durable, status, days_ago,
    )  # fmt: skip
    return message_id


async def ids(conn: asyncpg.Connection, query: str) -> set[uuid.UUID]:
    return {r[0] for r in await conn.fetch(query)}


async def test_purge_deletes_exactly_what_is_past_its_retention(env: Env) -> None:
    sea = await asyncpg.connect(env.dsn("sea"))
    vibespro = await asyncpg.connect(env.dsn("vibespro"))
    try:
        old_published = {await outbox_row(sea, 8) for _ in range(7)}
        kept_outbox = {
            await outbox_row(sea, 6),  # published, younger than 7 days
            await outbox_row(sea, None),  # never published, however old
        }
        old_processed = {await inbox_row(vibespro, VIBESPRO_DURABLE, "processed", 40)
                         for _ in range(5)}  # fmt: skip
        kept_inbox = {
            await inbox_row(vibespro, VIBESPRO_DURABLE, "processed", 30),  # younger
            await inbox_row(vibespro, VIBESPRO_DURABLE, "failed", 40),  # dead-lettered
            await inbox_row(vibespro, VIBESPRO_DURABLE, "retrying", 40),  # unfinished
            await inbox_row(vibespro, VIBESPRO_DURABLE, "processing", 40),
        }
        other_durable = {await inbox_row(sea, SEA_DURABLE, "processed", 40) for _ in range(2)}

        dry = await ferry(env, "purge", "--dry-run", "--json")
        assert dry.returncode == 0, dry.stderr
        counts = {(t["table"], t["scope"]): t["purged"] for t in json.loads(dry.stdout)["tables"]}
        assert counts == {("outbox", "sea"): 7, ("outbox", "vibespro"): 0,
                          ("inbox", VIBESPRO_DURABLE): 5, ("inbox", SEA_DURABLE): 2}  # fmt: skip
        assert await sea.fetchval("SELECT count(*) FROM outbox_events") == 9  # nothing deleted

        # One durable only, in batches of 2: its 5 rows go over three statements.
        only = await ferry(env, "purge", VIBESPRO_DURABLE, "--batch", "2")
        assert only.returncode == 0, only.stderr
        assert f"inbox {VIBESPRO_DURABLE}" in only.stdout and "purged 5 rows" in only.stdout
        assert "outbox" not in only.stdout
        remaining = await ids(vibespro, "SELECT message_id FROM inbox_messages")
        assert remaining == kept_inbox and not remaining & old_processed
        assert await ids(sea, "SELECT id FROM outbox_events") == old_published | kept_outbox

        everything = await ferry(env, "purge", "--batch", "3")
        assert everything.returncode == 0, everything.stderr
        assert await ids(sea, "SELECT id FROM outbox_events") == kept_outbox
        assert len(other_durable) == 2
        assert await ids(sea, "SELECT message_id FROM inbox_messages") == set()
        assert await ids(vibespro, "SELECT message_id FROM inbox_messages") == kept_inbox

        again = await ferry(env, "purge", "--json")
        assert [t["purged"] for t in json.loads(again.stdout)["tables"]] == [0, 0, 0, 0]
    finally:
        await sea.close()
        await vibespro.close()


async def test_purge_names_an_unknown_scope(env: Env) -> None:
    done = await ferry(env, "purge", "nonesuch")
    assert done.returncode == 2
    assert "'nonesuch' is neither a context nor a durable of topology sea-vibespro" in done.stderr
