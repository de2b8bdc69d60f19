"""Rows waiting behind a set-aside row leave the claim's walk (issue 48, migration 0023).

A set-aside row holds back its aggregate's later rows until an operator republishes it.
They are marked (``waiting_behind``) when it is set aside and by the publisher's sweep for
rows committed later, so a claim no longer walks them; a republish releases them in its
own transaction, and the sweep releases rows naming a row no longer set aside. The mark
never decides what is published: these tests count what a claim returns and what it
reads, against rows written here.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import pytest

from shared.adapters import outbox, outbox_set_aside
from tests.conftest import Env
from tests.helpers import insert_events

pytestmark = pytest.mark.integration


async def _set_aside_first_of(conn: asyncpg.Connection, aggregate_id: str) -> int:
    """Claim and set aside (as the publisher does, PAYLOAD_INVALID) ``aggregate_id``'s first
    pending row; its seq."""
    seq = await conn.fetchval(
        "SELECT min(seq) FROM outbox_events WHERE aggregate_id = $1 AND published_at IS NULL",
        aggregate_id,
    )
    async with conn.transaction():
        claimed = await outbox.claim(conn, 1000)
        assert seq in {row.seq for row in claimed.rows}
        failure = outbox.Failure("cannot build", set_aside=outbox.PAYLOAD_INVALID)
        set_aside = await outbox.mark_failed(conn, {seq: failure}, max_attempts=20)
        assert set_aside == {seq: outbox.PAYLOAD_INVALID}
        await outbox_set_aside.mark_waiting(conn)
    return int(seq)


async def _waiting(conn: asyncpg.Connection) -> dict[int, int]:
    """How many rows wait behind each row named."""
    rows = await conn.fetch(
        "SELECT waiting_behind, count(*) FROM outbox_events"
        " WHERE waiting_behind IS NOT NULL GROUP BY 1"
    )
    return {r["waiting_behind"]: r["count"] for r in rows}


async def _claimable(conn: asyncpg.Connection) -> set[str]:
    """The aggregates a claim (rolled back) returns rows of."""
    transaction = conn.transaction()
    await transaction.start()
    try:
        claimed = await outbox.claim(conn, 10_000)
    finally:
        await transaction.rollback()
    return {row.aggregate_id for row in claimed.rows}


async def _claim_reads(conn: asyncpg.Connection, limit: int) -> tuple[int, int]:
    """(rows the claim returned, outbox rows its scans read), by EXPLAIN ANALYZE."""
    await conn.execute(outbox.CLAIM_TRANSACTION)
    try:
        [plan] = json.loads(
            await conn.fetchval(
                "EXPLAIN (ANALYZE, FORMAT JSON, TIMING OFF) " + outbox._CLAIM, limit
            )
        )
    finally:
        await conn.execute("ROLLBACK")
    read = 0

    def walk(node: dict[str, Any]) -> None:
        nonlocal read
        if node.get("Relation Name") == "outbox_events":
            loops = int(node.get("Actual Loops", 1))
            read += (int(node["Actual Rows"]) + int(node.get("Rows Removed by Filter", 0))) * loops
        for child in node.get("Plans", []):
            walk(child)

    walk(plan["Plan"])
    return int(plan["Plan"]["Actual Rows"]), read


async def test_rows_behind_a_set_aside_row_cost_a_claim_nothing(
    env: Env, sea_conn: asyncpg.Connection
) -> None:
    """2,000 rows wait behind a set-aside row, older than 50 rows of other aggregates: the
    claim returns the 50 and reads neither the 2,000 nor their probes of the set-aside
    row; rows committed behind it later are marked by the sweep."""
    await insert_events(sea_conn, 1, aggregates=1)  # the head, aggregate m0
    await insert_events(sea_conn, 2000, aggregates=1)
    head = await _set_aside_first_of(sea_conn, "m0")
    assert await _waiting(sea_conn) == {head: 2000}, "marked in the set-aside's transaction"
    others = await insert_events(sea_conn, 50, aggregates=5)
    await sea_conn.execute(
        "UPDATE outbox_events SET aggregate_id = 'o' || aggregate_id WHERE id = ANY($1::uuid[])",
        others,
    )
    await sea_conn.execute("ANALYZE outbox_events")
    returned, read = await _claim_reads(sea_conn, 20)
    assert returned == 20
    assert read < 200, f"the claim read {read} outbox rows for 20"
    # Committed behind the set-aside row after it was set aside: walked until the sweep.
    await insert_events(sea_conn, 300, aggregates=1)
    assert await _waiting(sea_conn) == {head: 2000}
    assert await outbox_set_aside.mark_waiting(sea_conn) == 300
    assert await _waiting(sea_conn) == {head: 2300}
    assert await outbox_set_aside.mark_waiting(sea_conn) == 0, "a second sweep finds nothing new"
    assert await _claimable(sea_conn) == {"om0", "om1", "om2", "om3", "om4"}


async def test_a_republish_releases_its_rows_in_order_and_a_later_set_aside_row_keeps_its(
    env: Env, sea_conn: asyncpg.Connection
) -> None:
    """Two set-aside rows in one aggregate: the rows wait behind the first. Republishing it
    releases every one; the claim then offers the first alone (the rest wait behind it in
    the stream's order), and the sweep marks again the rows behind the second."""
    await insert_events(sea_conn, 1, aggregates=1)
    await insert_events(sea_conn, 10, aggregates=1)
    first = await _set_aside_first_of(sea_conn, "m0")
    second = first + 6
    await sea_conn.execute(
        "UPDATE outbox_events SET waiting_behind = NULL, publish_attempts = 1,"
        " set_aside_at = now(), set_aside_reason = 'PAYLOAD_INVALID' WHERE seq = $1",
        second,
    )
    assert await _waiting(sea_conn) == {first: 9}
    republished = await outbox_set_aside.republish(sea_conn, None, actor="test", reason="fixed")
    assert [r["seq"] for r in republished] == [first, second]
    assert await _waiting(sea_conn) == {}, "released with the republish"
    transaction = sea_conn.transaction()
    await transaction.start()
    try:
        claimed = await outbox.claim(sea_conn, 100)
        assert [row.seq for row in claimed.rows] == list(range(first, first + 11))
    finally:
        await transaction.rollback()
    # Set the second aside again: the rows past it wait behind it, those before it do not.
    await sea_conn.execute(
        "UPDATE outbox_events SET publish_attempts = 1, set_aside_at = now(),"
        " set_aside_reason = 'PAYLOAD_INVALID' WHERE seq = $1",
        second,
    )
    await sea_conn.execute(
        "UPDATE outbox_events SET published_at = now() WHERE seq >= $1 AND seq < $2",
        first,
        second,
    )
    await outbox_set_aside.mark_waiting(sea_conn)
    assert await _waiting(sea_conn) == {second: 4}


async def test_rows_naming_a_row_no_longer_set_aside_are_released_by_the_sweep(
    env: Env, sea_conn: asyncpg.Connection
) -> None:
    """A set-aside row made pending by hand (no `ferry outbox republish`): the next sweep
    releases what waited behind it, and the claim offers the aggregate again."""
    await insert_events(sea_conn, 1, aggregates=1)
    await insert_events(sea_conn, 40, aggregates=1)
    head = await _set_aside_first_of(sea_conn, "m0")
    assert await _waiting(sea_conn) == {head: 40}
    await sea_conn.execute(
        "UPDATE outbox_events SET set_aside_at = NULL, set_aside_reason = NULL,"
        " publish_attempts = 0 WHERE seq = $1",
        head,
    )
    assert await outbox_set_aside.mark_waiting(sea_conn) == 40
    assert await _waiting(sea_conn) == {}
    assert await _claimable(sea_conn) == {"m0"}


async def test_a_sweep_and_a_republish_racing_never_strand_a_row(
    env: Env, sea_conn: asyncpg.Connection
) -> None:
    """Either order of a sweep's transaction and an operator's republish ends with nothing
    marked: a republish waits for a sweep holding the set-aside row, then releases what it
    marked; a sweep skips a set-aside row a republish holds."""
    await insert_events(sea_conn, 1, aggregates=1)
    await insert_events(sea_conn, 5, aggregates=1)
    head = await _set_aside_first_of(sea_conn, "m0")
    await sea_conn.execute("UPDATE outbox_events SET waiting_behind = NULL")
    other = await asyncpg.connect(env.dsn("sea"))
    try:
        # The sweep first, its transaction open: the republish waits for it.
        sweep = other.transaction()
        await sweep.start()
        assert await outbox_set_aside.mark_waiting(other) == 5
        republish = asyncio.create_task(
            outbox_set_aside.republish(sea_conn, None, actor="test", reason="fixed")
        )
        await asyncio.sleep(0.5)
        assert not republish.done(), "the republish waits for the sweep's lock"
        await sweep.commit()
        assert [r["seq"] for r in await asyncio.wait_for(republish, 10)] == [head]
        assert await _waiting(sea_conn) == {}
        # Set aside again; the republish first, its transaction open: the sweep skips it.
        await sea_conn.execute("UPDATE outbox_events SET waiting_behind = NULL")
        await sea_conn.execute(
            "UPDATE outbox_events SET publish_attempts = 1, set_aside_at = now(),"
            " set_aside_reason = 'PAYLOAD_INVALID' WHERE seq = $1",
            head,
        )
        held = sea_conn.transaction()
        await held.start()
        await outbox_set_aside.republish(sea_conn, None, actor="test", reason="fixed again")
        assert await asyncio.wait_for(outbox_set_aside.mark_waiting(other), 10) == 0
        await held.commit()
        assert await _waiting(sea_conn) == {}
    finally:
        await other.close()
