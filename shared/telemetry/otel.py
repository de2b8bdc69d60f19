"""Traces: OpenTelemetry set up from settings, W3C context through NATS and HTTP headers.

One trace per event, following the messaging semantic conventions
(``messaging.system = nats``)::

    create <type>.v<n>         PRODUCER  record_event, in the producer's transaction;
                                         its traceparent is stored in the outbox row
    └ publish <subject>        PRODUCER  outbox-publisher (operation type send); its
                                         context travels in the NATS headers
      └ process <subject>      CONSUMER  inbox-consumer, consumer group = durable
        ├ POST                 CLIENT    aiohttp client instrumentation; traceparent
        │ └ POST /handle       SERVER    in the HTTP headers → the handler service
        ├ publish <dlq subject> PRODUCER a dead letter written by the consumer
        └ ack|nak|term <subject> CLIENT  settle
    receive <stream>           CLIENT    one per fetched batch, linked to its messages
    process <advisory subject> CONSUMER  dlq-router: a new trace, linked to the message's
    publish <replay subject>   PRODUCER  dlq-replayer: a new trace, linked to the message's

Tracing is off unless an exporter is configured (``FERRY_TRACES_EXPORTER`` or
``OTEL_TRACES_EXPORTER``): then :func:`active` is false and every helper here returns
before creating anything, so the hot paths pay one boolean test. Ferry keeps its own
tracer (:func:`use_tracer_provider`) instead of relying only on the process-global one,
so tests can run several in-process roles against an in-memory exporter; role processes
also install it globally for third-party instrumentation.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import Link, Status, StatusCode
from opentelemetry.trace import Span as Span  # re-exported for the roles
from opentelemetry.trace import SpanKind as SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from shared.domain.errors import ConfigurationError

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.util.types import Attributes

log = logging.getLogger("ferry.telemetry")


class TracingSettings(Protocol):
    """The settings tracing is set up from (``shared.runtime.settings.CommonSettings``).

    A protocol, so this layer does not import the runtime layer above it.
    """

    @property
    def otel_sdk_disabled(self) -> bool: ...
    @property
    def traces_exporter(self) -> str: ...
    @property
    def otlp_protocol(self) -> str: ...
    @property
    def otlp_endpoint(self) -> str | None: ...
    @property
    def traces_file(self) -> Path: ...
    @property
    def traces_sampler(self) -> str: ...
    @property
    def traces_sampler_arg(self) -> float: ...

#: ``messaging.system`` of every messaging span and metric.
MESSAGING_SYSTEM = "nats"
#: Instrumentation scope of Ferry's own spans.
TRACER_NAME = "ferry"
#: Exporter names accepted by FERRY_TRACES_EXPORTER / OTEL_TRACES_EXPORTER.
EXPORTERS = frozenset({"none", "otlp", "file", "console"})
PROTOCOLS = frozenset({"grpc", "http/protobuf"})

# W3C trace context only: it is what the outbox row, NATS and HTTP headers carry.
_PROPAGATOR: TextMapPropagator = TraceContextTextMapPropagator()
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")
#: A well-formed version-00 traceparent with non-zero ids whose sampled flag is clear.
_UNSAMPLED = re.compile(r"^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f][02468ace]$")


@dataclass
class _State:
    tracer: trace.Tracer | None = None
    provider: TracerProvider | None = None
    instrumented: list[Any] = field(default_factory=list)
    #: The sampler follows the parent's decision: a child of an unsampled span can skip
    #: the SDK altogether (most hops at a 10 % ratio).
    parent_based: bool = False


_state = _State()


def use_tracer_provider(provider: TracerProvider | None) -> None:
    """Make ``provider`` Ferry's tracer provider (None: tracing off again)."""
    _state.provider = provider
    _state.tracer = None if provider is None else provider.get_tracer(TRACER_NAME)
    _state.parent_based = provider is not None and isinstance(provider.sampler, ParentBased)


def active() -> bool:
    """Whether spans are being recorded at all (false: every helper is a no-op)."""
    return _state.tracer is not None


