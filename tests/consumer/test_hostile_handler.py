"""Whatever a handler answers, the consumer settles the one message and goes on.

Issue 22: ``Retry-After: nan`` raised ``ValueError`` in ``nak`` and a non-UTF-8 error
body raised ``UnicodeDecodeError`` in dispatch; either ended the batch task and with it
the process (a crash loop: the message comes back on every start). ``Retry-After: 0``
spent every delivery within milliseconds, so a brief overload dead-lettered healthy
events. Each test here runs the real consumer against a real aiohttp handler that
misbehaves in one way, and counts what the handler applied and what was dead-lettered.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from nats.aio.client import Client as NATS

from services.inbox_consumer.dispatch import DETAIL_LIMIT
from shared.access.streams import provision
from shared.domain.ack import Outcome
from tests.conftest import CAPS, Env
from tests.consumer.conftest import (
    DURABLE,
    RunningConsumer,
    dead_letters,
    envelope,
    fast_durable,
    inbox_row,
    publish,
    publish_raw,
)
from tests.consumer.hostile import (
    HostileHandler,
    dead_letter_rows,
    hostile,
    reset_mid_body,
    status,
    trickle,
    until_all,
)

pytestmark = pytest.mark.integration
__all__ = ["hostile"]  # the fixture


@pytest.fixture
async def world(env: Env, nc: NATS, hostile: HostileHandler) -> Env:
    fast_durable(env, hostile.url)
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    return env


@pytest.mark.parametrize(
    "value",
    ["nan", "inf", "-inf", "-1", "1e400", "1.5", "soon", "9" * 200, "Sun, 31 Feb 2027 x GMT"],
)
async def test_an_invalid_retry_after_is_ignored_and_the_consumer_goes_on(
    world: Env, nc: NATS, hostile: HostileHandler, value: str
) -> None:
    event, after = envelope(), envelope()
    hostile.scripts[event.message_id] = [status(503, headers={"Retry-After": value})]
    running = RunningConsumer(world, nc, hostile.url)
    async with running:
        await publish(nc, event)
        await publish(nc, after)
        await until_all(world, [event.message_id, after.message_id])
        assert not running.task.done()  # the role did not exit
    assert hostile.applied[event.message_id] == hostile.applied[after.message_id] == 1
    assert len(hostile.calls[event.message_id]) == 2  # the 503, then the 200
    assert await dead_letters(nc) == []


async def test_retry_after_zero_cannot_spend_the_deliveries_of_a_brief_overload(
    env: Env, nc: NATS, hostile: HostileHandler
) -> None:
    # Six deliveries, 1 s apart by the ladder; the handler is overloaded for 2.5 s and
    # asks to be called again at once. Honouring "0" dead-lettered the event in ms.
    fast_durable(env, hostile.url, max_deliver=6, backoff=["1s"])
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    events = [envelope() for _ in range(3)]
    hostile.overload = status(503, b"busy", {"Retry-After": "0"})
    hostile.overloaded_until = time.monotonic() + 2.5
    async with RunningConsumer(env, nc, hostile.url):
        for event in events:
            await publish(nc, event)
        await until_all(env, [e.message_id for e in events])
    assert all(hostile.applied[e.message_id] == 1 for e in events)
    assert all(2 <= len(hostile.calls[e.message_id]) <= 5 for e in events)
    assert await dead_letters(nc) == []


async def test_a_non_utf8_body_is_decoded_safely_retried_or_dead_lettered_by_its_status(
    world: Env, nc: NATS, hostile: HostileHandler
) -> None:
    retried, rejected = envelope(), envelope()
    bad = b"\xff\xfe invalid \x80\x00 utf-8"
    utf8 = {"Content-Type": "text/plain; charset=utf-8"}
    hostile.scripts[retried.message_id] = [status(500, bad, utf8)]
    hostile.scripts[rejected.message_id] = [status(422, bad, utf8)]
    running = RunningConsumer(world, nc, hostile.url)
    async with running:
        await publish(nc, retried)
        await publish(nc, rejected)
        await until_all(world, [retried.message_id])
        await until_all(world, [rejected.message_id], "failed")
        assert not running.task.done()
    assert hostile.applied[retried.message_id] == 1
    assert hostile.applied[rejected.message_id] == 0
    [record] = await dead_letters(nc)
    assert record["reasonCode"] == "HANDLER_REJECTED"
    assert "invalid" in record["lastError"] and "\ufffd" in record["lastError"]
    assert "\x00" not in record["lastError"]


async def test_a_huge_error_body_becomes_a_bounded_detail(
    world: Env, nc: NATS, hostile: HostileHandler
) -> None:
    event = envelope()
    hostile.scripts[event.message_id] = [status(422, "ж".encode() * 5_000_000)]  # 10 MB
    async with RunningConsumer(world, nc, hostile.url):
        await publish(nc, event)
        await until_all(world, [event.message_id], "failed")
    [record] = await dead_letters(nc)
    assert record["reasonCode"] == "HANDLER_REJECTED"
    assert 0 < len(record["lastError"]) <= DETAIL_LIMIT
    assert record["lastError"].startswith("жжж")


async def test_a_connection_reset_mid_body_keeps_the_handlers_status(
    world: Env, nc: NATS, hostile: HostileHandler
) -> None:
    retried, rejected = envelope(), envelope()
    hostile.scripts[retried.message_id] = [reset_mid_body(503)]
    hostile.scripts[rejected.message_id] = [reset_mid_body(422)]
    running = RunningConsumer(world, nc, hostile.url)
    async with running:
        await publish(nc, retried)
        await publish(nc, rejected)
        await until_all(world, [retried.message_id])
        await until_all(world, [rejected.message_id], "failed")
        assert not running.task.done()
    assert hostile.applied[retried.message_id] == 1
    [record] = await dead_letters(nc)
    assert record["reasonCode"] == "HANDLER_REJECTED"
    assert "body unreadable" in record["lastError"]


async def test_a_response_trickled_past_the_timeout_keeps_the_handlers_status(
    world: Env, nc: NATS, hostile: HostileHandler
) -> None:
    event = envelope()
    hostile.scripts[event.message_id] = [trickle(503, 3.0)]  # the timeout is 1 s
    running = RunningConsumer(world, nc, hostile.url)
    async with running:
        await publish(nc, event)
        await until_all(world, [event.message_id])
        assert not running.task.done()
    assert hostile.applied[event.message_id] == 1
    assert len(hostile.calls[event.message_id]) == 2
    row = await inbox_row(world, event.message_id)
    assert row is not None
    [first] = json.loads(row["retry_history"])
    assert first["status"] == 503  # its answer, though the body never finished
    assert await dead_letters(nc) == []


class _Exploding:
    """The consumer's handler port, raising something no path expects for one id."""

    def __init__(self, inner: Any, poisoned: str) -> None:
        self.inner, self.poisoned = inner, poisoned

    async def handle(self, body: dict[str, Any], headers: dict[str, str]) -> Outcome:
        if body["message_id"] == self.poisoned:
            raise RuntimeError("a bug met by one message")
        result: Outcome = await self.inner.handle(body, headers)
        return result

    async def close(self) -> None:
        await self.inner.close()


