"""The dead-letter store: one record per (durable, message_id), and replays of it.

Both dead-letter paths write through :func:`record_dead_letter` — the inbox-consumer's
direct path (422, malformed input, digest mismatch) and the dlq-router (JetStream's
MAX_DELIVERIES / MSG_TERMINATED advisories) — so whichever comes second finds the row and
does nothing. In one transaction of the target context's database it:

1. locks (or inserts) the ``dead_letters`` row;
2. publishes the record (EVT-047-002 MessageDeadLettered + INFRA-005 §4) on the durable's
   dead-letter subject with ``Nats-Msg-Id = durable:message_id:generation``, so a
   re-publish after a crash is dropped by the dead-letter stream's (day-long) window;
3. marks the inbox row failed, with ``dlq_metadata``.

A publish failure rolls the transaction back and the caller retries later; a crash after
the publish and before the commit re-publishes under the same id. Nothing is lost and no
record is written twice.

:func:`replay` republishes the original envelope under a fresh ``Nats-Msg-Id`` (JetStream's
duplicate window would swallow the old one) on ``ferry.replay.{STREAM}.{durable}``, which
only the failed durable's filter covers; ``message_id`` — the inbox key — is unchanged, so
a replay of something a handler already applied is answered 409 and processed once.
"""

from __future__ import annotations

import json
import logging
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal
from uuid import UUID

from nats.js import JetStreamContext

from shared import telemetry
from shared.adapters import dead_letter_records, inbox
from shared.adapters.postgres import Conn
from shared.contracts.topology import DurableSpec, ReplayLimits
from shared.domain import dead_letter as policy
from shared.domain.dead_letter import NOT_REPLAYABLE, dead_letter_record
from shared.domain.envelope import format_timestamp
from shared.domain.subjects import replay_subject

log = logging.getLogger("ferry.dead_letters")

__all__ = ["NOT_REPLAYABLE", "Failure", "NoEnvelope", "NotReplayable", "record_dead_letter"]

#: Statuses an operator may replay from, and those that are final.
REPLAYABLE_STATUSES = ("dead", "held", "parked")
FINAL_STATUSES = ("replayed", "discarded")

Source = Literal["consumer", "advisory:max_deliveries", "advisory:terminated", "sweep"]
Outcome = Literal["recorded", "already"]


@dataclass(frozen=True)
class Failure:
    """Everything known about a message that will not be delivered again."""

    durable: str
    message_id: UUID
    stream: str
    stream_seq: int | None
    original_subject: str
    reason_code: str
    last_error: str
    attempts: int
    #: The original message: the parsed envelope, else its raw text (never lost).
    payload: Any
    retry_history: list[dict[str, Any]]
    source: Source
    event_type: str | None = None
    event_version: int | None = None
    occurred_at: datetime | None = None
    traceparent: str | None = None
    handler_status: int | None = None
    #: A retry-history entry for this last attempt, if the caller has one to add.
    history_entry: dict[str, Any] | None = None


def replay_delay(
    limits: ReplayLimits, replay_attempts: int, rng: random.Random | None = None
) -> float:
    """Full-jitter back-off before replay number ``replay_attempts + 1`` (domain policy)."""
    return policy.replay_delay(limits.base_delay, limits.max_delay, replay_attempts, rng)


def initial_status(spec: DurableSpec, reason_code: str, replay_attempts: int) -> str:
    """Where a new (or again) dead letter starts: dead (auto-replay), held, or parked."""
    return policy.initial_status(
        spec.replay, reason_code, replay_attempts, spec.replay_limits.max_attempts
    )


_LOCK = """
SELECT status, generation, replay_attempts, stream_seq FROM dead_letters
WHERE durable = $1 AND message_id = $2 FOR UPDATE
"""

_INSERT = """
INSERT INTO dead_letters (durable, message_id, stream, stream_seq, original_subject, event_type,
                          event_version, reason_code, last_error, attempts, record, dlq_subject,
                          source, traceparent, status, next_replay_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::jsonb, $12, $13, $14, $15,
        clock_timestamp() + $16 * interval '1 second')
ON CONFLICT (durable, message_id) DO NOTHING
RETURNING 1
"""

# A replay failed again: same row, next generation.
_AGAIN = """
UPDATE dead_letters
SET stream_seq = $3, reason_code = $4, last_error = $5, attempts = $6, record = $7::jsonb,
    source = $8, status = $9, next_replay_at = clock_timestamp() + $10 * interval '1 second',
    generation = $11, dead_lettered_at = clock_timestamp(), updated_at = clock_timestamp(),
    replay_history = replay_history || jsonb_build_array($12::jsonb)
WHERE durable = $1 AND message_id = $2
"""

