"""W3C trace context: into and out of NATS and HTTP headers and stored traceparents.

The outbox row, the NATS headers and the HTTP headers carry W3C trace context only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.trace import Link, Span, SpanContext, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from shared.telemetry.provider import _state

if TYPE_CHECKING:
    from opentelemetry.context import Context

# W3C trace context only: it is what the outbox row, NATS and HTTP headers carry.
_PROPAGATOR: TextMapPropagator = TraceContextTextMapPropagator()
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")
#: A well-formed version-00 traceparent with non-zero ids whose sampled flag is clear.
#: A well-formed version-00 traceparent with non-zero ids (any flags).
_VERSION_00 = re.compile(r"^00-((?!0{32})[0-9a-f]{32})-((?!0{16})[0-9a-f]{16})-([0-9a-f]{2})$")
_UNSAMPLED = re.compile(r"^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f][02468ace]$")


def inject(headers: MutableMapping[str, str], span: Span | None = None) -> None:
    """Write ``span``'s (default: the current) W3C trace context into ``headers``."""
    ctx = trace.set_span_in_context(span) if span is not None else None
    _PROPAGATOR.inject(headers, context=ctx)


def _plain(traceparent: str | None) -> Context | None:
    """The context of a well-formed version-00 ``traceparent`` without tracestate, built
    directly (what the propagator would build, without its carrier copy and parsing);
    None when the propagator must decide."""
    if traceparent is None or len(traceparent) != 55:
        return None
    found = _VERSION_00.match(traceparent)
    if found is None:
        return None
    trace_id, span_id, flags = found.groups()
    return trace.set_span_in_context(
        trace.NonRecordingSpan(
            SpanContext(int(trace_id, 16), int(span_id, 16), True, TraceFlags(int(flags, 16)))
        )
    )


def extract(headers: Mapping[str, str] | None) -> Context:
    """The W3C trace context carried by ``headers`` (empty context when none)."""
    if headers and "tracestate" not in headers:
        ctx = _plain(headers.get("traceparent"))
        if ctx is not None:  # the common case: once per message, skip the propagator
            return ctx
    return _PROPAGATOR.extract(dict(headers or {}))


def remote_context(traceparent: str | None, tracestate: str | None = None) -> Context:
    """The context a stored traceparent (outbox row, dead letter) stands for."""
    if not tracestate:
        ctx = _plain(traceparent)
        if ctx is not None:
            return ctx
    carrier = {"traceparent": traceparent} if traceparent else {}
    if traceparent and tracestate:
        carrier["tracestate"] = tracestate
    return _PROPAGATOR.extract(carrier)


def passes_unchanged(traceparent: str | None) -> bool:
    """Whether a hop's span under ``traceparent`` would carry that same traceparent on.

    True when tracing is on with a parent-based sampler and ``traceparent`` is a
    well-formed, unsampled W3C one. The hop's span would then be a non-recording copy
    of its parent (see :func:`start_span`), and injecting it would write ``traceparent``
    again, byte for byte: a hop that only forwards the context can keep the header it
    has and build nothing. Anything else (sampled, malformed, another version, tracing
    off or not parent-based) answers False, and the hop takes the ordinary path.
    """
    return (
        _state.parent_based
        and traceparent is not None
        and _UNSAMPLED.fullmatch(traceparent) is not None
    )


def unsampled_span(traceparent: str | None, tracestate: str | None = None) -> Span | None:
    """The span a hop would start as the child of ``traceparent`` when
    :func:`passes_unchanged` says it is an unsampled one and no ``tracestate`` comes with
    it: that context itself, not recording (what :func:`shared.telemetry.start_span`
    returns for it), built straight from the header. None otherwise: the hop takes the
    ordinary path (which carries a tracestate on)."""
    if traceparent is None or tracestate is not None or not passes_unchanged(traceparent):
        return None
    return trace.NonRecordingSpan(
        SpanContext(
            int(traceparent[3:35], 16),
            int(traceparent[36:52], 16),
            True,
            TraceFlags(int(traceparent[53:55], 16)),
        )
    )


def link_to(traceparent: str | None) -> list[Link]:
    """A link to the span a stored traceparent names (none when absent or invalid)."""
    ctx = trace.get_current_span(remote_context(traceparent)).get_span_context()
    return [Link(ctx)] if ctx.is_valid else []


def parse_traceparent(traceparent: str | None) -> tuple[str, str] | None:
    """(trace id, span id) in hex from a traceparent header, or None."""
    if not traceparent:
        return None
    found = _TRACEPARENT.match(traceparent.strip())
    if found is None or found.group(1) == "0" * 32:
        return None
    return found.group(1), found.group(2)
