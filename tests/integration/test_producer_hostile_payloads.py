"""Hostile payloads at the producer and through plain SQL, against a real PostgreSQL.

Multi-byte text at the payload limit travels whole: the envelope the publisher builds
from the stored row fits the consumer's max message bytes, and the payload takes in it
exactly the bytes the producer counted. NULs and lone surrogates are refused by the
producer with its own error (not a driver's), and by PostgreSQL itself on the plain-SQL
path, inside the producer's transaction: nothing half-written, nothing to publish.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest

from services.inbox_consumer.consumer import DEFAULT_MAX_MESSAGE_BYTES
from services.outbox_publisher.publisher import build_message
from shared.adapters.outbox import OutboxRow
from shared.adapters.producer import MAX_KEY_BYTES, MAX_PAYLOAD_BYTES, record_event
from shared.domain.envelope import Envelope
from shared.domain.errors import OutboxValidationError

pytestmark = pytest.mark.integration

FRAME = len(b'{"model_id":"m1","name":""}')
_ROW = (
    "SELECT id, seq, aggregate_type, aggregate_id, event_type, event_version,"
    " payload::text AS payload, occurred_at, correlation_id, causation_id, traceparent,"
    " tracestate FROM outbox_events"
)


async def _record(conn: asyncpg.Connection, payload: dict[str, Any], **fields: Any) -> None:
    args = {"aggregate_type": "model", "aggregate_id": "m1", "event_type": "model_published"}
    args.update(fields)
    async with conn.transaction():
        await record_event(conn, payload=payload, **args)


async def _count(conn: asyncpg.Connection) -> int:
    count = await conn.fetchval("SELECT count(*) FROM outbox_events")
    assert isinstance(count, int)
    return count


@pytest.mark.parametrize(("char", "width"), [("Ж", 2), ("😀", 4)])
async def test_multibyte_payload_at_the_limit_travels_within_the_consumers_max(
    sea_conn: asyncpg.Connection, char: str, width: int
) -> None:
    name = char * ((MAX_PAYLOAD_BYTES - FRAME) // width)
    payload = {"model_id": "m1", "name": name}
    counted = len(json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode())
    aggregate_id = "Я" * (MAX_KEY_BYTES // 2)
    await _record(sea_conn, payload, aggregate_id=aggregate_id, aggregate_type="м" * 512)

    row = OutboxRow(**dict(await sea_conn.fetchrow(_ROW)))
    _, body, _ = build_message(row, namespace="sea.event", context="sea")

    assert len(body) <= DEFAULT_MAX_MESSAGE_BYTES  # and the stream's 1 MiB max_msg_size
    envelope = Envelope.from_wire(body, nats_subject="sea.event.model_published.v1")
    assert envelope.payload == payload and envelope.aggregate_id == aggregate_id
    # The payload takes exactly the bytes the producer counted: UTF-8, not \u escapes.
    empty = Envelope.from_wire(body).to_dict() | {"payload": {}}
    rest = len(json.dumps(empty, separators=(",", ":"), ensure_ascii=False).encode()) - 2
    assert len(body) == rest + counted


async def test_multibyte_payload_just_over_the_limit_is_refused_and_nothing_written(
    sea_conn: asyncpg.Connection,
) -> None:
    name = "Ж" * ((MAX_PAYLOAD_BYTES - FRAME) // 2 + 1)
    with pytest.raises(OutboxValidationError) as refused:
        await _record(sea_conn, {"model_id": "m1", "name": name})
    assert refused.value.code == "MESSAGE_TOO_LARGE"
    assert f"{FRAME + 2 * len(name)} bytes" in str(refused.value)
    assert f"limit of {MAX_PAYLOAD_BYTES} bytes" in str(refused.value)
    assert await _count(sea_conn) == 0


@pytest.mark.parametrize(
    ("payload", "fields", "named"),
    [
        ({"model_id": "m1", "name": "a\x00b"}, {}, "payload.name: text contains NUL"),
        ({"model_id": "m1", "name": "\ud800"}, {}, "payload.name: text is not valid Unicode"),
        ({"model_id": "m1", "name": "n"}, {"aggregate_id": "m\x00"}, "aggregate_id: text"),
        ({"model_id": "m1", "name": "n"}, {"aggregate_type": "\udfff"}, "aggregate_type: text"),
    ],
)
async def test_nul_and_lone_surrogates_are_refused_by_the_producer_not_the_driver(
    sea_conn: asyncpg.Connection, payload: dict[str, Any], fields: dict[str, Any], named: str
) -> None:
    await sea_conn.execute("CREATE TABLE models (id TEXT PRIMARY KEY)")
    with pytest.raises(OutboxValidationError, match="INVALID_OUTBOX") as refused:
        async with sea_conn.transaction():
            await sea_conn.execute("INSERT INTO models VALUES ('m1')")
            await _record(sea_conn, payload, **fields)
    assert named in str(refused.value)
    assert await _count(sea_conn) == 0
    assert await sea_conn.fetchval("SELECT count(*) FROM models") == 0


@pytest.mark.parametrize(
    "payload_sql",
    [
        '{"model_id": "m1", "name": "a\\u0000b"}',
        '{"model_id": "m1", "name": "\\ud800"}',
        '{"model_id": "m1", "name": NaN}',
    ],
)
async def test_plain_sql_payloads_postgres_cannot_store_fail_in_the_producers_transaction(
    sea_conn: asyncpg.Connection, payload_sql: str
) -> None:
    """Nothing of them reaches the outbox: the INSERT itself fails, where the plain-SQL
    producer can see it and roll its state change back."""
    with pytest.raises(asyncpg.DataError):
        async with sea_conn.transaction():
            await sea_conn.execute(
                "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type,"
                " payload) VALUES (gen_random_uuid(), 'model', 'm1', 'model_published', $1)",
                payload_sql,
            )
    assert await _count(sea_conn) == 0
