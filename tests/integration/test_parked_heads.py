"""The ordered drainer's heads (issue 48, migration 0022): events behind a head (held or
retrying) wait at 'infinity', a key's new head is made due when the one before it goes
(released, discarded) or stops being held, the rounds find due heads without reading what
waits behind them, and a takeover makes due any head left waiting for nothing. Against
PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import asyncpg
import pytest

from devstack.postgres import PostgresServer
from services.inbox_consumer.ordering_base import KeyOrder
from shared.adapters import parked_queue, parking
from shared.adapters.postgres import discover_migrations, migrate_database
from tests.helpers import eventually

pytestmark = pytest.mark.integration

DURABLE = "vibespro__from_sea"


@pytest.fixture
async def dsn(pg_server: PostgresServer) -> str:
    """A fresh, migrated database."""
    url = pg_server.dsn("ph" + uuid.uuid4().hex[:12])
    await asyncio.wait_for(migrate_database(url), timeout=60)
    return url


@pytest.fixture
async def conn(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(dsn)
    try:
        yield c
    finally:
        await c.close()


_seq = iter(range(1, 1_000_000))


def entry(
    key: str, state: str = "queued", *, partition: int = 0, delay: float = 0.0, **kw: Any
) -> parking.ParkedEntry:
    return parking.ParkedEntry(
        message_id=kw.pop("message_id", None) or uuid.uuid4(),
        ordering_key=key,
        stream_seq=kw.pop("stream_seq", None) or next(_seq),
        partition=partition,
        subject="vibespro.event.vibe_created.v1",
        headers={},
        data=b"{}",
        state=state,
        delay=delay,
        **kw,
    )


async def rows_of(conn: asyncpg.Connection, key: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT message_id, state, next_attempt_at, held_head,"
        " next_attempt_at = 'infinity' AS infinite, next_attempt_at <= clock_timestamp() AS due"
        " FROM parked_messages WHERE durable = $1 AND ordering_key = $2 ORDER BY stream_seq",
        DURABLE,
        key,
    )


def infinite(row: asyncpg.Record) -> bool:
    return bool(row["infinite"])


async def held_key(
    conn: asyncpg.Connection, key: str, behind: int
) -> tuple[parking.ParkedEntry, list[parking.ParkedEntry]]:
    """``key`` parked with a held head and ``behind`` events queued behind it."""
    head = entry(key, "held", reason="HANDLER_REJECTED")
    followers = [entry(key) for _ in range(behind)]
    await parking.park(conn, DURABLE, [head, *followers])
    return head, followers


async def test_events_behind_a_held_head_wait_at_infinity(conn: asyncpg.Connection) -> None:
    head, _ = await held_key(conn, "k", 2)
    later = entry("k")  # parked afterwards, behind the same held head
    await parking.park(conn, DURABLE, [later])
    rows = await rows_of(conn, "k")
    assert rows[0]["state"] == "held" and not infinite(rows[0])
    assert all(infinite(r) and r["held_head"] == head.message_id for r in rows[1:])
    assert len(rows) == 4
    # The key is neither ready nor ever due.
    assert await parking.ready_keys(conn, DURABLE, 0, 10) == []
    assert await parking.next_due(conn, DURABLE, 0) is None


async def test_events_behind_any_head_wait_at_infinity_and_the_next_is_due_when_it_goes(
    conn: asyncpg.Connection,
) -> None:
    """Behind a retrying head too (a handler outage): only heads have a time, so a round
    reads heads, not the queue behind them; the head's release makes the next one due at
    once. A message parked with nothing before it is a head: due at its own time."""
    head, first = entry("r", "retrying", delay=30), entry("r")
    await parking.park(conn, DURABLE, [head, first])  # head and follower in one batch
    later = entry("r")
    await parking.park(conn, DURABLE, [later])  # behind a head parked before
    await parking.park(conn, DURABLE, [entry("alone", delay=60)])  # blocked, nothing before
    rows = await rows_of(conn, "r")
    assert [r["state"] for r in rows] == ["retrying", "queued", "queued"]
    assert not infinite(rows[0]) and all(infinite(r) for r in rows[1:])
    assert [r["held_head"] for r in rows] == [None] * 3, "nothing is held"
    [alone] = await rows_of(conn, "alone")
    assert not infinite(alone) and not alone["due"]
    assert await parking.ready_keys(conn, DURABLE, 0, 10) == []
    due = await parking.next_due(conn, DURABLE, 0)
    assert due is not None and 0 < due <= 30, "the next head due: r's, in 30 s ('alone' 60)"

    async with conn.transaction():
        assert await parking.release(conn, DURABLE, "r", [head.message_id]) == 2
    rows = await rows_of(conn, "r")
    assert rows[0]["message_id"] == first.message_id and rows[0]["due"]
    assert infinite(rows[1])
    assert await parking.ready_keys(conn, DURABLE, 0, 10) == ["r"]


async def test_a_round_reads_heads_only_however_many_wait_behind_retrying_ones(
    conn: asyncpg.Connection,
) -> None:
    """200 keys, each a retrying head (back-off 30 s) and 50 events behind it, parked as the
    consumer parks them: the drainer's two questions read about one index entry per head
    (EXPLAIN ANALYZE), not the 10,000 events waiting. Parked due-now, as before, each
    question read all of them."""
    for k in range(200):
        key = f"out{k}"
        await parking.park(
            conn, DURABLE, [entry(key, "retrying", delay=30), *(entry(key) for _ in range(50))]
        )
    await conn.execute("VACUUM ANALYZE parked_messages")
    for sql, args in (
        (parking.ready_keys_sql(32), (DURABLE, 0)),
        (parking._NEXT_DUE, (DURABLE, 0)),
    ):
        plan = await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *args)
        read = _rows_read(json.loads(plan)[0]["Plan"])
        assert read <= 400, f"{read} index entries read for 200 heads\n{sql}"


def _rows_read(node: dict[str, Any]) -> int:
    """Rows the plan's scans of parked_messages returned, over all their loops."""
    own = 0
    if node.get("Relation Name") == "parked_messages":
        own = int(node.get("Actual Rows", 0) * node.get("Actual Loops", 1))
        own += int(node.get("Rows Removed by Filter", 0))
    return own + sum(_rows_read(child) for child in node.get("Plans", []))


