"""``ferry purge``: rows past their retention go, everything unfinished or younger stays.

Rows are back-dated in SQL around the shipped retentions (outbox 7 days after
publishing, inbox 35 days after processing); every row is then accounted for by id.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable

import asyncpg
import pytest

from devstack.ports import free_port
from shared.access.identities import Identity
from shared.adapters import inbox, outbox
from shared.ops.purge import purge_forever
from shared.runtime.settings import CommonSettings
from tests.conftest import ROOT, Env

pytestmark = pytest.mark.integration

VIBESPRO_DURABLE = "vibespro__from_sea"
SEA_DURABLE = "sea__from_vibespro"


#: ``ferry purge`` runs as the topology's own retention login, as in production.
PURGER = "retention-sea-vibespro"


async def ferry(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "shared.cli", *args],
        cwd=ROOT, env=env.settings_env(role=PURGER), capture_output=True, text=True,
        timeout=60,
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
        counts = {(t["table"], t["scope"]): t["purged"] for t in json.loads(dry.stdout)["tables"]
                  if t["table"] in ("outbox", "inbox")}  # fmt: skip
        assert counts == {("outbox", "sea"): 7, ("outbox", "vibespro"): 0,
                          ("inbox", VIBESPRO_DURABLE): 5, ("inbox", SEA_DURABLE): 2}  # fmt: skip
        assert await sea.fetchval("SELECT count(*) FROM outbox_events") == 9  # nothing deleted
        # The oldest row past its retention, per table: what the purge is behind by.
        oldest = {(t["table"], t["scope"]): t["oldest_age_seconds"]
                  for t in json.loads(dry.stdout)["tables"]}  # fmt: skip
        assert oldest[("outbox", "sea")] == pytest.approx(8 * 86400, abs=600)
        assert oldest[("inbox", VIBESPRO_DURABLE)] == pytest.approx(40 * 86400, abs=600)
        assert oldest[("outbox", "vibespro")] is None  # nothing published there

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
        tables = json.loads(again.stdout)["tables"]
        assert {t["purged"] for t in tables} == {0}
        # Caught up: the rows left (unpublished, younger, unfinished) are within policy.
        assert {t["oldest_age_seconds"] for t in tables
                if t["table"] in ("outbox", "inbox")} == {None}  # fmt: skip
    finally:
        await sea.close()
        await vibespro.close()


async def test_purge_names_an_unknown_scope(env: Env) -> None:
    done = await ferry(env, "purge", "nonesuch")
    assert done.returncode == 2
    assert "'nonesuch' is neither a context nor a durable of topology sea-vibespro" in done.stderr


async def test_two_purges_at_once_delete_every_row_once(env: Env) -> None:
    """Side by side, in small batches, two purges delete each old row exactly once."""
    sea = await asyncpg.connect(env.dsn("sea"))
    try:
        old = {await outbox_row(sea, 9) for _ in range(40)}
        old_inbox = {await inbox_row(sea, SEA_DURABLE, "processed", 50) for _ in range(40)}
        kept = await outbox_row(sea, 1)
        purger = Identity("retention", "sea-vibespro")
        database = env.topology.contexts["sea"].database
        conns = [await asyncpg.connect(env.role_dsn(purger, database)) for _ in range(2)]
        cutoff = await sea.fetchval("SELECT now() - interval '7 days'")
        inbox_cutoff = await sea.fetchval("SELECT now() - interval '35 days'")

        async def drain(conn: asyncpg.Connection) -> tuple[int, int]:
            done_outbox = done_inbox = 0
            while n := await outbox.purge_batch(conn, cutoff, 3):
                done_outbox += n
            while n := await inbox.purge_batch(conn, SEA_DURABLE, inbox_cutoff, 3):
                done_inbox += n
            return done_outbox, done_inbox

        try:
            results = await asyncio.gather(*(drain(c) for c in conns))
        finally:
            for conn in conns:
                await conn.close()
        assert sum(r[0] for r in results) == len(old)
        assert sum(r[1] for r in results) == len(old_inbox)
        assert await ids(sea, "SELECT id FROM outbox_events") == {kept}
        assert await ids(sea, "SELECT message_id FROM inbox_messages") == set()
    finally:
        await sea.close()


async def _until(predicate: Callable[[], Awaitable[bool]], what: str, timeout: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def test_purge_every_runs_until_sigterm(env: Env) -> None:
    """``ferry purge --every 1s``: purges at start and again at each interval, logs JSON
    lines, and stops cleanly on SIGTERM (supervisord's and Kubernetes' stop)."""
    sea = await asyncpg.connect(env.dsn("sea"))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "shared.cli", "purge", "--every", "1s",
        cwd=ROOT, env=env.settings_env(role=PURGER),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        first = {await outbox_row(sea, 8) for _ in range(3)}
        kept = await outbox_row(sea, 2)

        async def only_kept() -> bool:
            return await ids(sea, "SELECT id FROM outbox_events") == {kept}

        await _until(only_kept, "the first purge")
        second = {await outbox_row(sea, 9) for _ in range(2)}  # arrives after a run
        await _until(only_kept, "a later purge")
        process.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(process.communicate(), 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await sea.close()
    assert process.returncode == 0, out.decode()
    lines = [json.loads(line) for line in out.decode().splitlines()]
    purged = sum(line.get("purged", 0) for line in lines if line.get("table") == "outbox")
    assert purged == len(first) + len(second)
    assert all(line["role"] == "retention" for line in lines)
    assert lines[-1]["message"] == "retention scheduler stopped"


async def test_purge_every_outlives_an_unreachable_database(
    env: Env, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A run that cannot reach its database is logged; the scheduler keeps going."""
    for name, value in env.settings_env(role=PURGER).items():
        if name.startswith("FERRY_"):
            monkeypatch.setenv(name, value)
    closed = free_port()
    databases = {c.database for c in env.topology.contexts.values()}
    monkeypatch.setenv("FERRY_DATABASES", json.dumps(
        {db: f"postgresql://nobody@127.0.0.1:{closed}/{db}" for db in databases}
    ))  # fmt: skip
    stop = asyncio.Event()
    task = asyncio.create_task(purge_forever(CommonSettings(), 0.2, stop=stop))

    async def failed_twice() -> bool:
        return sum("purge failed" in r.getMessage() for r in caplog.records) >= 2

    with caplog.at_level(logging.WARNING, logger="ferry.retention"):
        await _until(failed_twice, "two failed runs")
        assert not task.done()
        stop.set()
        assert await asyncio.wait_for(task, 10) == 0
    assert f"127.0.0.1:{closed}" in caplog.records[0].__dict__["error"]


async def test_purge_every_stops_on_a_configuration_error(env: Env) -> None:
    """No later run could succeed: the scheduler exits 2 and names the problem."""
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "shared.cli", "purge", "nonesuch", "--every", "1s"],
        cwd=ROOT, env=env.settings_env(role=PURGER), capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "'nonesuch' is neither a context nor a durable" in done.stderr
