"""The event envelope: what travels in a JetStream message body and to ``POST /handle``.

SDS-047 §12 / REQ-058 fields, plus ``context`` (the producing context) and
``payload_digest`` (INFRA-005 §2) so a consumer can tell a payload that was altered
in transit from one that is merely unexpected. Parsing never raises anything but
:class:`PoisonError`, whose ``reason_code`` names what is wrong.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from shared.domain.errors import MalformedInput, OutboxValidationError, PoisonError
from shared.domain.json_text import (
    MAX_PAYLOAD_DEPTH,
    canonical_json,
    json_defect,
    parse_json_body,
    payload_digest,
    shown,
    wire_json,
)
from shared.domain.subjects import EventSubject, parse_subject

__all__ = [  # the JSON helpers live in shared.domain.json_text; importers found them here
    "MAX_PAYLOAD_DEPTH",
    "REQUIRED_FIELDS",
    "SURROGATE_NAMESPACE",
    "Envelope",
    "Identified",
    "canonical_json",
    "format_timestamp",
    "identify",
    "json_defect",
    "parse_json_body",
    "parse_timestamp",
    "payload_digest",
    "wire_json",
]

#: Fields a well-formed envelope must carry; the rest are optional.
REQUIRED_FIELDS = (
    "message_id",
    "subject",
    "event_type",
    "event_version",
    "occurred_at",
    "aggregate_type",
    "aggregate_id",
    "payload",
)


def format_timestamp(moment: datetime) -> str:
    """RFC 3339 in UTC with microseconds and a ``Z`` (years below 1000 keep four digits)."""
    text = moment.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds")
    return text + "Z"


#: RFC 3339 date-time (§5.6), with a space allowed for the ``T`` as its note permits.
_RFC3339 = re.compile(
    r"(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})",
    re.ASCII,
)


#: What :func:`format_timestamp` writes (most timestamps read are in this form).
_CANONICAL_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z", re.ASCII)


def parse_timestamp(text: str) -> datetime:
    """Parse an RFC 3339 timestamp into an aware datetime in UTC.

    Naive ones are refused because they are ambiguous; fractions beyond microseconds are
    cut. Raises :class:`MalformedInput` (a ``ValueError``) naming the text, nothing else.
    """
    if isinstance(text, str) and _CANONICAL_TIME.fullmatch(text):
        # Ferry's own form: read directly (an impossible date goes the long way round,
        # which words the error).
        with contextlib.suppress(ValueError):
            return datetime.fromisoformat(text[:-1] + "+00:00")
    match = _RFC3339.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise MalformedInput(f"{shown(text)} is not an RFC 3339 time with a zone")
    day, clock, fraction, zone = match.groups()
    micros = (fraction or "").ljust(6, "0")[:6]
    offset = "+00:00" if zone in ("Z", "z") else zone
    try:
        moment = datetime.fromisoformat(f"{day}T{clock}.{micros}{offset}")
        return moment.astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        raise MalformedInput(f"{shown(text)}: {exc}") from None


@dataclass(frozen=True, slots=True)
class Envelope:
    """One domain event as Ferry carries it."""

    message_id: str
    subject: str
    event_type: str
    event_version: int
    occurred_at: datetime
    aggregate_type: str
    aggregate_id: str
    payload: dict[str, Any]
    context: str = ""
    correlation_id: str | None = None
    causation_id: str | None = None
    payload_digest: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document of the envelope (the handler request body's core)."""
        body: dict[str, Any] = {
            "message_id": self.message_id,
            "subject": self.subject,
            "context": self.context,
            "event_type": self.event_type,
            "event_version": self.event_version,
            "occurred_at": format_timestamp(self.occurred_at),
            "correlation_id": self.correlation_id,
            "causation_id": self.causation_id,
            "aggregate_type": self.aggregate_type,
            "aggregate_id": self.aggregate_id,
            "payload": self.payload,
            "payload_digest": self.payload_digest or payload_digest(self.payload),
        }
        body.update(self.extra)
        return body

    def to_wire(self) -> bytes:
        """Bytes for the JetStream message body."""
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False).encode()

    @classmethod
    def from_wire(cls, data: bytes, *, nats_subject: str | None = None) -> Envelope:
        """Parse and check a message body; raise :class:`PoisonError` naming the defect."""
        doc = parse_json_body(data)
        if not isinstance(doc, dict):
            raise PoisonError("MALFORMED_ENVELOPE", "body is JSON but not an object")
        return cls._from_sound_doc(doc, nats_subject=nats_subject)

    @classmethod
    def from_dict(cls, doc: dict[str, Any], *, nats_subject: str | None = None) -> Envelope:
        """Build from a decoded document; see :meth:`from_wire`."""
        defect = json_defect(doc, where="envelope", max_depth=MAX_PAYLOAD_DEPTH + 1)
        if defect is not None:
            raise PoisonError("MALFORMED_JSON", defect)
        return cls._from_sound_doc(doc, nats_subject=nats_subject)

    @classmethod
    def from_json_body(cls, doc: dict[str, Any], *, nats_subject: str | None = None) -> Envelope:
        """:meth:`from_dict` of a document :func:`parse_json_body` returned, which already
        holds it to the same depth and text rules (so it is not walked a second time)."""
        return cls._from_sound_doc(doc, nats_subject=nats_subject)

    @classmethod
    def _from_sound_doc(cls, doc: dict[str, Any], *, nats_subject: str | None) -> Envelope:
        missing = [name for name in REQUIRED_FIELDS if doc.get(name) in (None, "")]
        if missing:
            raise PoisonError("MISSING_FIELD", f"envelope lacks {', '.join(missing)}")
        envelope = cls(
            message_id=_uuid_field(doc, "message_id"),
            subject=_str_field(doc, "subject"),
            event_type=_str_field(doc, "event_type"),
            event_version=_version_field(doc),
            occurred_at=_timestamp_field(doc),
            aggregate_type=_str_field(doc, "aggregate_type"),
            aggregate_id=_str_field(doc, "aggregate_id"),
            payload=_payload_field(doc),
            context=_optional_str(doc, "context"),
            correlation_id=_optional_uuid(doc, "correlation_id"),
            causation_id=_optional_uuid(doc, "causation_id"),
            payload_digest=_optional_str(doc, "payload_digest"),
        )
        envelope.check(nats_subject=nats_subject)
        return envelope

    def check(self, *, nats_subject: str | None = None) -> None:
        """Cross-field checks: subject rule, subject agreement, payload digest."""
        parsed = _PARSED_SUBJECTS.get(self.subject)
        if parsed is None:
            try:
                parsed = parse_subject(self.subject)
            except OutboxValidationError as exc:
                raise PoisonError("INVALID_SUBJECT", exc.reason) from exc
            if len(_PARSED_SUBJECTS) >= _MAX_PARSED_SUBJECTS:
                _PARSED_SUBJECTS.clear()
            _PARSED_SUBJECTS[self.subject] = parsed
        if (parsed.event_type, parsed.version) != (self.event_type, self.event_version):
            raise PoisonError(
                "SUBJECT_MISMATCH",
                f"subject {shown(self.subject)} disagrees with event_type/event_version "
                f"{shown(self.event_type)}/{shown(self.event_version)}",
            )
        if nats_subject is not None and nats_subject != self.subject:
            raise PoisonError(
                "SUBJECT_MISMATCH",
                f"delivered on {shown(nats_subject)} but the envelope says {shown(self.subject)}",
            )
        if self.payload_digest and self.payload_digest != payload_digest(self.payload):
            raise PoisonError("DIGEST_MISMATCH", "payload_digest does not match the payload")


