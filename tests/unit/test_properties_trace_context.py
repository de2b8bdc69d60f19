"""Ferry's shortcut for W3C trace context (shared.telemetry.propagation) reads every
traceparent exactly as OpenTelemetry's propagator does: same ids, flags, validity."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from shared import telemetry

_PROPAGATOR = TraceContextTextMapPropagator()
_HEX = "0123456789abcdef"


def _seen(ctx: object) -> tuple[int, int, bool, int, bool]:
    sc = trace.get_current_span(ctx).get_span_context()  # type: ignore[arg-type]
    return sc.trace_id, sc.span_id, sc.is_remote, int(sc.trace_flags), sc.is_valid


def _field(size: int) -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(_HEX, min_size=size, max_size=size),
        st.just("0" * size),
        st.text(_HEX + "ABCDEF-x ", min_size=size - 1, max_size=size + 1),
    )


traceparents = st.one_of(
    st.builds(
        lambda v, t, s, f: f"{v}-{t}-{s}-{f}",
        st.sampled_from(["00", "01", "ff", "0", "zz"]),
        _field(32),
        _field(16),
        _field(2),
    ),
    st.text(max_size=80),
)


@given(traceparents)
def test_extract_reads_what_the_propagator_reads(traceparent: str) -> None:
    assert _seen(telemetry.extract({"traceparent": traceparent})) == _seen(
        _PROPAGATOR.extract({"traceparent": traceparent})
    )


@given(traceparents, st.sampled_from([None, "", "vendor=abc"]))
def test_remote_context_reads_what_the_propagator_reads(
    traceparent: str, tracestate: str | None
) -> None:
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    ours = trace.get_current_span(telemetry.remote_context(traceparent, tracestate))
    theirs = trace.get_current_span(_PROPAGATOR.extract(carrier))
    assert _seen(trace.set_span_in_context(ours)) == _seen(trace.set_span_in_context(theirs))
    assert ours.get_span_context().trace_state == theirs.get_span_context().trace_state


_unsampled_00 = st.builds(
    lambda t, s, f: f"00-{t}-{s}-{f:02x}",
    st.text(_HEX, min_size=32, max_size=32).filter(lambda v: v != "0" * 32),
    st.text(_HEX, min_size=16, max_size=16).filter(lambda v: v != "0" * 16),
    st.integers(0, 127).map(lambda f: f * 2),
)


@given(st.one_of(traceparents, _unsampled_00, _unsampled_00.map(lambda v: v + "\n")))
def test_an_unsampled_shortcut_is_what_start_span_gives_for_that_parent(
    traceparent: str,
) -> None:
    """Under a parent-based sampler, :func:`unsampled_span` answers for an unsampled
    caller exactly what starting a child of it would give (its context, not recording),
    and leaves every other traceparent to the ordinary path."""
    from opentelemetry.sdk.trace import TracerProvider

    from shared.telemetry.setup import build_sampler

    provider = TracerProvider(sampler=build_sampler("parentbased_traceidratio", 1.0))
    telemetry.use_tracer_provider(provider)
    try:
        ours = telemetry.unsampled_span(traceparent)
        child = telemetry.start_span(
            "process",
            kind=trace.SpanKind.CONSUMER,
            attributes={},
            parent=_PROPAGATOR.extract({"traceparent": traceparent}),
        )
        assert child is not None
        if ours is not None:  # None: the ordinary path decides, nothing to compare
            assert not ours.is_recording() and not child.is_recording()
            assert _seen(trace.set_span_in_context(ours)) == _seen(trace.set_span_in_context(child))
        child.end()
    finally:
        telemetry.use_tracer_provider(None)
        provider.shutdown()


def test_the_unsampled_shortcut_is_off_without_a_parent_based_sampler() -> None:
    unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
    assert telemetry.unsampled_span(unsampled) is None  # tracing off


@given(_unsampled_00)
def test_the_unsampled_shortcut_takes_every_plain_unsampled_caller(traceparent: str) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    from shared.telemetry.setup import build_sampler

    provider = TracerProvider(sampler=build_sampler("parentbased_traceidratio", 0.1))
    telemetry.use_tracer_provider(provider)
    try:
        span = telemetry.unsampled_span(traceparent)
        assert span is not None and not span.is_recording()
        carrier: dict[str, str] = {}
        telemetry.inject(carrier, span)
        assert carrier["traceparent"] == traceparent  # the context travels on unchanged
        # With a tracestate the ordinary path carries it on.
        assert telemetry.unsampled_span(traceparent, "vendor=abc") is None
    finally:
        telemetry.use_tracer_provider(None)
        provider.shutdown()


def test_a_trailing_newline_is_not_a_plain_unsampled_traceparent() -> None:
    from opentelemetry.sdk.trace import TracerProvider

    from shared.telemetry.setup import build_sampler

    provider = TracerProvider(sampler=build_sampler("parentbased_traceidratio", 0.1))
    telemetry.use_tracer_provider(provider)
    try:
        plain = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
        assert telemetry.passes_unchanged(plain)
        assert not telemetry.passes_unchanged(plain + "\n")
        assert telemetry.unsampled_span(plain + "\n") is None
    finally:
        telemetry.use_tracer_provider(None)
        provider.shutdown()
