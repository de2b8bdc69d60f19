"""Recording a dead letter: one record per (durable, message_id), whichever path is first.

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
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from nats.js import JetStreamContext

from shared import telemetry
from shared.adapters import inbox
from shared.adapters.dead_letters import records
from shared.adapters.dead_letters.audit import record_action
from shared.adapters.postgres import Conn
from shared.contracts.topology import DurableSpec, ReplayLimits
from shared.domain import dead_letter as policy
from shared.domain.dead_letter import dead_letter_record, history_event, is_failed_replay

log = logging.getLogger("ferry.dead_letters")

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
    #: ``ordering: key`` durables: the event's key and what its later events do
    #: (``held`` behind it, or ``order_broken_after`` it).
    ordering: dict[str, Any] | None = None


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
    kept exactly (:func:`~shared.adapters.dead_letters.records.stored_record`), other
    text with a replacement character.

    ``dlq_stream`` names the dead-letter stream, whose max_msg_size then bounds the
    published record (:mod:`shared.adapters.dead_letters.records`).
    """
    failure = _storable(failure)
    async with conn.transaction():
        row = await conn.fetchrow(_LOCK, failure.durable, failure.message_id)
        if row is not None and not is_failed_replay(
            row["status"], row["stream_seq"], failure.stream_seq
        ):
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
                records.stored_record(record),
                failure.source,
                status,
                delay,
                generation,
                json.dumps(history_event("failed", failure.reason_code, failure.last_error)),
            )
            if status == "parked":
                await record_action(
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
    clean = records.storable
    return replace(
        failure,
        original_subject=clean(failure.original_subject),
        last_error=clean(failure.last_error),
        retry_history=clean(failure.retry_history),
        history_entry=clean(failure.history_entry),
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
    if failure.ordering is not None:
        record["ordering"] = failure.ordering
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
        records.stored_record(record),
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
        fitted = await records.publish(
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
            **({"ordering": failure.ordering} if failure.ordering is not None else {}),
        },
        history_entry=failure.history_entry,
        attempts=failure.attempts,
        event_type=failure.event_type,
        event_version=failure.event_version,
        occurred_at=failure.occurred_at,
        stream_seq=failure.stream_seq,
        traceparent=failure.traceparent,
    )
