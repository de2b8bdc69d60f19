"""The per-message trace scopes: ``current(span)``, ``log_fields(...)`` and the handler
call's CLIENT span.

Each is entered for every message a consumer or handler serves, so they are plain
classes and a plain function rather than generators or coroutines of their own; these
tests pin what callers rely on: what is current inside, what is restored after (also
when the block raises), and that a request outside a recording span reaches aiohttp
untouched while one inside gets its CLIENT span and traceparent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

from shared import telemetry
from shared.telemetry.logcontext import log_context
from shared.telemetry.setup import _AioHttpClientSpans

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
SPAN_ID = 0x00F067AA0BA902B7


def unsampled() -> NonRecordingSpan:
    return NonRecordingSpan(SpanContext(TRACE_ID, SPAN_ID, True, TraceFlags(0)))


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Ferry's tracing on, every trace sampled, spans kept in memory; restored after."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    token = otel_context.attach(otel_context.get_current())
    telemetry.use_tracer_provider(provider)
    telemetry.instrument(provider)
    try:
        yield exporter
    finally:
        telemetry.uninstrument()
        telemetry.use_tracer_provider(None)
        provider.shutdown()
        otel_context.detach(token)


# --------------------------------------------------------------------------- current


def test_current_makes_the_span_current_and_restores_the_caller_s() -> None:
    outer = trace.get_current_span()
    span = unsampled()
    with telemetry.current(span):
        assert trace.get_current_span() is span
        # An unsampled span keeps library instrumentation suppressed inside.
        assert otel_context.get_value(_SUPPRESS_INSTRUMENTATION_KEY) is True
    assert trace.get_current_span() is outer


def test_current_restores_the_caller_s_span_when_the_block_raises() -> None:
    outer = trace.get_current_span()
    with pytest.raises(ZeroDivisionError), telemetry.current(unsampled()):
        _ = 1 / 0
    assert trace.get_current_span() is outer


def test_current_of_none_changes_nothing() -> None:
    before = otel_context.get_current()
    with telemetry.current(None):
        assert otel_context.get_current() is before
    assert otel_context.get_current() is before


def test_current_lifts_the_suppression_inside_a_recording_span(
    spans: InMemorySpanExporter,
) -> None:
    span = telemetry.start_span("work", kind=SpanKind.INTERNAL, attributes={})
    assert span is not None and span.is_recording()
    with telemetry.current(unsampled()):
        with telemetry.current(span):
            assert otel_context.get_value(_SUPPRESS_INSTRUMENTATION_KEY) is False
            assert trace.get_current_span() is span
        assert otel_context.get_value(_SUPPRESS_INSTRUMENTATION_KEY) is True
    span.end()


# --------------------------------------------------------------------------- log fields


def test_log_fields_are_on_lines_inside_and_gone_after() -> None:
    assert "message_id" not in log_context()
    with telemetry.log_fields(message_id="m-1", rewind=None):
        fields = log_context()
        assert fields["message_id"] == "m-1"
        assert "rewind" not in fields  # None is left out
        with telemetry.log_fields(durable="d"):
            assert log_context()["message_id"] == "m-1"  # nested: merged
            assert log_context()["durable"] == "d"
        assert "durable" not in log_context()
    assert "message_id" not in log_context()


def test_log_fields_are_restored_when_the_block_raises() -> None:
    with pytest.raises(KeyError), telemetry.log_fields(message_id="m-2"):
        raise KeyError("x")
    assert "message_id" not in log_context()


async def test_log_fields_stay_in_their_task() -> None:
    seen: dict[str, object] = {}

    async def other() -> None:
        await asyncio.sleep(0)
        seen.update(log_context())

    with telemetry.log_fields(message_id="mine"):
        task = asyncio.create_task(other())  # copies the context at creation: sees it
    outside = asyncio.create_task(other())
    await task
    assert seen.get("message_id") == "mine"
    seen.clear()
    await outside
    assert "message_id" not in seen


# --------------------------------------------------------------------------- client span


@pytest.fixture
async def echo_traceparent() -> AsyncIterator[TestServer]:
    async def handle(request: web.Request) -> web.Response:
        return web.Response(text=request.headers.get("traceparent", ""))

    app = web.Application()
    app.router.add_post("/handle", handle)
    async with TestServer(app) as server:
        yield server


async def test_a_request_outside_a_recording_span_reaches_aiohttp_untouched(
    spans: InMemorySpanExporter, echo_traceparent: TestServer
) -> None:
    url = echo_traceparent.make_url("/handle")
    async with aiohttp.ClientSession() as session:
        with telemetry.current(unsampled()):
            call = session._request("POST", url)
            # aiohttp's own coroutine, not one of ours around it: no frame of Ferry's
            # is resumed at each step of an untraced request.
            assert call.cr_code is _AioHttpClientSpans._original.__code__
            async with await call as response:
                assert await response.text() == ""
    assert spans.get_finished_spans() == ()


async def test_a_request_inside_a_recording_span_gets_a_client_span_and_its_context(
    spans: InMemorySpanExporter, echo_traceparent: TestServer
) -> None:
    url = echo_traceparent.make_url("/handle")
    parent = telemetry.start_span("process", kind=SpanKind.CONSUMER, attributes={})
    assert parent is not None
    async with aiohttp.ClientSession() as session:
        with telemetry.current(parent):
            async with session.post(url, headers={"X-Kept": "1"}) as response:
                sent = await response.text()
    parent.end()
    (client,) = [s for s in spans.get_finished_spans() if s.kind is SpanKind.CLIENT]
    assert client.name == "POST"
    assert client.parent is not None and client.parent.span_id == parent.get_span_context().span_id
    assert client.attributes is not None
    assert client.attributes["http.response.status_code"] == 200
    assert sent.split("-")[2] == f"{client.context.span_id:016x}"  # the server saw it


async def test_a_failed_request_ends_its_client_span_as_an_error(
    spans: InMemorySpanExporter,
) -> None:
    parent = telemetry.start_span("process", kind=SpanKind.CONSUMER, attributes={})
    assert parent is not None
    async with aiohttp.ClientSession() as session:
        with telemetry.current(parent), pytest.raises(aiohttp.ClientConnectionError):
            await session.post("http://127.0.0.1:9/handle")  # discard port: refused
    parent.end()
    (client,) = [s for s in spans.get_finished_spans() if s.kind is SpanKind.CLIENT]
    assert not client.status.is_ok
    assert client.attributes is not None
    assert client.attributes["error.type"] == "ClientConnectorError"
