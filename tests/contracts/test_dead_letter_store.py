"""The DeadLetterStore contract (:class:`shared.domain.ports.DeadLetterStore`)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from shared.adapters import dead_letters
from shared.adapters.dead_letters import Failure
from shared.domain.ports import DeadLetterStore
from tests.contracts.conftest import StoreBackend

pytestmark = pytest.mark.integration

DURABLE = "sea__from_vibespro"


def failure(reason_code: str = "HANDLER_REJECTED", **changes: Any) -> Failure:
    message_id = changes.pop("message_id", uuid.uuid4())
    fields: dict[str, Any] = {"source": "consumer", **changes}
    return Failure(
        durable=DURABLE,
        message_id=message_id,
        stream="VIBESPRO_EVENTS",
        stream_seq=7,
        original_subject="vibespro.event.model_published.v1",
        reason_code=reason_code,
        last_error="422 from the handler",
        attempts=1,
        payload={"message_id": str(message_id)},
        retry_history=[],
        **fields,
    )


def expected_status(store_backend: StoreBackend, reason_code: str) -> str:
    spec = store_backend.env.topology.durable(DURABLE)
    return dead_letters.initial_status(spec, reason_code, 0)


async def test_a_failure_is_recorded_once_whoever_reports_it(
    dead_letter_store: DeadLetterStore[Any, Any], store_backend: StoreBackend
) -> None:
    conn = await store_backend.connect()
    first = failure()
    assert await dead_letter_store.record(conn, first) == "recorded"
    again = failure(message_id=first.message_id, source="advisory:max_deliveries")
    assert await dead_letter_store.record(conn, again) == "already"
    status = await dead_letter_store.status(conn, DURABLE, first.message_id)
    assert status == expected_status(store_backend, first.reason_code)


async def test_a_defect_of_the_bytes_is_held_for_an_operator(
    dead_letter_store: DeadLetterStore[Any, Any], store_backend: StoreBackend
) -> None:
    conn = await store_backend.connect()
    poison = failure("SCHEMA_INVALID")
    assert await dead_letter_store.record(conn, poison) == "recorded"
    assert await dead_letter_store.status(conn, DURABLE, poison.message_id) == "held"


async def test_park_and_discard_only_from_a_status_that_allows_it(
    dead_letter_store: DeadLetterStore[Any, Any], store_backend: StoreBackend
) -> None:
    conn = await store_backend.connect()
    record = failure("SCHEMA_INVALID")
    await dead_letter_store.record(conn, record)
    key = {"durable": DURABLE, "message_id": record.message_id, "actor": "ops", "reason": "t"}
    assert await dead_letter_store.set_status(conn, status="parked", **key)
    assert not await dead_letter_store.set_status(conn, status="parked", **key)
    assert await dead_letter_store.set_status(conn, status="discarded", **key)
    assert not await dead_letter_store.set_status(conn, status="discarded", **key)
    assert await dead_letter_store.status(conn, DURABLE, record.message_id) == "discarded"


async def test_settling_replays_is_idempotent(
    dead_letter_store: DeadLetterStore[Any, Any], store_backend: StoreBackend
) -> None:
    conn = await store_backend.connect()
    await dead_letter_store.record(conn, failure())
    assert await dead_letter_store.settle_replayed(conn, [DURABLE]) == 0
    assert await dead_letter_store.settle_replayed(conn, [DURABLE]) == 0


async def test_an_unknown_message_has_no_record(
    dead_letter_store: DeadLetterStore[Any, Any], store_backend: StoreBackend
) -> None:
    conn = await store_backend.connect()
    assert await dead_letter_store.status(conn, DURABLE, uuid.uuid4()) is None