_ACTION = """
INSERT INTO dead_letter_actions (durable, message_id, action, actor, reason, details)
VALUES ($1, $2, $3, $4, $5, $6::jsonb)
"""


async def record_dead_letter(
    conn: Conn,
    js: JetStreamContext,
    failure: Failure,
    spec: DurableSpec,
    *,
    dlq_stream: str | None = None,
) -> Outcome:
    """Record ``failure`` once (see the module doc); ``already`` when another path did.

    Text PostgreSQL cannot store (NUL, lone surrogates) never fails it: the payload is
    kept exactly (:func:`~shared.adapters.dead_letter_records.stored_record`), other
    text with a replacement character.

    ``dlq_stream`` names the dead-letter stream, whose max_msg_size then bounds the
    published record (:mod:`shared.adapters.dead_letter_records`).
    """
    failure = _storable(failure)
    async with conn.transaction():
        row = await conn.fetchrow(_LOCK, failure.durable, failure.message_id)
        if row is not None and not _is_failed_replay(row, failure):
            return "already"
        generation = row["generation"] + 1 if row else 1
        replay_attempts = row["replay_attempts"] if row else 0
        status = initial_status(spec, failure.reason_code, replay_attempts)
        delay = replay_delay(spec.replay_limits, replay_attempts) if status == "dead" else None
        record = _record(failure, spec, generation, replay_attempts, status)
        if row is None:
            inserted = await conn.fetchval(
                _INSERT, *_insert_args(failure, spec, record, status, delay)
            )
            if inserted is None:  # another router replica got there first
                return "already"
        else:
            await conn.execute(
                _AGAIN,
                failure.durable,
                failure.message_id,
                failure.stream_seq,
                failure.reason_code,
                failure.last_error,
                failure.attempts,
                dead_letter_records.stored_record(record),
                failure.source,
                status,
                delay,
                generation,
                json.dumps(_event("failed", failure.reason_code, failure.last_error)),
            )
            if status == "parked":
                await _action(
                    conn,
                    failure.durable,
                    failure.message_id,
                    "auto_park",
                    "dlq-replayer",
                    f"replay cap of {spec.replay_limits.max_attempts} reached",
                    {},
                )
        await _publish_record(js, spec, failure, record, generation, dlq_stream)
        await inbox.mark_dead_lettered(conn, failure.durable, _inbox_row(failure, spec, record))
    return "recorded"


def _storable(failure: Failure) -> Failure:
    """``failure`` with the text that goes into columns fit for PostgreSQL."""
    clean = dead_letter_records.storable
    return replace(
        failure,
        original_subject=clean(failure.original_subject),
        last_error=clean(failure.last_error),
        retry_history=clean(failure.retry_history),
        history_entry=clean(failure.history_entry),
    )


def _is_failed_replay(row: Any, failure: Failure) -> bool:
    """A replay of this row is in flight and this failure is of that replay, not older.

    A replay is published into the stream of the failure it repeats, so its sequence is
    always greater than the recorded one (``stream_seq``, which the replay never changes);
    a late advisory for the recorded delivery (or an earlier one) is never greater.
    """
    return bool(
        row["status"] == "replaying"
        and failure.stream_seq is not None
        and failure.stream_seq > (row["stream_seq"] or 0)
    )


def _record(
    failure: Failure, spec: DurableSpec, generation: int, replay_attempts: int, status: str
) -> dict[str, Any]:
    history = list(failure.retry_history)
    if failure.history_entry is not None:
        history.append(failure.history_entry)
    record = dead_letter_record(
        durable=failure.durable,
        stream=failure.stream,
        stream_sequence=failure.stream_seq or 0,
        message_id=str(failure.message_id),
        original_subject=failure.original_subject,
        reason_code=failure.reason_code,
        last_error=failure.last_error,
        attempts=failure.attempts,
        payload=failure.payload,
        retry_history=history,
        traceparent=failure.traceparent,
    )
    record.update(
        source=failure.source,
        generation=generation,
        replay_policy=spec.replay,
        replay_attempts=replay_attempts,
        status=status,
        dead_letter_subject=spec.dead_letter_subject,
    )
    return record


