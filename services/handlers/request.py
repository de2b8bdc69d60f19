"""Parsing a ``POST /handle`` call into a checked :class:`HandleRequest`.

The body is the envelope (:class:`shared.domain.envelope.Envelope`) plus a ``delivery``
object; the mediation topology adds INFRA-005's names (``messageId``, ``traceKey``...),
which ride along in :attr:`HandleRequest.doc`. Everything wrong with a call raises
:class:`PoisonError`, which the service answers with 422: resending the same bytes can
never succeed.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.domain.envelope import Envelope, parse_json_body
from shared.domain.errors import PoisonError

from .faults import FAULT_KEY

IDEMPOTENCY_HEADER = "Idempotency-Key"
TRACEPARENT_HEADER = "traceparent"


@dataclass(frozen=True, slots=True)
class Delivery:
    """The consumer's delivery facts for this call."""

    attempt: int
    max_attempts: int | None = None
    stream_sequence: int | None = None
    durable: str | None = None


@dataclass(frozen=True, slots=True)
class HandleRequest:
    """A well-formed handler call: the envelope, its delivery, the raw document."""

    envelope: Envelope
    delivery: Delivery
    doc: dict[str, Any]
    traceparent: str | None = None
    #: Whether the service obeys fault directives (then ``_ferry_test`` is not business data).
    fault_injection: bool = False

    @property
    def message_id(self) -> str:
        """The event id (also the idempotency key)."""
        return self.envelope.message_id

    @property
    def payload(self) -> dict[str, Any]:
        """The event payload."""
        return self.envelope.payload

    @property
    def business_payload(self) -> dict[str, Any]:
        """The payload a route stores: without ``_ferry_test`` when fault injection is on
        (the directive was the service's), the whole payload otherwise (plain data)."""
        if not self.fault_injection or FAULT_KEY not in self.payload:
            return self.payload
        return {k: v for k, v in self.payload.items() if k != FAULT_KEY}

    @property
    def route_key(self) -> tuple[str, int]:
        """``(event_type, event_version)``, the routing-table key."""
        return self.envelope.event_type, self.envelope.event_version


@dataclass(frozen=True, slots=True)
class CallIds:
    """What can be told about a call even when it is malformed, for the effects ledger."""

    message_id: uuid.UUID | None
    attempt: int | None


def decode_body(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, or ``MALFORMED_JSON``/``MALFORMED_ENVELOPE``."""
    doc = parse_json_body(body)  # strict: depth, huge numbers, NaN, surrogates → poison
    if not isinstance(doc, dict):
        raise PoisonError("MALFORMED_ENVELOPE", "body is JSON but not an object")
    return doc


def parse_request(body: bytes, headers: Mapping[str, str]) -> HandleRequest:
    """Decode and check a call; raise :class:`PoisonError` naming the first defect."""
    doc = decode_body(body)
    envelope = Envelope.from_dict(doc)
    _check_idempotency_key(headers.get(IDEMPOTENCY_HEADER), envelope.message_id)
    _check_infra005_id(doc, envelope.message_id)
    return HandleRequest(
        envelope=envelope,
        delivery=_parse_delivery(doc.get("delivery")),
        doc=doc,
        traceparent=headers.get(TRACEPARENT_HEADER) or None,
    )


def call_ids(body: bytes, headers: Mapping[str, str]) -> CallIds:
    """Best-effort id and attempt of a call that may be malformed (never raises)."""
    try:
        doc = parse_json_body(body)
    except PoisonError:
        doc = None
    if not isinstance(doc, dict):
        doc = {}
    message_id = _loose_uuid(doc.get("message_id")) or _loose_uuid(headers.get(IDEMPOTENCY_HEADER))
    delivery = doc.get("delivery")
    attempt = delivery.get("attempt") if isinstance(delivery, dict) else None
    if isinstance(attempt, bool) or not isinstance(attempt, int):
        attempt = None
    return CallIds(message_id, attempt)


def _loose_uuid(value: object) -> uuid.UUID | None:
    if not isinstance(value, str):
        return None
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


def _check_idempotency_key(key: str | None, message_id: str) -> None:
    if key is None:
        raise PoisonError("MISSING_FIELD", f"the {IDEMPOTENCY_HEADER} header is missing")
    if _loose_uuid(key) != uuid.UUID(message_id):
        raise PoisonError(
            "IDEMPOTENCY_KEY_MISMATCH",
            f"{IDEMPOTENCY_HEADER} {key!r} differs from message_id {message_id!r}",
        )


def _check_infra005_id(doc: Mapping[str, Any], message_id: str) -> None:
    # INFRA-005's messageId must name the same event: a disagreement means the consumer
    # built the envelope wrongly, and idempotency would be keyed on the wrong id.
    alias = doc.get("messageId")
    if alias is not None and _loose_uuid(alias) != uuid.UUID(message_id):
        raise PoisonError(
            "INVALID_FIELD", f"messageId {alias!r} differs from message_id {message_id!r}"
        )


def _optional_int(delivery: Mapping[str, Any], name: str, minimum: int) -> int | None:
    value = delivery.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise PoisonError(
            "INVALID_FIELD", f"delivery.{name} must be an integer >= {minimum}, got {value!r}"
        )
    return value


def _parse_delivery(value: object) -> Delivery:
    if not isinstance(value, dict):
        raise PoisonError("MISSING_FIELD", "delivery must be an object with at least 'attempt'")
    attempt = _optional_int(value, "attempt", 1)
    if attempt is None:
        raise PoisonError("MISSING_FIELD", "delivery.attempt is missing")
    durable = value.get("durable")
    if durable is not None and not isinstance(durable, str):
        raise PoisonError("INVALID_FIELD", f"delivery.durable must be a string, got {durable!r}")
    return Delivery(
        attempt=attempt,
        max_attempts=_optional_int(value, "max_attempts", 1),
        stream_sequence=_optional_int(value, "stream_sequence", 0),
        durable=durable,
    )
