"""The publisher's linger (FERRY_PUBLISHER_LINGER) against real servers.

One-row commits, each with its NOTIFY, in bursts or as a trickle: with the linger on, a
woken worker gathers the commits behind it into one claim, up to a full batch; off, each
wake-up claims what is there. A batch that fills early needs a batch of commits within
the linger, so that test commits in bursts from many connections: a trickle from one
connection fills none on a machine whose commits take over 50 ms (a CI run hit that).
Counted in batches, never timed: the linger here is the longest the setting allows (1 s),
so a batch ends by filling, not by the clock, and the rows' way out still never depends
on the poll (a minute here).
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from services.outbox_publisher.publisher import OutboxPublisher
from shared.access.streams import provision
from tests.conftest import CAPS, Env
from tests.helpers import RunningPublisher, eventually, insert_events, stream_messages

pytestmark = pytest.mark.integration
STREAM = "SEA_EVENTS"
BATCH = 20
ROWS = 200
#: The longest linger the setting allows: a batch that ends early ended by filling up.
LINGER = 1.0


async def _is_zero(conn: asyncpg.Connection) -> bool:
    count = await conn.fetchval("SELECT count(*) FROM outbox_events WHERE published_at IS NULL")
    return int(count) == 0


async def _trickle(conn: asyncpg.Connection, rows: int) -> None:
    """``rows`` commits of one row each (one NOTIFY each), one after the other."""
    for _ in range(rows):
        await insert_events(conn, 1, aggregates=7)


async def _bursts(dsn: str, rows: int) -> None:
    """``rows`` commits of one row each, BATCH at a time from BATCH connections at once:
    however slow the machine's commits, each burst's NOTIFYs land well within the linger
    (a trickle of one connection's commits needs 20 commits a second to fill a batch)."""
    conns = [await asyncpg.connect(dsn) for _ in range(BATCH)]
    try:
        for _ in range(rows // BATCH):
            await asyncio.gather(*(insert_events(c, 1, aggregates=7) for c in conns))
    finally:
        for conn in conns:
            await conn.close()


def _lingered(publisher: OutboxPublisher, outcome: str) -> float:
    value = publisher.metrics.role.registry.get_sample_value(
        "ferry_outbox_linger_total", {"context": "sea", "outcome": outcome}
    )
    return value or 0.0


async def _assert_once_in_order(nc: NATS, conn: asyncpg.Connection) -> None:
    rows = await conn.fetch("SELECT id::text, aggregate_id FROM outbox_events ORDER BY seq")
    msgs = await stream_messages(nc.jetstream(), STREAM)
    assert sorted(m.msg_id for m in msgs) == sorted(r["id"] for r in rows)
    for aggregate in {r["aggregate_id"] for r in rows}:
        want = [r["id"] for r in rows if r["aggregate_id"] == aggregate]
        assert [m.msg_id for m in msgs if m.body["aggregate_id"] == aggregate] == want


async def test_lingering_fills_batches_from_bursts_of_commits(
    env: Env, nc: NATS, sea_conn: asyncpg.Connection
) -> None:
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    async with RunningPublisher(
        env.topology, "sea", env.dsn("sea"), nc.jetstream(), batch_size=BATCH, concurrency=3,
        poll_interval=60,
    ) as publisher:  # fmt: skip
        publisher.fill_linger = LINGER
        await _bursts(env.dsn("sea"), ROWS)
        await eventually(lambda: _is_zero(sea_conn), timeout=30, what="the bursts published")
    assert publisher.stats.published == ROWS
    # About ROWS / BATCH batches (the first commits come before the pace is known, and a
    # worker whose claim was full claims again at once); without the linger, 79 of them
    # in one run, nearer one per commit.
    assert publisher.stats.batches <= 2 * ROWS // BATCH
    # Some wait ended by count, well before its linger of a second.
    assert _lingered(publisher, "full") >= 1
    await _assert_once_in_order(nc, sea_conn)


async def test_an_isolated_commit_is_published_with_the_linger_on(
    env: Env, nc: NATS, sea_conn: asyncpg.Connection
) -> None:
    """One commit with nothing behind it — first alone, then after a trickle set a quick
    pace — still gets out: the wait ends at the linger, not at the next commit."""
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    async with RunningPublisher(
        env.topology, "sea", env.dsn("sea"), nc.jetstream(), batch_size=BATCH, concurrency=3,
        poll_interval=60,
    ) as publisher:  # fmt: skip
        publisher.fill_linger = LINGER
        await insert_events(sea_conn, 1)
        await eventually(lambda: _is_zero(sea_conn), timeout=30, what="the first row published")
        await _trickle(sea_conn, BATCH // 2)
        await eventually(lambda: _is_zero(sea_conn), timeout=30, what="the trickle published")
        timeouts = _lingered(publisher, "timeout")
        await insert_events(sea_conn, 1)
        await eventually(lambda: _is_zero(sea_conn), timeout=30, what="the last row published")
    assert publisher.stats.published == 2 + BATCH // 2
    # The trickle never filled a batch: its last wait ended at the linger's end.
    assert timeouts >= 1
    await _assert_once_in_order(nc, sea_conn)


async def test_linger_zero_claims_at_every_wake_up(
    env: Env, nc: NATS, sea_conn: asyncpg.Connection
) -> None:
    """FERRY_PUBLISHER_LINGER=0 (and FERRY_LINGER=0): no wake-up waits, all is published."""
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    async with RunningPublisher(
        env.topology, "sea", env.dsn("sea"), nc.jetstream(), batch_size=BATCH, concurrency=3,
        poll_interval=60,
    ) as publisher:  # fmt: skip
        assert publisher.fill_linger == 0 and publisher.linger == 0
        await _trickle(sea_conn, ROWS // 2)
        await eventually(lambda: _is_zero(sea_conn), timeout=30, what="the trickle published")
    assert publisher.stats.published == ROWS // 2
    for outcome in ("full", "timeout", "busy", "none"):
        assert _lingered(publisher, outcome) == 0
    await _assert_once_in_order(nc, sea_conn)
