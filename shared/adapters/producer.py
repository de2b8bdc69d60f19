"""The producer API (REQ-050, INV-022): record an event inside the caller's transaction.

    async with conn.transaction():
        await conn.execute("UPDATE vibes SET title = $1 WHERE id = $2", title, vibe_id)
        await record_event(conn, aggregate_type="vibe", aggregate_id=vibe_id,
                           event_type="vibe_created", payload={...})

If the transaction rolls back, neither the state change nor the event exists; if it
commits, both do, and the outbox-publisher takes it from there. The event must be one the
manifests declare, and its payload must fit that version's schema (the registry file
``FERRY_REGISTRY`` names, else Ferry's own: :mod:`shared.contracts.events`); otherwise
nothing is written. Producers in other languages INSERT the SDS-047 columns into
``outbox_events`` themselves; the table's constraints enforce the same rules.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, NotRequired, TypedDict, Unpack

from shared.adapters.postgres import Conn, Statement, with_ctes
from shared.contracts.events import check_outgoing
from shared.domain.envelope import MAX_PAYLOAD_DEPTH, json_defect
from shared.domain.errors import OutboxValidationError
from shared.domain.subjects import validate_event_type, validate_event_version
from shared.telemetry import create_span

_INSERT_HEAD = (
    "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, event_version,"
    " payload, occurred_at, correlation_id, causation_id, traceparent, tracestate)"
)
_INSERT = (
    f"{_INSERT_HEAD} VALUES ($1, $2, $3, $4, $5, $6::jsonb, COALESCE($7, now()), $8, $9, $10, $11)"
)


class EventFields(TypedDict):
    """The event's arguments, as :func:`record_event` takes them."""

    aggregate_type: str
    aggregate_id: str
    event_type: str
    payload: dict[str, Any]
    event_version: NotRequired[int]
    event_id: NotRequired[uuid.UUID | str | None]
    occurred_at: NotRequired[datetime | None]
    correlation_id: NotRequired[uuid.UUID | str | None]
    causation_id: NotRequired[uuid.UUID | str | None]
    traceparent: NotRequired[str | None]
    context: NotRequired[str | None]
    tracestate: NotRequired[str | None]


#: Largest ``aggregate_type`` / ``aggregate_id`` (UTF-8 bytes): with the payload limit
#: below, it keeps the whole envelope inside the stream's max_msg_size.
MAX_KEY_BYTES = 1024


