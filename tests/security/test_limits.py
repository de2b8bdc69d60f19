"""Input limits at the producer: an oversized payload is refused and nothing is written."""

from __future__ import annotations

import asyncpg
import pytest

from shared.adapters.producer import MAX_PAYLOAD_BYTES, record_event
from shared.domain.errors import OutboxValidationError

pytestmark = pytest.mark.integration


async def test_an_oversized_payload_is_refused_before_anything_is_written(
    sea_conn: asyncpg.Connection,
) -> None:
    big = {"model_id": "m1", "name": "x" * (MAX_PAYLOAD_BYTES + 1)}
    with pytest.raises(OutboxValidationError) as caught:
        async with sea_conn.transaction():
            await record_event(
                sea_conn,
                aggregate_type="model",
                aggregate_id="m1",
                event_type="model_published",
                payload=big,
            )
    assert caught.value.code == "MESSAGE_TOO_LARGE" and caught.value.field == "payload"
    assert f"exceeds the limit of {MAX_PAYLOAD_BYTES}" in str(caught.value)
    assert await sea_conn.fetchval("SELECT count(*) FROM outbox_events") == 0


async def test_a_payload_just_under_the_limit_is_recorded(sea_conn: asyncpg.Connection) -> None:
    name = "x" * (MAX_PAYLOAD_BYTES - 100)
    async with sea_conn.transaction():
        await record_event(
            sea_conn,
            aggregate_type="model",
            aggregate_id="m1",
            event_type="model_published",
            payload={"model_id": "m1", "name": name},
        )
    assert await sea_conn.fetchval("SELECT count(*) FROM outbox_events") == 1