async def test_ready_keys_are_due_heads_most_overdue_first(conn: asyncpg.Connection) -> None:
    assert await parking.ready_keys(conn, DURABLE, 0, 10) == []
    assert await parking.next_due(conn, DURABLE, 0) is None
    await parking.park(conn, DURABLE, [entry("a", "retrying"), entry("a"), entry("a")])
    await parking.park(conn, DURABLE, [entry("b"), entry("b")])
    await parking.park(conn, DURABLE, [entry("later", "retrying", delay=60), entry("later")])
    await parking.park(conn, DURABLE, [entry("elsewhere", partition=1)])
    await held_key(conn, "held", 3)
    # Heads 30 s (b) and 10 s (a) overdue; the events behind them earlier still.
    await conn.execute(
        "UPDATE parked_messages SET next_attempt_at = now() - CASE ordering_key"
        " WHEN 'a' THEN interval '10 s' ELSE interval '30 s' END"
        " WHERE ordering_key IN ('a', 'b') AND stream_seq = (SELECT min(stream_seq)"
        " FROM parked_messages m WHERE m.ordering_key = parked_messages.ordering_key)"
    )
    await conn.execute(
        "UPDATE parked_messages p SET next_attempt_at = now() - interval '1 hour'"
        " WHERE ordering_key IN ('a', 'b', 'later') AND state = 'queued'"
        " AND stream_seq > (SELECT min(stream_seq) FROM parked_messages m"
        " WHERE m.ordering_key = p.ordering_key)"
    )
    assert await parking.ready_keys(conn, DURABLE, 0, 10) == ["b", "a"]
    assert await parking.ready_keys(conn, DURABLE, 0, 1) == ["b"]
    assert await parking.ready_keys(conn, DURABLE, 1, 10) == ["elsewhere"]
    due = await parking.next_due(conn, DURABLE, 0)
    assert due is not None and 29 < -due < 40
    # Once a and b are gone: the next is 'later' in about a minute (its follower, an hour
    # overdue, is no head).
    await conn.execute("DELETE FROM parked_messages WHERE ordering_key IN ('a', 'b')")
    assert await parking.ready_keys(conn, DURABLE, 0, 10) == []
    due = await parking.next_due(conn, DURABLE, 0)
    assert due is not None and 50 < due <= 60
    assert await parking.blocked_keys(conn, DURABLE, 0) == {"later", "held"}
    assert await parking.blocked_keys(conn, DURABLE, 1) == {"elsewhere"}
    assert await parking.blocked_keys(conn, DURABLE, 2) == set()