def _insert_args(
    failure: Failure, spec: DurableSpec, record: dict[str, Any], status: str, delay: float | None
) -> tuple[Any, ...]:
    return (
        failure.durable,
        failure.message_id,
        failure.stream,
        failure.stream_seq,
        failure.original_subject,
        failure.event_type,
        failure.event_version,
        failure.reason_code,
        failure.last_error,
        failure.attempts,
        dead_letter_records.stored_record(record),
        spec.dead_letter_subject,
        failure.source,
        failure.traceparent,
        status,
        delay,
    )


async def _publish_record(
    js: JetStreamContext,
    spec: DurableSpec,
    failure: Failure,
    record: dict[str, Any],
    generation: int,
    dlq_stream: str | None,
) -> None:
    headers = {
        "Nats-Msg-Id": f"{failure.durable}:{failure.message_id}:{generation}",
        "Ferry-Reason": failure.reason_code,
    }
    if failure.traceparent:
        headers["traceparent"] = failure.traceparent
    # In the trace that dead-letters it (the consumer's, or the router's linked one).
    with telemetry.publish_span(
        spec.dead_letter_subject,
        message_id=str(failure.message_id),
        headers=headers,
        extra={"ferry.reason_code": failure.reason_code, "ferry.durable": failure.durable},
    ):
        fitted = await dead_letter_records.publish(
            js, spec.dead_letter_subject, record, headers, stream=dlq_stream
        )
        if fitted.by_reference:
            log.info(
                "dead-letter record keeps the payload by reference",
                extra={"durable": failure.durable, "message_id": str(failure.message_id)},
            )


def _inbox_row(
    failure: Failure, spec: DurableSpec, record: dict[str, Any]
) -> inbox.DeadLetteredRow:
    return inbox.DeadLetteredRow(
        message_id=failure.message_id,
        subject=failure.original_subject,
        error=failure.last_error,
        status=failure.handler_status,
        reason_code=failure.reason_code,
        dlq_metadata={
            "subject": spec.dead_letter_subject,
            "reason": failure.reason_code,
            "source": failure.source,
            "generation": record["generation"],
            "status": record["status"],
            "replay_attempts": record["replay_attempts"],
            "dead_lettered_at": record["dead_lettered_at"],
        },
        history_entry=failure.history_entry,
        attempts=failure.attempts,
        event_type=failure.event_type,
        event_version=failure.event_version,
        occurred_at=failure.occurred_at,
        stream_seq=failure.stream_seq,
        traceparent=failure.traceparent,
    )


def _event(kind: str, reason: str, detail: str, **extra: Any) -> dict[str, Any]:
    return {
        "event": kind,
        "at": format_timestamp(datetime.now(UTC)),
        "reason": reason,
        "detail": detail[:500],
        **extra,
    }


async def _action(
    conn: Conn,
    durable: str,
    message_id: UUID,
    action: str,
    actor: str,
    reason: str,
    details: dict[str, Any],
) -> None:
    await conn.execute(
        _ACTION, durable, message_id, action, actor, reason, json.dumps(details, default=str)
    )


# --------------------------------------------------------------------------- replays


@dataclass(frozen=True)
class Replayed:
    """One replay that was published."""

    durable: str
    message_id: UUID
    replay_attempt: int
    subject: str
    stream_seq: int


_LOCK_FOR_REPLAY = """
SELECT status, record, replay_attempts, traceparent, stream FROM dead_letters
WHERE durable = $1 AND message_id = $2 FOR UPDATE
"""

_MARK_REPLAYING = """
UPDATE dead_letters
SET status = 'replaying', replay_attempts = $3, last_replay_at = clock_timestamp(),
    next_replay_at = NULL, replay_published_at = NULL, updated_at = clock_timestamp(),
    replay_history = replay_history || jsonb_build_array($4::jsonb)
WHERE durable = $1 AND message_id = $2
"""

_PUBLISHED = """
UPDATE dead_letters
SET replay_stream_seq = $4, replay_published_at = clock_timestamp(), updated_at = clock_timestamp()
WHERE durable = $1 AND message_id = $2 AND status = 'replaying' AND replay_attempts = $3
"""

# Replays marked but never confirmed published (a crash between the two): publish again.
# The same Nats-Msg-Id inside the duplicate window is dropped, and a second copy outside
# it meets an inbox row that is already final, so this can never process anything twice.
_UNCONFIRMED = """
SELECT message_id, replay_attempts FROM dead_letters
WHERE durable = $1 AND status = 'replaying' AND replay_published_at IS NULL
  AND last_replay_at < clock_timestamp() - $2 * interval '1 second'
"""


