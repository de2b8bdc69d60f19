"""Sequenced parking (migration 0009): the parked messages of ``ordering: key`` durables.

A key is blocked while it has rows here; its head (lowest ``stream_seq``) is the message
that failed, the others wait behind it in stream order. Rows are written before the
JetStream ack of the messages they hold, so nothing is lost between the two.

This module is the consumer's side (park, drain, release, retry); the queue as operators
see it (its summary, its keys, the discard of a held head) is
:mod:`shared.adapters.parked_queue`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from shared.adapters.postgres import Conn


@dataclass(frozen=True, slots=True)
class ParkedEntry:
    """A message to park: where it sits in its key's queue and its bytes."""

    message_id: UUID
    ordering_key: str
    stream_seq: int
    partition: int
    subject: str
    headers: Mapping[str, str]
    data: bytes
    #: 'queued' (behind the head), 'retrying' or 'held' (the head itself).
    state: str = "queued"
    attempts: int = 0
    #: Seconds from now until it may be tried (a retrying head's back-off).
    delay: float = 0.0
    reason: str | None = None
    #: Whether a replay of this message is in hand (it un-holds the parked held copy).
    replay: bool = False


@dataclass(frozen=True, slots=True)
class ParkedRow:
    """One parked message as the drainer reads it."""

    message_id: UUID
    ordering_key: str
    stream_seq: int
    delivered_seq: int
    partition: int
    subject: str
    headers: dict[str, str]
    data: bytes
    state: str
    attempts: int
    next_attempt_at: datetime
    reason: str | None
    due: bool


# A replay of a held head un-holds it (it is tried at once, from here, keeping its place,
# its deliveries counted afresh like a replay's);
# any other copy of a message already parked is a duplicate and changes nothing.
# A message parked behind an earlier one of its key (parked before, or earlier in this
# batch) waits at 'infinity' whatever its head is doing: only heads are due at a time, so
# the drainer's walk of idx_parked_due reads heads and nothing behind them, however many
# wait (before: every event behind a *retrying* head was read at every round, a second a
# round at 100,000 of them, as in a long handler outage). A head that goes makes the next
# one due (_PROMOTE, in the same transaction). A head deleted by another process as this
# runs (an operator's discard of a held head) is seen by park()'s _PROMOTE_KEYS; any head
# left at 'infinity' all the same, by the drainer's periodic promote_stranded.
_PARK = """
WITH held AS (
  SELECT DISTINCT ordering_key FROM parked_messages
  WHERE durable = $1 AND ordering_key = ANY($2::text[]) AND state = 'held'
)
INSERT INTO parked_messages AS p (durable, ordering_key, stream_seq, delivered_seq, message_id,
                                  partition, subject, headers, data, state, attempts,
                                  next_attempt_at, reason)
SELECT $1, m.ordering_key, m.stream_seq, m.stream_seq, m.message_id, m.partition, m.subject,
       m.headers::jsonb, m.data, m.state, m.attempts,
       CASE WHEN m.state <> 'held'
                 AND (m.stream_seq > min(m.stream_seq) OVER (PARTITION BY m.ordering_key)
                      OR EXISTS (SELECT 1 FROM parked_messages e
                                 WHERE e.durable = $1 AND e.ordering_key = m.ordering_key
                                   AND e.stream_seq < m.stream_seq))
            THEN 'infinity'
            ELSE clock_timestamp() + m.delay * interval '1 second' END,
       m.reason
FROM unnest($2::text[], $3::bigint[], $4::uuid[], $5::int[], $6::text[], $7::text[],
            $8::bytea[], $9::text[], $10::int[], $11::float8[], $12::text[])
     AS m(ordering_key, stream_seq, message_id, partition, subject, headers, data, state,
          attempts, delay, reason)
ON CONFLICT (durable, message_id) DO UPDATE
  SET state = 'retrying', next_attempt_at = clock_timestamp(), attempts = 0,
      delivered_seq = EXCLUDED.delivered_seq, reason = EXCLUDED.reason
  WHERE p.state = 'held' AND EXCLUDED.reason = 'REPLAYED'
RETURNING p.ordering_key, p.ordering_key IN (SELECT ordering_key FROM held) AS behind_held
"""

# The partition's keys ($1 durable, $2 partition) as the recursive CTE ``k``, one index
# probe each (a loose scan of idx_parked_partition_key, migration 0022), never every
# parked row behind them; the last row of ``k`` is NULL.
_PARTITION_KEYS = """
k AS (
  (SELECT ordering_key FROM parked_messages WHERE durable = $1 AND partition = $2
   ORDER BY ordering_key LIMIT 1)
  UNION ALL
  SELECT (SELECT n.ordering_key FROM parked_messages n
          WHERE n.durable = $1 AND n.partition = $2 AND n.ordering_key > k.ordering_key
          ORDER BY n.ordering_key LIMIT 1)
  FROM k WHERE k.ordering_key IS NOT NULL
)"""

