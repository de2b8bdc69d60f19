"""The inbox repository (PORT-047-002) on PostgreSQL: queries shared by roles and tools."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from shared.adapters.postgres import Conn, fetch_backlog
from shared.domain.ports import FailedAttempt, InboxDelivery

# The rows in play through idx_inbox_open (migration 0021), and the dead letters still
# open through idx_dead_letters_status: never the year of processed rows, nor the
# dead-lettered rows whose dead letter was settled (discarded, or replayed and processed).
_BACKLOG = """
SELECT o.count + f.failed AS count, o.oldest_at, o.retrying, f.failed
FROM (SELECT count(*) AS count, min(received_at) AS oldest_at,
             count(*) FILTER (WHERE status = 'retrying') AS retrying
      FROM inbox_messages
      WHERE durable = $1 AND status IN ('received', 'processing', 'retrying')) AS o,
     (SELECT count(*) AS failed FROM dead_letters
      WHERE durable = $1 AND status IN ('dead', 'held', 'replaying', 'parked')) AS f
"""


async def backlog(conn: Conn, durable: str) -> dict[str, Any]:
    """QRY-051: unprocessed count and oldest received_at for ``durable``.

    The rows in play (received, processing, retrying) plus the dead letters still open
    (``failed``: dead, held, replaying or parked — waiting for the replayer or an
    operator), shown apart so an operator can tell a stuck consumer from poison. A dead
    letter settled by a discard is no longer counted, and one the dlq-router has yet to
    record (a second or so after the consumer gave up) not yet. The oldest is the oldest
    row still in play (a dead letter waits for an operator).
    """
    return await fetch_backlog(conn, _BACKLOG, durable)


# Record-before-processing (REQ-051), for a whole fetched batch in one round trip.
# A row is (re)claimed unless its outcome is final or another delivery holds a live
# lease on it; 'inserted' tells a first delivery from a retry.
_CLAIM = """
INSERT INTO inbox_messages AS i (message_id, durable, subject, status, lease_owner, lease_until,
                                 attempts, event_type, event_version, occurred_at, stream_seq,
                                 traceparent)
SELECT m.message_id, $1, m.subject, 'processing', $2, clock_timestamp() + $3 * interval '1 second',
       1, m.event_type, m.event_version, m.occurred_at, m.stream_seq, m.traceparent
FROM unnest($4::uuid[], $5::text[], $6::text[], $7::int[], $8::timestamptz[], $9::bigint[],
            $10::text[])
     AS m(message_id, subject, event_type, event_version, occurred_at, stream_seq, traceparent)
ON CONFLICT (durable, message_id) DO UPDATE
  SET status = 'processing', lease_owner = EXCLUDED.lease_owner,
      lease_until = EXCLUDED.lease_until, attempts = i.attempts + 1,
      stream_seq = EXCLUDED.stream_seq, updated_at = clock_timestamp()
  WHERE i.status IN ('received', 'retrying')
     OR (i.status = 'processing' AND i.lease_until < clock_timestamp())
RETURNING i.message_id, i.attempts
"""

_STATE = """
SELECT message_id, status, lease_until > clock_timestamp() AS leased,
       extract(epoch FROM lease_until - clock_timestamp()) AS lease_left
FROM inbox_messages WHERE durable = $1 AND message_id = ANY($2::uuid[])
"""

_DUPLICATE = """
UPDATE inbox_messages SET duplicates = duplicates + 1, updated_at = clock_timestamp()
WHERE durable = $1 AND message_id = ANY($2::uuid[])
"""

# One statement per distinct handler status (nearly always one: 200). ``= ANY`` of an
# array keeps the primary-key index scan; a join with unnest() was planned as a scan of
# the whole table, a cost that grew with the inbox (measured at 100 msg/s on a young
# inbox of about 2,000 rows: 633 µs per message, against 117 µs now).
_PROCESSED = """
UPDATE inbox_messages
SET status = 'processed', processed_at = greatest(clock_timestamp(), received_at),
    handler_status = $3, lease_owner = NULL, lease_until = NULL,
    last_error = NULL, updated_at = clock_timestamp()
