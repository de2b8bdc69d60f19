"""The body and headers of a handler call (``POST /handle``), as the inbox-consumer sends
them: one builder, used by the consumer and by the SDK's signing test client alike.

The body is the envelope's document, a ``delivery`` object, and INFRA-005 §2's names of
the same facts (``messageId``, ``traceKey``...) for the Mediation modules.
"""

from __future__ import annotations

from typing import Any

from shared.domain.envelope import Envelope

IDEMPOTENCY_HEADER = "Idempotency-Key"
TRACEPARENT_HEADER = "traceparent"


def request_body(
    envelope: Envelope,
    *,
    attempt: int,
    max_attempts: int,
    stream_sequence: int,
    durable: str,
) -> dict[str, Any]:
    """The JSON document of a handler call for ``envelope``'s delivery number ``attempt``."""
    body = envelope.to_dict()
    body["delivery"] = {
        "attempt": attempt,
        "max_attempts": max_attempts,
        "stream_sequence": stream_sequence,
        "durable": durable,
    }
    body.update(
        messageId=envelope.message_id,
        traceKey=envelope.correlation_id or envelope.message_id,
        opportunityKey=envelope.payload.get("opportunity_key"),
        module=envelope.context,
        eventType=envelope.event_type,
        payloadDigest=body["payload_digest"],
        createdAt=body["occurred_at"],
        retryCount=attempt - 1,
        maxRetries=max_attempts - 1,
    )
    return body


def request_headers(message_id: str, traceparent: str | None = None) -> dict[str, str]:
    """The call's headers (before signing): the idempotency key and the trace context."""
    found = {IDEMPOTENCY_HEADER: message_id}
    if traceparent:
        found[TRACEPARENT_HEADER] = traceparent
    return found