_BLOCKED_KEYS = f"""
WITH RECURSIVE {_PARTITION_KEYS}
SELECT ordering_key FROM k WHERE ordering_key IS NOT NULL
"""

# Heads (migration 0022, _PARK): the events waiting behind a head are due at 'infinity', so
# the walk of idx_parked_due up to now reads the due heads, never what waits behind them;
# a row is a head when no row of its key is before it (one probe of idx_parked_key).
# now(): run outside a transaction, the statement's time (clock_timestamp() cannot bound
# an index scan).
# Keys whose head may be tried now, the most overdue first. The limit is written into the
# statement (ready_keys_sql), not passed: planned with "LIMIT $3" unknown, the generic plan
# looks dearer than the custom ones at volume, so PostgreSQL would plan the statement again
# at every round (0.3 ms of the drainer's idle round, most of it); with the limit known it
# settles on the generic plan after five rounds, as it does on an empty table.
_READY_KEYS = """
SELECT p.ordering_key FROM parked_messages p
WHERE p.durable = $1 AND p.partition = $2 AND p.state <> 'held' AND p.next_attempt_at <= now()
  AND NOT EXISTS (SELECT 1 FROM parked_messages e
                  WHERE e.durable = $1 AND e.ordering_key = p.ordering_key
                    AND e.stream_seq < p.stream_seq)
ORDER BY p.next_attempt_at LIMIT {limit:d}
"""


def ready_keys_sql(limit: int) -> str:
    """The ready-keys statement for a drainer asking ``limit`` keys a round."""
    if limit < 1:
        raise ValueError(f"a drainer's round asks at least 1 key, not {limit}")
    return _READY_KEYS.format(limit=limit)


# Seconds until the next head falls due (none: no row; an event behind a held head is
# never one).
_NEXT_DUE = """
SELECT extract(epoch FROM p.next_attempt_at - clock_timestamp()) FROM parked_messages p
WHERE p.durable = $1 AND p.partition = $2 AND p.state <> 'held'
  AND p.next_attempt_at < 'infinity'
  AND NOT EXISTS (SELECT 1 FROM parked_messages e
                  WHERE e.durable = $1 AND e.ordering_key = p.ordering_key
                    AND e.stream_seq < p.stream_seq)
ORDER BY p.next_attempt_at LIMIT 1
"""

_KEY_ROWS = """
SELECT message_id, ordering_key, stream_seq, delivered_seq, partition, subject, headers, data,
       state, attempts, next_attempt_at, reason, next_attempt_at <= clock_timestamp() AS due
FROM parked_messages WHERE durable = $1 AND ordering_key = $2
ORDER BY stream_seq LIMIT $3
"""

# The inbox rows of released events that waited behind a held head keep its id (held_by,
# migration 0015): the KPI job gives their latency apart from the pipeline's own.
_RELEASE = """
WITH gone AS (
  DELETE FROM parked_messages WHERE durable = $1 AND message_id = ANY($2::uuid[])
  RETURNING message_id, held_head
), waited AS (
  UPDATE inbox_messages i SET held_by = g.held_head
  FROM gone g
  WHERE g.held_head IS NOT NULL AND i.durable = $1 AND i.message_id = g.message_id
)
SELECT count(*) FROM parked_messages
WHERE durable = $1 AND ordering_key = $3 AND NOT (message_id = ANY($2::uuid[]))
"""

# The events behind a held head of the given keys wait for an operator: each remembers the
# first held head it waited behind (after a park, or when a head is held), and is due at
# 'infinity' (migration 0022) until it is its key's head again (_PROMOTE). Again after a
# replay un-held the head and it was held anew: held_head is kept, 'infinity' set again.
# The held head is locked (KEY SHARE) until this transaction ends: an operator's discard of
# it waits, and its promotion, a statement after its DELETE, sees the events marked here.
_MARK_HELD = """
WITH h AS (
  SELECT ordering_key, message_id, stream_seq FROM parked_messages
  WHERE durable = $1 AND ordering_key = ANY($2::text[]) AND state = 'held'
  FOR KEY SHARE
)
UPDATE parked_messages p
SET held_head = coalesce(p.held_head, h.message_id),
    next_attempt_at = CASE WHEN p.state = 'held' THEN p.next_attempt_at ELSE 'infinity' END
FROM h
WHERE p.durable = $1 AND p.ordering_key = h.ordering_key AND p.stream_seq > h.stream_seq
  AND (p.held_head IS NULL OR (p.state <> 'held' AND p.next_attempt_at <> 'infinity'))
"""