async def test_a_release_makes_the_next_head_due(conn: asyncpg.Connection) -> None:
    head, followers = await held_key(conn, "k", 4)
    # A replay un-holds the head: it is due at once, the events behind it wait still.
    await parking.park(conn, DURABLE, [entry("k", message_id=head.message_id,
                                             stream_seq=head.stream_seq, replay=True)])  # fmt: skip
    rows = await rows_of(conn, "k")
    assert rows[0]["state"] == "retrying" and rows[0]["due"]
    assert all(infinite(r) for r in rows[1:])
    assert await parking.ready_keys(conn, DURABLE, 0, 10) == ["k"]
    # The drainer's batch: the head and the events behind it, in order, whatever their
    # next_attempt_at; a batch of two released leaves three, the first of them due.
    batch = await parking.key_rows(conn, DURABLE, "k", 2)
    assert [r.message_id for r in batch] == [head.message_id, followers[0].message_id]
    async with conn.transaction():
        left = await parking.release(conn, DURABLE, "k", [r.message_id for r in batch])
    assert left == 3
    rows = await rows_of(conn, "k")
    assert rows[0]["message_id"] == followers[1].message_id and rows[0]["due"]
    assert all(infinite(r) for r in rows[1:])
    assert await parking.ready_keys(conn, DURABLE, 0, 10) == ["k"]
    # The new head fails for good: held, and the rest wait behind it at 'infinity' still.
    await parking.retry_head(conn, DURABLE, followers[1].message_id, state="held",
                             attempts=5, delay=0.0, reason="HANDLER_REJECTED")  # fmt: skip
    assert await parking.ready_keys(conn, DURABLE, 0, 10) == []
    assert await parking.next_due(conn, DURABLE, 0) is None
    # The last release empties the key: nothing to promote.
    await conn.execute("DELETE FROM parked_messages WHERE message_id = $1", followers[1].message_id)
    async with conn.transaction():
        await parking.release(conn, DURABLE, "k", [followers[2].message_id])
    async with conn.transaction():
        assert await parking.release(conn, DURABLE, "k", [followers[3].message_id]) == 0


async def test_a_release_promotes_nothing_but_a_waiting_head(conn: asyncpg.Connection) -> None:
    await parking.park(conn, DURABLE, [entry("k", "retrying"), entry("k"), entry("k")])
    rows = await rows_of(conn, "k")
    await parking.retry_head(conn, DURABLE, rows[1]["message_id"], state="retrying",
                             attempts=1, delay=300.0, reason="HTTP_503")  # fmt: skip
    async with conn.transaction():
        await parking.release(conn, DURABLE, "k", [rows[0]["message_id"]])
    after = await rows_of(conn, "k")
    # The new head keeps its back-off (it had a time of its own); what waits behind stays.
    assert after[0]["message_id"] == rows[1]["message_id"]
    assert not after[0]["due"] and not infinite(after[0]) and infinite(after[1])


async def test_a_follower_held_again_after_a_replay_waits_again(conn: asyncpg.Connection) -> None:
    head, _ = await held_key(conn, "k", 1)
    await parking.park(conn, DURABLE, [entry("k", message_id=head.message_id,
                                             stream_seq=head.stream_seq, replay=True)])  # fmt: skip
    newer = entry("k")  # parked behind the retrying head: its turn comes, no operator needed
    await parking.park(conn, DURABLE, [newer])
    rows = await rows_of(conn, "k")
    assert infinite(rows[1]) and infinite(rows[2]) and rows[2]["held_head"] is None
    # The replayed head is dead-lettered again: held, and every event behind it waits.
    await parking.retry_head(conn, DURABLE, head.message_id, state="held", attempts=5,
                             delay=0.0, reason="HANDLER_REJECTED")  # fmt: skip
    rows = await rows_of(conn, "k")
    assert all(infinite(r) and r["held_head"] == head.message_id for r in rows[1:])
    # A follower promoted once (its held_head kept) and held behind a head again: infinity.
    await conn.execute(
        "UPDATE parked_messages SET next_attempt_at = now() WHERE message_id = $1",
        newer.message_id,
    )
    await parking.park(conn, DURABLE, [entry("k")])
    assert all(infinite(r) for r in (await rows_of(conn, "k"))[1:])