def _require_text(name: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise OutboxValidationError("INVALID_OUTBOX", name, "must be a non-empty string")
    defect = json_defect(value, where=name, forbid_nul=True)
    if defect is not None:
        raise OutboxValidationError("INVALID_OUTBOX", name, defect)
    size = len(value.encode())
    if size > MAX_KEY_BYTES:
        raise OutboxValidationError(
            "MESSAGE_TOO_LARGE",
            name,
            f"{size} bytes (UTF-8) exceeds the limit of {MAX_KEY_BYTES} bytes",
        )
    return value


def _optional_uuid(name: str, value: uuid.UUID | str | None) -> uuid.UUID | None:
    if value is None or isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise OutboxValidationError("INVALID_OUTBOX", name, f"{value!r} is not a UUID") from None


def _check_occurred_at(occurred_at: datetime | None) -> datetime | None:
    if occurred_at is None:
        return None
    if occurred_at.tzinfo is None:
        raise OutboxValidationError("INVALID_OUTBOX", "occurred_at", "must be timezone-aware")
    if occurred_at > datetime.now(UTC):
        raise OutboxValidationError(
            "FUTURE_EVENT",
            "occurred_at",
            f"{occurred_at.isoformat()} is in the future (POL-047-002)",
        )
    return occurred_at


def _check_declared(event_type: str, version: int, payload: object, context: str | None) -> None:
    check_outgoing(event_type, version, payload, context=context)


#: Largest payload the producer accepts, in UTF-8 bytes of compact JSON: exactly the bytes
#: the payload takes in the envelope on the wire. The default stream max_msg_size (1 MiB)
#: minus room for the envelope's other fields (at most a few KiB: ids, timestamps, the
#: subject, the digest, two keys of at most ``MAX_KEY_BYTES``).
MAX_PAYLOAD_BYTES = 1024 * 1024 - 64 * 1024


def _payload_json(payload: object) -> tuple[str, object]:
    """The payload as the JSON text stored and sent, and as it will be read back."""
    if not isinstance(payload, dict):
        raise OutboxValidationError("INVALID_OUTBOX", "payload", "must be a JSON object (a dict)")
    try:
        text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        # Checked as it will be read (JSON), so e.g. a tuple is checked as the array it becomes.
        decoded = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise OutboxValidationError(
            "INVALID_OUTBOX", "payload", f"not JSON-serialisable: {exc}"
        ) from exc
    except RecursionError:
        raise OutboxValidationError(
            "INVALID_OUTBOX", "payload", f"nested deeper than {MAX_PAYLOAD_DEPTH} levels"
        ) from None
    defect = json_defect(decoded, forbid_nul=True)
    if defect is not None:
        raise OutboxValidationError("INVALID_OUTBOX", "payload", defect)
    size = len(text.encode())
    if size > MAX_PAYLOAD_BYTES:
        # Refused here, where the caller can still act, rather than by the stream later,
        # where the row would only fail to publish over and over.
        raise OutboxValidationError(
            "MESSAGE_TOO_LARGE",
            "payload",
            f"{size} bytes of JSON (UTF-8) exceeds the limit of {MAX_PAYLOAD_BYTES} bytes "
            "(the envelope must fit the stream's max_msg_size, 1 MiB by default)",
        )
    return text, decoded


async def record_event(conn: Conn, **event: Unpack[EventFields]) -> uuid.UUID:
    """Insert one outbox row on ``conn``, which must be inside a transaction.

    Validates POL-047-001 (id and event type present), POL-047-002 (not in the future),
    the subject rule, and the payload against the manifests' schema of the version
    (``UNDECLARED_EVENT``, ``SCHEMA_INVALID``), raising :class:`OutboxValidationError`
    before anything is written. ``context`` names the producing context; it narrows the
    manifest lookup (needed only when two contexts declare one type and version
    differently). Returns the event id, which becomes the ``Nats-Msg-Id``.

    Tracing: a ``create`` span (child of ``traceparent``/``tracestate`` when given, else
    of the caller's current span) is recorded, and its context stored in the row, so the
    event's trace runs on through the publisher, the consumer and the handler.
    """
    if not conn.is_in_transaction():
        raise OutboxValidationError(
            "INVALID_OUTBOX", "conn", "record_event must run inside the caller's transaction"
        )
    with _checked_row(**event) as (row_id, values):
        await conn.execute(_INSERT, *values)
    return row_id


def event_statement(
    change: Statement,
    **event: Unpack[EventFields],
) -> tuple[uuid.UUID, Statement]:
    """The state ``change`` and the event's outbox row as ONE statement: atomic on its
    own, one round trip. Returns the event id and that statement, to run (see
    :func:`record_event_with`) or to hand on (a handler's ``@one_statement`` route).

    The same checks and ``create`` span as :func:`record_event`. The row is inserted by a
    CTE ahead of ``change``, so it is written whatever ``change`` matches — zero rows
    included: an event that depends on what the change finds needs the transaction form.
    """
    with _checked_row(**event) as (row_id, values):
        first = len(change.args) + 1
        placeholders = [f"${n}" for n in range(first, first + len(values))]
        placeholders[5] += "::jsonb"
        placeholders[6] = f"COALESCE({placeholders[6]}::timestamptz, now())"
        cte = f"ferry_event AS ({_INSERT_HEAD} VALUES ({', '.join(placeholders)}))"
        statement = Statement(with_ctes(change.sql, cte), (*change.args, *values))
    return row_id, statement


async def record_event_with(
    conn: Conn,
    change: Statement,
    **event: Unpack[EventFields],
) -> uuid.UUID:
    """Run the state ``change`` and record its event as ONE statement (one round trip
    instead of a transaction's four); see :func:`event_statement`. ``conn`` may be in a
    transaction or not: both or neither are written either way."""
    row_id, statement = event_statement(change, **event)
    await conn.execute(statement.sql, *statement.args)
    return row_id


@contextlib.contextmanager
def _checked_row(
    *,
    aggregate_type: str,
    aggregate_id: str,
    event_type: str,
    payload: dict[str, Any],
    event_version: int = 1,
    event_id: uuid.UUID | str | None = None,
    occurred_at: datetime | None = None,
    correlation_id: uuid.UUID | str | None = None,
    causation_id: uuid.UUID | str | None = None,
    traceparent: str | None = None,
    context: str | None = None,
    tracestate: str | None = None,
) -> Iterator[tuple[uuid.UUID, tuple[Any, ...]]]:
    """The event's id and its outbox values in :data:`_INSERT`'s order, checked, inside
    its ``create`` span (raises :class:`OutboxValidationError` before anything)."""
    row_id = _optional_uuid("event_id", event_id) or uuid.uuid4()
    aggregate = (
        _require_text("aggregate_type", aggregate_type),
        _require_text("aggregate_id", aggregate_id),
    )
    checked_type = validate_event_type(event_type)
    checked_version = validate_event_version(event_version)
    payload_json, decoded = _payload_json(payload)
    checked_at = _check_occurred_at(occurred_at)
    links = (
        _optional_uuid("correlation_id", correlation_id),
        _optional_uuid("causation_id", causation_id),
    )
    _check_declared(checked_type, checked_version, decoded, context)
    with create_span(
        event_type=checked_type,
        event_version=checked_version,
        message_id=str(row_id),
        traceparent=traceparent,
        tracestate=tracestate,
        correlation_id=str(links[0]) if links[0] else None,
        context=context,
    ) as trace_context:
        yield (
            row_id,
            (
                row_id,
                *aggregate,
                checked_type,
                checked_version,
                payload_json,
                checked_at,
                *links,
                *trace_context,
            ),
        )