#: Subjects parsed so far (a process sees a handful of event types): parse_subject is pure.
_PARSED_SUBJECTS: dict[str, EventSubject] = {}
_MAX_PARSED_SUBJECTS = 1024


def _str_field(doc: dict[str, Any], name: str) -> str:
    value = doc[name]
    if not isinstance(value, str):
        raise PoisonError("INVALID_FIELD", f"{name} must be a string, got {type(value).__name__}")
    return value


def _optional_str(doc: dict[str, Any], name: str) -> str:
    return "" if doc.get(name) in (None, "") else _str_field(doc, name)


#: A UUID as ``str(uuid.UUID(...))`` writes it: such a text is already its own canonical form.
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _uuid_field(doc: dict[str, Any], name: str) -> str:
    value = _str_field(doc, name)
    if _CANONICAL_UUID.fullmatch(value):
        return value
    try:
        return str(uuid.UUID(value))
    except ValueError as exc:
        raise PoisonError("INVALID_FIELD", f"{name} {shown(value)} is not a UUID") from exc


def _optional_uuid(doc: dict[str, Any], name: str) -> str | None:
    return None if doc.get(name) in (None, "") else _uuid_field(doc, name)


def _version_field(doc: dict[str, Any]) -> int:
    value = doc["event_version"]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PoisonError(
            "INVALID_FIELD", f"event_version must be a positive integer: {shown(value)}"
        )
    return value


def _timestamp_field(doc: dict[str, Any]) -> datetime:
    value = _str_field(doc, "occurred_at")
    try:
        return parse_timestamp(value)
    except MalformedInput as exc:
        raise PoisonError("INVALID_FIELD", f"occurred_at: {exc}") from exc


def _payload_field(doc: dict[str, Any]) -> dict[str, Any]:
    value = doc["payload"]
    if not isinstance(value, dict):
        raise PoisonError("INVALID_FIELD", "payload must be a JSON object")
    return value


#: Namespace of surrogate ids for messages that carry no usable id of their own.
SURROGATE_NAMESPACE = uuid.UUID("5b0e4c2e-55a2-4f0e-9a43-5f1b1c6f0a11")
#: Replays travel on ``ferry.replay.{STREAM}.{durable}``; their envelope keeps its subject.
_REPLAY_PREFIX = "ferry.replay."


@dataclass(frozen=True, slots=True)
class Identified:
    """A stream message's inbox key and envelope, or the defect that makes it poison."""

    message_id: uuid.UUID
    envelope: Envelope | None
    poison: PoisonError | None


def identify(
    data: bytes, *, subject: str, msg_id_header: str | None, stream: str, seq: int
) -> Identified:
    """Parse without raising; the same key whoever asks (consumer or dlq-router).

    The inbox key is the envelope's ``message_id``, not ``Nats-Msg-Id``: a replay is
    published under a fresh Nats-Msg-Id (the duplicate window would drop it) but keeps
    its key. A body too broken to name its id falls back to the header, then to a
    surrogate derived from the stream position, so it can still be recorded once.
    """
    delivered_on = None if subject.startswith(_REPLAY_PREFIX) else subject
    envelope: Envelope | None = None
    poison: PoisonError | None = None
    try:
        envelope = Envelope.from_wire(data, nats_subject=delivered_on)
    except PoisonError as exc:
        poison = exc
    if envelope is not None:
        return Identified(uuid.UUID(envelope.message_id), envelope, None)
    try:
        key = uuid.UUID(str(msg_id_header))
    except ValueError:
        key = uuid.uuid5(SURROGATE_NAMESPACE, f"{stream}:{seq}")
    return Identified(key, None, poison)
