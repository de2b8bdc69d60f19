"""inbox-consumer against real servers and a scripted handler: every ACK rule, by counting."""

from __future__ import annotations

import asyncio
import json

import pytest
from nats.aio.client import Client as NATS

from devstack.ports import free_port
from tests.conftest import Env
from tests.consumer.conftest import (
    DURABLE,
    STREAM,
    RunningConsumer,
    ScriptedHandler,
    dead_letters,
    envelope,
    fast_durable,
    inbox_row,
    publish,
    publish_raw,
)
from tests.helpers import RunningRouter, eventually

pytestmark = pytest.mark.integration


async def _status(env: Env, mid: str) -> str | None:
    row = await inbox_row(env, mid)
    return None if row is None else str(row["status"])


async def _settled(nc: NATS) -> bool:
    info = await nc.jetstream().consumer_info(STREAM, DURABLE)
    return info.num_pending == 0 and info.num_ack_pending == 0


async def _until(env: Env, nc: NATS, mid: str, status: str, timeout: float = 20) -> None:
    async def done() -> bool:
        return await _status(env, mid) == status and await _settled(nc)

    await eventually(done, timeout=timeout, what=f"{mid} {status} and acked")


@pytest.mark.parametrize("status", [200, 409])
async def test_200_and_409_mark_processed_and_ack(
    world: Env, nc: NATS, handler: ScriptedHandler, status: int
) -> None:
    event = envelope()
    handler.scripts[event.message_id] = [status]
    async with RunningConsumer(world, nc, handler.url) as consumer:
        await publish(nc, event)
        await _until(world, nc, event.message_id, "processed")
    row = await inbox_row(world, event.message_id)
    assert row is not None and row["handler_status"] == status and row["processed_at"]
    [call] = handler.calls
    assert call["headers"]["Idempotency-Key"] == event.message_id
    body = call["body"]
    for name in (
        "message_id",
        "subject",
        "event_type",
        "event_version",
        "occurred_at",
        "correlation_id",
        "causation_id",
        "aggregate_type",
        "aggregate_id",
        "payload",
    ):
        assert name in body
    assert body["delivery"] == {
        "attempt": 1,
        "max_attempts": 4,
        "stream_sequence": 1,
        "durable": DURABLE,
    }
    assert consumer.stats.processed == 1