WHERE durable = $1 AND message_id = ANY($2::uuid[])
"""

_RETRYING = """
UPDATE inbox_messages
SET status = 'retrying', lease_owner = NULL, lease_until = NULL, last_error = $3,
    handler_status = $4, reason_code = $5,
    retry_history = retry_history || jsonb_build_array($6::jsonb),
    updated_at = clock_timestamp()
WHERE durable = $1 AND message_id = $2
"""

# Final outcome 'failed' (dead-lettered, REQ-053), whichever path got there: the consumer
# has the row it claimed; the dlq-router may find none (a consumer that died before its
# claim committed, every time), so this inserts as well. A processed row is never failed.
_DEAD_LETTERED = """
INSERT INTO inbox_messages AS i (message_id, durable, subject, status, last_error, handler_status,
                                 reason_code, dlq_metadata, retry_history, attempts, event_type,
                                 event_version, occurred_at, stream_seq, traceparent)
VALUES ($1, $2, $3, 'failed', $4, $5, $6, $7::jsonb, $8::jsonb, $9, $10, $11, $12, $13, $14)
ON CONFLICT (durable, message_id) DO UPDATE
  SET status = 'failed', lease_owner = NULL, lease_until = NULL, last_error = EXCLUDED.last_error,
      handler_status = coalesce(EXCLUDED.handler_status, i.handler_status),
      reason_code = EXCLUDED.reason_code, dlq_metadata = EXCLUDED.dlq_metadata,
      retry_history = i.retry_history || EXCLUDED.retry_history,
      attempts = greatest(i.attempts, EXCLUDED.attempts), updated_at = clock_timestamp()
  WHERE i.status <> 'processed'
"""

# A replay is about to be published: the row must no longer look final, or the replayed
# delivery would be skipped as a duplicate.
_REOPEN = """
UPDATE inbox_messages
SET status = 'retrying', lease_owner = NULL, lease_until = NULL, reason_code = 'REPLAY',
    dlq_metadata = $3::jsonb, updated_at = clock_timestamp()
WHERE durable = $1 AND message_id = $2 AND status = 'failed'
"""

_ROW = """
SELECT status, attempts, last_error, handler_status, reason_code, retry_history, dlq_metadata,
       lease_until > clock_timestamp() AS leased,
       extract(epoch FROM lease_until - clock_timestamp()) AS lease_left
FROM inbox_messages WHERE durable = $1 AND message_id = $2
"""

_HISTORY = "SELECT retry_history FROM inbox_messages WHERE durable = $1 AND message_id = $2"


@dataclass(frozen=True, slots=True)
class InboxEntry:
    """What the consumer knows of a delivery when it records it (an
    :class:`~shared.domain.ports.InboxDelivery`)."""

    message_id: UUID
    subject: str
    event_type: str | None
    event_version: int | None
    occurred_at: datetime | None
    stream_seq: int
    traceparent: str | None


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """Per message id: claimed (with attempt count), final (a duplicate), or leased elsewhere."""

    claimed: dict[UUID, int]
    final: set[UUID]
    leased: dict[UUID, float]


async def claim_batch(
    conn: Conn, *, durable: str, owner: str, lease_seconds: float, entries: Sequence[InboxDelivery]
) -> ClaimResult:
    """Record and lease ``entries`` (unique ids); classify those that could not be claimed."""
    rows = await conn.fetch(
        _CLAIM,
        durable,
        owner,
        lease_seconds,
        [e.message_id for e in entries],
        [e.subject for e in entries],
        [e.event_type for e in entries],
        [e.event_version for e in entries],
        [e.occurred_at for e in entries],
        [e.stream_seq for e in entries],
        [e.traceparent for e in entries],
    )
    claimed = {r["message_id"]: r["attempts"] for r in rows}
    rest = [e.message_id for e in entries if e.message_id not in claimed]
    final: set[UUID] = set()
    leased: dict[UUID, float] = {}
    if rest:
        for r in await conn.fetch(_STATE, durable, rest):
            if r["status"] in ("processed", "failed"):
                final.add(r["message_id"])
            else:
                leased[r["message_id"]] = max(float(r["lease_left"] or 0.0), 0.0)
        if final:
            await conn.execute(_DUPLICATE, durable, list(final))
    return ClaimResult(claimed, final, leased)


async def mark_processed(conn: Conn, durable: str, outcomes: dict[UUID, int]) -> None:
    """Final outcome 'processed' for each id, with the handler's status."""
    by_status: dict[int, list[UUID]] = {}
    for message_id, status in outcomes.items():
        by_status.setdefault(status, []).append(message_id)
    for status, ids in by_status.items():
        await conn.execute(_PROCESSED, durable, ids, status)


