"""Set-aside outbox rows (migration 0008) and the rows waiting behind them (0023): the
operator's list and republish, and the marks that keep waiting rows out of the publisher's
claim (see :mod:`shared.adapters.outbox` for the claim itself)."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

from shared.adapters.outbox import _FAILING
from shared.adapters.postgres import Conn

_SET_ASIDE = f"""
SELECT s.seq, s.id, s.aggregate_type, s.aggregate_id, s.event_type, s.event_version,
       s.publish_attempts AS attempts, s.publish_error AS last_error,
       s.set_aside_reason AS reason, s.set_aside_at,
       (SELECT count(*) FROM outbox_events w
        WHERE w.published_at IS NULL AND w.aggregate_type = s.aggregate_type
          AND w.aggregate_id = s.aggregate_id AND w.seq > s.seq) AS waiting
FROM outbox_events s
WHERE s.{_FAILING} AND s.set_aside_at IS NOT NULL
ORDER BY s.seq
LIMIT $1
"""

_LOCK_SET_ASIDE = f"""
SELECT id, seq, publish_attempts, publish_error, set_aside_reason, set_aside_at
FROM outbox_events
WHERE {_FAILING} AND set_aside_at IS NOT NULL AND ($1::uuid[] IS NULL OR id = ANY($1::uuid[]))
ORDER BY seq
FOR UPDATE
"""

_REPUBLISH = """
UPDATE outbox_events
SET set_aside_at = NULL, set_aside_reason = NULL, publish_attempts = 0,
    publish_error = NULL, last_attempt_at = NULL
WHERE seq = ANY($1::bigint[])
"""

# The rows waiting behind republished rows join the claim's walk again (those behind a
# later set-aside row of the aggregate too: the next sweep marks them again).
_RELEASE_WAITING = """
UPDATE outbox_events SET waiting_behind = NULL WHERE waiting_behind = ANY($1::bigint[])
"""

# Mark the pending rows behind each aggregate's first set-aside row. The set-aside rows are
# locked FOR SHARE first, skipping any an operator is republishing (FOR UPDATE): a row
# whose republish committed meanwhile is re-read and left out, and a republish that comes
# after waits for this statement's commit and then releases what it marked. Per set-aside
# row only the rows past the last one it already holds are read (idx_outbox_waiting gives
# that seq): a sweep of an unchanged outbox reads nothing but the set-aside rows. The seq
# is compared within the aggregate as a row, which only idx_outbox_pending_aggregate can
# bound: never a walk of every claimable row after the set-aside one.
_MARK_WAITING = f"""
WITH locked AS (
  SELECT seq, aggregate_type, aggregate_id FROM outbox_events
  WHERE {_FAILING} AND set_aside_at IS NOT NULL
  FOR SHARE SKIP LOCKED
), firsts AS (
  SELECT DISTINCT ON (aggregate_type, aggregate_id) seq, aggregate_type, aggregate_id
  FROM locked ORDER BY aggregate_type, aggregate_id, seq
), heads AS (
  SELECT f.*, greatest(f.seq, coalesce(
           (SELECT max(m.seq) FROM outbox_events m WHERE m.waiting_behind = f.seq), 0)) AS past
  FROM firsts f
)
UPDATE outbox_events w SET waiting_behind = h.seq
FROM heads h
WHERE w.aggregate_type = h.aggregate_type AND w.aggregate_id = h.aggregate_id
  AND (w.aggregate_type, w.aggregate_id, w.seq) > (h.aggregate_type, h.aggregate_id, h.past)
  AND w.published_at IS NULL AND w.waiting_behind IS NULL AND w.set_aside_at IS NULL
"""

# Rows naming a row that is no longer set aside (published, or made pending again by a
# hand other than `ferry outbox republish`) rejoin the walk. The rows named are found by a
# skip scan of idx_outbox_waiting (one probe per set-aside row, not per waiting row).
_RELEASE_STRANDED = f"""
WITH RECURSIVE named AS (
  (SELECT waiting_behind AS seq FROM outbox_events
   WHERE waiting_behind IS NOT NULL ORDER BY waiting_behind LIMIT 1)
  UNION ALL
  SELECT (SELECT waiting_behind FROM outbox_events
          WHERE waiting_behind > named.seq ORDER BY waiting_behind LIMIT 1)
  FROM named WHERE named.seq IS NOT NULL
), stranded AS (
  SELECT n.seq FROM named n
  WHERE n.seq IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM outbox_events s WHERE s.seq = n.seq AND s.{_FAILING}
      AND s.set_aside_at IS NOT NULL)
)
UPDATE outbox_events SET waiting_behind = NULL
WHERE waiting_behind IN (SELECT seq FROM stranded)
"""

_ACTION = """
INSERT INTO outbox_actions (event_id, seq, action, actor, reason, details)
VALUES ($1, $2, $3, $4, $5, $6::jsonb)
"""


async def set_aside_rows(conn: Conn, limit: int = 1000) -> list[dict[str, Any]]:
    """Set-aside rows, oldest first, each with how many rows of its aggregate wait behind it."""
    return [dict(record) for record in await conn.fetch(_SET_ASIDE, limit)]


async def republish(
    conn: Conn, ids: list[UUID] | None, *, actor: str, reason: str
) -> list[dict[str, Any]]:
    """Make set-aside rows (``ids``, or all when None) pending again, attempts 0, and audit
    each; wake the publisher. Returns the rows as they were. Rows not set aside are left
    alone (not returned)."""
    if not reason.strip():
        raise ValueError("a republish needs a reason")
    async with conn.transaction():
        rows = [dict(r) for r in await conn.fetch(_LOCK_SET_ASIDE, ids)]
        if not rows:
            return []
        seqs = [row["seq"] for row in rows]
        await conn.execute(_REPUBLISH, seqs)
        await conn.execute(_RELEASE_WAITING, seqs)
        await conn.executemany(
            _ACTION,
            [(row["id"], row["seq"], "republish", actor, reason, _details(row)) for row in rows],
        )
        await conn.execute("SELECT pg_notify('ferry_outbox', '')")
    return rows


async def mark_waiting(conn: Conn) -> int:
    """Take the rows behind set-aside rows out of the claim's walk; release those whose
    set-aside row is gone. The rows marked or released. The publisher runs it after it sets
    rows aside (in that transaction) and every :data:`WAITING_SWEEP_SECONDS`."""
    marked = await conn.execute(_MARK_WAITING)
    released = await conn.execute(_RELEASE_STRANDED)
    return int(marked.split()[-1]) + int(released.split()[-1])


#: How often the publisher marks the rows committed behind a set-aside row since its last
#: sweep. Until then such a row is walked, and refused, by every claim, as before 0023.
WAITING_SWEEP_SECONDS = 5.0


def _details(row: dict[str, Any]) -> str:
    return json.dumps(
        {
            "was": row["set_aside_reason"],
            "set_aside_at": row["set_aside_at"].isoformat(),
            "attempts": row["publish_attempts"],
            "last_error": (row["publish_error"] or "")[:500],
        }
    )


async def actions(conn: Conn, event_id: UUID) -> list[dict[str, Any]]:
    """The audit of one outbox row, oldest first."""
    query = "SELECT * FROM outbox_actions WHERE event_id = $1 ORDER BY at, id"
    return [dict(r) for r in await conn.fetch(query, event_id)]