async def test_one_batch_with_200_and_409_keeps_each_status(
    world: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    """Rows of one batch are marked by status group; each keeps its own answer."""
    events = [envelope() for _ in range(5)]
    statuses = [200, 409, 200, 409, 200]
    for event, status in zip(events, statuses, strict=True):
        handler.scripts[event.message_id] = [status]
        await publish(nc, event)  # all in the stream before the first fetch: one batch
    async with RunningConsumer(world, nc, handler.url) as consumer:
        for event in events:
            await _until(world, nc, event.message_id, "processed")
    for event, status in zip(events, statuses, strict=True):
        row = await inbox_row(world, event.message_id)
        assert row is not None and row["handler_status"] == status and row["processed_at"]
    assert consumer.stats.processed == 5 and consumer.stats.fetched == 5


async def test_422_dead_letters_marks_failed_and_acks(
    world: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    event = envelope()
    handler.scripts[event.message_id] = [422]
    async with RunningConsumer(world, nc, handler.url):
        await publish(nc, event)
        await _until(world, nc, event.message_id, "failed")
    assert len(handler.calls) == 1
    [record] = await dead_letters(nc)
    assert record["message_id"] == event.message_id
    assert record["reasonCode"] == record["reason"] == "HANDLER_REJECTED"
    assert record["failedStream"] == STREAM and record["durable"] == DURABLE
    assert record["original_subject"] == "vibespro.event.vibe_created.v1"
    assert record["payload"]["payload"] == event.payload
    row = await inbox_row(world, event.message_id)
    assert row is not None and json.loads(row["dlq_metadata"])["reason"] == "HANDLER_REJECTED"


async def test_5xx_is_retried_and_processed_on_redelivery(
    world: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    event = envelope()
    handler.scripts[event.message_id] = [500, 503, 200]
    async with RunningConsumer(world, nc, handler.url):
        await publish(nc, event)
        await _until(world, nc, event.message_id, "processed")
    assert [c["body"]["delivery"]["attempt"] for c in handler.calls] == [1, 2, 3]
    assert handler.applied[event.message_id] == 1
    row = await inbox_row(world, event.message_id)
    assert row is not None
    assert [h["status"] for h in json.loads(row["retry_history"])] == [500, 503]
    assert row["attempts"] == 3


async def test_retry_after_is_honoured(world: Env, nc: NATS, handler: ScriptedHandler) -> None:
    event = envelope()
    handler.scripts[event.message_id] = [(503, {"Retry-After": "2"}), 200]
    async with RunningConsumer(world, nc, handler.url):
        await publish(nc, event)
        await _until(world, nc, event.message_id, "processed")
    # The ladder says 200 ms; the handler asked for 2 s, and got it.
    first, second = (c["at"] for c in handler.calls)
    assert second - first >= 1.9


async def test_timeout_is_retried(world: Env, nc: NATS, handler: ScriptedHandler) -> None:
    event = envelope()
    handler.scripts[event.message_id] = [1.5, 200]  # first call outlives the 1 s timeout
    async with RunningConsumer(world, nc, handler.url):
        await publish(nc, event)
        await _until(world, nc, event.message_id, "processed")
    row = await inbox_row(world, event.message_id)
    assert row is not None
    assert json.loads(row["retry_history"])[0]["reason"].startswith("handler_timeout")


async def test_connection_refused_until_max_deliver_then_dead_letter(env: Env, nc: NATS) -> None:
    from shared.access.streams import provision
    from tests.conftest import CAPS

    dead_url = f"http://127.0.0.1:{free_port()}/handle"  # nothing listens there
    fast_durable(env, dead_url)
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    event = envelope()
    dsns = {env.topology.contexts[c].database: env.dsn(c) for c in ("sea", "vibespro")}
    async with (
        RunningConsumer(env, nc, dead_url) as consumer,
        RunningRouter(env.topology, dsns, nc.jetstream()) as router,
    ):
        await publish(nc, event)
        await _until(env, nc, event.message_id, "failed")
    # The consumer gave up on the last delivery; JetStream's MAX_DELIVERIES advisory made
    # the dlq-router write the record, with the history the consumer kept.
    [record] = await dead_letters(nc)
    assert record["reasonCode"] == "MAX_DELIVERIES_EXCEEDED"
    assert record["source"] == "advisory:max_deliveries"
    assert record["attempts"] == 4
    assert [h["attempt"] for h in record["retryHistory"]] == [1, 2, 3, 4]
    assert all(h["reason"].startswith("handler_unreachable") for h in record["retryHistory"])
    assert consumer.stats.exhausted == 1 and consumer.stats.dead_lettered == 0
    assert router.stats.recorded == 1


async def test_slow_handler_is_kept_alive_by_heartbeats(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    from shared.access.streams import provision
    from tests.conftest import CAPS

    # ack_wait 2 s, handler takes 5 s: without in_progress JetStream would redeliver.
    fast_durable(env, handler.url, ack_wait="2s", handler={"url": handler.url, "timeout": "8s"})
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    event = envelope()
    handler.scripts[event.message_id] = [5.0]
    async with RunningConsumer(env, nc, handler.url):
        await publish(nc, event)
        await _until(env, nc, event.message_id, "processed", timeout=30)
    assert len(handler.calls) == 1


async def test_redelivered_processed_message_does_not_reach_the_handler(
    world: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    events = [envelope() for _ in range(5)]
    async with RunningConsumer(world, nc, handler.url):
        for event in events:
            await publish(nc, event)
        for event in events:
            await _until(world, nc, event.message_id, "processed")
    # Replay the whole stream to the durable: every message arrives a second time.
    js = nc.jetstream()
    info = await js.consumer_info(STREAM, DURABLE)
    await js.delete_consumer(STREAM, DURABLE)
    await js.add_consumer(STREAM, info.config)
    async with RunningConsumer(world, nc, handler.url) as consumer:
        await eventually(lambda: _duplicates(consumer, 5), timeout=20, what="5 duplicates")
    assert len(handler.calls) == 5
    row = await inbox_row(world, events[0].message_id)
    assert row is not None and row["duplicates"] == 1


async def _duplicates(consumer, n: int) -> bool:  # type: ignore[no-untyped-def]
    return bool(consumer.stats.duplicates == n)


async def test_concurrent_copies_of_one_id_call_the_handler_once(
    world: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    """Two copies in the stream (a replay under a fresh Nats-Msg-Id), two replicas."""
    handler.delay = 0.5
    event = envelope()
    await publish(nc, event, msg_id="copy-1")
    await publish(nc, event, msg_id="copy-2")
    async with RunningConsumer(world, nc, handler.url), RunningConsumer(world, nc, handler.url):
        await eventually(lambda: _settled(nc), timeout=20, what="both copies acked")
    assert len(handler.calls_for(event.message_id)) == 1
    row = await inbox_row(world, event.message_id)
    assert row is not None and row["status"] == "processed" and row["duplicates"] == 1


@pytest.mark.parametrize(
    ("subject", "data", "reason"),
    [
        ("vibespro.event.vibe_created.v1", b"{not json", "MALFORMED_JSON"),
        ("vibespro.event.vibe_created.v1", b"[1, 2]", "MALFORMED_ENVELOPE"),
        ("vibespro.event.vibe_created.v1", b'{"message_id": "a"}', "MISSING_FIELD"),
    ],
)
async def test_malformed_input_is_dead_lettered_with_its_reason(
    world: Env, nc: NATS, handler: ScriptedHandler, subject: str, data: bytes, reason: str
) -> None:
    async with RunningConsumer(world, nc, handler.url) as consumer:
        await publish_raw(nc, subject, data, msg_id="raw-1")
        await eventually(lambda: _settled(nc), timeout=20, what="malformed message acked")
    [record] = await dead_letters(nc)
    assert record["reasonCode"] == reason
    assert record["payload"] == data.decode()
    assert handler.calls == [] and consumer.stats.dead_lettered == 1


async def test_unknown_version_and_digest_mismatch_are_dead_lettered(
    world: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    unknown = envelope(version=9)
    tampered = envelope()
    doc = tampered.to_dict()
    doc["payload"]["title"] = "changed in transit"
    async with RunningConsumer(world, nc, handler.url):
        await publish(nc, unknown)
        await publish_raw(nc, tampered.subject, json.dumps(doc).encode(), tampered.message_id)
        await eventually(lambda: _settled(nc), timeout=20, what="both acked")
    reasons = {r["message_id"]: r["reasonCode"] for r in await dead_letters(nc)}
    assert reasons == {unknown.message_id: "UNKNOWN_EVENT", tampered.message_id: "DIGEST_MISMATCH"}
    assert handler.calls == []


async def test_v1_and_v2_are_handled_side_by_side(
    world: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    v1, v2 = envelope(version=1), envelope(version=2)
    async with RunningConsumer(world, nc, handler.url):
        await publish(nc, v1)
        await publish(nc, v2)
        await _until(world, nc, v2.message_id, "processed")
        await _until(world, nc, v1.message_id, "processed")
    versions = sorted(c["body"]["event_version"] for c in handler.calls)
    assert versions == [1, 2]


async def test_burst_is_processed_exactly_once(
    world: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    events = [envelope() for _ in range(300)]
    for index, event in enumerate(events):
        if index % 10 == 0:
            handler.scripts[event.message_id] = [503, 200]
    async with RunningConsumer(world, nc, handler.url) as consumer:
        await asyncio.gather(*(publish(nc, e) for e in events))
        await eventually(lambda: _settled(nc), timeout=60, what="300 settled")
    assert consumer.stats.processed == 300
    assert all(handler.applied[e.message_id] == 1 for e in events)
    assert len(handler.calls) == 330
