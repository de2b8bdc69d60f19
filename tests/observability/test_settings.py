"""Telemetry settings: FERRY_* first, then the standard OTEL_* variables; bad values named."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import SpanKind

from shared import telemetry
from shared.domain.errors import ConfigurationError
from shared.runtime.settings import CommonSettings


def test_otel_variables_apply_and_ferry_ones_win(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FERRY_TRACES_EXPORTER", "FERRY_OTLP_PROTOCOL", "FERRY_TRACES_SAMPLER_ARG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.1")
    settings = CommonSettings()
    assert (settings.traces_exporter, settings.otlp_protocol) == ("otlp", "grpc")
    assert (settings.traces_sampler, settings.traces_sampler_arg) == (
        "parentbased_traceidratio",
        0.1,
    )
    monkeypatch.setenv("FERRY_TRACES_EXPORTER", "file")
    assert CommonSettings().traces_exporter == "file"
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert telemetry.exporter_names(CommonSettings()) == []


def test_tracing_is_off_by_default_and_costs_no_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FERRY_TRACES_EXPORTER", "OTEL_TRACES_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    handle = telemetry.setup_tracing("outbox-publisher", CommonSettings(), install_global=False)
    assert handle.provider is None and not telemetry.active()
    assert telemetry.start_span("x", kind=SpanKind.INTERNAL, attributes={}) is None


def test_bad_exporter_protocol_and_sampler_are_named() -> None:
    with pytest.raises(ConfigurationError, match=r"unknown exporter.*jaeger"):
        telemetry.exporter_names(CommonSettings(traces_exporter="otlp,jaeger"))
    with pytest.raises(ConfigurationError, match=r"FERRY_TRACES_SAMPLER.*'sometimes'"):
        telemetry.build_sampler("sometimes", 1.0)
    settings = CommonSettings(traces_exporter="otlp", otlp_protocol="carrier-pigeon")
    with pytest.raises(ConfigurationError, match="carrier-pigeon"):
        telemetry.setup_tracing("x", settings, install_global=False)
    assert not telemetry.active()


def test_sampler_keeps_ratio_of_new_traces_and_drops_orphan_queries() -> None:
    sampler = telemetry.build_sampler("parentbased_traceidratio", 0.1)
    kept = sum(
        sampler.should_sample(None, trace_id, "process s").decision is Decision.RECORD_AND_SAMPLE
        for trace_id in range(1, 2**64, 2**64 // 10_000)
    )
    assert 800 < kept < 1200  # the ratio is a threshold on the trace id: ~10 % of spread ids
    query = sampler.should_sample(None, 2**60, "SELECT", attributes={"db.system": "postgresql"})
    assert query.decision is Decision.DROP


def test_children_of_unsampled_traces_record_nothing_and_keep_the_decision() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=telemetry.build_sampler("parentbased_traceidratio", 0.1))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.use_tracer_provider(provider)
    try:
        trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
        for flags, recorded in (("00", False), ("01", True)):
            parent = telemetry.remote_context(f"00-{trace_id}-00f067aa0ba902b7-{flags}")
            span = telemetry.start_span("process s", kind=SpanKind.CONSUMER, attributes={},
                                        parent=parent)  # fmt: skip
            assert span is not None and span.is_recording() is recorded
            headers: dict[str, str] = {}
            telemetry.inject(headers, span)
            assert headers["traceparent"].split("-")[1] == trace_id
            assert headers["traceparent"].endswith(f"-{flags}")
            telemetry.end_span(span)
        assert [s.name for s in exporter.get_finished_spans()] == ["process s"]
    finally:
        telemetry.use_tracer_provider(None)
        provider.shutdown()


def _ordinary_hop(traceparent: str) -> tuple[bool, str | None]:
    """What the ordinary path does with ``traceparent``: recording?, injected header."""
    span = telemetry.start_span("publish s", kind=SpanKind.PRODUCER, attributes={},
                                parent=telemetry.remote_context(traceparent))  # fmt: skip
    assert span is not None
    headers: dict[str, str] = {}
    telemetry.inject(headers, span)
    recording = span.is_recording()
    telemetry.end_span(span)
    return recording, headers.get("traceparent")


_TID, _SID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
_RATIO = "parentbased_traceidratio"


@pytest.mark.parametrize(
    ("sampler", "traceparent", "passes"),
    [
        (_RATIO, f"00-{_TID}-{_SID}-00", True),
        ("parentbased_always_on", f"00-{_TID}-{_SID}-02", True),  # a flag beside 'sampled'
        (_RATIO, f"00-{_TID}-{_SID}-01", False),
        (_RATIO, f"00-{_TID}-{_SID}-03", False),
        (_RATIO, f"00-{'0' * 32}-{_SID}-00", False),
        (_RATIO, f"00-{_TID}-{'0' * 16}-00", False),
        (_RATIO, f"00-{_TID.upper()}-{_SID.upper()}-00", False),
        (_RATIO, f"01-{_TID}-{_SID}-00", False),
        (_RATIO, f" 00-{_TID}-{_SID}-00", False),
        (_RATIO, "garbage", False),
        ("always_on", f"00-{_TID}-{_SID}-00", False),  # not parent-based: a span of its own
    ],
)
def test_a_hop_passes_an_unsampled_traceparent_on_exactly_as_its_span_would(
    sampler: str, traceparent: str, passes: bool
) -> None:
    """``passes_unchanged`` is a shortcut of the ordinary path, never a different answer:
    where it says yes, the ordinary path records nothing and injects the same header."""
    assert not telemetry.passes_unchanged(traceparent)  # tracing off: no shortcut
    provider = TracerProvider(sampler=telemetry.build_sampler(sampler, 0.1))
    telemetry.use_tracer_provider(provider)
    try:
        assert telemetry.passes_unchanged(traceparent) is passes
        if passes:
            assert _ordinary_hop(traceparent) == (False, traceparent)
    finally:
        telemetry.use_tracer_provider(None)
        provider.shutdown()
