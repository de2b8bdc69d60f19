"""One trace per event: producer → outbox-publisher → inbox-consumer → handler service.

In-process, with the roles' own classes and the real example handler service, into an
in-memory exporter. The trace is checked span by span: names, kinds, parent/child links,
messaging semantic-convention attributes, and the trace context found where it travels
(the outbox row, the NATS headers, the HTTP request the handler received).
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import uuid

import asyncpg
import pytest
from nats.aio.client import Client as NATS
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from shared import telemetry
from shared.adapters.producer import record_event
from shared.runtime.logs import JsonFormatter
from tests.conftest import Env
from tests.consumer.conftest import DURABLE, STREAM, RunningConsumer, ScriptedHandler
from tests.helpers import RunningPublisher, eventually, stream_messages

from .conftest import handler_app, one, parent_of, trace_spans

pytestmark = pytest.mark.integration


async def record(env: Env, *, title: str = "t", traceparent: str | None = None) -> str:
    conn = await asyncpg.connect(env.dsn("vibespro"))
    try:
        async with conn.transaction():
            event_id = await record_event(
                conn,
                aggregate_type="vibe",
                aggregate_id=f"v-{uuid.uuid4().hex[:6]}",
                event_type="vibe_created",
                payload={"vibe_id": "v1", "title": title},
                traceparent=traceparent,
                context="vibespro",
            )
    finally:
        await conn.close()
    return str(event_id)


async def inbox_status(env: Env, message_id: str) -> str | None:
    conn = await asyncpg.connect(env.dsn("sea"))
    try:
        return await conn.fetchval(  # type: ignore[no-any-return]
            "SELECT status FROM inbox_messages WHERE durable = $1 AND message_id = $2",
            DURABLE,
            uuid.UUID(message_id),
        )
    finally:
        await conn.close()


async def outbox_traceparent(env: Env, message_id: str) -> str | None:
    conn = await asyncpg.connect(env.dsn("vibespro"))
    try:
        return await conn.fetchval(  # type: ignore[no-any-return]
            "SELECT traceparent FROM outbox_events WHERE id = $1", uuid.UUID(message_id)
        )
    finally:
        await conn.close()


def _hex_span(span_id: int) -> str:
    return f"{span_id:016x}"


async def test_one_trace_spans_producer_publisher_consumer_and_handler(
    sea_world: Env, nc: NATS, spans: InMemorySpanExporter
) -> None:
    env = sea_world
    async with handler_app(env, "sea") as app:
        env.doc["durables"][DURABLE]["handler"]["url"] = app.url
        env.write()
        message_id = await record(env)
        async with (
            RunningPublisher(env.topology, "vibespro", env.dsn("vibespro"), nc.jetstream()),
            RunningConsumer(env, nc, app.url),
        ):

            async def processed() -> bool:
                return await inbox_status(env, message_id) == "processed"

            await eventually(processed, timeout=20, what="the event processed")
            # The process span ends after the ack; give the settle a moment to finish.
            await asyncio.sleep(0.2)

    create = one(spans.get_finished_spans(), "create vibe_created.v1")
    trace = trace_spans(spans, create.context.trace_id)
    subject = "vibespro.event.vibe_created.v1"
    publish = one(trace, f"publish {subject}")
    process = one(trace, f"process {subject}")
    client = one([s for s in trace if s.kind == SpanKind.CLIENT], "POST")
    server = one(trace, "POST /handle")
    ack = one(trace, f"ack {subject}")

    # Parent/child: create → publish → process → POST → POST /handle; process → ack.
    assert create.parent is None
    assert parent_of(publish) == create.context.span_id
    assert parent_of(process) == publish.context.span_id
    assert parent_of(client) == process.context.span_id
    assert parent_of(server) == client.context.span_id
    assert parent_of(ack) == process.context.span_id
    assert (create.kind, publish.kind, process.kind, server.kind) == (
        SpanKind.PRODUCER, SpanKind.PRODUCER, SpanKind.CONSUMER, SpanKind.SERVER,
    )  # fmt: skip
    # The handler's own database work is inside its span (asyncpg instrumented).
    handler_queries = [s for s in trace if parent_of(s) == server.context.span_id]
    assert handler_queries
    assert all(s.attributes["db.system"] == "postgresql" for s in handler_queries)

    # Messaging semantic conventions.
    for span, operation_type in ((create, "create"), (publish, "send"), (process, "process"),
                                 (ack, "settle")):  # fmt: skip
        assert span.attributes["messaging.system"] == "nats"
        assert span.attributes["messaging.operation.type"] == operation_type
        assert span.attributes["messaging.message.id"] == message_id
    for span in (publish, process, ack):
        assert span.attributes["messaging.destination.name"] == subject
    assert process.attributes["messaging.consumer.group.name"] == DURABLE
    assert ack.attributes["messaging.operation.name"] == "ack"
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["messaging.message.id"] == message_id

    # The fetch's receive span is a trace of its own, linked to the message.
    receive = [s for s in spans.get_finished_spans() if s.name == f"receive {STREAM}"]
    assert any(link.context.span_id == publish.context.span_id for s in receive for link in s.links)
    assert all(s.attributes["messaging.operation.type"] == "receive" for s in receive)

    # Where the context travels: the outbox row holds create's, the NATS headers publish's.
    trace_hex = f"{create.context.trace_id:032x}"
    stored = await outbox_traceparent(env, message_id)
    assert stored is not None and stored.split("-")[1:3] == [
        trace_hex,
        _hex_span(create.context.span_id),
    ]
    [msg] = [m for m in await stream_messages(nc.jetstream(), STREAM) if m.msg_id == message_id]
    assert msg.headers["traceparent"].split("-")[1:3] == [
        trace_hex,
        _hex_span(publish.context.span_id),
    ]


async def test_context_travels_unchanged_with_tracing_off(
    sea_world: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    """Tracing off: the producer's own traceparent reaches the handler, in NATS and HTTP."""
    assert not telemetry.active()
    caller = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"
    message_id = await record(sea_world, traceparent=caller)
    assert await outbox_traceparent(sea_world, message_id) == caller
    async with (
        RunningPublisher(sea_world.topology, "vibespro", sea_world.dsn("vibespro"), nc.jetstream()),
        RunningConsumer(sea_world, nc, handler.url),
    ):

        async def called() -> bool:
            return bool(handler.calls_for(message_id))

        await eventually(called, timeout=20, what="the handler called")
    [msg] = [m for m in await stream_messages(nc.jetstream(), STREAM) if m.msg_id == message_id]
    assert msg.headers["traceparent"] == caller
    assert handler.calls_for(message_id)[0]["headers"]["traceparent"] == caller


