"""The outbox repository (PORT-047-001) on PostgreSQL.

Claiming is the heart of the publisher's guarantees:

* rows are found by ``published_at IS NULL``, never by a cursor, so a row whose
  transaction commits after later ones is never skipped;
* ``FOR UPDATE SKIP LOCKED`` makes claims of concurrent replicas (and of one
  replica's concurrent batches) disjoint; a crashed claimer's locks die with its
  connection, and its rows are claimed again;
* a row is published only when no earlier row of its aggregate is still pending
  outside this claim, so per-aggregate order holds across replicas;
* a row that failed waits out an exponential back-off (by ``last_attempt_at``, its
  exponent capped so no attempt count overflows it) so a row the stream refuses cannot
  spin, while its aggregate's later rows wait behind it;
* a row that cannot be published is *set aside* (``set_aside_at``): never claimed again
  until an operator republishes it, its aggregate's later rows still behind it;
* rows behind a backing-off or set-aside row are not candidates at all, so they never
  fill a claim's ``LIMIT``: other aggregates are never starved;
* rows behind a set-aside row are marked (``waiting_behind``, migration 0023) when it is
  set aside and by :func:`~shared.adapters.outbox_set_aside.mark_waiting` for those
  committed later, so the claim's walk (idx_outbox_claimable) no longer passes them at
  all: a set-aside row with 50,000 rows behind it costs the claim nothing. The mark is
  only a shortcut; the check of the earlier rows above still decides.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from shared.adapters.postgres import Conn, fetch_backlog

#: Longest back-off between attempts of one failing row.
ROW_RETRY_CAP_SECONDS = 60
#: The back-off's exponent stops here: 0.1 s * 2^10 is past the cap already, and power()
#: of a larger count (47 is enough) overflows an interval.
_BACKOFF_EXPONENT_CAP = 10
#: publish_attempts is an INT: it stops counting one short of its largest value.
_ATTEMPTS_CEILING = 2**31 - 2

#: Reason codes of set-aside rows.
PAYLOAD_INVALID = "PAYLOAD_INVALID"
MESSAGE_TOO_LARGE = "MESSAGE_TOO_LARGE"
PUBLISH_REFUSED = "PUBLISH_REFUSED"


def _backoff(prefix: str = "") -> str:
    """The back-off of a failed row, for its columns as ``{prefix}publish_attempts``."""
    attempts = f"LEAST(GREATEST({prefix}publish_attempts, 0), {_BACKOFF_EXPONENT_CAP})"
    return (
        f"LEAST(interval '100 milliseconds' * power(2, {attempts}), "
        f"interval '{ROW_RETRY_CAP_SECONDS} seconds')"
    )


#: The predicate of idx_outbox_failing (migrations/0008), word for word.
_FAILING = "published_at IS NULL AND (publish_attempts <> 0 OR set_aside_at IS NOT NULL)"

# A candidate must have no earlier row of its aggregate that is set aside or backing off:
# one probe of idx_outbox_failing per row walked (small: only an aggregate's head is ever
# attempted). ``OFFSET 0`` keeps the NOT EXISTS a per-row subplan: turned into an anti
# join, the planner may materialize every failing row and rescan them per row walked —
# quadratic in a long outage, when every aggregate's head backs off and the statistics
# (taken while nothing failed) have not caught up. The candidates carry their columns out
# of the CTE: joining them back to the table by seq made the planner hash-join against a
# sequential scan of the whole table, once per claim (74 µs of the 91 µs of database time
# per published row in a 30,000-row drain).
_CLAIM = f"""
WITH cand AS (
  SELECT o.id, o.seq, o.aggregate_type, o.aggregate_id, o.event_type, o.event_version,
         o.payload::text AS payload, o.occurred_at, o.correlation_id, o.causation_id,
         o.traceparent, o.tracestate
  FROM outbox_events o
  WHERE o.published_at IS NULL AND o.waiting_behind IS NULL AND o.set_aside_at IS NULL
    AND (o.publish_attempts = 0
         OR coalesce(o.last_attempt_at, '-infinity') < now() - {_backoff("o.")})
    AND NOT EXISTS (
      SELECT 1 FROM outbox_events b
      WHERE b.aggregate_type = o.aggregate_type AND b.aggregate_id = o.aggregate_id
        AND b.seq < o.seq
        AND b.published_at IS NULL AND (b.publish_attempts <> 0 OR b.set_aside_at IS NOT NULL)
        AND (b.set_aside_at IS NOT NULL
             OR coalesce(b.last_attempt_at, '-infinity') >= now() - {_backoff("b.")})
      OFFSET 0)
  ORDER BY o.seq
  LIMIT $1
  FOR UPDATE OF o SKIP LOCKED
)
SELECT c.*,
       EXISTS (
         SELECT 1 FROM outbox_events p
         WHERE p.published_at IS NULL
           AND p.aggregate_type = c.aggregate_type
           AND p.aggregate_id = c.aggregate_id
           AND (p.aggregate_type, p.aggregate_id, p.seq)
               < (c.aggregate_type, c.aggregate_id, c.seq)
           AND p.seq NOT IN (SELECT seq FROM cand)
       ) AS held_back
