"""Telemetry: OpenTelemetry set-up, spans, trace context and the log context.

Callers import the package (``from shared import telemetry``) and use ``telemetry.X``:

    provider     Ferry's tracer provider and whether tracing is on (:func:`active`)
    setup        tracing from settings: exporters, sampler, instrumentation, shutdown
    propagation  W3C trace context in headers and stored traceparents
    spans        the spans Ferry starts (the trace of one event) and their attributes
    logcontext   fields every log line of a task carries, with its trace ids
    otlp_wire    finished spans serialised for OTLP/HTTP (the exporter's encoder, faster)

Imports only :mod:`shared.contracts` and :mod:`shared.domain` below it; the adapters and
every role above use it to trace and to log with trace ids.
"""

from shared.telemetry.logcontext import log_context, log_fields, set_log_fields
from shared.telemetry.propagation import (
    extract,
    inject,
    link_to,
    parse_traceparent,
    passes_unchanged,
    remote_context,
    unsampled_span,
)
from shared.telemetry.provider import TRACER_NAME, active, tracer, use_tracer_provider
from shared.telemetry.setup import (
    EXPORTERS,
    PROTOCOLS,
    JsonLinesSpanExporter,
    Tracing,
    TracingSettings,
    build_sampler,
    exporter_names,
    instrument,
    setup_tracing,
    uninstrument,
)
from shared.telemetry.spans import (
    MESSAGING_SYSTEM,
    Span,
    SpanKind,
    annotate,
    create_span,
    current,
    end_span,
    link_current,
    messaging_attributes,
    now_ns,
    publish_span,
    receive_span,
    server_span,
    span_scope,
    start_span,
)

__all__ = [
    "EXPORTERS",
    "MESSAGING_SYSTEM",
    "PROTOCOLS",
    "TRACER_NAME",
    "JsonLinesSpanExporter",
    "Span",
    "SpanKind",
    "Tracing",
    "TracingSettings",
    "active",
    "annotate",
    "build_sampler",
    "create_span",
    "current",
    "end_span",
    "exporter_names",
    "extract",
    "inject",
    "instrument",
    "link_current",
    "link_to",
    "log_context",
    "log_fields",
    "messaging_attributes",
    "now_ns",
    "parse_traceparent",
    "passes_unchanged",
    "publish_span",
    "receive_span",
    "remote_context",
    "server_span",
    "set_log_fields",
    "setup_tracing",
    "span_scope",
    "start_span",
    "tracer",
    "uninstrument",
    "unsampled_span",
    "use_tracer_provider",
]