async def test_an_unexpected_error_for_one_message_dead_letters_it_and_the_rest_goes_on(
    world: Env, nc: NATS, hostile: HostileHandler
) -> None:
    poisoned, others = envelope(), [envelope() for _ in range(4)]
    running = RunningConsumer(world, nc, hostile.url)
    async with running as consumer:
        consumer.decider.handler = _Exploding(consumer.decider.handler, poisoned.message_id)  # type: ignore[assignment]
        await publish(nc, poisoned)
        for event in others:
            await publish(nc, event)
        await until_all(world, [e.message_id for e in others])
        await until_all(world, [poisoned.message_id], "failed")
        assert not running.task.done()
        errors = consumer.metrics.role.registry.get_sample_value(
            "ferry_consumer_errors_total", {"durable": DURABLE, "stage": "decide"}
        )
    assert errors == 1
    assert all(hostile.applied[e.message_id] == 1 for e in others)
    [record] = await dead_letters(nc)
    assert record["reasonCode"] == "CONSUMER_ERROR"
    assert "RuntimeError: a bug met by one message" in record["lastError"]
    assert [r["reason_code"] for r in await dead_letter_rows(world)] == ["CONSUMER_ERROR"]


@pytest.mark.parametrize(
    "body",
    [
        b'{"message_id": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # deep nesting
        b'{"message_id": 1' + b"0" * 5_000 + b"}",  # an integer of 5,000 digits
        b'{"message_id": "\\ud800", "payload": {"x": "\\udfff"}}',  # lone surrogates
    ],
    ids=["deep", "huge-int", "surrogates"],
)
async def test_a_body_that_breaks_parsing_is_dead_lettered_and_its_batch_goes_on(
    world: Env, nc: NATS, hostile: HostileHandler, body: bytes
) -> None:
    bad_id, good = str(uuid.uuid4()), [envelope() for _ in range(3)]
    running = RunningConsumer(world, nc, hostile.url)
    async with running:
        await publish(nc, good[0])
        await publish_raw(nc, good[0].subject, body, msg_id=bad_id)
        for event in good[1:]:
            await publish(nc, event)
        await until_all(world, [e.message_id for e in good])
        await until_all(world, [bad_id], "failed")
        assert not running.task.done()
    assert all(hostile.applied[e.message_id] == 1 for e in good)
    assert hostile.calls.get(bad_id) is None
    [record] = await dead_letters(nc)
    assert record["message_id"] == bad_id and record["reasonCode"]


