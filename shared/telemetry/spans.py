"""Ferry's spans: one trace per event, following the messaging semantic conventions
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

The helpers here return before creating anything when tracing is off
(:func:`shared.telemetry.active`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY
from opentelemetry.trace import Link, Status, StatusCode
from opentelemetry.trace import Span as Span  # re-exported for the roles
from opentelemetry.trace import SpanKind as SpanKind

from shared.telemetry.propagation import extract, inject, link_to, remote_context, unsampled_span
from shared.telemetry.provider import _state, tracer

if TYPE_CHECKING:
    from opentelemetry.context import Context

#: ``messaging.system`` of every messaging span and metric.
MESSAGING_SYSTEM = "nats"


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
    named = {
        "messaging.destination.name": destination,
        "messaging.message.id": message_id,
        "messaging.consumer.group.name": consumer_group,
    }
    for optional in (named, extra or {}):  # in turn: ``extra`` wins where both name one
        attrs.update((k, v) for k, v in optional.items() if v is not None)
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
        parent_span = trace.get_current_span(parent)
        parent_ctx = parent_span.get_span_context()
        if parent_ctx.is_valid and not parent_ctx.trace_flags.sampled:
            # A non-recording parent (a remote context, most often) can stand for its
            # child as it is: same context, nothing to record or end.
            if not parent_span.is_recording():
                return parent_span
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


class current:  # a lower-case name: used as a function, ``with current(span):``
    """Make ``span`` current (children and log lines see it); nothing when None.

    Library instrumentation (asyncpg, aiohttp client) runs inside a recording span only
    (see :func:`instrument`). A class rather than a generator: it is entered two or three
    times per message, and a generator-based context manager costs twice as much.
    """

    __slots__ = ("_span", "_token")

    def __init__(self, span: Span | None) -> None:
        self._span = span
        self._token: object = None

    def __enter__(self) -> None:
        span = self._span
        if span is None:
            return
        ctx = trace.set_span_in_context(span)
        suppress = not span.is_recording()
        if otel_context.get_value(_SUPPRESS_INSTRUMENTATION_KEY, ctx) is not suppress:
            ctx = otel_context.set_value(_SUPPRESS_INSTRUMENTATION_KEY, suppress, ctx)
        self._token = otel_context.attach(ctx)

    def __exit__(self, *_: object) -> None:
        if self._token is not None:
            otel_context.detach(self._token)  # type: ignore[arg-type]
            self._token = None


@contextlib.contextmanager
def _ended(span: Span) -> Iterator[None]:
    """``span`` current around a block and ended after it, failed when the block raises."""
    try:
        with current(span):
            yield
    except BaseException as exc:
        end_span(span, f"{type(exc).__name__}: {exc}", error_type=type(exc).__name__)
        raise
    span.end()


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
    with _ended(span):
        yield span


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
    tracestate = headers.get("tracestate")
    # Most callers are not sampled: their span is the caller's context, built directly.
    span = unsampled_span(traceparent, tracestate)
    if span is None:
        parent = remote_context(traceparent, tracestate) if traceparent else otel_context.Context()
        span = start_span(
            f"{method} {route}",
            kind=SpanKind.SERVER,
            attributes=lambda: {
                "http.request.method": method,
                "http.route": route,
                "url.path": route,
                **({"messaging.message.id": message_id} if message_id else {}),
            },
            parent=parent,
        )
        assert span is not None
    with _ended(span):
        yield span


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
        operation_type="create",
        operation_name="create",
        message_id=message_id,
        extra={
            "messaging.message.conversation_id": correlation_id,
            "ferry.event.type": event_type,
            "ferry.event.version": event_version,
            "ferry.context": context,
        },
    )
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
