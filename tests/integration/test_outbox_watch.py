"""The outbox watch against real servers: commits skip their NOTIFY while a publisher
promised to claim on a timer, and no row is left behind for it.

Every NOTIFY is counted on a LISTEN connection of the test's own (an independent record);
every row is counted in the stream. The publishers poll once a minute here, so a row can
only get out by a NOTIFY or by the watch's own claims — never by the poll.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from shared.access.streams import provision
from tests.conftest import CAPS, Env
from tests.helpers import RunningPublisher, eventually, insert_events, stream_messages

pytestmark = pytest.mark.integration
STREAM = "SEA_EVENTS"
#: A watch starts once commits come more than 20 a second: with 16 connections committing
#: back to back, even a loaded CI machine's slow commits (up to about 0.8 s) get there.
PERIOD = 0.05
#: Longer than any test: a row that gets out did not need the poll.
POLL = 60.0


class Notifies:
    """NOTIFYs on ``ferry_outbox`` seen by a connection of the test's own."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, *_: object) -> None:
        self.count += 1


@pytest.fixture
async def notifies(env: Env) -> AsyncIterator[Notifies]:
    seen = Notifies()
    conn = await asyncpg.connect(env.dsn("sea"))
    await conn.add_listener("ferry_outbox", seen)
    try:
        yield seen
    finally:
        await conn.close()


async def _unpublished(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM outbox_events WHERE published_at IS NULL"))


async def _promises(conn: asyncpg.Connection) -> int:
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM outbox_watch WHERE watch_until > clock_timestamp()"
        )
    )


async def _settled(notifies: Notifies) -> int:
    """The NOTIFY count once those already sent have arrived."""
    await asyncio.sleep(0.3)
    return notifies.count


async def _once_each(nc: NATS, conn: asyncpg.Connection) -> None:
    ids = [r["id"] for r in await conn.fetch("SELECT id::text FROM outbox_events")]
    sent = [m.msg_id for m in await stream_messages(nc.jetstream(), STREAM)]
    assert sorted(sent) == sorted(ids)


async def _steady(dsn: str, commits: int, connections: int = 16) -> None:
    """``commits`` one-row transactions, back to back on ``connections`` connections."""

    async def one_connection(share: int) -> None:
        conn = await asyncpg.connect(dsn)
        try:
            for _ in range(share):
                await insert_events(conn, 1, aggregates=13)
                await asyncio.sleep(0.002)
        finally:
            await conn.close()

    await asyncio.gather(*(one_connection(commits // connections) for _ in range(connections)))


async def test_a_watched_outbox_spares_most_notifies_and_publishes_every_row(
    env: Env, nc: NATS, sea_conn: asyncpg.Connection, notifies: Notifies
) -> None:
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    commits = 400
    async with RunningPublisher(
        env.topology, "sea", env.dsn("sea"), nc.jetstream(), batch_size=100, concurrency=3,
        poll_interval=POLL, watch_period=PERIOD,
    ) as publisher:  # fmt: skip
        assert publisher.watch is not None
        await _steady(env.dsn("sea"), commits)
        await eventually(
            lambda: _unpublished_is(sea_conn, 0), timeout=30, what="the steady stream published"
        )
        during = await _settled(notifies)
        assert publisher.watch.watches >= 1
        # Without the watch each of the 400 commits notifies; with it, only those before
        # the first promise and after each watch (commits came quickly throughout).
        assert during < commits // 4, f"{during} NOTIFYs for {commits} commits"
        # Quiet again: the promise is deleted, and a lone commit notifies as before.
        await eventually(lambda: _no_promise(sea_conn), timeout=10, what="the watch to end")
        assert not publisher.watch.watching
        await insert_events(sea_conn, 1)
        await eventually(lambda: _unpublished_is(sea_conn, 0), timeout=10, what="a lone row out")
        assert await _settled(notifies) == during + 1
    assert publisher.stats.published == commits + 1
    assert publisher.watch.errors == 0
    await _once_each(nc, sea_conn)


async def _unpublished_is(conn: asyncpg.Connection, count: int) -> bool:
    return await _unpublished(conn) == count


async def _no_promise(conn: asyncpg.Connection) -> bool:
    return await _promises(conn) == 0


async def test_a_commit_that_skipped_its_notify_under_a_promise_is_still_published(
    env: Env, nc: NATS, sea_conn: asyncpg.Connection, notifies: Notifies
) -> None:
    """The race the watch is built around: a transaction INSERTs while a promise holds (so
    its trigger sends no NOTIFY) and commits after the watch ended. The watch's claims
    after the promise find it; the poll (a minute) is never needed."""
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    async with RunningPublisher(
        env.topology, "sea", env.dsn("sea"), nc.jetstream(), batch_size=100, concurrency=2,
        poll_interval=POLL, watch_period=PERIOD,
    ) as publisher:  # fmt: skip
        watch = publisher.watch
        assert watch is not None
        steady = asyncio.create_task(_steady(env.dsn("sea"), 4_000))
        await eventually(lambda: _has_promise(sea_conn), timeout=10, what="a promise")
        slow = await asyncpg.connect(env.dsn("sea"))
        try:
            tx = slow.transaction()
            await tx.start()
            [late] = await insert_events(slow, 1)
            steady.cancel()
            await asyncio.gather(steady, return_exceptions=True)
            await eventually(lambda: _no_promise(sea_conn), timeout=10, what="the watch to end")
            before = await _settled(notifies)
            await tx.commit()
        finally:
            await slow.close()
        await eventually(lambda: _unpublished_is(sea_conn, 0), timeout=20, what="the late row")
        # Its trigger ran under the promise: the row got out without a NOTIFY.
        assert await _settled(notifies) == before
    assert late in {m.msg_id for m in await stream_messages(nc.jetstream(), STREAM)}
    await _once_each(nc, sea_conn)


async def _has_promise(conn: asyncpg.Connection) -> bool:
    return await _promises(conn) > 0


async def test_the_trigger_notifies_only_without_a_promise_whatever_the_search_path(
    env: Env, sea_conn: asyncpg.Connection, notifies: Notifies
) -> None:
    async def commit_one(search_path: str = "public") -> None:
        async with sea_conn.transaction():
            await sea_conn.execute(f"SET LOCAL search_path TO {search_path}")
            await sea_conn.execute(
                "INSERT INTO public.outbox_events (id, aggregate_type, aggregate_id, event_type,"
                " payload) VALUES (gen_random_uuid(), 'model', 'm1', 'model_published', '{}')"
            )

    await commit_one()
    assert await _settled(notifies) == 1
    await sea_conn.execute(
        "INSERT INTO outbox_watch (publisher, watch_until, period_ms)"
        " VALUES ('p1', clock_timestamp() + interval '1 hour', 10)"
    )
    await commit_one()
    # The producer's search_path does not hide the table from the trigger.
    await commit_one("pg_catalog")
    assert await _settled(notifies) == 1
    # A promise past its time holds nothing: commits notify again.
    await sea_conn.execute("UPDATE outbox_watch SET watch_until = clock_timestamp()")
    await commit_one("pg_catalog")
    assert await _settled(notifies) == 2