async def mark_retrying(conn: Conn, durable: str, message_id: UUID, attempt: FailedAttempt) -> None:
    """No final outcome yet: release the lease, remember why."""
    history = json.dumps(attempt.history_entry)
    await conn.execute(
        _RETRYING, durable, message_id, attempt.error, attempt.status, attempt.reason_code, history
    )


@dataclass(frozen=True, slots=True)
class DeadLetteredRow:
    """What the inbox row of a dead-lettered message is set to."""

    message_id: UUID
    subject: str
    error: str
    status: int | None
    reason_code: str
    dlq_metadata: dict[str, Any]
    history_entry: dict[str, Any] | None
    attempts: int
    event_type: str | None = None
    event_version: int | None = None
    occurred_at: datetime | None = None
    stream_seq: int | None = None
    traceparent: str | None = None


async def mark_dead_lettered(conn: Conn, durable: str, row: DeadLetteredRow) -> None:
    """Final outcome 'failed' (dead-lettered, REQ-053), inserting the row if there is none."""
    await conn.execute(
        _DEAD_LETTERED,
        row.message_id,
        durable,
        row.subject,
        row.error,
        row.status,
        row.reason_code,
        json.dumps(row.dlq_metadata),
        json.dumps([row.history_entry] if row.history_entry else []),
        row.attempts,
        row.event_type,
        row.event_version,
        row.occurred_at,
        row.stream_seq,
        row.traceparent,
    )


async def reopen_for_replay(
    conn: Conn, durable: str, message_id: UUID, dlq_metadata: dict[str, Any]
) -> None:
    """Make a dead-lettered row claimable again for its replay."""
    await conn.execute(_REOPEN, durable, message_id, json.dumps(dlq_metadata))


async def fetch_row(conn: Conn, durable: str, message_id: UUID) -> dict[str, Any] | None:
    """The inbox row of one message (for the dlq-router's join), or None."""
    row = await conn.fetchrow(_ROW, durable, message_id)
    if row is None:
        return None
    doc = dict(row)
    doc["retry_history"] = json.loads(doc["retry_history"]) if doc["retry_history"] else []
    return doc


async def retry_history(conn: Conn, durable: str, message_id: UUID) -> list[dict[str, Any]]:
    """The recorded attempts of one message."""
    raw = await conn.fetchval(_HISTORY, durable, message_id)
    return list(json.loads(raw)) if raw else []


# Retention (``ferry purge``): processed rows older than the context's inbox_retention,
# a bounded batch per statement so no statement holds many row locks for long. Rows that
# are not final — or were dead-lettered (status 'failed', governed by their dead letter's
# lifecycle) — are never purged. No FOR UPDATE (it would need UPDATE privilege, which the
# purge's login does not have): the DELETE re-checks its conditions on the row it locks,
# so a second purge running beside the first waits for its rows and then skips them.
_PURGE = """
DELETE FROM inbox_messages WHERE ctid = ANY(ARRAY(
  SELECT ctid FROM inbox_messages
  WHERE durable = $1 AND status = 'processed' AND processed_at < $2 LIMIT $3))
AND durable = $1 AND status = 'processed' AND processed_at < $2
"""

_PURGEABLE = """
SELECT count(*) FROM inbox_messages
WHERE durable = $1 AND status = 'processed' AND processed_at < $2
"""


async def purge_batch(conn: Conn, durable: str, before: datetime, limit: int) -> int:
    """Delete up to ``limit`` of ``durable``'s rows processed before ``before``; the count."""
    status = await conn.execute(_PURGE, durable, before, limit)
    return int(status.split()[-1])


