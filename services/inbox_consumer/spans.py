"""The consumer's spans and log fields: ``process`` per delivery, ``ack``/``nak``/``term``.

A delivery's ``process`` span is the child of the context its headers carry; the handler
call runs inside it, and its settlement opens a CLIENT span (ack, nak or term) before the
``process`` span ends with the decision's error, if any.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from services.inbox_consumer.delivery import EXHAUSTED, Delivery
from shared import telemetry
from shared.domain.ack import Ack, DeadLetter, Decision, Nak


def process_span(delivery: Delivery, *, durable: str, stream: str) -> telemetry.Span | None:
    """The delivery's ``process`` span, child of the context its headers carry."""
    if not telemetry.active():
        return None
    headers = delivery.msg.headers
    if headers:
        # Most deliveries are not sampled: their span is the producer's context as is.
        span = telemetry.unsampled_span(headers.get("traceparent"), headers.get("tracestate"))
        if span is not None:
            return span
    env = delivery.envelope
    return telemetry.start_span(
        f"process {delivery.subject}",
        kind=telemetry.SpanKind.CONSUMER,
        parent=telemetry.extract(delivery.msg.headers),
        attributes=lambda: telemetry.messaging_attributes(
            operation_type="process",
            operation_name="process",
            destination=delivery.subject,
            message_id=str(delivery.message_id),
            consumer_group=durable,
            extra={
                "messaging.message.delivery_attempt": delivery.attempt,
                "messaging.message.conversation_id": env.correlation_id if env else None,
                "ferry.stream": stream,
                "ferry.stream.sequence": delivery.stream_seq,
                "ferry.event.type": env.event_type if env else None,
                "ferry.replay": delivery.replay,
                "ferry.rewind": delivery.rewind,
            },
        ),
    )


def log_fields(delivery: Delivery) -> contextlib.AbstractContextManager[None]:
    """The delivery's message id and traceparent on every log line inside."""
    traceparent = delivery.traceparent
    return telemetry.log_fields(
        message_id=str(delivery.message_id), traceparent=traceparent, rewind=delivery.rewind
    )


def settling(
    delivery: Delivery, decision: Decision, *, durable: str
) -> contextlib.AbstractContextManager[None]:
    """The ``settle`` span of one delivery; ends its ``process`` span afterwards.

    An ack of a delivery whose ``process`` span records nothing (tracing off, or a trace
    not sampled) has no span to open or end, and an ack carries no trace context on: it
    needs its log fields only. A nak or a dead letter always gets the whole scope (a
    dead letter carries the delivery's trace context on, sampled or not).
    """
    span = delivery.span
    if isinstance(decision, Ack) and (span is None or not span.is_recording()):
        delivery.span = None  # ended: a span that records nothing has nothing to end
        return log_fields(delivery)
    return _settling(delivery, decision, durable=durable)


@contextlib.contextmanager
def _settling(delivery: Delivery, decision: Decision, *, durable: str) -> Iterator[None]:
    with telemetry.current(delivery.span), log_fields(delivery):
        if isinstance(decision, Ack):
            operation = "ack"
        elif isinstance(decision, Nak) or decision.reason_code == EXHAUSTED:
            operation = "nak"
        else:
            operation = "term"
        span = None
        if delivery.span is not None and delivery.span.is_recording():
            span = telemetry.start_span(
                f"{operation} {delivery.subject}",
                kind=telemetry.SpanKind.CLIENT,
                attributes=telemetry.messaging_attributes(
                    operation_type="settle",
                    operation_name=operation,
                    destination=delivery.subject,
                    message_id=str(delivery.message_id),
                    consumer_group=durable,
                ),
            )
        try:
            with telemetry.current(span):
                yield
        finally:
            telemetry.end_span(span)
            error = None if isinstance(decision, Ack) else decision_error(decision)
            telemetry.end_span(delivery.span, error)
            delivery.span = None


def decision_error(decision: Decision) -> str:
    """The error a decision other than Ack leaves on the ``process`` span."""
    if isinstance(decision, Nak):
        return f"retry: {decision.reason}"
    assert isinstance(decision, DeadLetter)
    return f"{decision.reason_code}: {decision.detail}"
