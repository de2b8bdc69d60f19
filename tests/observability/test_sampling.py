"""Sampling decided once, at the producer, and honoured end to end (parent-based).

Tracing on with ``parentbased_traceidratio`` at 0: a new trace is never sampled, so an
event recorded without a caller's context leaves no span anywhere, yet its traceparent
(flag clear) still travels outbox row → NATS headers → HTTP request, so that whatever
runs downstream sees the same trace and the same decision. A caller that did sample its
trace gets the whole trace, producer to handler, whatever the ratio says.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from nats.aio.client import Client as NATS
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from shared import telemetry
from shared.telemetry.setup import build_sampler
from tests.conftest import Env
from tests.consumer.conftest import DURABLE, STREAM, RunningConsumer, ScriptedHandler
from tests.helpers import RunningPublisher, eventually, stream_messages

from .conftest import handler_app, one, parent_of, trace_spans
from .test_traces import inbox_status, outbox_traceparent, record

pytestmark = pytest.mark.integration

SUBJECT = "vibespro.event.vibe_created.v1"


@pytest.fixture
def ratio_zero() -> Iterator[InMemorySpanExporter]:
    """Ferry's tracing on with the roles' sampler at parentbased_traceidratio 0."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({SERVICE_NAME: "ferry-test"}),
        sampler=build_sampler("parentbased_traceidratio", 0.0),
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.use_tracer_provider(provider)
    telemetry.instrument(provider)
    try:
        yield exporter
    finally:
        telemetry.uninstrument()
        telemetry.use_tracer_provider(None)
        provider.shutdown()


def _ids(traceparent: str) -> tuple[str, bool]:
    """(trace id, sampled flag) of a traceparent."""
    parts = traceparent.split("-")
    return parts[1], bool(int(parts[3], 16) & 1)


async def test_an_unsampled_trace_exports_nothing_and_its_context_still_travels(
    sea_world: Env, nc: NATS, handler: ScriptedHandler, ratio_zero: InMemorySpanExporter
) -> None:
    assert telemetry.active()
    message_id = await record(sea_world)  # no caller context: the producer starts the trace
    stored = await outbox_traceparent(sea_world, message_id)
    assert stored is not None
    trace_id, sampled = _ids(stored)
    assert not sampled  # decided once, at the producer
    async with (
        RunningPublisher(sea_world.topology, "vibespro", sea_world.dsn("vibespro"), nc.jetstream()),
        RunningConsumer(sea_world, nc, handler.url),
    ):

        async def processed() -> bool:
            return await inbox_status(sea_world, message_id) == "processed"

        await eventually(processed, timeout=20, what="the event processed")
        await asyncio.sleep(0.2)  # the settle after the mark
    [msg] = [m for m in await stream_messages(nc.jetstream(), STREAM) if m.msg_id == message_id]
    assert msg.headers["traceparent"] == stored
    received = handler.calls_for(message_id)[0]["headers"]["traceparent"]
    assert _ids(received) == (trace_id, False)
    # Nothing at all: no create/publish/process/ack span, no receive span, no query span.
    assert ratio_zero.get_finished_spans() == ()


async def test_a_sampled_caller_gets_its_whole_trace_whatever_the_ratio(
    sea_world: Env, nc: NATS, ratio_zero: InMemorySpanExporter
) -> None:
    env = sea_world
    caller_trace = uuid.uuid4().hex
    caller = f"00-{caller_trace}-{uuid.uuid4().hex[:16]}-01"
    async with handler_app(env, "sea") as app:
        env.doc["durables"][DURABLE]["handler"]["url"] = app.url
        env.write()
        sampled_id = await record(env, traceparent=caller)
        unsampled_id = await record(env)  # beside it, at ratio 0: not sampled
        async with (
            RunningPublisher(env.topology, "vibespro", env.dsn("vibespro"), nc.jetstream()),
            RunningConsumer(env, nc, app.url),
        ):

            async def processed() -> bool:
                statuses = [await inbox_status(env, i) for i in (sampled_id, unsampled_id)]
                return statuses == ["processed", "processed"]

            await eventually(processed, timeout=20, what="both events processed")
            await asyncio.sleep(0.2)

    finished = ratio_zero.get_finished_spans()
    # Every exported span belongs to the sampled caller's trace (receive spans, roots of
    # their own at ratio 0, are not sampled either).
    assert {f"{s.context.trace_id:032x}" for s in finished} == {caller_trace}
    trace = trace_spans(ratio_zero, int(caller_trace, 16))
    create = one(trace, "create vibe_created.v1")
    publish = one(trace, f"publish {SUBJECT}")
    process = one(trace, f"process {SUBJECT}")
    client = one([s for s in trace if s.kind == SpanKind.CLIENT], "POST")
    server = one(trace, "POST /handle")
    ack = one(trace, f"ack {SUBJECT}")
    assert f"{parent_of(create):016x}" == caller.split("-")[2]
    assert parent_of(publish) == create.context.span_id
    assert parent_of(process) == publish.context.span_id
    assert parent_of(client) == process.context.span_id
    assert client.attributes is not None and client.attributes["url.full"] == app.url
    assert client.attributes["server.address"] == "127.0.0.1"
    assert parent_of(server) == client.context.span_id
    assert parent_of(ack) == process.context.span_id
    assert all(s.context.trace_flags.sampled for s in trace)
    assert process.attributes["messaging.message.id"] == sampled_id
    assert process.attributes["messaging.consumer.group.name"] == DURABLE
    # The handler's queries are traced inside the sampled message only.
    assert [s for s in trace if parent_of(s) == server.context.span_id]
    stored = await outbox_traceparent(env, unsampled_id)
    assert stored is not None and _ids(stored)[1] is False