async def oldest_past(conn: Conn, durable: str, before: datetime) -> datetime | None:
    """When ``durable``'s oldest row processed before ``before`` was processed (None: no
    such row): only rows the purge should already have deleted, through the BRIN index on
    processed_at (a few page ranges while the purge keeps up)."""
    found: datetime | None = await conn.fetchval(
        "SELECT min(processed_at) FROM inbox_messages"
        " WHERE durable = $1 AND status = 'processed' AND processed_at < $2",
        durable, before,
    )  # fmt: skip
    return found


async def purgeable(conn: Conn, durable: str, before: datetime) -> int:
    """How many of ``durable``'s rows :func:`purge_batch` would delete, in all."""
    return int(await conn.fetchval(_PURGEABLE, durable, before))


# The dlq-router's sweep (exhaustion never reported): rows without a final outcome that
# nobody touched for ``horizon`` seconds and hold no live lease. ``replayed`` tells the
# sweep a replay's deliveries were counted on the row too. A row reopened for a replay
# whose delivery has not arrived yet (its sequence is still the dead letter's) is the
# replayer's business, not the sweep's.
_UNREPORTED = """
SELECT i.message_id, i.stream_seq, i.attempts, d.message_id IS NOT NULL AS replayed
FROM inbox_messages AS i
LEFT JOIN dead_letters AS d ON d.durable = i.durable AND d.message_id = i.message_id
WHERE i.durable = $1 AND i.status IN ('received', 'processing', 'retrying')
  AND i.updated_at < clock_timestamp() - (CASE WHEN i.attempts >= $4::int
                                               THEN least($2::float8, $5::float8)
                                               ELSE $2::float8 END) * interval '1 second'
  AND (i.lease_until IS NULL OR i.lease_until < clock_timestamp())
  AND i.stream_seq IS NOT NULL
  AND NOT (d.status IS NOT NULL AND d.status = 'replaying'
           AND i.stream_seq <= coalesce(d.stream_seq, 0))
ORDER BY i.updated_at
LIMIT $3
"""

# The same conditions, re-checked under the row's lock; SKIP LOCKED lets another router
# replica's sweep pass over the rows this one holds.
_LOCK_UNREPORTED = """
SELECT message_id, subject, stream_seq, attempts, last_error, handler_status, reason_code,
       retry_history, event_type, event_version, occurred_at, traceparent
FROM inbox_messages
WHERE durable = $1 AND message_id = $2 AND status IN ('received', 'processing', 'retrying')
  AND updated_at < clock_timestamp() - (CASE WHEN attempts >= $4::int
                                             THEN least($3::float8, $5::float8)
                                             ELSE $3::float8 END) * interval '1 second'
  AND (lease_until IS NULL OR lease_until < clock_timestamp())
FOR UPDATE SKIP LOCKED
"""


@dataclass(frozen=True)
class SweepWait:
    """How long a row must stay untouched before the sweep may take it: ``horizon``
    seconds, or only ``spent_after`` once its attempts reached ``max_deliver`` (its last
    delivery failed: JetStream delivers it no more, only the advisory is awaited)."""

    horizon: float
    max_deliver: int
    spent_after: float


async def unreported(conn: Conn, durable: str, wait: SweepWait, limit: int) -> list[dict[str, Any]]:
    """Candidates for the sweep, stalest first (see ``_UNREPORTED``)."""
    rows = await conn.fetch(
        _UNREPORTED, durable, wait.horizon, limit, wait.max_deliver, wait.spent_after
    )
    return [dict(r) for r in rows]


async def lock_unreported(
    conn: Conn, durable: str, message_id: UUID, wait: SweepWait
) -> dict[str, Any] | None:
    """Lock one candidate if it still qualifies and no other sweep holds it (in a
    transaction); the row, or None."""
    row = await conn.fetchrow(
        _LOCK_UNREPORTED, durable, message_id, wait.horizon, wait.max_deliver, wait.spent_after
    )
    if row is None:
        return None
    doc = dict(row)
    doc["retry_history"] = json.loads(doc["retry_history"]) if doc["retry_history"] else []
    return doc
