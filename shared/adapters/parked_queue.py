"""The parked queue of an ``ordering: key`` durable as operators see it (``ferry parked``,
``ferry where``, the console, the consumer's metrics): its summary, its keys with their
heads, and the discard of a held head, audited in ``parked_actions``.

The consumer's side of the same table (park, drain, release, retry) is
:mod:`shared.adapters.parking`.
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID

import asyncpg

from shared.adapters import parking
from shared.adapters.postgres import Conn

log = logging.getLogger("ferry.parking")

# Each figure by its own index (migration 0025): the keys by a loose scan, the events
# index only, the held heads by their partial index, the oldest by one probe.
_SUMMARY = """
WITH RECURSIVE k AS (
  (SELECT ordering_key FROM parked_messages WHERE durable = $1 ORDER BY ordering_key LIMIT 1)
  UNION ALL
  SELECT (SELECT n.ordering_key FROM parked_messages n
          WHERE n.durable = $1 AND n.ordering_key > k.ordering_key
          ORDER BY n.ordering_key LIMIT 1)
  FROM k WHERE k.ordering_key IS NOT NULL
)
SELECT (SELECT count(*) FROM k WHERE ordering_key IS NOT NULL) AS keys,
       (SELECT count(*) FROM parked_messages WHERE durable = $1) AS events,
       (SELECT count(*) FROM parked_messages WHERE durable = $1 AND state = 'held') AS held,
       (SELECT min(parked_at) FROM parked_messages WHERE durable = $1) AS oldest_at
"""

_KEYS = """
SELECT ordering_key, min(partition) AS partition, count(*) AS events,
       min(parked_at) AS oldest_at,
       (array_agg(message_id ORDER BY stream_seq))[1] AS head_id,
       (array_agg(state ORDER BY stream_seq))[1] AS head_state,
       (array_agg(attempts ORDER BY stream_seq))[1] AS head_attempts,
       (array_agg(reason ORDER BY stream_seq))[1] AS head_reason,
       (array_agg(next_attempt_at ORDER BY stream_seq))[1] AS head_next_attempt_at
FROM parked_messages WHERE durable = $1 AND ($2::text IS NULL OR ordering_key = $2)
GROUP BY ordering_key ORDER BY min(parked_at) LIMIT $3
"""

_DISCARD = """
DELETE FROM parked_messages p
USING (SELECT message_id FROM parked_messages WHERE durable = $1 AND ordering_key = $2
       ORDER BY stream_seq LIMIT 1) h
WHERE p.durable = $1 AND p.message_id = h.message_id AND p.state = 'held'
RETURNING p.message_id
"""

_DISCARD_HELD = """
DELETE FROM parked_messages WHERE durable = $1 AND message_id = $2 AND state = 'held'
RETURNING ordering_key
"""

_ACTION = """
INSERT INTO parked_actions (durable, ordering_key, message_id, action, actor, reason)
VALUES ($1, $2, $3, $4, $5, $6)
"""


async def summary(conn: Conn, durable: str) -> dict[str, Any]:
    """Parked keys, parked events, held heads, oldest parked_at (metrics, `ferry parked`)."""
    row = await conn.fetchrow(_SUMMARY, durable)
    assert row is not None
    return dict(row)


async def keys(
    conn: Conn, durable: str, key: str | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    """Parked keys with their head and how many wait (oldest first)."""
    return [dict(r) for r in await conn.fetch(_KEYS, durable, key, limit)]


async def discard_head(
    conn: Conn, durable: str, key: str, *, actor: str, reason: str
) -> UUID | None:
    """Remove ``key``'s held head so the rest flows (audited); None when it holds none."""
    async with conn.transaction():
        gone: UUID | None = await conn.fetchval(_DISCARD, durable, key)
        if gone is not None:
            await conn.execute(_ACTION, durable, key, gone, "discard", actor, reason)
            await _promote_after_discard(conn, durable, key)
    return gone


async def discard_held(
    conn: Conn, durable: str, message_id: UUID, *, actor: str, reason: str
) -> str | None:
    """Remove a held head by its message id (its dead letter was discarded); its key, or
    None when it is not a held head."""
    async with conn.transaction():
        key: str | None = await conn.fetchval(_DISCARD_HELD, durable, message_id)
        if key is not None:
            await conn.execute(_ACTION, durable, key, message_id, "discard", actor, reason)
            await _promote_after_discard(conn, durable, key)
    return key


async def _promote_after_discard(conn: Conn, durable: str, key: str) -> None:
    """The discarded head's key goes on: its next event is due (a statement of its own,
    after the DELETE: it sees an event parked and marked behind the head meanwhile, whose
    transaction the DELETE waited for). A login without UPDATE on parked_messages (the
    console's, granted before migration 0022) cannot: the discard stands, and the key's
    next event waits for its partition's next takeover
    (:func:`~shared.adapters.parking.promote_stranded`)."""
    try:
        async with conn.transaction():  # a savepoint: the discard stands without it
            await parking.promote_head(conn, durable, key)
    except asyncpg.InsufficientPrivilegeError as exc:
        log.warning(
            "discarded the held head of key %r of %s, but cannot make its next event due "
            "(%s): it waits for the partition's next takeover; grant UPDATE on "
            "parked_messages (next_attempt_at) to this login",
            key,
            durable,
            exc,
        )
