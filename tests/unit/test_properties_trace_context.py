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