# A key's head went (released, discarded) or stopped being held: the head it has now is
# due if it waited behind a held head. Its own statement after the DELETE, in the same
# transaction: under READ COMMITTED it sees what committed meanwhile (_MARK_HELD).
_PROMOTE = """
UPDATE parked_messages p SET next_attempt_at = clock_timestamp()
FROM (SELECT message_id FROM parked_messages WHERE durable = $1 AND ordering_key = $2
      ORDER BY stream_seq LIMIT 1) h
WHERE p.durable = $1 AND p.message_id = h.message_id AND p.state <> 'held'
  AND p.next_attempt_at = 'infinity'
"""

# After a park (its own statement, after _MARK_HELD): the head of each key parked is due
# if it waits at 'infinity' not held. _PARK set 'infinity' behind the head it saw; if an
# operator's discard deleted that head meanwhile (uncommitted then, so _PARK still saw it;
# _MARK_HELD waited for it), the discard's promotion could not see the new row: this one,
# under READ COMMITTED, sees the discard. One probe per key.
_PROMOTE_KEYS = """
UPDATE parked_messages p SET next_attempt_at = clock_timestamp()
FROM unnest($2::text[]) AS k(ordering_key)
CROSS JOIN LATERAL (SELECT message_id FROM parked_messages h
                    WHERE h.durable = $1 AND h.ordering_key = k.ordering_key
                    ORDER BY h.stream_seq LIMIT 1) h
WHERE p.durable = $1 AND p.message_id = h.message_id AND p.state <> 'held'
  AND p.next_attempt_at = 'infinity'
"""

# At a partition's takeover: a head due at 'infinity' that is not held waits for nothing
# (a race unforeseen, a discard by an older console): due now. One probe per key.
_PROMOTE_STRANDED = f"""
WITH RECURSIVE {_PARTITION_KEYS}, heads AS (
  SELECT h.message_id FROM k
  CROSS JOIN LATERAL (SELECT message_id, state, next_attempt_at FROM parked_messages
                      WHERE durable = $1 AND ordering_key = k.ordering_key
                      ORDER BY stream_seq LIMIT 1) h
  WHERE k.ordering_key IS NOT NULL AND h.state <> 'held' AND h.next_attempt_at = 'infinity'
)
UPDATE parked_messages p SET next_attempt_at = clock_timestamp()
FROM heads
WHERE p.durable = $1 AND p.message_id = heads.message_id AND p.state <> 'held'
  AND p.next_attempt_at = 'infinity'
RETURNING p.ordering_key
"""

_RETRY_HEAD = """
UPDATE parked_messages
SET state = $3, attempts = $4, next_attempt_at = clock_timestamp() + $5 * interval '1 second',
    reason = $6
WHERE durable = $1 AND message_id = $2
RETURNING ordering_key
"""

# Claimed in the inbox but never handed to the handler (parked behind a failed event):
# the lease is released and the attempt the claim counted taken back.
_UNCLAIM = """
UPDATE inbox_messages
SET status = CASE WHEN attempts <= 1 THEN 'received' ELSE 'retrying' END,
    attempts = greatest(attempts - 1, 0), lease_owner = NULL, lease_until = NULL,
    updated_at = clock_timestamp()
WHERE durable = $1 AND message_id = ANY($2::uuid[]) AND lease_owner = $3
  AND status = 'processing'
"""

#: The ``reason`` of a replayed copy: it un-holds the held copy parked before it.
REPLAYED = "REPLAYED"

# A dead letter recorded as holding its key (``on_dead_letter: hold``) and not settled
# since: neither discarded nor replayed.
_HOLDING = """
SELECT EXISTS (SELECT 1 FROM dead_letters WHERE durable = $1 AND message_id = $2
               AND status IN ('dead', 'held', 'parked')
               AND record -> 'ordering' ->> 'held' = 'true')
"""