async def test_a_discarded_head_makes_the_next_due(conn: asyncpg.Connection) -> None:
    await held_key(conn, "by-key", 2)
    head, _ = await held_key(conn, "by-id", 2)
    gone = await parked_queue.discard_head(conn, DURABLE, "by-key", actor="ops", reason="poison")
    assert gone is not None
    key = await parked_queue.discard_held(conn, DURABLE, head.message_id, actor="ops", reason="x")
    assert key == "by-id"
    for k in ("by-key", "by-id"):
        rows = await rows_of(conn, k)
        assert len(rows) == 2 and rows[0]["due"] and infinite(rows[1])
    assert sorted(await parking.ready_keys(conn, DURABLE, 0, 10)) == ["by-id", "by-key"]
    # A key whose head is not held: nothing discarded, nothing promoted.
    await parking.park(conn, DURABLE, [entry("retrying", "retrying", delay=60), entry("retrying")])
    assert await parked_queue.discard_head(conn, DURABLE, "retrying", actor="o", reason="r") is None


async def test_a_discard_by_a_login_that_may_not_update_still_discards(
    conn: asyncpg.Connection, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The console's login before it is granted UPDATE (next_attempt_at): the discard
    stands, the key's next event waits for promote_stranded (the drainer's periodic look,
    or a takeover), which makes it due."""
    await held_key(conn, "k", 2)
    role = "ph_" + uuid.uuid4().hex[:8]
    await conn.execute(f"CREATE ROLE {role}")
    await conn.execute(f"GRANT SELECT, DELETE ON parked_messages TO {role}")
    await conn.execute(f"GRANT SELECT, INSERT ON parked_actions TO {role}")
    console = await asyncpg.connect(dsn)
    try:
        await console.execute(f"SET ROLE {role}")
        with caplog.at_level(logging.WARNING, "ferry.parking"):
            assert await parked_queue.discard_head(console, DURABLE, "k", actor="o", reason="r")
    finally:
        await console.close()
        await conn.execute(f"DROP OWNED BY {role}")
        await conn.execute(f"DROP ROLE {role}")
    assert "cannot make its next event due" in caplog.text
    rows = await rows_of(conn, "k")
    assert len(rows) == 2 and all(infinite(r) for r in rows)
    assert await parking.promote_stranded(conn, DURABLE, 0) == ["k"]
    assert await parking.ready_keys(conn, DURABLE, 0, 10) == ["k"]


async def test_the_takeover_makes_stranded_heads_due(
    dsn: str, conn: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    await held_key(conn, "stranded", 2)
    await held_key(conn, "held", 2)
    await held_key(conn, "other-partition", 1)
    await parking.park(conn, DURABLE, [entry("fine", "retrying", delay=60), entry("fine")])
    # Heads gone without a promotion (a race unforeseen, an older console's discard).
    await conn.execute(
        "DELETE FROM parked_messages WHERE state = 'held' AND ordering_key <> 'held'"
    )
    await conn.execute(
        "UPDATE parked_messages SET partition = 1 WHERE ordering_key = 'other-partition'"
    )
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
    assert pool is not None
    try:
        order = KeyOrder(
            pool=pool, holder=None, decider=None, gatherer=None, settler=None, replies=None,  # type: ignore[arg-type]
            stats=None, durable=DURABLE, spec=SimpleNamespace(on_dead_letter="hold"),  # type: ignore[arg-type]
            policy=None, partition=0, key_fields={},  # type: ignore[arg-type]
        )  # fmt: skip
        with caplog.at_level(logging.WARNING, "ferry.inbox_consumer"):
            await order.load()
        assert order.blocked == {"stranded", "held", "fine"}
        assert order.wake.is_set()
        assert "1 keys of partition 0 had a head waiting for nothing" in caplog.text
        rows = await rows_of(conn, "stranded")
        assert rows[0]["due"] and infinite(rows[1])
        assert all(infinite(r) for r in (await rows_of(conn, "held"))[1:])
        assert not (await rows_of(conn, "fine"))[0]["due"]
        assert infinite((await rows_of(conn, "other-partition"))[0])
        assert await parking.ready_keys(conn, DURABLE, 0, 10) == ["stranded"]
        # Once more: nothing left to promote.
        assert await parking.promote_stranded(conn, DURABLE, 0) == []
    finally:
        await pool.close()


async def _waiting_for_a_lock(conn: asyncpg.Connection, pid: int) -> bool:
    return bool(
        await conn.fetchval(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid
        )
    )


async def test_a_discard_waits_for_an_event_marked_behind_its_head(dsn: str) -> None:
    """An event parked and marked behind a held head, uncommitted, while an operator
    discards the head: the discard waits for it, then makes it due."""
    setup, parker, operator = [await asyncpg.connect(dsn) for _ in range(3)]
    try:
        head, _ = await held_key(setup, "k", 0)
        follower = entry("k")
        tx = parker.transaction()
        await tx.start()
        await parking.park(parker, DURABLE, [follower])  # marked: infinity, head locked
        discard = asyncio.ensure_future(
            parked_queue.discard_head(operator, DURABLE, "k", actor="ops", reason="poison")
        )
        pid = operator.get_server_pid()
        await eventually(lambda: _waiting_for_a_lock(setup, pid), timeout=10,
                         what="the discard waiting for the parker's lock")  # fmt: skip
        assert not discard.done()
        await tx.commit()
        assert await asyncio.wait_for(discard, 10) == head.message_id
        rows = await rows_of(setup, "k")
        assert [r["message_id"] for r in rows] == [follower.message_id]
        assert rows[0]["due"] and rows[0]["held_head"] == head.message_id
    finally:
        for c in (setup, parker, operator):
            await c.close()


async def test_an_event_parked_behind_a_head_being_discarded_is_due(dsn: str) -> None:
    """The other way round: the discard deletes the head first (uncommitted); the parker's
    mark waits for it and, the head gone, leaves the event due."""
    setup, parker, operator = [await asyncpg.connect(dsn) for _ in range(3)]
    try:
        head, _ = await held_key(setup, "k", 0)
        follower = entry("k")
        tx = operator.transaction()
        await tx.start()
        assert await operator.fetchval(parked_queue._DISCARD, DURABLE, "k") == head.message_id

        async def park() -> None:
            async with parker.transaction():
                await parking.park(parker, DURABLE, [follower])

        parking_task = asyncio.ensure_future(park())
        pid = parker.get_server_pid()
        await eventually(lambda: _waiting_for_a_lock(setup, pid), timeout=10,
                         what="the parker's mark waiting for the discard")  # fmt: skip
        await operator.execute(parking._PROMOTE, DURABLE, "k")  # sees no follower yet
        await tx.commit()
        await asyncio.wait_for(parking_task, 10)
        rows = await rows_of(setup, "k")
        assert [r["message_id"] for r in rows] == [follower.message_id]
        assert rows[0]["due"] and rows[0]["held_head"] is None
    finally:
        for c in (setup, parker, operator):
            await c.close()


async def test_the_migration_sets_waiting_events_to_infinity(conn: asyncpg.Connection) -> None:
    """Rows parked before 0022 (followers of a held head with a time) get 'infinity' when it
    is applied again; applying it twice changes nothing more."""
    await held_key(conn, "k", 2)
    await parking.park(conn, DURABLE, [entry("r", "retrying"), entry("r")])
    await conn.execute("UPDATE parked_messages SET next_attempt_at = now()")
    sql = next(m.sql for m in discover_migrations() if m.version == "0022_parked_heads")
    await conn.execute(sql)
    await conn.execute(sql)
    rows = await rows_of(conn, "k")
    assert not infinite(rows[0]) and all(infinite(r) for r in rows[1:])
    assert not any(infinite(r) for r in await rows_of(conn, "r"))