FROM cand c
ORDER BY c.seq
"""

#: How a claim's transaction begins (one simple query, no extra round trip). The claim
#: must walk idx_outbox_claimable in order and stop at its LIMIT; with statistics taken
#: while the table was small (a backlog that built up since, as after an outage, before
#: autovacuum's ANALYZE), the planner expects a handful of candidates and fetches every
#: pending row with a bitmap or sequential scan to sort them: a cost per claim that grows
#: with the backlog (a 20,000-row drain: 942 against 199 ms of claims).
CLAIM_TRANSACTION = "BEGIN; SET LOCAL enable_bitmapscan = off; SET LOCAL enable_seqscan = off"

_MARK_PUBLISHED = f"""
UPDATE outbox_events
SET published_at = now(), publish_attempts = LEAST(publish_attempts, {_ATTEMPTS_CEILING}) + 1,
    publish_error = NULL, last_attempt_at = now()
WHERE seq = ANY($1::bigint[])
"""

# $3: a reason code to set the rows aside at once; $4: the failure counts towards the cap
# $5 (a refusal; an outage never sets a row aside). Set-asides are audited in one go.
_MARK_FAILED = f"""
WITH marked AS (
  UPDATE outbox_events
  SET publish_attempts = LEAST(publish_attempts, {_ATTEMPTS_CEILING}) + 1,
      publish_error = $2, last_attempt_at = now(),
      set_aside_reason = CASE
        WHEN $3::text IS NOT NULL THEN $3::text
        WHEN $4::boolean AND publish_attempts >= $5::int - 1 THEN '{PUBLISH_REFUSED}'
      END,
      set_aside_at = CASE
        WHEN $3::text IS NOT NULL OR ($4::boolean AND publish_attempts >= $5::int - 1)
        THEN now()
      END
  WHERE seq = ANY($1::bigint[])
  RETURNING id, seq, set_aside_reason, publish_attempts
),
audited AS (
  INSERT INTO outbox_actions (event_id, seq, action, actor, reason, details)
  SELECT id, seq, 'set_aside', 'outbox-publisher', set_aside_reason,
         jsonb_build_object('error', $2::text, 'attempts', publish_attempts)
  FROM marked WHERE set_aside_reason IS NOT NULL
)
SELECT seq, set_aside_reason FROM marked WHERE set_aside_reason IS NOT NULL
"""

_BACKLOG = """
SELECT count(*) AS count, min(occurred_at) AS oldest_at,
       count(*) FILTER (WHERE publish_error IS NOT NULL) AS failing,
       count(*) FILTER (WHERE set_aside_at IS NOT NULL) AS set_aside,
       coalesce(max(publish_attempts), 0) AS max_attempts