async def test_an_unsampled_event_is_published_with_its_own_traceparent_and_no_span(
    sea_world: Env, nc: NATS, spans: InMemorySpanExporter
) -> None:
    """Tracing on, producer unsampled: the stream carries the row's traceparent and
    tracestate as stored, and the publisher records nothing for it."""
    caller = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-00"
    message_id = await record(sea_world, traceparent=caller)
    stored = await outbox_traceparent(sea_world, message_id)
    assert stored is not None and stored.split("-")[1] == caller.split("-")[1]
    assert stored.endswith("-00")
    conn = await asyncpg.connect(sea_world.dsn("vibespro"))
    try:
        await conn.execute(
            "UPDATE outbox_events SET tracestate = 'ferry=t61rcWkgMzE' WHERE id = $1",
            uuid.UUID(message_id),
        )
    finally:
        await conn.close()
    async with RunningPublisher(
        sea_world.topology, "vibespro", sea_world.dsn("vibespro"), nc.jetstream()
    ):

        async def published() -> bool:
            stored = await stream_messages(nc.jetstream(), STREAM)
            return any(m.msg_id == message_id for m in stored)

        await eventually(published, timeout=20, what="the event in the stream")
    [msg] = [m for m in await stream_messages(nc.jetstream(), STREAM) if m.msg_id == message_id]
    assert msg.headers["traceparent"] == stored
    assert msg.headers["tracestate"] == "ferry=t61rcWkgMzE"
    trace_hex = caller.split("-")[1]
    traced = [s for s in spans.get_finished_spans() if f"{s.context.trace_id:032x}" == trace_hex]
    assert traced == []


async def test_log_lines_carry_trace_ids_durable_and_message_id(
    sea_world: Env, nc: NATS, handler: ScriptedHandler, spans: InMemorySpanExporter
) -> None:
    """A dead-lettered message's log line names durable, message id, trace and span."""
    buffer = io.StringIO()
    sink = logging.StreamHandler(buffer)
    sink.setFormatter(JsonFormatter("inbox-consumer"))
    logger = logging.getLogger("ferry")
    logger.addHandler(sink)
    previous = logger.level
    logger.setLevel(logging.INFO)
    try:
        message_id = await record(sea_world)
        handler.scripts[message_id] = [422]
        async with (
            RunningPublisher(
                sea_world.topology, "vibespro", sea_world.dsn("vibespro"), nc.jetstream()
            ),
            RunningConsumer(sea_world, nc, handler.url),
        ):

            async def dead_lettered() -> bool:
                return await inbox_status(sea_world, message_id) == "failed"

            await eventually(dead_lettered, timeout=20, what="the message dead-lettered")
            await asyncio.sleep(0.2)
    finally:
        logger.removeHandler(sink)
        logger.setLevel(previous)
    lines = [json.loads(line) for line in buffer.getvalue().splitlines()]
    [line] = [x for x in lines if x["message"] == "dead-lettered"]
    process = one(spans.get_finished_spans(), "process vibespro.event.vibe_created.v1")
    assert line["durable"] == DURABLE
    assert line["message_id"] == message_id
    assert line["trace_id"] == f"{process.context.trace_id:032x}"
    assert len(line["span_id"]) == 16
    assert line["role"] == "inbox-consumer"
    assert {"time", "level"} <= set(line)
    # The dead letter's publish is in the same trace, its process span marked failed.
    trace = trace_spans(spans, process.context.trace_id)
    dlq = one(trace, "publish sea.dlq.sea__from_vibespro")
    assert parent_of(dlq) is not None
    assert process.status.status_code.name == "ERROR"
    assert one(trace, "term vibespro.event.vibe_created.v1").parent is not None
