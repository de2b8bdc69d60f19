"""The outbox repository (PORT-047-001) on PostgreSQL.

Claiming is the heart of the publisher's guarantees:

* rows are found by ``published_at IS NULL``, never by a cursor, so a row whose
  transaction commits after later ones is never skipped;
* ``FOR UPDATE SKIP LOCKED`` makes claims of concurrent replicas (and of one
  replica's concurrent batches) disjoint; a crashed claimer's locks die with its
  connection, and its rows are claimed again;
* a row is published only when no earlier row of its aggregate is still pending
  outside this claim, so per-aggregate order holds across replicas;
* a row that failed waits out an exponential back-off (by ``last_attempt_at``) so a
  row the stream refuses cannot spin, while its aggregate's later rows wait behind it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from shared.adapters.postgres import Conn

#: Longest back-off between attempts of one failing row.
ROW_RETRY_CAP_SECONDS = 60

_CLAIM = f"""
WITH cand AS (
  SELECT seq FROM outbox_events
  WHERE published_at IS NULL
    AND (publish_attempts = 0
         OR last_attempt_at < now() - LEAST(
              interval '100 milliseconds' * power(2, publish_attempts),
              interval '{ROW_RETRY_CAP_SECONDS} seconds'))
  ORDER BY seq
  LIMIT $1
  FOR UPDATE SKIP LOCKED
)
SELECT o.id, o.seq, o.aggregate_type, o.aggregate_id, o.event_type, o.event_version,
       o.payload::text AS payload, o.occurred_at, o.correlation_id, o.causation_id,
       o.traceparent, o.tracestate,
       EXISTS (
         SELECT 1 FROM outbox_events p
         WHERE p.published_at IS NULL
           AND p.aggregate_type = o.aggregate_type
           AND p.aggregate_id = o.aggregate_id
           AND p.seq < o.seq
           AND p.seq NOT IN (SELECT seq FROM cand)
       ) AS held_back
FROM outbox_events o JOIN cand c ON c.seq = o.seq
ORDER BY o.seq
"""

_MARK_PUBLISHED = """
UPDATE outbox_events
SET published_at = now(), publish_attempts = publish_attempts + 1,
    publish_error = NULL, last_attempt_at = now()
WHERE seq = ANY($1::bigint[])
"""

_MARK_FAILED = """
UPDATE outbox_events
SET publish_attempts = publish_attempts + 1, publish_error = $2, last_attempt_at = now()
WHERE seq = ANY($1::bigint[])
"""

_BACKLOG = """
SELECT count(*) AS count, min(occurred_at) AS oldest_at,
       count(*) FILTER (WHERE publish_error IS NOT NULL) AS failing,
       max(publish_attempts) AS max_attempts
FROM outbox_events WHERE published_at IS NULL
"""


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """A claimed outbox row; ``payload`` is the JSON text as stored."""

    id: UUID
    seq: int
    aggregate_type: str
    aggregate_id: str
    event_type: str
    event_version: int
    payload: str
    occurred_at: datetime
    correlation_id: UUID | None
    causation_id: UUID | None
    traceparent: str | None
    tracestate: str | None

    @property
    def aggregate(self) -> tuple[str, str]:
        """The aggregate key whose order the stream must keep."""
        return (self.aggregate_type, self.aggregate_id)


@dataclass(frozen=True, slots=True)
class Claim:
    """What one claim locked: the rows to publish, and how many wait behind others.

    ``held_back`` counts candidates whose aggregate has an earlier row still pending
    outside this claim — in another worker's batch being published, or failing. They are
    locked with the claim but not published; the caller should claim again once that
    earlier row is settled (another worker's commit), not wait for new commits.
    """

    rows: list[OutboxRow]
    held_back: int


async def claim(conn: Conn, limit: int) -> Claim:
    """Lock up to ``limit`` candidates; return the publishable ones (inside a transaction)."""
    rows, held_back = [], 0
    for record in await conn.fetch(_CLAIM, limit):
        fields = dict(record)
        if fields.pop("held_back"):
            held_back += 1
        else:
            rows.append(OutboxRow(**fields))
    return Claim(rows, held_back)


async def mark_published(conn: Conn, seqs: list[int]) -> None:
    """CMD-050: set published_at and count the attempt."""
    if seqs:
        await conn.execute(_MARK_PUBLISHED, seqs)


async def mark_published_and_commit(conn: Conn, seqs: list[int]) -> None:
    """CMD-050 and the claim's ``COMMIT`` in one round trip (one simple query).

    The sequence numbers are integers written as literals (no quoting involved), so the
    statement and the commit travel together; without rows it is a bare ``COMMIT``.
    """
    if not seqs:
        await conn.execute("COMMIT")
        return
    if not all(type(seq) is int for seq in seqs):
        raise TypeError("outbox sequence numbers must be integers")
    listed = ",".join(str(seq) for seq in seqs)
    marked = _MARK_PUBLISHED.replace("$1::bigint[]", f"'{{{listed}}}'::bigint[]").strip()
    await conn.execute(f"{marked}; COMMIT")


async def mark_failed(conn: Conn, failures: dict[int, str]) -> None:
    """Record failed attempts; one UPDATE per distinct error text."""
    by_error: dict[str, list[int]] = defaultdict(list)
    for seq, error in failures.items():
        by_error[error[:2000]].append(seq)
    for error, seqs in by_error.items():
        await conn.execute(_MARK_FAILED, seqs, error)


async def backlog(conn: Conn) -> dict[str, Any]:
    """QRY-050: unpublished count and oldest occurred_at (plus failing rows)."""
    row = await conn.fetchrow(_BACKLOG)
    assert row is not None
    oldest = row["oldest_at"]
    return {
        "count": row["count"],
        "oldest_at": oldest.isoformat() if oldest else None,
        "failing": row["failing"],
        "max_attempts": row["max_attempts"] or 0,
    }


# Retention (``ferry purge``): published rows older than the context's outbox_retention.
# An unpublished row (pending or failing) is never purged, whatever its age. As for the
# inbox's purge: no FOR UPDATE (the purge's login may not UPDATE), conditions re-checked.
_PURGE = """
DELETE FROM outbox_events WHERE ctid = ANY(ARRAY(
  SELECT ctid FROM outbox_events WHERE published_at < $1 LIMIT $2))
AND published_at < $1
"""


async def purge_batch(conn: Conn, before: datetime, limit: int) -> int:
    """Delete up to ``limit`` rows published before ``before``; return the count."""
    status = await conn.execute(_PURGE, before, limit)
    return int(status.split()[-1])


async def purgeable(conn: Conn, before: datetime) -> int:
    """How many rows :func:`purge_batch` would delete, in all."""
    return int(await conn.fetchval("SELECT count(*) FROM outbox_events WHERE published_at < $1",
                                   before))