class NotReplayable(Exception):
    """The dead letter is missing, final, or has no envelope to replay."""


class NoEnvelope(NotReplayable):
    """The dead letter keeps no parseable envelope: only an operator can settle it."""


async def replay(
    conn: Conn,
    js: JetStreamContext,
    *,
    durable: str,
    message_id: UUID,
    actor: str,
    reason: str,
    automatic: bool,
    allowed: Sequence[str] = REPLAYABLE_STATUSES,
) -> Replayed:
    """Replay one dead letter: record it, then publish it, then confirm the publish.

    The inbox row is reopened and committed *before* the publish — otherwise the consumer
    could receive the replay while the row still says failed, and skip it as a duplicate.
    A failed publish or a crash before the confirmation is healed by
    :func:`republish_unconfirmed`.
    """
    async with conn.transaction():
        row = await conn.fetchrow(_LOCK_FOR_REPLAY, durable, message_id)
        if row is None:
            raise NotReplayable(f"no dead letter {durable}/{message_id}")
        if row["status"] not in allowed:
            raise NotReplayable(
                f"{durable}/{message_id} is {row['status']}; replayable from: {', '.join(allowed)}"
            )
        record = json.loads(row["record"])
        if dead_letter_records.replay_body(record) is None:
            raise NoEnvelope(
                f"{durable}/{message_id} has no parseable envelope to replay "
                f"({record.get('reasonCode')}); discard it or republish it at the source"
            )
        attempt = row["replay_attempts"] + 1
        event = _event("replayed", reason, "", actor=actor, attempt=attempt)
        await conn.execute(_MARK_REPLAYING, durable, message_id, attempt, json.dumps(event))
        await inbox.reopen_for_replay(
            conn,
            durable,
            message_id,
            {
                "subject": record.get("dead_letter_subject"),
                "reason": record.get("reasonCode"),
                "status": "replaying",
                "replay_attempts": attempt,
                "last_replay_at": format_timestamp(datetime.now(UTC)),
            },
        )
        await _action(
            conn,
            durable,
            message_id,
            "auto_replay" if automatic else "replay",
            actor,
            reason,
            {"attempt": attempt},
        )
    # A failed publish leaves the entry 'replaying' and unconfirmed: republish_unconfirmed
    # publishes it again under the same Nats-Msg-Id (undoing instead could race a publish
    # that did land but whose PubAck was lost).
    seq = await _publish_replay(js, durable, message_id, row, record, attempt)
    await conn.execute(_PUBLISHED, durable, message_id, attempt, seq)
    return Replayed(durable, message_id, attempt, replay_subject(row["stream"], durable), seq)


async def _publish_replay(
    js: JetStreamContext,
    durable: str,
    message_id: UUID,
    row: Any,
    record: dict[str, Any],
    attempt: int,
) -> int:
    headers = {
        "Nats-Msg-Id": f"replay:{durable}:{message_id}:{attempt}",
        "Ferry-Replay": str(attempt),
        "Ferry-Original-Subject": str(record.get("original_subject", "")),
    }
    if row["traceparent"]:
        headers["traceparent"] = row["traceparent"]
    body = dead_letter_records.replay_body(record)  # UTF-8, byte for byte as stored
    if body is None:
        raise NoEnvelope(f"{durable}/{message_id} has no envelope to replay")
    subject = replay_subject(row["stream"], durable)
    # A replay starts a new trace, linked to the message's original one.
    with telemetry.publish_span(
        subject,
        message_id=str(message_id),
        headers=headers,
        root=True,
        link=row["traceparent"],
        extra={"ferry.replay.attempt": attempt, "ferry.durable": durable},
    ):
        ack = await js.publish(subject, body, headers=headers)
    return int(ack.seq)


async def republish_unconfirmed(
    conn: Conn, js: JetStreamContext, durable: str, *, older_than: float
) -> int:
    """Publish again the replays whose publish was never confirmed; how many."""
    count = 0
    for due in await conn.fetch(_UNCONFIRMED, durable, older_than):
        row = await conn.fetchrow(
            "SELECT record, traceparent, stream FROM dead_letters "
            "WHERE durable = $1 AND message_id = $2",
            durable,
            due["message_id"],
        )
        if row is None:
            continue
        record = json.loads(row["record"])
        attempt = due["replay_attempts"]
        seq = await _publish_replay(js, durable, due["message_id"], row, record, attempt)
        await conn.execute(_PUBLISHED, durable, due["message_id"], attempt, seq)
        count += 1
    return count


# --------------------------------------------------------------------------- operator actions


