"""Ferry's OTLP span encoder (shared.telemetry.otlp_wire) writes, for any spans, the
request OpenTelemetry's own encoder writes: compared message to message, in their
deterministic serialisation, on spans the SDK recorded and on spans built by hand."""

from __future__ import annotations

import itertools
import logging
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http import trace_exporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    set_span_in_context,
)
from opentelemetry.trace.span import TraceState

from shared.telemetry import otlp_wire

_INT64 = 1 << 63

keys = st.text(min_size=0, max_size=12)
scalars = st.one_of(
    st.text(max_size=30),
    st.booleans(),
    st.integers(min_value=-_INT64, max_value=_INT64 - 1),
    st.integers(),  # beyond int64 too: both encoders leave such an attribute out
    st.floats(allow_nan=True, allow_infinity=True),
    st.binary(max_size=20),
)
homogeneous = st.one_of(
    st.lists(st.text(max_size=8), max_size=4).map(tuple),
    st.lists(st.booleans(), max_size=4).map(tuple),
    st.lists(st.integers(min_value=-_INT64, max_value=_INT64 - 1), max_size=4).map(tuple),
    st.lists(st.floats(), max_size=4).map(tuple),
)
sdk_attributes = st.dictionaries(keys, st.one_of(scalars, homogeneous), max_size=8)
#: What a hand-built ReadableSpan may carry, past the SDK's checks: nested mappings,
#: lists, mixed sequences, None, objects no encoder knows.
loose_values = st.recursive(
    st.one_of(scalars, st.none(), st.just(object()), st.just(-0.0), st.just(0.0)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=5), inner, max_size=3),
    ),
    max_leaves=8,
)
loose_attributes = st.dictionaries(keys, loose_values, max_size=6)
ids = st.integers(min_value=0, max_value=(1 << 64) - 1)
trace_ids = st.integers(min_value=0, max_value=(1 << 128) - 1)
states = st.one_of(
    st.none(),
    st.lists(
        st.tuples(st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True),
                  st.from_regex(r"[a-zA-Z0-9]{1,8}", fullmatch=True)),
        max_size=3, unique_by=lambda kv: kv[0],
    ).map(TraceState),
)  # fmt: skip
contexts = st.builds(
    SpanContext,
    trace_ids,
    ids,
    st.booleans(),
    st.sampled_from([TraceFlags(0), TraceFlags(TraceFlags.SAMPLED)]),
    states,
)
statuses = st.one_of(
    st.builds(Status, st.sampled_from(list(StatusCode)), st.one_of(st.none(), st.text(max_size=20)))
)


def _same(spans: list[ReadableSpan]) -> None:
    expected = encode_spans(spans)
    mine = ExportTraceServiceRequest.FromString(otlp_wire.encode_request(spans))
    assert mine.SerializeToString(deterministic=True) == expected.SerializeToString(
        deterministic=True
    )


class _CountingIds(IdGenerator):
    """Ids from a counter: hypothesis wants no ``random`` inside its strategies."""

    def __init__(self) -> None:
        self._next = itertools.count(0x0123456789ABCDEF)

    def generate_span_id(self) -> int:
        return next(self._next)

    def generate_trace_id(self) -> int:
        return next(self._next) << 64 | 0x42


