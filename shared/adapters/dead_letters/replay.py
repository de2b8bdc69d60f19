"""Replaying dead letters, and the operator's other actions on them.

:func:`replay` republishes the original envelope under a fresh ``Nats-Msg-Id`` (JetStream's
duplicate window would swallow the old one) on ``ferry.replay.{STREAM}.{durable}``, which
only the failed durable's filter covers — for an ``ordering: key`` durable on a partitioned
stream ``….{durable}.{k}``, k the partition of the event's ordering key now, so the replay
comes back through its key's partition; ``message_id`` — the inbox key — is unchanged, so
a replay of something a handler already applied is answered 409 and processed once.
:func:`republish_unconfirmed` heals a replay whose publish was never confirmed,
:func:`settle_replayed` marks those processed since, :func:`set_status` parks or discards.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal
from uuid import UUID

from nats.js import JetStreamContext

from shared import telemetry
from shared.adapters import inbox
from shared.adapters.dead_letters import records
from shared.adapters.dead_letters.audit import record_action
from shared.adapters.dead_letters.edit import Edit, apply_edit
from shared.adapters.postgres import Conn
from shared.contracts.topology import Topology
from shared.domain.dead_letter import (
    DISCARDABLE_STATUSES,
    PARKABLE_STATUSES,
    REPLAYABLE_STATUSES,
    history_event,
)
from shared.domain.envelope import format_timestamp
from shared.domain.ordering import OrderingKeyError


@dataclass(frozen=True)
class Replayed:
    """One replay that was published."""

    durable: str
    message_id: UUID
    replay_attempt: int
    subject: str
    stream_seq: int
    #: An edited replay: its ``dead_letter_edits`` row and the paths it changed.
    edit_id: int | None = None
    changed: tuple[str, ...] = ()


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
    topology: Topology,
    edit: Edit | None = None,
) -> Replayed:
    """Replay one dead letter: record it, then publish it, then confirm the publish.

    ``topology`` (the durable's) places the replay on its key's partition when the
    durable has a consumer per partition; without it the replay goes to the durable's
    plain replay subject, which only an unpartitioned consumer reads.

    The inbox row is reopened and committed *before* the publish — otherwise the consumer
    could receive the replay while the row still says failed, and skip it as a duplicate.
    A failed publish or a crash before the confirmation is healed by
    :func:`republish_unconfirmed`.

    With ``edit`` (edit-and-retry, :mod:`~shared.adapters.dead_letters.edit`) the row's
    envelope takes the edited payload and the edit is audited in the same transaction, so
    the replay — and any republish of it — carries the edited payload under the same
    message id; an :class:`~shared.adapters.dead_letters.edit.EditRefused` changes nothing.
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
        if records.replay_body(record) is None:
            raise NoEnvelope(
                f"{durable}/{message_id} has no parseable envelope to replay "
                f"({record.get('reasonCode')}); discard it or republish it at the source"
            )
        attempt = row["replay_attempts"] + 1
        details: dict[str, Any] = {"attempt": attempt}
        if edit is not None:
            record, edited = await apply_edit(
                conn, durable, message_id, record, edit, attempt=attempt, actor=actor,
                reason=reason,
            )  # fmt: skip
            details.update(edited)
        subject = _replay_subject(topology, durable, message_id, row, record)
        detail = "edited " + ", ".join(details["changed"]) if edit is not None else ""
        event = history_event("replayed", reason, detail, actor=actor, attempt=attempt)
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
        await record_action(
            conn,
            durable,
            message_id,
            "edit" if edit is not None else "auto_replay" if automatic else "replay",
            actor,
            reason,
            details,
        )
    # A failed publish leaves the entry 'replaying' and unconfirmed: republish_unconfirmed
    # publishes it again under the same Nats-Msg-Id (undoing instead could race a publish
    # that did land but whose PubAck was lost).
    seq = await _publish_replay(js, durable, message_id, row, record, attempt, subject)
    await conn.execute(_PUBLISHED, durable, message_id, attempt, seq)
    return Replayed(
        durable, message_id, attempt, subject, seq, details.get("edit_id"),
        tuple(details.get("changed", ())),
    )  # fmt: skip


def _replay_subject(
    topology: Topology, durable: str, message_id: UUID, row: Any, record: dict[str, Any]
) -> str:
    """The replay's subject (see :meth:`Topology.replay_subject_for`). The topology is
    required: without it a partitioned durable's replay would go to a subject none of its
    partition consumers reads, and be lost silently."""
    if durable not in topology.durables:
        raise NotReplayable(
            f"{durable}/{message_id}: durable not in topology {topology.name!r}; replay it "
            "with the topology it belongs to"
        )
    body = records.replay_body(record)
    try:
        envelope = json.loads(body) if body is not None else None
    except ValueError:
        envelope = None
    if not isinstance(envelope, dict):
        envelope = {}
    try:
        return topology.replay_subject_for(durable, envelope)
    except OrderingKeyError as exc:
        raise NotReplayable(
            f"{durable}/{message_id}: its ordering key cannot be read ({exc}), so it has no "
            "partition to replay through; discard it or republish it at the source"
        ) from None


async def _publish_replay(
    js: JetStreamContext,
    durable: str,
    message_id: UUID,
    row: Any,
    record: dict[str, Any],
    attempt: int,
    subject: str,
) -> int:
    headers = {
        "Nats-Msg-Id": f"replay:{durable}:{message_id}:{attempt}",
        "Ferry-Replay": str(attempt),
        "Ferry-Original-Subject": str(record.get("original_subject", "")),
    }
    if row["traceparent"]:
        headers["traceparent"] = row["traceparent"]
    body = records.replay_body(record)  # UTF-8, byte for byte as stored
    if body is None:
        raise NoEnvelope(f"{durable}/{message_id} has no envelope to replay")
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
    conn: Conn,
    js: JetStreamContext,
    durable: str,
    *,
    older_than: float,
    topology: Topology,
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
        subject = _replay_subject(topology, durable, due["message_id"], row, record)
        seq = await _publish_replay(js, durable, due["message_id"], row, record, attempt, subject)
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
    allowed = list(PARKABLE_STATUSES if status == "parked" else DISCARDABLE_STATUSES)
    async with conn.transaction():
        done = await conn.fetchval(
            _SET_STATUS,
            durable,
            message_id,
            status,
            json.dumps(history_event(status, reason, "", actor=actor)),
            allowed,
        )
        if done is None:
            return False
        await record_action(
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
