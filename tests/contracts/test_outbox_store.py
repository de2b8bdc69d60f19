"""The OutboxStore contract (:class:`shared.domain.ports.OutboxStore`), per implementation."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from shared.domain.ports import OutboxStore
from tests.contracts.conftest import BOUND, StoreBackend, real_only


@dataclass(frozen=True)
class Refused:
    """A failure as the port sees it (any object with these fields will do)."""

    error: str
    set_aside: str | None = None
    outage: bool = False


async def _claimed_ids(store: OutboxStore[Any], conn: Any, limit: int) -> list[str]:
    return [str(row.id) for row in (await store.claim(conn, limit)).rows]


async def test_concurrent_claims_are_disjoint_and_miss_nothing(
    outbox_store: OutboxStore[Any], store_backend: StoreBackend
) -> None:
    writer, first, second = [await store_backend.connect() for _ in range(3)]
    ids = await store_backend.insert_events(writer, 10, aggregates=10)
    async with first.transaction(), second.transaction():
        mine = await _claimed_ids(outbox_store, first, 4)
        theirs = await _claimed_ids(outbox_store, second, 10)
    assert len(mine) == 4
    assert not set(mine) & set(theirs)
    assert sorted(mine + theirs) == sorted(ids)


async def test_rows_come_in_order_and_an_aggregate_waits_behind_its_earlier_row(
    outbox_store: OutboxStore[Any], store_backend: StoreBackend
) -> None:
    writer, first, second = [await store_backend.connect() for _ in range(3)]
    ids = await store_backend.insert_events(writer, 3, aggregates=1)
    async with first.transaction(), second.transaction():
        assert await _claimed_ids(outbox_store, first, 1) == ids[:1]
        behind = await outbox_store.claim(second, 10)
        assert list(behind.rows) == []
        assert behind.held_back == 2
    async with first.transaction():
        assert await _claimed_ids(outbox_store, first, 10) == ids


async def test_mark_published_is_final_and_idempotent(
    outbox_store: OutboxStore[Any], store_backend: StoreBackend
) -> None:
    writer, conn = await store_backend.connect(), await store_backend.connect()
    await store_backend.insert_events(writer, 5, aggregates=5)
    async with conn.transaction():
        seqs = [row.seq for row in (await outbox_store.claim(conn, 10)).rows]
        await outbox_store.mark_published(conn, seqs)
        await outbox_store.mark_published(conn, seqs)
        await outbox_store.mark_published(conn, [])
    async with conn.transaction():
        assert (await outbox_store.claim(conn, 10)).rows == []
    assert (await outbox_store.backlog(conn))["count"] == 0


async def test_a_failed_row_stays_pending_and_waits_out_a_back_off(
    outbox_store: OutboxStore[Any], store_backend: StoreBackend
) -> None:
    writer, conn = await store_backend.connect(), await store_backend.connect()
    ids = await store_backend.insert_events(writer, 1)
    async with conn.transaction():
        rows = (await outbox_store.claim(conn, 10)).rows
        for _ in range(4):  # four attempts: a back-off of seconds, not milliseconds
            await outbox_store.mark_failed(
                conn, {rows[0].seq: Refused("stream refused it")}, max_attempts=5
            )
    backlog = await outbox_store.backlog(conn)
    assert (backlog["count"], backlog["failing"]) == (1, 1)
    async with conn.transaction():
        assert (await outbox_store.claim(conn, 10)).rows == []  # inside its back-off
    await asyncio.sleep(2.0)
    async with conn.transaction():
        assert await _claimed_ids(outbox_store, conn, 10) == ids


async def test_a_row_whose_transaction_commits_late_is_not_skipped(
    outbox_store: OutboxStore[Any], store_backend: StoreBackend
) -> None:
    late, early, conn = [await store_backend.connect() for _ in range(3)]
    slow = late.transaction()
    await slow.start()
    late_id = await store_backend.record(late, "late")  # the lower seq, committed last
    async with early.transaction():
        early_id = await store_backend.record(early, "early")
    async with conn.transaction():
        assert await _claimed_ids(outbox_store, conn, 10) == [early_id]
    await slow.commit()
    async with conn.transaction():
        assert await _claimed_ids(outbox_store, conn, 10) == [late_id, early_id]


async def test_a_row_whose_transaction_rolls_back_is_never_claimed(
    outbox_store: OutboxStore[Any], store_backend: StoreBackend
) -> None:
    writer, conn = await store_backend.connect(), await store_backend.connect()
    undone = writer.transaction()
    await undone.start()
    await store_backend.record(writer, "undone")
    await undone.rollback()
    kept = await store_backend.insert_events(writer, 1)
    async with conn.transaction():
        assert await _claimed_ids(outbox_store, conn, 10) == kept
    assert (await outbox_store.backlog(conn))["count"] == 1


async def test_a_row_that_can_never_be_published_is_set_aside_for_good(
    outbox_store: OutboxStore[Any], store_backend: StoreBackend
) -> None:
    writer, conn = await store_backend.connect(), await store_backend.connect()
    await store_backend.insert_events(writer, 1)
    async with conn.transaction():
        (row,) = (await outbox_store.claim(conn, 10)).rows
        poison = Refused("over the size limit", set_aside="MESSAGE_TOO_LARGE")
        set_aside = await outbox_store.mark_failed(conn, {row.seq: poison}, max_attempts=5)
    assert dict(set_aside) == {row.seq: "MESSAGE_TOO_LARGE"}
    await asyncio.sleep(0.5)
    async with conn.transaction():
        assert (await outbox_store.claim(conn, 10)).rows == []


async def test_an_outage_never_sets_a_row_aside(
    outbox_store: OutboxStore[Any], store_backend: StoreBackend
) -> None:
    writer, conn = await store_backend.connect(), await store_backend.connect()
    ids = await store_backend.insert_events(writer, 1)
    for _ in range(3):
        await asyncio.sleep(1.0)  # past the back-off of the attempts so far
        async with conn.transaction():
            (row,) = (await outbox_store.claim(conn, 10)).rows
            outage = Refused("no responders", outage=True)
            assert await outbox_store.mark_failed(conn, {row.seq: outage}, max_attempts=1) == {}
    await asyncio.sleep(1.0)
    async with conn.transaction():
        assert await _claimed_ids(outbox_store, conn, 10) == ids


@real_only(
    "a claim's locks dying with a lost connection is the database server's doing; the "
    "in-memory store lives in the claimer's process and dies with it"
)
async def test_a_dead_claimers_rows_are_claimed_again(
    outbox_store: OutboxStore[Any], store_backend: StoreBackend
) -> None:
    writer, dying, conn = [await store_backend.connect() for _ in range(3)]
    ids = await store_backend.insert_events(writer, 3, aggregates=3)
    claim = dying.transaction()
    await claim.start()
    assert await _claimed_ids(outbox_store, dying, 10) == ids
    dying.terminate()  # the socket closed at once: no ROLLBACK ever sent
    async with asyncio.timeout(BOUND):
        while True:  # the server notices the lost connection, then its locks go
            async with conn.transaction():
                if await _claimed_ids(outbox_store, conn, 10) == ids:
                    break
            await asyncio.sleep(0.1)
