"""Spans leave each role process the configured way and join into one trace.

The producer records the event here (in-memory exporter); the outbox-publisher exports
over OTLP/gRPC and the inbox-consumer over OTLP/HTTP, each to a test receiver speaking
the real OTLP protobuf protocol; the example handler service writes its spans to a file.
Put together, the spans make one trace with the right parents and ``service.name`` per
role; the consumer's and the handler's JSON log lines about the event carry its trace id.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import grpc
import pytest
from aiohttp import web
from nats.aio.client import Client as NATS
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from devstack.ports import free_port
from shared.adapters.producer import record_event
from tests.conftest import Env
from tests.consumer.conftest import DURABLE
from tests.helpers import eventually

from .conftest import Roles, one, wait_ready

pytestmark = pytest.mark.integration

#: Export every 100 ms instead of every 5 s (the SDK reads it).
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}


@dataclass
class Span:
    """A span as it arrived, whatever the transport."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    attributes: dict[str, Any] = field(default_factory=dict)


def _from_otlp(request: trace_service_pb2.ExportTraceServiceRequest) -> list[Span]:
    out = []
    for resource_spans in request.resource_spans:
        attrs = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
        for scope in resource_spans.scope_spans:
            for s in scope.spans:
                out.append(
                    Span(
                        attrs.get("service.name", ""),
                        s.name,
                        s.trace_id.hex(),
                        s.span_id.hex(),
                        s.parent_span_id.hex() or None,
                        {a.key: a.value.string_value for a in s.attributes},
                    )
                )
    return out