def tracer() -> trace.Tracer:
    """Ferry's tracer; the process-global one when Ferry configured none (a producer
    application that set up OpenTelemetry itself still gets ``create`` spans)."""
    return _state.tracer or trace.get_tracer(TRACER_NAME)


# --------------------------------------------------------------------------- setup


class JsonLinesSpanExporter(SpanExporter):
    """Appends each finished span to a file as one JSON object per line (local use)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Write ``spans``; a file error fails the batch (the processor logs it)."""
        lines = "".join(span.to_json(indent=None) + "\n" for span in spans)
        try:
            with self._lock, self.path.open("a", encoding="utf-8") as out:
                out.write(lines)
        except OSError as exc:
            log.warning("cannot write spans to %s: %s", self.path, exc)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing held open between exports."""


class _NoOrphanQueries(Sampler):
    """Drops a *root* span of a database query, else asks ``root``.

    The publisher's claims and the replayer's scans run outside any message's trace:
    sampled as roots they would bury the message traces under one-span traces.
    Queries inside a message's span are sampled with it (ParentBased).
    """

    def __init__(self, root: Sampler) -> None:
        self.root = root

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        if attributes and ("db.system" in attributes or "db.system.name" in attributes):
            return SamplingResult(Decision.DROP)
        return self.root.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return f"NoOrphanQueries{{{self.root.get_description()}}}"


def build_sampler(name: str, ratio: float) -> Sampler:
    """The sampler OpenTelemetry calls ``name`` (OTEL_TRACES_SAMPLER's values)."""
    roots: dict[str, Sampler] = {
        "always_on": ALWAYS_ON,
        "always_off": ALWAYS_OFF,
        "traceidratio": TraceIdRatioBased(ratio),
    }
    key = name.strip().lower()
    if key in roots:
        return _NoOrphanQueries(roots[key])
    if key.startswith("parentbased_") and key.removeprefix("parentbased_") in roots:
        return ParentBased(_NoOrphanQueries(roots[key.removeprefix("parentbased_")]))
    choices = sorted([*roots, *(f"parentbased_{r}" for r in roots)])
    raise ConfigurationError(
        f"FERRY_TRACES_SAMPLER / OTEL_TRACES_SAMPLER {name!r} is not one of {', '.join(choices)}"
    )


def exporter_names(settings: TracingSettings) -> list[str]:
    """The configured exporters; empty means tracing is off."""
    if settings.otel_sdk_disabled:
        return []
    names = [n.strip().lower() for n in settings.traces_exporter.split(",") if n.strip()]
    unknown = sorted(set(names) - EXPORTERS)
    if unknown:
        raise ConfigurationError(
            f"FERRY_TRACES_EXPORTER / OTEL_TRACES_EXPORTER: unknown exporter(s) "
            f"{', '.join(unknown)}; use {', '.join(sorted(EXPORTERS))}"
        )
    return [n for n in names if n != "none"]


def _otlp_exporter(settings: TracingSettings) -> SpanExporter:
    protocol = settings.otlp_protocol.strip().lower()
    if protocol not in PROTOCOLS:
        raise ConfigurationError(
            f"FERRY_OTLP_PROTOCOL / OTEL_EXPORTER_OTLP_PROTOCOL {settings.otlp_protocol!r}: "
            f"use {' or '.join(sorted(PROTOCOLS))}"
        )
    endpoint = settings.otlp_endpoint
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter(endpoint=endpoint)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    if endpoint is not None and not endpoint.rstrip("/").endswith("/v1/traces"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"
    return HttpExporter(endpoint=endpoint)


def _exporter(name: str, settings: TracingSettings) -> SpanExporter:
    if name == "otlp":
        return _otlp_exporter(settings)
    if name == "file":
        return JsonLinesSpanExporter(settings.traces_file)
    return ConsoleSpanExporter()


@dataclass
class Tracing:
    """What :func:`setup_tracing` installed; :meth:`shutdown` flushes and removes it."""

    provider: TracerProvider | None

    def shutdown(self) -> None:
        """Flush the spans in hand, uninstrument, and turn Ferry's tracing off."""
        uninstrument()
        if self.provider is not None:
            self.provider.shutdown()
        use_tracer_provider(None)


def setup_tracing(role: str, settings: TracingSettings, *, install_global: bool = True) -> Tracing:
    """Tracing of one role process from its settings (see README "Observability").

    ``service.name`` is the role; OTEL_RESOURCE_ATTRIBUTES adds to the resource (the SDK
    reads it). With no exporter configured nothing is installed and tracing costs nothing.
    """
    names = exporter_names(settings)
    if not names:
        return Tracing(None)
    provider = TracerProvider(
        resource=Resource.create({SERVICE_NAME: role}),
        sampler=build_sampler(settings.traces_sampler, settings.traces_sampler_arg),
    )
    for name in names:
        provider.add_span_processor(BatchSpanProcessor(_exporter(name, settings)))
    use_tracer_provider(provider)
    if install_global:
        trace.set_tracer_provider(provider)
    instrument(provider)
    log.info(
        "tracing on: exporters %s, sampler %s",
        ", ".join(names),
        provider.sampler.get_description(),
    )
    return Tracing(provider)


def instrument(provider: TracerProvider) -> None:
    """Trace asyncpg queries and aiohttp client calls into ``provider`` — inside recording
    spans only.

    The instrumentations wrap every query and request and would start a span for each,
    sampled or not: measured, that halved the consumer's throughput at 10 % sampling. So
    the calling context (a role's main task, which every later task copies) suppresses
    them, and :func:`current` lifts the suppression inside a recording span only: SQL and
    HTTP calls of sampled messages are traced, the rest pay one context lookup.
    """
    from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor
    from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor

    asyncpg_instrumentor = AsyncPGInstrumentor()  # type: ignore[no-untyped-call]
    for instrumentor in (asyncpg_instrumentor, AioHttpClientInstrumentor()):
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument(tracer_provider=provider)
            _state.instrumented.append(instrumentor)
    otel_context.attach(otel_context.set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))


def uninstrument() -> None:
    """Undo :func:`instrument` (tests install and remove providers repeatedly)."""
    while _state.instrumented:
        _state.instrumented.pop().uninstrument()


# --------------------------------------------------------------------------- propagation


def inject(headers: MutableMapping[str, str], span: Span | None = None) -> None:
    """Write ``span``'s (default: the current) W3C trace context into ``headers``."""
    ctx = trace.set_span_in_context(span) if span is not None else None
    _PROPAGATOR.inject(headers, context=ctx)


def extract(headers: Mapping[str, str] | None) -> Context:
    """The W3C trace context carried by ``headers`` (empty context when none)."""
    return _PROPAGATOR.extract(dict(headers or {}))


def remote_context(traceparent: str | None, tracestate: str | None = None) -> Context:
    """The context a stored traceparent (outbox row, dead letter) stands for."""
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
        and _UNSAMPLED.match(traceparent) is not None
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


# --------------------------------------------------------------------------- semantic conventions


def messaging_attributes(
    *,
    operation_type: str,
    operation_name: str,
    destination: str | None = None,
    message_id: str | None = None,
    consumer_group: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Attributes of a messaging span (OpenTelemetry messaging semantic conventions)."""
    attrs: dict[str, Any] = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.type": operation_type,
        "messaging.operation.name": operation_name,
    }
    if destination is not None:
        attrs["messaging.destination.name"] = destination
    if message_id is not None:
        attrs["messaging.message.id"] = message_id
    if consumer_group is not None:
        attrs["messaging.consumer.group.name"] = consumer_group
    attrs.update({k: v for k, v in (extra or {}).items() if v is not None})
    return attrs


def start_span(
    name: str,
    *,
    kind: SpanKind,
    attributes: dict[str, Any] | Callable[[], dict[str, Any]],
    parent: Context | None = None,
    links: Sequence[Link] = (),
) -> Span | None:
    """A started span, or None when tracing is off (callers test for None).

    Under a parent-based sampler, the child of an unsampled span is that span's context
    as a non-recording span: the decision travels on, nothing is built — not even the
    attributes, when they are given as a function (most messages are not sampled).
    """
    if _state.tracer is None:
        return None
    if _state.parent_based:
        parent_ctx = trace.get_current_span(parent).get_span_context()
        if parent_ctx.is_valid and not parent_ctx.trace_flags.sampled:
            return trace.NonRecordingSpan(parent_ctx)
    return _state.tracer.start_span(
        name,
        context=parent,
        kind=kind,
        attributes=attributes() if callable(attributes) else attributes,
        links=list(links),
    )


def end_span(span: Span | None, error: str | None = None, *, error_type: str | None = None) -> None:
    """End ``span`` (if any), marked as failed when ``error`` is given."""
    if span is None:
        return
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error[:500]))
        span.set_attribute("error.type", error_type or error.split(":")[0][:100])
    span.end()


def now_ns() -> int:
    """Wall clock in ns for a span's start time (0 when tracing is off: not needed)."""
    return time.time_ns() if _state.tracer is not None else 0


def receive_span(msgs: Sequence[Any], *, stream: str, durable: str, started_ns: int) -> None:
    """The ``receive`` span of one fetched batch, linked to each message's context."""
    if _state.tracer is None or not msgs:
        return
    span = _state.tracer.start_span(
        f"receive {stream}",
        context=otel_context.Context(),  # a root: a batch serves many traces
        kind=SpanKind.CLIENT,
        attributes=messaging_attributes(
            operation_type="receive",
            operation_name="fetch",
            destination=stream,
            consumer_group=durable,
            extra={"messaging.batch.message_count": len(msgs)},
        ),
        start_time=started_ns or None,
    )
    if span.is_recording():  # links only for a sampled batch: most are not
        for msg in msgs:
            ctx = trace.get_current_span(extract(msg.headers)).get_span_context()
            if ctx.is_valid:
                span.add_link(ctx)
    span.end()


@contextlib.contextmanager
def current(span: Span | None) -> Iterator[None]:
    """Make ``span`` current (children and log lines see it); nothing when None.

    Library instrumentation (asyncpg, aiohttp client) runs inside a recording span only
    (see :func:`instrument`).
    """
    if span is None:
        yield
        return
    ctx = trace.set_span_in_context(span)
    ctx = otel_context.set_value(_SUPPRESS_INSTRUMENTATION_KEY, not span.is_recording(), ctx)
    token = otel_context.attach(ctx)
    try:
        yield
    finally:
        otel_context.detach(token)


@contextlib.contextmanager
def span_scope(
    name: str,
    *,
    kind: SpanKind,
    attributes: dict[str, Any],
    root: bool = False,
    links: Sequence[Link] = (),
    headers: MutableMapping[str, str] | None = None,
) -> Iterator[Span | None]:
    """A current span around a block, failed when the block raises; its context is
    injected into ``headers`` when given. ``root``: start a new trace (links continue
    the old one). Yields None, and does nothing, when tracing is off."""
    if _state.tracer is None:
        yield None
        return
    parent = otel_context.Context() if root else None
    span = start_span(name, kind=kind, attributes=attributes, parent=parent, links=links)
    assert span is not None
    if headers is not None:
        inject(headers, span)
    try:
        with current(span):
            yield span
    except BaseException as exc:
        end_span(span, f"{type(exc).__name__}: {exc}", error_type=type(exc).__name__)
        raise
    span.end()


def publish_span(
    destination: str,
    *,
    message_id: str,
    headers: MutableMapping[str, str],
    root: bool = False,
    link: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> contextlib.AbstractContextManager[Span | None]:
    """:func:`span_scope` for a ``publish`` of one message (dead letter, replay)."""
    return span_scope(
        f"publish {destination}",
        kind=SpanKind.PRODUCER,
        attributes=messaging_attributes(
            operation_type="send",
            operation_name="publish",
            destination=destination,
            message_id=message_id,
            extra=extra,
        ),
        root=root,
        links=link_to(link) if _state.tracer is not None else (),
        headers=headers,
    )


def link_current(traceparent: str | None) -> None:
    """Link the current span to the span ``traceparent`` names (router: the message's)."""
    if _state.tracer is None:
        return
    span = trace.get_current_span()
    for link in link_to(traceparent):
        span.add_link(link.context)


def annotate(**attributes: Any) -> None:
    """Set attributes (None values skipped) on the current span, if one records."""
    if _state.tracer is None:
        return
    span = trace.get_current_span()
    for key, value in attributes.items():
        if value is not None:
            span.set_attribute(key.replace("__", "."), value)


@contextlib.contextmanager
def server_span(
    method: str, route: str, headers: Mapping[str, str], message_id: str | None
) -> Iterator[Span | None]:
    """The SERVER span of an HTTP request (the handler side), child of its traceparent.

    ``headers`` are looked up case-insensitively when they are (aiohttp's), else by
    their lower-case names. The child of an unsampled caller costs no SDK span.
    """
    if _state.tracer is None:
        yield None
        return
    traceparent = headers.get("traceparent")
    parent = (
        remote_context(traceparent, headers.get("tracestate"))
        if traceparent
        else otel_context.Context()
    )
    span = start_span(
        f"{method} {route}",
        kind=SpanKind.SERVER,
        attributes={
            "http.request.method": method,
            "http.route": route,
            "url.path": route,
            **({"messaging.message.id": message_id} if message_id else {}),
        },
        parent=parent,
    )
    assert span is not None
    try:
        with current(span):
            yield span
    except BaseException as exc:
        end_span(span, f"{type(exc).__name__}: {exc}", error_type=type(exc).__name__)
        raise
    span.end()


# --------------------------------------------------------------------------- log context

#: Fields every log line of the current task carries (durable, message_id, traceparent).
_LOG_FIELDS: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "ferry_log_fields", default=None
)


@contextlib.contextmanager
def log_fields(**fields: Any) -> Iterator[None]:
    """Add ``fields`` to every log line written inside the block (this task only)."""
    merged = {**(_LOG_FIELDS.get() or {}), **{k: v for k, v in fields.items() if v is not None}}
    token = _LOG_FIELDS.set(merged)
    try:
        yield
    finally:
        _LOG_FIELDS.reset(token)


def set_log_fields(**fields: Any) -> None:
    """Add ``fields`` to the log lines of this task and of the tasks it starts later."""
    _LOG_FIELDS.set({**(_LOG_FIELDS.get() or {}), **fields})


def log_context() -> dict[str, Any]:
    """Fields for a log line: the task's fields plus trace_id/span_id.

    The ids come from the current span when tracing is on; when it is off, from the
    traceparent the message carried (so a line can still be found by the producer's
    trace id).
    """
    fields = dict(_LOG_FIELDS.get() or {})
    traceparent = fields.pop("traceparent", None)
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        fields["trace_id"] = trace.format_trace_id(ctx.trace_id)
        fields["span_id"] = trace.format_span_id(ctx.span_id)
    else:
        ids = parse_traceparent(traceparent)
        if ids is not None:
            fields["trace_id"], fields["span_id"] = ids
    return fields


# --------------------------------------------------------------------------- producer


@contextlib.contextmanager
def create_span(
    *,
    event_type: str,
    event_version: int,
    message_id: str,
    traceparent: str | None,
    tracestate: str | None,
    correlation_id: str | None,
    context: str | None,
) -> Iterator[tuple[str | None, str | None]]:
    """The ``create`` span of an event being recorded; yields the trace context to store.

    Its parent is ``traceparent`` when the caller passes one, else the caller's current
    span. Without any tracing configured the caller's context passes through unchanged.
    """
    parent = remote_context(traceparent, tracestate) if traceparent else None
    attributes = messaging_attributes(
        operation_type="create", operation_name="create", message_id=message_id
    )
    extra = {
        "messaging.message.conversation_id": correlation_id,
        "ferry.event.type": event_type,
        "ferry.event.version": event_version,
        "ferry.context": context,
    }
    attributes.update({k: v for k, v in extra.items() if v is not None})
    span = tracer().start_span(
        f"create {event_type}.v{event_version}",
        context=parent,
        kind=SpanKind.PRODUCER,
        attributes=attributes,
    )
    carrier: dict[str, str] = {}
    inject(carrier, span)
    try:
        yield carrier.get("traceparent", traceparent), carrier.get("tracestate", tracestate)
    except BaseException as exc:
        end_span(span, f"{type(exc).__name__}: {exc}", error_type=type(exc).__name__)
        raise
    span.end()