_SET_STATUS = """
UPDATE dead_letters SET status = $3, next_replay_at = NULL, updated_at = clock_timestamp(),
    replay_history = replay_history || jsonb_build_array($4::jsonb)
WHERE durable = $1 AND message_id = $2 AND status = ANY($5::text[])
RETURNING 1
"""


async def set_status(
    conn: Conn,
    *,
    durable: str,
    message_id: UUID,
    status: Literal["parked", "discarded"],
    actor: str,
    reason: str,
) -> bool:
    """Park or discard one dead letter (with the action recorded); False if not allowed."""
    allowed = ["dead", "held"] if status == "parked" else ["dead", "held", "parked", "replaying"]
    async with conn.transaction():
        done = await conn.fetchval(
            _SET_STATUS,
            durable,
            message_id,
            status,
            json.dumps(_event(status, reason, "", actor=actor)),
            allowed,
        )
        if done is None:
            return False
        await _action(
            conn,
            durable,
            message_id,
            "park" if status == "parked" else "discard",
            actor,
            reason,
            {},
        )
    return True


# Replays whose delivery the consumer has since processed.
_SETTLE_REPLAYED = """
UPDATE dead_letters AS d
SET status = 'replayed', replayed_at = i.processed_at, updated_at = clock_timestamp()
FROM inbox_messages AS i
WHERE d.status = 'replaying' AND i.durable = d.durable AND i.message_id = d.message_id
  AND i.status = 'processed' AND d.durable = ANY($1::text[])
RETURNING d.durable, d.message_id
"""


async def settle_replayed(conn: Conn, durables: Sequence[str]) -> int:
    """Mark replays that were processed as ``replayed``; how many."""
    async with conn.transaction():
        rows = await conn.fetch(_SETTLE_REPLAYED, list(durables))
        for r in rows:
            await conn.execute(
                """UPDATE inbox_messages SET dlq_metadata = coalesce(dlq_metadata, '{}'::jsonb)
                   || '{"status": "replayed"}'::jsonb WHERE durable = $1 AND message_id = $2""",
                r["durable"],
                r["message_id"],
            )
    return len(rows)


@dataclass
class Query:
    """Filters for listing dead letters (operator CLI)."""

    durables: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)
    subject: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    message_ids: list[UUID] = field(default_factory=list)
    limit: int | None = None


def subject_regex(pattern: str) -> str:
    """A PostgreSQL regex for a NATS subject pattern (``*`` one token, ``>`` the rest)."""
    parts = []
    for token in pattern.split("."):
        parts.append("[^.]+" if token == "*" else ".+" if token == ">" else re.escape(token))
    return "^" + r"\.".join(parts) + "$"


def _where(query: Query) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    args: list[Any] = []

    def add(sql: str, value: Any) -> None:
        args.append(value)
        clauses.append(sql.format(f"${len(args)}"))

    if query.durables:
        add("durable = ANY({}::text[])", query.durables)
    if query.reasons:
        add("reason_code = ANY({}::text[])", query.reasons)
    if query.statuses:
        add("status = ANY({}::text[])", query.statuses)
    if query.subject:
        add("original_subject ~ {}", subject_regex(query.subject))
    if query.since:
        add("dead_lettered_at >= {}", query.since)
    if query.until:
        add("dead_lettered_at < {}", query.until)
    if query.message_ids:
        add("message_id = ANY({}::uuid[])", query.message_ids)
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", args


async def find(conn: Conn, query: Query) -> list[dict[str, Any]]:
    """Dead letters matching ``query``, oldest first, with their record decoded."""
    where, args = _where(query)
    sql = f"SELECT * FROM dead_letters{where} ORDER BY dead_lettered_at, durable, message_id"
    if query.limit:
        sql += f" LIMIT {int(query.limit)}"
    rows = await conn.fetch(sql, *args)
    out = []
    for r in rows:
        doc = dict(r)
        doc["record"] = json.loads(doc["record"])
        doc["replay_history"] = json.loads(doc["replay_history"])
        out.append(doc)
    return out


async def actions(conn: Conn, durable: str, message_id: UUID) -> list[dict[str, Any]]:
    """The recorded actions on one dead letter, oldest first."""
    rows = await conn.fetch(
        "SELECT action, actor, reason, at, details FROM dead_letter_actions "
        "WHERE durable = $1 AND message_id = $2 ORDER BY at, id",
        durable,
        message_id,
    )
    return [{**dict(r), "details": json.loads(r["details"])} for r in rows]