class _GrpcReceiver(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.spans: list[Span] = []

    async def Export(self, request: Any, context: Any) -> Any:  # the gRPC method name
        self.spans.extend(_from_otlp(request))
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
async def grpc_receiver() -> AsyncIterator[tuple[_GrpcReceiver, int]]:
    receiver = _GrpcReceiver()
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield receiver, port
    finally:
        await server.stop(None)


@pytest.fixture
async def http_receiver() -> AsyncIterator[tuple[list[Span], int]]:
    spans: list[Span] = []

    async def export(request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        parsed = trace_service_pb2.ExportTraceServiceRequest.FromString(await request.read())
        spans.extend(_from_otlp(parsed))
        body = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", export)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield spans, port
    finally:
        await runner.cleanup()


def _from_file(path: Path) -> list[Span]:
    out = []
    for line in path.read_text().splitlines():
        doc = json.loads(line)
        out.append(
            Span(
                doc["resource"]["attributes"]["service.name"],
                doc["name"],
                doc["context"]["trace_id"].removeprefix("0x"),
                doc["context"]["span_id"].removeprefix("0x"),
                (doc["parent_id"] or "").removeprefix("0x") or None,
                doc["attributes"],
            )
        )
    return out


async def test_spans_reach_otlp_grpc_otlp_http_and_a_file_as_one_trace(
    sea_world: Env,
    nc: NATS,
    roles: Roles,
    spans: InMemorySpanExporter,
    grpc_receiver: tuple[_GrpcReceiver, int],
    http_receiver: tuple[list[Span], int],
) -> None:
    env = sea_world
    handler_port, spans_file = free_port(), env.tmp_path / "handler-spans.jsonl"
    env.doc["durables"][DURABLE]["handler"]["url"] = f"http://127.0.0.1:{handler_port}/handle"
    env.write()
    grpc_spans, grpc_port = grpc_receiver[0].spans, grpc_receiver[1]
    http_spans, http_port = http_receiver
    ports = {"handler": handler_port, "publisher": free_port(), "consumer": free_port()}
    procs = {
        "handler": roles.start(
            "handler", ["services.handlers", "--service", "sea", "--port", str(handler_port)],
            FERRY_HANDLER_FAULT_INJECTION="true",  # the poison event is a _ferry_test directive
            FERRY_TRACES_EXPORTER="file", FERRY_TRACES_FILE=str(spans_file), **FAST_EXPORT,
        ),
        "publisher": roles.start(
            "publisher", ["services.outbox_publisher", "--context", "vibespro"],
            FERRY_HEALTH_PORT=str(ports["publisher"]), OTEL_TRACES_EXPORTER="otlp",
            OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{grpc_port}", **FAST_EXPORT,
        ),
        "consumer": roles.start(
            "consumer", ["services.inbox_consumer", "--durable", DURABLE],
            FERRY_HEALTH_PORT=str(ports["consumer"]), FERRY_TRACES_EXPORTER="otlp",
            FERRY_OTLP_PROTOCOL="http/protobuf", FERRY_OTLP_ENDPOINT=f"http://127.0.0.1:{http_port}",
            FERRY_FETCH_TIMEOUT="0.2", **FAST_EXPORT,
        ),
    }  # fmt: skip
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        for name, port in ports.items():
            await wait_ready(session, port, procs[name], name)
    good, bad = await _record(env, {}), await _record(env, {"poison": True})

    async def exported() -> bool:
        names = {s.name for s in http_spans}
        return {
            "ack vibespro.event.vibe_created.v1",
            "term vibespro.event.vibe_created.v1",
        } <= names

    await eventually(exported, timeout=30, what="the consumer's spans over OTLP/HTTP")
    for name in ("publisher", "consumer", "handler"):
        assert await roles.stop(name) == 0  # a clean stop flushes the last spans

    create = _create(spans, good)
    trace_id = f"{create.context.trace_id:032x}"
    received = [*grpc_spans, *http_spans, *_from_file(spans_file)]
    trace = [s for s in received if s.trace_id == trace_id]
    by_name = {s.name: s for s in trace}
    publish = by_name["publish vibespro.event.vibe_created.v1"]
    process = by_name["process vibespro.event.vibe_created.v1"]
    server = by_name["POST /handle"]
    client = next(s for s in trace if s.name == "POST" and s.parent_id == process.span_id)
    assert publish.parent_id == f"{create.context.span_id:016x}"
    assert (publish.service, process.service, client.service, server.service) == (
        "outbox-publisher", "inbox-consumer", "inbox-consumer", "handler-sea",
    )  # fmt: skip
    assert process.parent_id == publish.span_id
    assert server.parent_id == client.span_id
    assert server.attributes["messaging.message.id"] == good
    # Database spans of the handler's transaction, in the file with the rest of its spans.
    assert any(s.parent_id == server.span_id and s.service == "handler-sea" for s in trace)

    # Logs: the consumer's and the handler's lines about the poison event name its trace.
    bad_create = _create(spans, bad)
    bad_trace = f"{bad_create.context.trace_id:032x}"
    consumer_lines = [json.loads(x) for x in roles.log_lines("consumer") if x.startswith("{")]
    [dead] = [x for x in consumer_lines if x["message"] == "dead-lettered"]
    assert (dead["durable"], dead["message_id"], dead["trace_id"]) == (DURABLE, bad, bad_trace)
    assert dead["role"] == "inbox-consumer" and len(dead["span_id"]) == 16
    handler_lines = [json.loads(x) for x in roles.log_lines("handler") if x.startswith("{")]
    [answered] = [x for x in handler_lines if x.get("message_id") == bad]
    assert answered["trace_id"] == bad_trace and answered["role"] == "handler-sea"


def _create(spans: InMemorySpanExporter, message_id: str) -> Any:
    return one(
        [
            s
            for s in spans.get_finished_spans()
            if (s.attributes or {}).get("messaging.message.id") == message_id
        ],
        "create vibe_created.v1",
    )


async def _record(env: Env, faults: dict[str, Any]) -> str:
    payload: dict[str, Any] = {"vibe_id": f"v-{uuid.uuid4().hex[:6]}", "title": "t"}
    if faults:
        payload["_ferry_test"] = faults
    conn = await asyncpg.connect(env.dsn("vibespro"))
    try:
        async with conn.transaction():
            event_id = await record_event(
                conn,
                aggregate_type="vibe",
                aggregate_id=payload["vibe_id"],
                event_type="vibe_created",
                payload=payload,
                context="vibespro",
            )
    finally:
        await conn.close()
    return str(event_id)