FROM outbox_events WHERE published_at IS NULL
"""


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """A claimed outbox row (an :class:`~shared.domain.ports.OutboxRecord`; the in-memory
    outbox's too); ``payload`` is the JSON text as stored."""

    id: UUID
    seq: int
    aggregate_type: str
    aggregate_id: str
    event_type: str
    event_version: int
    payload: str
    occurred_at: datetime
    correlation_id: UUID | None = None
    causation_id: UUID | None = None
    traceparent: str | None = None
    tracestate: str | None = None

    @property
    def aggregate(self) -> tuple[str, str]:
        """The aggregate key whose order the stream must keep."""
        return (self.aggregate_type, self.aggregate_id)


@dataclass(frozen=True, slots=True)
class Claim:
    """What one claim locked: the rows to publish, and how many wait behind others.

    ``held_back`` counts candidates whose aggregate has an earlier row still pending
    outside this claim — in another worker's batch being published. They are locked with
    the claim but not published; the caller should claim again once that earlier row is
    settled (another worker's commit), not wait for new commits. (Rows behind a failing or
    set-aside row are not candidates, so they are not counted here.)
    """

    rows: list[OutboxRow]
    held_back: int


@dataclass(frozen=True, slots=True)
class Failure:
    """Why one row's publish failed, and what that means for the row.

    ``set_aside``: a reason code when the row can never be published as it is (set it
    aside at once). ``outage``: the failure says nothing about the row (JetStream did not
    answer); such attempts never set a row aside, however many. Otherwise the failure is
    a refusal, and a row refused ``max_attempts`` times is set aside (PUBLISH_REFUSED).
    """

    error: str
    set_aside: str | None = None
    outage: bool = False
    #: What failed, for metrics: an exception's type name, or ``MessageTooLarge``.
    kind: str = ""


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


async def mark_failed(
    conn: Conn, failures: dict[int, Failure], *, max_attempts: int
) -> dict[int, str]:
    """Record failed attempts, setting rows aside as :class:`Failure` says; one UPDATE per
    distinct failure. Returns the rows set aside now: seq → reason code."""
    by_failure: dict[Failure, list[int]] = defaultdict(list)
    for seq, failure in failures.items():
        error = _storable(failure.error)
        by_failure[Failure(error, failure.set_aside, failure.outage)].append(seq)
    set_aside: dict[int, str] = {}
    for failure, seqs in by_failure.items():
        for record in await conn.fetch(
            _MARK_FAILED, seqs, failure.error, failure.set_aside, not failure.outage,
            max_attempts,
        ):  # fmt: skip
            set_aside[record["seq"]] = record["set_aside_reason"]
    return set_aside


def _storable(text: str) -> str:
    """``text`` as PostgreSQL ``text`` can hold it: no NUL, no lone surrogate, bounded —
    an error message quoting odd input must not fail the statement recording it."""
    safe = text[:2000].encode("utf-8", "backslashreplace").decode("utf-8")
    return safe.replace("\x00", "\\x00")


async def backlog(conn: Conn) -> dict[str, Any]:
    """QRY-050: unpublished count and oldest occurred_at (plus failing and set-aside rows)."""
    return await fetch_backlog(conn, _BACKLOG)


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


async def oldest_past(conn: Conn, before: datetime) -> datetime | None:
    """When the oldest row published before ``before`` was published (None: no such row).

    Only rows the purge should already have deleted are looked at, through the BRIN index
    on published_at: while the purge keeps up, that is a few page ranges at most."""
    found: datetime | None = await conn.fetchval(
        "SELECT min(published_at) FROM outbox_events WHERE published_at < $1", before
    )
    return found


async def purgeable(conn: Conn, before: datetime) -> int:
    """How many rows :func:`purge_batch` would delete, in all."""
    return int(
        await conn.fetchval("SELECT count(*) FROM outbox_events WHERE published_at < $1", before)
    )