@pytest.mark.parametrize("traceparent", ["00-\x00-bad", "x" * 10_000, "00-zz-\u00e9"])
async def test_an_invalid_traceparent_header_is_dropped_and_the_event_processed(
    world: Env, nc: NATS, hostile: HostileHandler, traceparent: str
) -> None:
    odd, good = envelope(), [envelope() for _ in range(3)]
    running = RunningConsumer(world, nc, hostile.url)
    async with running:
        await publish(nc, good[0])
        await nc.jetstream().publish(
            odd.subject,
            odd.to_wire(),
            headers={"Nats-Msg-Id": odd.message_id, "traceparent": traceparent},
        )
        for event in good[1:]:
            await publish(nc, event)
        await until_all(world, [e.message_id for e in [odd, *good]])
        assert not running.task.done()
    assert all(hostile.applied[e.message_id] == 1 for e in [odd, *good])
    row = await inbox_row(world, odd.message_id)
    assert row is not None and row["traceparent"] is None
    assert await dead_letters(nc) == []


async def test_a_message_the_inbox_cannot_store_does_not_hold_back_its_batch(
    world: Env, nc: NATS, hostile: HostileHandler
) -> None:
    # A NUL in a subject is stored by JetStream but refused by PostgreSQL: the claim of
    # every batch holding it failed, and its batch-mates spent their deliveries with it.
    good = [envelope() for _ in range(4)]
    await publish(nc, good[0])
    await publish_raw(nc, "vibespro.event.\x00", b"{}", msg_id=str(uuid.uuid4()))
    for event in good[1:]:
        await publish(nc, event)
    running = RunningConsumer(world, nc, hostile.url)  # one batch: all five are waiting
    async with running as consumer:
        await until_all(world, [e.message_id for e in good])
        assert not running.task.done()
        errors = consumer.metrics.role.registry.get_sample_value(
            "ferry_consumer_errors_total", {"durable": DURABLE, "stage": "claim"}
        )
    assert errors is not None and errors >= 1
    assert all(hostile.attempts[e.message_id] == [1] for e in good)
    assert all(hostile.applied[e.message_id] == 1 for e in good)
