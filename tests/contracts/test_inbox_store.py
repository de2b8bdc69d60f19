"""The InboxStore contract (:class:`shared.domain.ports.InboxStore`), per implementation."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from shared.domain.ports import FailedAttempt, InboxStore
from tests.contracts.conftest import StoreBackend

DURABLE, OTHER = "sea__from_vibespro", "vibespro__from_sea"
LEASE = 30.0


@dataclass(frozen=True)
class Delivered:
    """A delivery as the port sees it (any object with these fields will do)."""

    message_id: UUID
    subject: str = "vibespro.event.model_published.v1"
    event_type: str | None = "model_published"
    event_version: int | None = 1
    occurred_at: datetime | None = datetime(2026, 1, 1, tzinfo=UTC)
    stream_seq: int = 1
    traceparent: str | None = None


async def _claim(
    store: InboxStore[Any], conn: Any, owner: str, *ids: UUID, durable: str = DURABLE
) -> Any:
    entries = [Delivered(message_id=i, stream_seq=n + 1) for n, i in enumerate(ids)]
    return await store.claim_batch(
        conn, durable=durable, owner=owner, lease_seconds=LEASE, entries=entries
    )


async def test_a_message_is_claimed_by_one_owner_at_a_time(
    inbox_store: InboxStore[Any], store_backend: StoreBackend
) -> None:
    conn = await store_backend.connect()
    message = uuid.uuid4()
    first = await _claim(inbox_store, conn, "a", message)
    assert dict(first.claimed) == {message: 1}
    second = await _claim(inbox_store, conn, "b", message)
    assert dict(second.claimed) == {}
    assert 0 < second.leased[message] <= LEASE


async def test_a_final_outcome_makes_every_later_delivery_a_duplicate(
    inbox_store: InboxStore[Any], store_backend: StoreBackend
) -> None:
    conn = await store_backend.connect()
    message = uuid.uuid4()
    await _claim(inbox_store, conn, "a", message)
    await inbox_store.mark_processed(conn, DURABLE, {message: 200})
    await inbox_store.mark_processed(conn, DURABLE, {message: 200})  # idempotent
    again = await _claim(inbox_store, conn, "b", message)
    assert (dict(again.claimed), set(again.final)) == ({}, {message})
    assert (await inbox_store.backlog(conn, DURABLE))["count"] == 0


async def test_a_retrying_message_is_claimable_again_with_one_more_attempt(
    inbox_store: InboxStore[Any], store_backend: StoreBackend
) -> None:
    conn = await store_backend.connect()
    message = uuid.uuid4()
    await _claim(inbox_store, conn, "a", message)
    await inbox_store.mark_retrying(
        conn,
        DURABLE,
        message,
        FailedAttempt(
            error="503 from the handler",
            status=503,
            reason_code="HANDLER_5XX",
            history_entry={"attempt": 1, "status": 503},
        ),
    )
    again = await _claim(inbox_store, conn, "b", message)
    assert dict(again.claimed) == {message: 2}
    backlog = await inbox_store.backlog(conn, DURABLE)
    assert backlog["count"] == 1


async def test_durables_are_independent(
    inbox_store: InboxStore[Any], store_backend: StoreBackend
) -> None:
    conn = await store_backend.connect()
    message = uuid.uuid4()
    await _claim(inbox_store, conn, "a", message)
    await inbox_store.mark_processed(conn, DURABLE, {message: 200})
    other = await _claim(inbox_store, conn, "a", message, durable=OTHER)
    assert dict(other.claimed) == {message: 1}


async def test_a_batch_is_classified_message_by_message(
    inbox_store: InboxStore[Any], store_backend: StoreBackend
) -> None:
    conn = await store_backend.connect()
    done, leased, new = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await _claim(inbox_store, conn, "a", done, leased)
    await inbox_store.mark_processed(conn, DURABLE, {done: 200})
    batch = await _claim(inbox_store, conn, "b", done, leased, new)
    assert dict(batch.claimed) == {new: 1}
    assert set(batch.final) == {done}
    assert set(batch.leased) == {leased}


async def test_a_lapsed_lease_lets_another_owner_claim_with_one_more_attempt(
    inbox_store: InboxStore[Any], store_backend: StoreBackend
) -> None:
    conn = await store_backend.connect()
    message = uuid.uuid4()
    entries = [Delivered(message_id=message)]
    await inbox_store.claim_batch(
        conn, durable=DURABLE, owner="a", lease_seconds=0.2, entries=entries
    )
    await asyncio.sleep(0.5)
    again = await _claim(inbox_store, conn, "b", message)
    assert dict(again.claimed) == {message: 2}
