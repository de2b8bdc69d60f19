"""A ``POST /handle`` call, parsed: the envelope, the ``delivery`` object, the payload.

The body is the envelope (:class:`shared.domain.envelope.Envelope`) plus a ``delivery``
object; the mediation topology adds INFRA-005's names (``messageId``, ``traceKey``...),
which ride along in :attr:`Call.doc`. Anything wrong with the request itself raises
:class:`MalformedRequest` (answered 400: resending the same bytes can never succeed).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from shared.domain.envelope import Envelope, parse_json_body
from shared.domain.errors import PoisonError

IDEMPOTENCY_HEADER = "Idempotency-Key"
TRACEPARENT_HEADER = "traceparent"

P = TypeVar("P")


class MalformedRequest(PoisonError):
    """The request is not a well-formed handler call (answered 400, ``reason_code``)."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """The consumer's delivery facts for this call."""

    attempt: int
    max_attempts: int | None = None
    stream_sequence: int | None = None
    durable: str | None = None


@dataclass(frozen=True, slots=True)
class Call(Generic[P]):
    """A well-formed handler call.

    ``payload`` is what the route reads: an instance of the route's pydantic model when it
    declares one (:mod:`shared.sdk.models` generates them from the manifests), else the
    payload's ``dict``. The envelope keeps the payload exactly as it came.
    """

    envelope: Envelope
    delivery: Delivery
    doc: dict[str, Any]
    payload: P
    traceparent: str | None = None

    @property
    def message_id(self) -> str:
        """The event id (also the idempotency key)."""
        return self.envelope.message_id

    @property
    def route_key(self) -> tuple[str, int]:
        """``(event_type, event_version)``, the routing-table key."""
        return self.envelope.event_type, self.envelope.event_version

    def with_payload(self, payload: Any) -> Call[Any]:
        """This call with another view of its payload."""
        return dataclasses.replace(self, payload=payload)


@dataclass(frozen=True, slots=True)
class CallIds:
    """What can be told about a call even when it is malformed (for a ledger)."""

    message_id: uuid.UUID | None
    attempt: int | None


def decode_body(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, or ``MALFORMED_JSON``/``MALFORMED_ENVELOPE``."""
    try:
        doc = parse_json_body(body)  # strict: depth, huge numbers, NaN, surrogates
    except PoisonError as exc:
        raise MalformedRequest(exc.reason_code, exc.detail) from None
    if not isinstance(doc, dict):
        raise MalformedRequest("MALFORMED_ENVELOPE", "body is JSON but not an object")
    return doc


def parse_call(body: bytes, headers: Mapping[str, str]) -> Call[dict[str, Any]]:
    """Decode and check a call; raise :class:`MalformedRequest` naming the first defect."""
    doc = decode_body(body)
    try:
        # decode_body held the body to the envelope's depth and text rules already.
        envelope = Envelope.from_json_body(doc)
    except PoisonError as exc:
        raise MalformedRequest(exc.reason_code, exc.detail) from None
    return _call(doc, envelope, headers)


def parse_call_document(
    doc: dict[str, Any], headers: Mapping[str, str], *, sound: bool = False
) -> Call[dict[str, Any]]:
    """:func:`parse_call` of a body already decoded (one event of a batch call).

    ``sound``: ``doc`` came out of :func:`parse_batch_request`, which held it to the depth
    and text rules already, so it is not walked again."""
    try:
        envelope = Envelope.from_json_body(doc) if sound else Envelope.from_dict(doc)
    except PoisonError as exc:
        raise MalformedRequest(exc.reason_code, exc.detail) from None
    return _call(doc, envelope, headers)


def _call(doc: dict[str, Any], envelope: Envelope, headers: Mapping[str, str]) -> Call[Any]:
    _check_idempotency_key(headers.get(IDEMPOTENCY_HEADER), envelope.message_id)
    _check_infra005_id(doc, envelope.message_id)
    return Call(
        envelope=envelope,
        delivery=_parse_delivery(doc.get("delivery")),
        doc=doc,
        payload=envelope.payload,
        traceparent=headers.get(TRACEPARENT_HEADER) or None,
    )


def call_ids(body: bytes, headers: Mapping[str, str]) -> CallIds:
    """Best-effort id and attempt of a call that may be malformed (never raises)."""
    try:
        doc = parse_json_body(body)
    except PoisonError:
        doc = None
    return document_ids(doc, headers)


def document_ids(doc: object, headers: Mapping[str, str]) -> CallIds:
    """:func:`call_ids` of a body already decoded (never raises)."""
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
        raise MalformedRequest("MISSING_FIELD", f"the {IDEMPOTENCY_HEADER} header is missing")
    if key != message_id and _loose_uuid(key) != uuid.UUID(message_id):
        raise MalformedRequest(
            "IDEMPOTENCY_KEY_MISMATCH",
            f"{IDEMPOTENCY_HEADER} {key[:60]!r} differs from message_id {message_id!r}",
        )


def _check_infra005_id(doc: Mapping[str, Any], message_id: str) -> None:
    # INFRA-005's messageId must name the same event: a disagreement means the envelope
    # was built wrongly, and idempotency would be keyed on the wrong id.
    alias = doc.get("messageId")
    if alias is not None and alias != message_id and _loose_uuid(alias) != uuid.UUID(message_id):
        raise MalformedRequest(
            "INVALID_FIELD", f"messageId {str(alias)[:60]!r} differs from message_id {message_id!r}"
        )


def _optional_int(delivery: Mapping[str, Any], name: str, minimum: int) -> int | None:
    value = delivery.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise MalformedRequest(
            "INVALID_FIELD",
            f"delivery.{name} must be an integer >= {minimum}, got {str(value)[:40]!r}",
        )
    return value


def _parse_delivery(value: object) -> Delivery:
    if not isinstance(value, dict):
        raise MalformedRequest(
            "MISSING_FIELD", "delivery must be an object with at least 'attempt'"
        )
    attempt = _optional_int(value, "attempt", 1)
    if attempt is None:
        raise MalformedRequest("MISSING_FIELD", "delivery.attempt is missing")
    durable = value.get("durable")
    if durable is not None and not isinstance(durable, str):
        raise MalformedRequest(
            "INVALID_FIELD", f"delivery.durable must be a string, got {str(durable)[:40]!r}"
        )
    return Delivery(
        attempt=attempt,
        max_attempts=_optional_int(value, "max_attempts", 1),
        stream_sequence=_optional_int(value, "stream_sequence", 0),
        durable=durable,
    )