async def park(conn: Conn, durable: str, entries: Sequence[ParkedEntry]) -> None:
    """Park ``entries`` (a copy already parked changes nothing; a replay un-holds)."""
    if not entries:
        return
    rows = await conn.fetch(
        _PARK,
        durable,
        [e.ordering_key for e in entries],
        [e.stream_seq for e in entries],
        [e.message_id for e in entries],
        [e.partition for e in entries],
        [e.subject for e in entries],
        [json.dumps(dict(e.headers)) for e in entries],
        [e.data for e in entries],
        [e.state for e in entries],
        [e.attempts for e in entries],
        [max(e.delay, 0.0) for e in entries],
        [REPLAYED if e.replay else e.reason for e in entries],
    )
    # Only a held head makes its followers remember it (_MARK_HELD), and only a held head
    # is deleted by another process (an operator's discard) while this one parks: the
    # keys whose head was held as this statement began, or is parked held now.
    held = {e.ordering_key for e in entries if e.state == "held"}
    held |= {r["ordering_key"] for r in rows if r["behind_held"]}
    if held:
        keys = sorted(held)
        await conn.execute(_MARK_HELD, durable, keys)
        await conn.execute(_PROMOTE_KEYS, durable, keys)


async def blocked_keys(conn: Conn, durable: str, partition: int) -> set[str]:
    """Every key of ``partition`` with parked messages."""
    return {r["ordering_key"] for r in await conn.fetch(_BLOCKED_KEYS, durable, partition)}


async def promote_stranded(conn: Conn, durable: str, partition: int) -> list[str]:
    """At a partition's takeover: the keys of ``partition`` whose head waited at 'infinity'
    though not held (nothing would ever try it), now due. Empty unless a race was missed."""
    rows = await conn.fetch(_PROMOTE_STRANDED, durable, partition)
    return sorted(r["ordering_key"] for r in rows)


async def ready_keys(conn: Conn, durable: str, partition: int, limit: int) -> list[str]:
    """Keys whose head may be tried now (not held, back-off over), most overdue first."""
    rows = await conn.fetch(ready_keys_sql(limit), durable, partition)
    return [r["ordering_key"] for r in rows]


async def next_due(conn: Conn, durable: str, partition: int) -> float | None:
    """Seconds until the next head may be tried (<= 0: now); None when nothing waits."""
    value = await conn.fetchval(_NEXT_DUE, durable, partition)
    return None if value is None else float(value)


async def key_rows(conn: Conn, durable: str, key: str, limit: int) -> list[ParkedRow]:
    """The first ``limit`` parked messages of ``key``, head first."""
    rows = await conn.fetch(_KEY_ROWS, durable, key, limit)
    return [
        ParkedRow(
            message_id=r["message_id"],
            ordering_key=r["ordering_key"],
            stream_seq=r["stream_seq"],
            delivered_seq=r["delivered_seq"],
            partition=r["partition"],
            subject=r["subject"],
            headers=json.loads(r["headers"]) if isinstance(r["headers"], str) else r["headers"],
            data=bytes(r["data"]),
            state=r["state"],
            attempts=r["attempts"],
            next_attempt_at=r["next_attempt_at"],
            reason=r["reason"],
            due=r["due"],
        )
        for r in rows
    ]


async def release(conn: Conn, durable: str, key: str, message_ids: Iterable[UUID]) -> int:
    """Delete the given parked messages of ``key`` (its next head due if it waited behind a
    held head); the number of its messages left. Run in the caller's transaction."""
    left = int(await conn.fetchval(_RELEASE, durable, list(message_ids), key) or 0)
    if left:
        await promote_head(conn, durable, key)
    return left


async def promote_head(conn: Conn, durable: str, key: str) -> None:
    """``key``'s head went (released, discarded): the head it has now is due if it waited
    behind a held head (:data:`_PROMOTE`)."""
    await conn.execute(_PROMOTE, durable, key)


async def retry_head(
    conn: Conn,
    durable: str,
    message_id: UUID,
    *,
    state: str,
    attempts: int,
    delay: float,
    reason: str,
) -> None:
    """The head failed again (``retrying`` after ``delay``) or was dead-lettered (``held``:
    the events behind it wait for an operator from the same commit)."""
    args = (durable, message_id, state, attempts, max(delay, 0.0), reason)
    if state != "held":
        await conn.fetchval(_RETRY_HEAD, *args)
        return
    async with conn.transaction():
        key = await conn.fetchval(_RETRY_HEAD, *args)
        if key is not None:
            await conn.execute(_MARK_HELD, durable, [key])


async def unclaim(conn: Conn, durable: str, owner: str, message_ids: Sequence[UUID]) -> None:
    """Give back inbox claims of messages parked before the handler saw them."""
    if message_ids:
        await conn.execute(_UNCLAIM, durable, list(message_ids), owner)


async def holds_its_key(conn: Conn, durable: str, message_id: UUID) -> bool:
    """Whether ``message_id``'s dead letter holds its key and waits for an operator still."""
    return bool(await conn.fetchval(_HOLDING, durable, message_id))