@st.composite
def recorded_spans(draw: st.DrawFn) -> list[ReadableSpan]:
    """Spans recorded by the SDK, limits low enough to drop attributes, events, links."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create(draw(st.dictionaries(keys, scalars, max_size=3))),
        id_generator=_CountingIds(),
        span_limits=SpanLimits(max_span_attributes=4, max_events=2, max_links=2,
                               max_event_attributes=2, max_link_attributes=2),
    )  # fmt: skip
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    scopes = [("ferry", None, None), ("lib", "1.2", "https://example.com/schema")]
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        name, version, schema = draw(st.sampled_from(scopes))
        tracer = provider.get_tracer(name, version, schema_url=schema)
        parent = draw(st.one_of(st.none(), contexts))
        links = draw(st.lists(st.tuples(contexts, sdk_attributes), max_size=3))
        events = draw(st.lists(st.tuples(st.text(max_size=8), sdk_attributes), max_size=3))
        span = tracer.start_span(
            draw(st.text(max_size=20)),
            context=set_span_in_context(NonRecordingSpan(parent)) if parent else None,
            kind=draw(st.sampled_from(list(SpanKind))),
            attributes=draw(sdk_attributes),
            links=[Link(c, a) for c, a in links],
        )
        for event_name, attrs in events:
            span.add_event(event_name, attrs)
        span.set_status(draw(statuses))
        span.end()
    return list(exporter.get_finished_spans())


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=150)
@given(recorded_spans())
def test_recorded_spans_encode_as_opentelemetry_encodes_them(spans: list[ReadableSpan]) -> None:
    _same(spans)


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=150)
@given(
    st.lists(
        st.tuples(contexts, st.one_of(st.none(), contexts), loose_attributes,
                  st.sampled_from(list(SpanKind)), st.integers(0, 2), statuses,
                  st.lists(st.tuples(st.text(max_size=5), loose_attributes,
                                     st.integers(0, (1 << 64) - 1)), max_size=2)),
        min_size=1, max_size=5,
    )
)  # fmt: skip
def test_hand_built_spans_encode_as_opentelemetry_encodes_them(draws: list[Any]) -> None:
    resources = [Resource({"service.name": "a"}), Resource({"service.name": "a"}),
                 Resource({"service.name": "b"}, schema_url="https://example.com/r")]  # fmt: skip
    spans = [
        ReadableSpan(
            name="span", context=ctx, parent=parent, attributes=attributes, kind=kind,
            resource=resources[which], status=status,
            events=[Event(n, a, timestamp=t) for n, a, t in events],
            start_time=1, end_time=2,
        )
        for ctx, parent, attributes, kind, which, status, events in draws
    ]  # fmt: skip
    _same(spans)


def test_equal_values_of_other_types_are_not_confused_by_the_cache() -> None:
    """0.0 and -0.0, True and 1, (True,) and (1,) compare equal but encode differently."""
    ctx = SpanContext(1, 2, False)
    spans = [
        ReadableSpan("s", ctx, attributes={"v": value}, resource=Resource({}))
        for value in (0.0, -0.0, 1, True, (1,), (True,), 1.0, "1")
    ]
    _same(spans)
    values = [
        ExportTraceServiceRequest.FromString(otlp_wire.encode_request([s]))
        .resource_spans[0].scope_spans[0].spans[0].attributes[0].value
        for s in spans
    ]  # fmt: skip
    assert math.copysign(1, values[1].double_value) == -1
    assert values[3].HasField("bool_value") and values[2].HasField("int_value")
    assert values[5].array_value.values[0].HasField("bool_value")


def test_an_attribute_no_encoder_can_write_is_left_out_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    spans = [ReadableSpan("s", SpanContext(1, 2, False), resource=Resource({}),
                          attributes={"huge": 1 << 70, "odd": object(), "bad": "\ud800",
                                      7: "a key that is not text", "kept": "yes"})]  # fmt: skip
    with caplog.at_level(logging.WARNING, "ferry.telemetry"):
        request = ExportTraceServiceRequest.FromString(otlp_wire.encode_request(spans))
    attributes = request.resource_spans[0].scope_spans[0].spans[0].attributes
    assert [a.key for a in attributes] == ["kept"]
    assert {"huge", "odd", "bad", 7} <= {r.args[0] for r in caplog.records}  # type: ignore[index]
    _same(spans)


def test_the_check_on_sample_spans_passes_and_catches_a_difference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    samples = otlp_wire.sample_spans()
    assert {s.kind for s in samples} == set(SpanKind)
    assert otlp_wire.agrees(encode_spans, samples)
    original = otlp_wire._span
    monkeypatch.setattr(otlp_wire, "_span", lambda span: original(span)[:-6])  # no flags
    assert not otlp_wire.agrees(encode_spans, samples)


@pytest.fixture
def reference_restored() -> Any:
    otlp_wire.uninstall()
    yield
    otlp_wire.uninstall()


def test_install_gives_the_http_exporter_the_fast_encoder(reference_restored: None) -> None:
    reference = trace_exporter.encode_spans
    assert otlp_wire.install() and otlp_wire.install()  # a second call changes nothing
    spans = otlp_wire.sample_spans()
    request = trace_exporter.encode_spans(spans)
    assert request.SerializePartialToString() == otlp_wire.encode_request(spans)
    assert request.resource_spans == reference(spans).resource_spans  # the rest: theirs
    otlp_wire.uninstall()
    assert trace_exporter.encode_spans is reference


def test_a_disagreeing_encoder_is_not_installed(
    reference_restored: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    reference = trace_exporter.encode_spans
    monkeypatch.setattr(otlp_wire, "agrees", lambda *_: False)
    with caplog.at_level(logging.WARNING, "ferry.telemetry"):
        assert not otlp_wire.install()
    assert trace_exporter.encode_spans is reference
    assert "disagrees" in caplog.text


def test_a_batch_the_fast_encoder_fails_on_goes_to_the_reference(
    reference_restored: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert otlp_wire.install()
    spans = otlp_wire.sample_spans()

    def broken(span: ReadableSpan) -> bytes:
        raise RuntimeError("surprise")

    monkeypatch.setattr(otlp_wire, "_span", broken)
    with caplog.at_level(logging.ERROR, "ferry.telemetry"):
        data = trace_exporter.encode_spans(spans).SerializePartialToString()
    assert data == encode_spans(spans).SerializePartialToString()
    assert "fast OTLP encoder failed" in caplog.text
